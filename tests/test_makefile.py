"""`make test` runs every stage even when one fails, and says at the end which ones failed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def run_stages(overrides: dict[str, str] | None = None, **commands: str) -> subprocess.CompletedProcess[str]:
    """``make test-stages`` with stage-NAME=command for each keyword and the other overrides."""
    args = [f"stage-{name}={command}" for name, command in commands.items()]
    args += [f"{name}={value}" for name, value in (overrides or {}).items()]
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO), "test-stages", *args],
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


def test_the_compiled_build_runs_in_the_background_and_its_stage_waits_for_it(tmp_path: Path) -> None:
    log, gate, marker = tmp_path / "build.log", tmp_path / "gate", tmp_path / "built"
    # The build finishes only after the first stage opened the gate, and the first stage sees no
    # finished build: both ran at the same time (no sleeps, so no timing luck either way).
    wait_for_gate = f"i=0; while [ ! -e {gate} ] && [ $$i -lt 6000 ]; do sleep 0.05; i=$$((i+1)); done"
    done = run_stages(
        pytest=f"sh -c 'test ! -e {marker} && touch {gate}'",
        lint="true",
        overrides={
            "compiled-build": f"sh -c '{wait_for_gate}; echo building; touch {marker}'",
            "compiled-tests": f"test -e {marker}",
            "COMPILED_BUILD_LOG": str(log),
            "COMPILED_TESTS_LOG": str(tmp_path / "tests.log"),
        },
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "building" in done.stdout
    assert "(compiled build: exit 0 after " in done.stdout
    assert done.stdout.splitlines()[-1] == "make test: every stage passed"


def test_a_failed_compiled_build_fails_its_stage_without_running_its_tests(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    done = run_stages(
        pytest="true",
        lint="true",
        overrides={
            "compiled-build": "sh -c 'echo mypyc says no; exit 1'",
            "compiled-tests": "echo compiled tests ran",
            "COMPILED_BUILD_LOG": str(log),
            "COMPILED_TESTS_LOG": str(tmp_path / "tests.log"),
        },
    )
    assert done.returncode != 0
    assert "mypyc says no" in done.stdout and "(compiled build: exit 1 after " in done.stdout
    assert "compiled tests ran" not in done.stdout
    assert done.stdout.splitlines()[-1] == "make test: FAILED stage(s): compiled"


def test_the_compiled_tests_run_beside_the_stages_as_soon_as_the_build_is_done(tmp_path: Path) -> None:
    started = tmp_path / "compiled-tests-started"
    # The pytest stage ends only once the compiled tests have started (bounded: 100 s), and lint
    # sees them started too: they ran beside the stages, not after them.
    wait_for = f"i=0; while [ ! -e {started} ] && [ $$i -lt 2000 ]; do sleep 0.05; i=$$((i+1)); done"
    done = run_stages(
        pytest=f"sh -c '{wait_for}; test -e {started}'",
        lint=f"test -e {started}",
        overrides={
            "compiled-build": "echo built",
            "compiled-tests": f"sh -c 'touch {started}; echo compiled tests ran; exit 5'",
            "COMPILED_BUILD_LOG": str(tmp_path / "build.log"),
            "COMPILED_TESTS_LOG": str(tmp_path / "tests.log"),
        },
    )
    lines = done.stdout.splitlines()
    assert done.returncode != 0
    assert " pytest:ok(" in lines[-2] and " lint:ok(" in lines[-2], done.stdout + done.stderr
    # the compiled stage shows the build's output, then the tests' output, and fails with them
    assert lines.index("built") < lines.index("compiled tests ran")
    assert "(compiled tests: exit 5 after " in done.stdout
    assert lines[-1] == "make test: FAILED stage(s): compiled"
