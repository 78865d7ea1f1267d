"""The build under test is the one the run says it is: ``MPIGATE_BUILD=compiled`` (``make
test-compiled``, against the wheel installed in .venv-compiled) means every hot module is a mypyc
extension module; otherwise (the editable .venv) every one is pure Python — a
stale extension module next to the source would silently shadow it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mpigate._build import COMPILED, compiled, module_builds

EXPECT_COMPILED = os.environ.get("MPIGATE_BUILD", "pure") == "compiled"


def test_hot_modules_are_the_expected_build() -> None:
    builds = module_builds()
    # the packages with their submodules (the rules subpackage included), and the single modules
    assert set(COMPILED) <= set(builds)
    assert "mpigate.policy.rules.quota" in builds
    assert "mpigate.trainjob.resolve" in builds
    assert not any(name.startswith("mpigate.admission.server") for name in builds)
    wrong = sorted(name for name, is_compiled in builds.items() if is_compiled != EXPECT_COMPILED)
    assert wrong == [], f"expected {'compiled' if EXPECT_COMPILED else 'pure'}: {wrong}"
    assert compiled() is EXPECT_COMPILED


def test_version_says_which_build() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mpigate", "--version"], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip().endswith(f"(compiled: {'yes' if EXPECT_COMPILED else 'no'})"), done.stdout


def test_serve_logs_which_build_at_startup(tmp_path: Path) -> None:
    # the first record of `mpigate serve`, before it checks its options (this run stops there)
    done = subprocess.run(
        [sys.executable, "-m", "mpigate", "serve", "--config", str(tmp_path / "missing"), "--insecure-dev"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    record = json.loads(done.stderr.splitlines()[0])
    assert record["event"] == "starting"
    assert record["compiled"] is EXPECT_COMPILED
    assert record["msg"].endswith(f"(compiled: {'yes' if EXPECT_COMPILED else 'no'})")
