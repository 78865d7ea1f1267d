"""Fixtures for the preflight tests: real OpenMPI, network namespaces, the example org's profiles."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import socket
from collections.abc import Iterator
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


# Real-mpirun tests listen on fixed ports. Two test runs on one machine (parallel CI jobs, a
# developer's run next to CI) would steal each other's ports, so they take turns on this lock.
_MPI_LOCK = Path(os.environ.get("TMPDIR", "/tmp")) / "mpigate-openmpi-tests.lock"
# The tests pin OpenMPI below Linux's ephemeral port range (32768-60999): the suite's own client
# sockets (thousands of HTTPS requests, TIME_WAIT for a minute) can hold a port inside that range
# and make a pinned listener fail to bind. The example org keeps its 40000s ranges (the demo and
# the CLI test use them); only the port numbers differ here, not the environment under test.
_TEST_BTL_MIN = 29000


@pytest.fixture(autouse=True)
def _one_mpirun_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("mpi") is None:
        yield
        return
    with open(_MPI_LOCK, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="session")
def pinned(example_org: Config) -> NetworkProfile:
    """The example org's pinned-ports profile, moved to free ports below the ephemeral range."""
    profile = example_org.network_profiles["pinned-ports"]
    assert profile.mode == "pinned-ports"
    for base in range(_TEST_BTL_MIN, 32000, 500):
        moved = dataclasses.replace(
            profile, btl_port_min=base, oob_port_min=base + 200, oob_port_max=base + 210
        )
        ports = [*range(base, base + moved.btl_port_range), *range(base + 200, base + 211)]
        if all(_bindable(p) for p in ports):
            return moved
    pytest.fail("no free 211-port window below 32000 for the pinned-ports tests")


@pytest.fixture
def fixtures_dir() -> Path:
    return REPO / "tests" / "fixtures" / "preflight"
