"""Shared fixtures and helpers for the whole suite."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# The day the fixtures are judged on (exception expiry); keeps the suite independent of the clock.
TODAY = dt.date(2026, 11, 22)


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
