"""Fixtures for the preflight tests: real OpenMPI, network namespaces, the example org's profiles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mpigate.config import Config, load
from mpigate.config.model import NetworkProfile
from mpigate.preflight import mpi_unavailable, virtual_pods_unavailable
from tests.conftest import REPO, TODAY


def _missing(reason: str) -> None:
    """Skip with the exact reason, except in CI (CI=true), where a missing tool is a failure."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def openmpi() -> None:
    """Real OpenMPI (mpirun) and an mpi4py that loads it, in this venv's Python."""
    reason = mpi_unavailable()
    if reason:
        _missing(reason)


@pytest.fixture(scope="session")
def netns() -> None:
    """Root and iproute2, to make virtual pods from network namespaces."""
    reason = virtual_pods_unavailable()
    if reason:
        _missing(reason)


@pytest.fixture(scope="session")
def example_org() -> Config:
    return load(REPO, today=TODAY)


@pytest.fixture(scope="session")
def pinned(example_org: Config) -> NetworkProfile:
    profile = example_org.network_profiles["pinned-ports"]
    assert profile.mode == "pinned-ports"
    return profile


@pytest.fixture
def fixtures_dir() -> Path:
    return REPO / "tests" / "fixtures" / "preflight"
