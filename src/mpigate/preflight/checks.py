"""The MPI program of the preflight: allreduce, point-to-point ring, ping-pong, own ports.

Run once per rank (``mpirun -np N python -m mpigate.preflight``). Every check is collective, so all
ranks call the same functions in the same order; rank 0 gathers the per-rank results, decides the
verdict and broadcasts it so that every rank exits with the same status (mpirun then exits non-zero
when a check failed).

mpi4py is imported here only, and lazily, so that the rest of mpigate never needs an MPI library.
"""

from __future__ import annotations

import os
import socket
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mpigate.config.mpienv import PINNED_ENV_NAMES

from .confinement import PortRanges
from .portwatch import ObservedSocket, sample_once
from .report import CheckResult, PingPong, PreflightReport, RankReport

if TYPE_CHECKING:
    from mpi4py.MPI import Intracomm

__all__ = ["DEFAULT_SIZES", "PINNED_ENV_PREFIXES", "PreflightSettings", "abort_job", "run_preflight"]

DEFAULT_SIZES: tuple[int, ...] = (8, 1 << 10, 64 << 10, 1 << 20)
# Large enough to cross OpenMPI's TCP eager limit (64 KiB), so that the rendezvous protocol is used.
ALLREDUCE_ELEMENTS = 1 << 15
SHIFT_BYTES = 1 << 20
# The names of every implementation's pinned-port environment (config.mpienv.pinned_env).
PINNED_ENV_PREFIXES = tuple(sorted(PINNED_ENV_NAMES))


@dataclass(frozen=True, slots=True)
class PreflightSettings:
    """Knobs of one run (all ranks must use the same)."""

    sizes: tuple[int, ...] = DEFAULT_SIZES
    iterations: int = 20
    hold: float = 0.0  # seconds to stay connected after the checks (lets a port sampler observe)
    max_latency_us: float | None = None  # fail when the smallest message is slower
    min_bandwidth_mbs: float | None = None  # fail when the largest message is slower
    expect_pinned: bool = False  # fail the ports check when no pinned-port environment is present

    def to_dict(self) -> dict[str, Any]:
        return {
            "sizes": list(self.sizes),
            "iterations": self.iterations,
            "hold": self.hold,
            "maxLatencyUs": self.max_latency_us,
            "minBandwidthMBs": self.min_bandwidth_mbs,
            "expectPinned": self.expect_pinned,
        }


