"""`make test` runs every stage even when one fails, and says at the end which ones failed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def run_stages(**commands: str) -> subprocess.CompletedProcess[str]:
    overrides = [f"stage-{name}={command}" for name, command in commands.items()]
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO), "test-stages", *overrides],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_failing_stage_does_not_stop_the_others() -> None:
    done = run_stages(pytest="false", lint="echo linted", compiled="sh -c 'exit 3'")
    assert done.returncode != 0
    lines = done.stdout.splitlines()
    assert lines[:4] == ["== make test: pytest", "== make test: lint", "linted", "== make test: compiled"]
    assert lines[-2].startswith("== make test: pytest:FAILED(") and " lint:ok(" in lines[-2]
    assert " compiled:FAILED(" in lines[-2]
    assert lines[-1] == "make test: FAILED stage(s): pytest compiled"


def test_every_stage_passing_passes() -> None:
    done = run_stages(pytest="true", lint="true", compiled="true")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "make test: every stage passed"
