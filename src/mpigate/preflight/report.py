"""The preflight's results as plain values: per-rank checks, ping-pong figures, the verdict.

Pure: built by the MPI program (``checks``) on rank 0, serialised to JSON, read back by the local
launcher, rendered as a table by the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from .portwatch import ObservedSocket

__all__ = [
    "CHECKS",
    "CheckResult",
    "PingPong",
    "PreflightReport",
    "RankReport",
    "Status",
    "format_bytes",
    "render_text",
]

Status = Literal["pass", "fail", "skip"]
# The checks every rank reports, in table order.
CHECKS: tuple[str, ...] = ("allreduce", "ring", "pingpong", "ports")


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check on one rank."""

    name: str
    status: Status
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> CheckResult:
        return CheckResult(str(data["name"]), cast(Status, data["status"]), str(data.get("detail", "")))


@dataclass(frozen=True, slots=True)
class PingPong:
    """Rank 0 ↔ ``peer`` ping-pong at one message size: half the mean round trip."""

    peer: int
    size: int
    iterations: int
    latency_us: float
    bandwidth_mbs: float  # 10**6 bytes per second, one direction

    def to_dict(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "size": self.size,
            "iterations": self.iterations,
            "latencyUs": round(self.latency_us, 3),
            "bandwidthMBs": round(self.bandwidth_mbs, 3),
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> PingPong:
        return PingPong(
            int(data["peer"]),
            int(data["size"]),
            int(data["iterations"]),
            float(data["latencyUs"]),
            float(data["bandwidthMBs"]),
        )


@dataclass(frozen=True, slots=True)
class RankReport:
    """What one rank saw: where it ran, its checks, the TCP ports it listened on."""

    rank: int
    host: str
    pid: int
    checks: tuple[CheckResult, ...]
    pingpong: tuple[PingPong, ...] = ()  # measured by rank 0 against this rank
    listen_ports: tuple[int, ...] = ()  # non-loopback TCP listeners of this rank (IPv4 and IPv6)
    # Every TCP socket of this rank, seen by the rank itself after the checks, while every
    # connection they made is open (the launcher's sampler may miss short windows on a busy host)
    sockets: tuple[ObservedSocket, ...] = ()

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.status == "fail")

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "checks": [c.to_dict() for c in self.checks],
            "pingpong": [p.to_dict() for p in self.pingpong],
            "listenPorts": list(self.listen_ports),
            "sockets": [s.to_dict() for s in self.sockets],
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> RankReport:
        return RankReport(
            rank=int(data["rank"]),
            host=str(data["host"]),
            pid=int(data["pid"]),
            checks=tuple(CheckResult.from_dict(c) for c in data.get("checks", ())),
            pingpong=tuple(PingPong.from_dict(p) for p in data.get("pingpong", ())),
            listen_ports=tuple(int(p) for p in data.get("listenPorts", ())),
            sockets=tuple(ObservedSocket.from_dict(s) for s in data.get("sockets", ())),
        )


@dataclass(frozen=True, slots=True)
class PreflightReport:
    """The whole run as rank 0 saw it."""

    size: int
    library: str
    mpi4py: str
    ranks: tuple[RankReport, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    pinned_env: Mapping[str, str] = field(default_factory=dict)  # OMPI_MCA_* port settings seen by rank 0

    @property
    def ok(self) -> bool:
        """Every rank reported and no check failed."""
        return len(self.ranks) == self.size and not any(r.failed for r in self.ranks)

    @property
    def verdict(self) -> Literal["PASS", "FAIL"]:
        return "PASS" if self.ok else "FAIL"

    @property
    def failures(self) -> tuple[tuple[int, CheckResult], ...]:
        return tuple((r.rank, c) for r in self.ranks for c in r.failed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "size": self.size,
            "library": self.library,
            "mpi4py": self.mpi4py,
            "settings": dict(self.settings),
            "pinnedEnv": dict(self.pinned_env),
            "ranks": [r.to_dict() for r in self.ranks],
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> PreflightReport:
        return PreflightReport(
            size=int(data["size"]),
            library=str(data["library"]),
            mpi4py=str(data["mpi4py"]),
            ranks=tuple(RankReport.from_dict(r) for r in data.get("ranks", ())),
            settings=dict(data.get("settings", {})),
            pinned_env={str(k): str(v) for k, v in data.get("pinnedEnv", {}).items()},
        )


def format_bytes(size: int) -> str:
    """``8 B``, ``64 KiB``, ``1 MiB`` (exact binary units, else bytes)."""
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    return [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip()
        for row in (header, *rows)
    ]


def render_text(report: PreflightReport) -> str:
    """The human table: one row per rank, the ping-pong figures, failures and the verdict."""
    lines = [f"mpigate preflight: {report.size} rank(s), {report.library}, mpi4py {report.mpi4py}"]
    if report.pinned_env:
        lines.append("pinned ports: " + " ".join(f"{k}={v}" for k, v in sorted(report.pinned_env.items())))
    header = ["rank", "host", "pid", *CHECKS, "listening"]
    rows = []
    for r in report.ranks:
        statuses = [c.status if (c := r.check(name)) else "-" for name in CHECKS]
        ports = ",".join(str(p) for p in r.listen_ports) or "-"
        rows.append([str(r.rank), r.host, str(r.pid), *statuses, ports])
    lines += ["", *_table(header, rows)]
    pings = [p for r in report.ranks for p in r.pingpong]
    if pings:
        lines += ["", "ping-pong rank 0 <-> peer (half round trip):"]
        lines += _table(
            ["peer", "size", "iterations", "latency", "bandwidth"],
            [
                [
                    str(p.peer),
                    format_bytes(p.size),
                    str(p.iterations),
                    f"{p.latency_us:.1f} us",
                    f"{p.bandwidth_mbs:.1f} MB/s",
                ]
                for p in pings
            ],
        )
    if report.failures:
        lines += ["", "failures:"]
        lines += [f"  rank {rank} {check.name}: {check.detail}" for rank, check in report.failures]
    missing = report.size - len(report.ranks)
    if missing:
        lines.append(f"  {missing} rank(s) did not report")
    skipped = sorted({f"{c.name}: {c.detail}" for r in report.ranks for c in r.checks if c.status == "skip"})
    if skipped:
        lines += ["", "skipped:", *(f"  {s}" for s in skipped)]
    lines += ["", f"verdict: {report.verdict}"]
    return "\n".join(lines) + "\n"