def _pattern(seed: int, size: int) -> bytearray:
    """A buffer whose content identifies ``seed`` (cheap to build, detects shifted or mixed data)."""
    block = bytes((i * 7 + seed * 13) % 256 for i in range(256))
    return bytearray((block * (size // 256 + 1))[:size])


def _allreduce(comm: Intracomm) -> CheckResult:
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    # Integer-valued doubles sum exactly, so equality is the right test.
    send = array("d", [float(rank + 1 + i % 7) for i in range(ALLREDUCE_ELEMENTS)])
    recv = array("d", bytes(8 * ALLREDUCE_ELEMENTS))
    comm.Allreduce(send, recv, op=MPI.SUM)
    base = size * (size + 1) // 2
    wrong = [i for i in range(ALLREDUCE_ELEMENTS) if recv[i] != base + size * (i % 7)]
    scalar = comm.allreduce(rank, op=MPI.SUM)
    if wrong:
        i = wrong[0]
        return CheckResult(
            "allreduce",
            "fail",
            f"{len(wrong)} wrong element(s); [{i}]={recv[i]:g}, want {base + size * (i % 7)}",
        )
    if scalar != size * (size - 1) // 2:
        return CheckResult("allreduce", "fail", f"sum of ranks {scalar}, want {size * (size - 1) // 2}")
    return CheckResult("allreduce", "pass", f"{ALLREDUCE_ELEMENTS} doubles and the sum of ranks are exact")


def _ring(comm: Intracomm) -> CheckResult:
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return CheckResult("ring", "skip", "needs at least 2 ranks")
    right, left = (rank + 1) % size, (rank - 1) % size
    problems: list[str] = []
    # 1. A token travels 0 → 1 → … → n-1 → 0 and records every hop.
    if rank == 0:
        comm.send([0], dest=right, tag=11)
        token = comm.recv(source=left, tag=11)
        if token != list(range(size)):
            problems.append(f"token came back as {token}, want {list(range(size))}")
    else:
        token = comm.recv(source=left, tag=11)
        comm.send([*token, rank], dest=right, tag=11)
    # 2. Everyone shifts 1 MiB to the right at once (Sendrecv cannot deadlock on the ring).
    send = _pattern(rank, SHIFT_BYTES)
    recv = bytearray(SHIFT_BYTES)
    comm.Sendrecv(send, dest=right, sendtag=12, recvbuf=recv, source=left, recvtag=12)
    want = _pattern(left, SHIFT_BYTES)
    if recv != want:
        first = next(i for i in range(SHIFT_BYTES) if recv[i] != want[i])
        problems.append(f"1 MiB from rank {left} differs at byte {first}")
    if problems:
        return CheckResult("ring", "fail", "; ".join(problems))
    return CheckResult("ring", "pass", f"token ring and 1 MiB shift from rank {left} intact")


def _pingpong(comm: Intracomm, settings: PreflightSettings) -> tuple[CheckResult, list[PingPong]]:
    """Rank 0 plays ping-pong with every other rank in turn; the result belongs to the peer."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return CheckResult("pingpong", "skip", "needs at least 2 ranks"), []
    results: list[PingPong] = []
    problems: dict[int, list[str]] = {}
    for peer in range(1, size):
        for msg_size in settings.sizes:
            if rank not in (0, peer):
                continue
            buf = _pattern(peer + msg_size, msg_size)
            echo = bytearray(msg_size)
            if rank == 0:
                comm.Send(buf, dest=peer, tag=21)  # warm-up: connection set-up is not latency
                comm.Recv(echo, source=peer, tag=22)
                start = MPI.Wtime()
                for _ in range(settings.iterations):
                    comm.Send(buf, dest=peer, tag=21)
                    comm.Recv(echo, source=peer, tag=22)
                half = (MPI.Wtime() - start) / settings.iterations / 2
                if echo != buf:
                    problems.setdefault(peer, []).append(f"{msg_size} B echoed back differ")
                results.append(
                    PingPong(
                        peer,
                        msg_size,
                        settings.iterations,
                        half * 1e6,
                        msg_size / half / 1e6 if half else 0.0,
                    )
                )
            else:
                for _ in range(settings.iterations + 1):
                    comm.Recv(echo, source=0, tag=21)
                    comm.Send(echo, dest=0, tag=22)
    # Rank 0 judges each peer; every peer learns its own figures and verdict.
    per_peer: list[tuple[CheckResult, list[PingPong]]] = [(CheckResult("pingpong", "skip"), [])]
    if rank == 0:
        for peer in range(1, size):
            mine = [p for p in results if p.peer == peer]
            per_peer.append((_judge_pingpong(mine, problems.get(peer, []), settings), mine))
    scattered = comm.scatter(per_peer if rank == 0 else None, root=0)
    check, figures = scattered
    if rank == 0:
        return CheckResult("pingpong", "pass", f"measured {size - 1} peer(s)"), []
    return check, figures


def _judge_pingpong(
    figures: Sequence[PingPong], problems: Sequence[str], settings: PreflightSettings
) -> CheckResult:
    failures = list(problems)
    if figures:
        small, large = min(figures, key=lambda p: p.size), max(figures, key=lambda p: p.size)
        if settings.max_latency_us is not None and small.latency_us > settings.max_latency_us:
            failures.append(f"latency {small.latency_us:.1f} us > {settings.max_latency_us:g} us")
        if settings.min_bandwidth_mbs is not None and large.bandwidth_mbs < settings.min_bandwidth_mbs:
            failures.append(f"bandwidth {large.bandwidth_mbs:.1f} MB/s < {settings.min_bandwidth_mbs:g} MB/s")
        summary = f"{small.latency_us:.1f} us, {large.bandwidth_mbs:.1f} MB/s"
    else:
        summary = "no figures"
    if failures:
        return CheckResult("pingpong", "fail", "; ".join(failures))
    return CheckResult("pingpong", "pass", summary)


def _own_sockets() -> frozenset[ObservedSocket] | None:
    """This rank's TCP sockets now; None where there is no /proc to read them from."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    return frozenset(sample_once([os.getpid()]))


def _own_ports(
    env: Mapping[str, str], settings: PreflightSettings, sockets: frozenset[ObservedSocket] | None
) -> tuple[CheckResult, tuple[int, ...]]:
    """This rank's network-reachable TCP listeners, judged against the pinned env it was given."""
    if sockets is None:
        return CheckResult("ports", "skip", "no /proc: cannot observe sockets on this OS"), ()
    listening = sorted(
        {s.local_port for s in sockets if s.listening and not s.loopback_only},
    )
    try:
        ranges = PortRanges.from_env(env)
    except ValueError as exc:
        return CheckResult("ports", "fail", f"invalid pinned-port environment: {exc}"), tuple(listening)
    if ranges is None:
        if settings.expect_pinned:
            return CheckResult(
                "ports",
                "fail",
                "no pinned-port environment (OMPI_MCA_*, I_MPI_PORT_RANGE, ...: was it injected?)",
            ), tuple(listening)
        return CheckResult("ports", "skip", "ports not pinned (no pinned-port environment)"), tuple(listening)
    outside = [p for p in listening if ranges.range_of(p) is None]
    if outside:
        return CheckResult(
            "ports", "fail", f"listening outside {ranges.describe()}: {', '.join(map(str, outside))}"
        ), tuple(listening)
    return CheckResult("ports", "pass", f"all listeners in {ranges.describe()}"), tuple(listening)


def run_preflight(
    comm: Intracomm | None = None,
    settings: PreflightSettings | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[PreflightReport | None, bool]:
    """Run every check on this rank. Returns (the report on rank 0 else None, verdict for all ranks)."""
    import mpi4py
    from mpi4py import MPI

    comm = comm if comm is not None else MPI.COMM_WORLD
    settings = settings or PreflightSettings()
    env = os.environ if env is None else env
    rank = comm.Get_rank()
    checks = [_allreduce(comm), _ring(comm)]
    pingpong_check, figures = _pingpong(comm, settings)
    checks.append(pingpong_check)
    # Connections made by the checks stay open until MPI_Finalize: observe them while they exist.
    comm.Barrier()
    sockets = _own_sockets()
    ports_check, listening = _own_ports(env, settings, sockets)
    checks.append(ports_check)
    if settings.hold > 0:
        comm.Barrier()
        time.sleep(settings.hold)
    mine = RankReport(
        rank=rank,
        host=socket.gethostname(),
        pid=os.getpid(),
        checks=tuple(checks),
        pingpong=tuple(figures),
        listen_ports=listening,
        sockets=tuple(sorted(sockets or (), key=lambda s: (s.local_port, s.remote_address, s.remote_port))),
    )
    gathered = comm.gather(mine.to_dict(), root=0)
    report: PreflightReport | None = None
    ok = False
    if rank == 0:
        assert gathered is not None
        report = PreflightReport(
            size=comm.Get_size(),
            library=MPI.Get_library_version().splitlines()[0].split(",")[0].strip(),
            mpi4py=mpi4py.__version__,
            ranks=tuple(RankReport.from_dict(d) for d in gathered),
            settings=settings.to_dict(),
            pinned_env={k: v for k, v in sorted(env.items()) if k.startswith(PINNED_ENV_PREFIXES)},
        )
        ok = report.ok
    ok = bool(comm.bcast(ok, root=0))
    return report, ok


def abort_job(code: int) -> None:
    """End every rank of the job (MPI_Abort on COMM_WORLD) with ``code``."""
    from mpi4py import MPI

    MPI.COMM_WORLD.Abort(code)
