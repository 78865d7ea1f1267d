"""Shared fixtures and helpers for the whole suite."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests judge outcomes, never speed: on a busy shared machine hypothesis's timing checks (a
# 200 ms deadline per example, the "too slow" health check on data generation) failed tests whose
# outcomes were right (tests/policy/test_images.py under load 15). Every property test inherits this
# profile; a test's own @settings only adds to it.
settings.register_profile("mpigate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mpigate")

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# The day the fixtures are judged on (exception expiry); keeps the suite independent of the clock.
TODAY = dt.date(2026, 11, 22)
# The example org's config folders and examples: a tree `mpigate check` loads as a whole.
ORG_DIRS = ("policies", "quotas", "rbac", "networkpolicies", "examples")


def copy_org(target: Path) -> Path:
    """Copy the example org's config folders and examples (not its tests or build output) into
    ``target``, a tree of its own that a test may edit."""
    for name in ORG_DIRS:
        shutil.copytree(REPO / name, target / name)
    return target


def upstream_dir() -> Path | None:
    """``../shared/upstream`` (or $MPIGATE_UPSTREAM) when present."""
    env = os.environ.get("MPIGATE_UPSTREAM")
    candidate = Path(env) if env else REPO.parent / "shared" / "upstream"
    return candidate if candidate.is_dir() else None


@pytest.fixture
def upstream() -> Path:
    found = upstream_dir()
    if found is None:
        pytest.skip("upstream Trainer/Kueue data not found at ../shared/upstream (set MPIGATE_UPSTREAM)")
    return found


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


def unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (a real disk that fills up); needs root, skips (fails under CI=true) without."""
    if os.geteuid() != 0:
        unavailable("mounting a 256 KiB tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        unavailable(f"cannot mount a tmpfs: {result.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_disk(path: Path) -> None:
    """Write zeros to ``path`` until its file system is full (raises OSError ENOSPC)."""
    with path.open("wb", buffering=0) as fh:
        while True:
            fh.write(b"\0" * 4096)


@pytest.fixture
def org_tree(tmp_path: Path) -> Path:
    """A copy of the example org in the test's temporary directory."""
    return copy_org(tmp_path)
