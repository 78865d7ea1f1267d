"""Before a local launch: are the pinned port ranges free here, and if not, who holds them?

An operator who sees OpenMPI's "No sockets were able to be opened" runs ``ss -ltnp`` and looks
for the process on the port; ``busy_ports`` does the same from ``/proc``: the kernel's TCP tables
of this network namespace (``/proc/net/tcp`` and ``tcp6``, parsed by ``portwatch``) joined with
every process' socket file descriptors (``/proc/<pid>/fd``), as the port watcher does for the
job's own processes.

``free_window`` moves a profile's ranges (their sizes and their distance unchanged) to ports that
nothing holds, below the kernel's ephemeral range so that the machine's outgoing connections
cannot take one between the check and mpirun's bind. Concurrent callers start their search at a
random place, so that two runs on one machine rarely try the same window.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mpigate.config.model import NetworkProfile

from .portwatch import Family, TcpEntry, parse_tcp_table, socket_inodes

__all__ = [
    "BusyPort",
    "PortWindowError",
    "busy_ports",
    "describe_busy",
    "ephemeral_range",
    "free_window",
    "launch_ranges",
    "move_ranges",
]

# Unprivileged ports start here; windows are searched from here up to the ephemeral range.
_LOWEST = 10000
# Linux's default net.ipv4.ip_local_port_range, when /proc does not say.
_DEFAULT_EPHEMERAL = (32768, 60999)


class PortWindowError(RuntimeError):
    """No free window for the ranges (message says where it looked)."""


@dataclass(frozen=True, slots=True)
class BusyPort:
    """A port of a pinned range that a socket on this machine holds."""

    port: int
    range: str  # "BTL 40000-40099", "OOB 40200-40210"
    entry: TcpEntry
    pid: int | None  # None: its /proc/<pid> is not readable (another user's, or just gone)
    process: str | None

    def describe(self) -> str:
        who = f"{self.process}[{self.pid}]" if self.pid is not None else "a process this user cannot see"
        e = self.entry
        socket = f"{e.state} {e.local_address}:{e.local_port}"
        if e.state != "LISTEN":
            socket += f" -> {e.remote_address}:{e.remote_port}"
        return f"port {self.port} ({self.range}) is in use by {who}: {e.family} {socket}"


def launch_ranges(profile: NetworkProfile) -> tuple[tuple[str, int, int], ...]:
    """The ranges a local mpirun binds: the BTL's and the OOB's (the SSH port is the cluster's)."""
    _ssh, (btl_low, btl_high), (oob_low, oob_high) = profile.port_ranges()
    return (("BTL", btl_low, btl_high), ("OOB", oob_low, oob_high))


def _owners(proc: Path) -> dict[int, int]:
    """Socket inode -> pid, over every process this user may inspect."""
    owners: dict[int, int] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            for inode in socket_inodes(pid, proc):
                owners.setdefault(inode, pid)
    return owners


def _comm(pid: int, proc: Path) -> str | None:
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return None


def busy_ports(
    ranges: Sequence[tuple[str, int, int]], proc: Path = Path("/proc"), *, time_wait: bool = False
) -> list[BusyPort]:
    """Every TCP socket of this network namespace whose local port lies in ``ranges``.

    A listener and a connection's local end count (a bind to their port fails); a TIME_WAIT does
    not, unless ``time_wait``: OpenMPI's listeners set SO_REUSEADDR, so the TIME_WAITs a run leaves
    behind do not stop the next run within the minute from binding the same ports (checked with
    OpenMPI 4.1 here). A TIME_WAIT left by a socket *without* SO_REUSEADDR still blocks that bind
    (Linux's inet_bind_conflict needs the flag on both), and /proc does not say which it was.
    """
    tables: tuple[tuple[str, Family], ...] = (("tcp", "ipv4"), ("tcp6", "ipv6"))
    found: list[tuple[int, str, TcpEntry]] = []
    for name, family in tables:
        try:
            text = (proc / "net" / name).read_text()
        except OSError:
            continue
        for entry in parse_tcp_table(text, family):
            if entry.state == "TIME_WAIT" and not time_wait:
                continue
            for label, low, high in ranges:
                if low <= entry.local_port <= high:
                    found.append((entry.local_port, f"{label} {low}-{high}", entry))
                    break
    if not found:
        return []
    owners = _owners(proc)
    busy = []
    for port, label, entry in sorted(found, key=lambda f: (f[0], f[2].family, f[2].state)):
        pid = owners.get(entry.inode) if entry.inode else None
        busy.append(BusyPort(port, label, entry, pid, _comm(pid, proc) if pid is not None else None))
    return busy


def describe_busy(busy: Iterable[BusyPort], limit: int = 10) -> list[str]:
    """One line per busy port (the first ``limit``), and how many more."""
    items = list(busy)
    lines = [b.describe() for b in items[:limit]]
    if len(items) > limit:
        lines.append(f"... and {len(items) - limit} more")
    return lines


def ephemeral_range(proc: Path = Path("/proc")) -> tuple[int, int]:
    """The kernel's ephemeral port range (``net.ipv4.ip_local_port_range``)."""
    try:
        low, high = (proc / "sys" / "net" / "ipv4" / "ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL


def move_ranges(profile: NetworkProfile, base: int) -> NetworkProfile:
    """``profile`` with its BTL and OOB ranges moved so that the lower of the two starts at ``base``
    (sizes and the distance between them unchanged). Raises ValueError past port 65535."""
    offset = base - min(profile.btl_port_min, profile.oob_port_min)
    moved = dataclasses.replace(
        profile,
        btl_port_min=profile.btl_port_min + offset,
        oob_port_min=profile.oob_port_min + offset,
        oob_port_max=profile.oob_port_max + offset,
    )
    top = max(high for _, _, high in launch_ranges(moved))
    if base < 1024 or top > 65535:
        raise ValueError(f"ranges starting at {base} would end at {top}: outside 1024-65535")
    return moved


def free_window(
    profile: NetworkProfile,
    *,
    proc: Path = Path("/proc"),
    rng: random.Random | None = None,
) -> NetworkProfile:
    """``profile`` moved to a window of ports that nothing on this machine holds, below the
    ephemeral range. Raises PortWindowError when every window is busy."""
    ranges = launch_ranges(profile)
    span = max(high for _, _, high in ranges) - min(low for _, low, _ in ranges) + 1
    ceiling = ephemeral_range(proc)[0]
    step = -(-span // 100) * 100 + 100  # a gap between windows
    bases = list(range(_LOWEST, ceiling - span, step))
    if not bases:
        raise PortWindowError(
            f"no room for {span} ports between {_LOWEST} and the ephemeral range ({ceiling})"
        )
    start = (rng or random.SystemRandom()).randrange(len(bases))
    # A window no socket touches first; then one with only TIME_WAITs (see busy_ports: a TIME_WAIT
    # of a socket without SO_REUSEADDR would still refuse the bind).
    for time_wait in (True, False):
        for base in bases[start:] + bases[:start]:
            moved = move_ranges(profile, base)
            if not busy_ports(launch_ranges(moved), proc, time_wait=time_wait):
                return moved
    raise PortWindowError(f"every {span}-port window between {_LOWEST} and {ceiling} has a port in use")
