"""Observe every TCP socket of a process tree while it runs (Linux ``/proc``).

The sampler walks the tree below a root pid (``mpirun`` → ``orted`` → ranks), maps each process'
socket file descriptors to inodes and joins them with the kernel's TCP tables of the process'
network namespace (``/proc/<pid>/net/tcp`` and ``tcp6``). Polling from a background thread keeps
the union of everything seen, so a socket that lived for a few milliseconds between two samples
can be missed, but a connection that stays open (MPI keeps BTL and OOB connections until
``MPI_Finalize``; the preflight's ``--hold`` keeps them longer) cannot.

Parsing is pure (``parse_tcp_table``) so that it can be tested without a kernel.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

__all__ = [
    "TCP_STATES",
    "ObservedSocket",
    "PortSampler",
    "TcpEntry",
    "parse_tcp_table",
    "process_tree",
    "sample_once",
    "socket_inodes",
]

log = logging.getLogger(__name__)

# include/net/tcp_states.h
TCP_STATES: Mapping[int, str] = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
    12: "NEW_SYN_RECV",
}

Family = Literal["ipv4", "ipv6"]


@dataclass(frozen=True, slots=True)
class TcpEntry:
    """One row of ``/proc/net/tcp`` or ``/proc/net/tcp6``."""

    family: Family
    local_address: str
    local_port: int
    remote_address: str
    remote_port: int
    state: str
    inode: int


def _decode_address(hex_address: str, family: Family) -> str:
    """The kernel prints addresses as host-order 32-bit words in hex."""
    raw = bytes.fromhex(hex_address)
    # Each 4-byte word is little-endian on the machines this runs on (x86-64, arm64).
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if family == "ipv4":
        return str(ipaddress.IPv4Address(words))
    address = ipaddress.IPv6Address(words)
    # A dual-stack socket's IPv4 peer shows up as ::ffff:a.b.c.d; it is IPv4 traffic.
    return str(address.ipv4_mapped) if address.ipv4_mapped else str(address)


def parse_tcp_table(text: str, family: Family) -> list[TcpEntry]:
    """Parse the content of ``/proc/net/tcp`` (``family="ipv4"``) or ``tcp6`` (``"ipv6"``).

    Malformed rows are skipped (the table is read while the kernel changes it, but each row is
    written atomically; a skipped row is logged).
    """
    entries: list[TcpEntry] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            local, remote, state_hex, inode = fields[1], fields[2], fields[3], int(fields[9])
            local_addr, local_port = local.split(":")
            remote_addr, remote_port = remote.split(":")
            entries.append(
                TcpEntry(
                    family=family,
                    local_address=_decode_address(local_addr, family),
                    local_port=int(local_port, 16),
                    remote_address=_decode_address(remote_addr, family),
                    remote_port=int(remote_port, 16),
                    state=TCP_STATES.get(int(state_hex, 16), f"UNKNOWN({state_hex})"),
                    inode=inode,
                )
            )
        except ValueError:
            log.debug("skipping malformed TCP table row %r", line)
    return entries


@dataclass(frozen=True, slots=True)
class ObservedSocket:
    """A TCP socket seen in a process of the watched tree."""

    pid: int
    process: str  # comm of the process, e.g. "mpirun", "orted", "python"
    family: Family
    local_address: str
    local_port: int
    remote_address: str
    remote_port: int
    state: str

    @property
    def listening(self) -> bool:
        return self.state == "LISTEN"

    @property
    def loopback_only(self) -> bool:
        """Bound to (and, when connected, talking over) the loopback interface only."""
        local = ipaddress.ip_address(self.local_address)
        if not local.is_loopback:
            return False
        return self.listening or ipaddress.ip_address(self.remote_address).is_loopback

    def describe(self) -> str:
        local = _endpoint(self.local_address, self.local_port)
        if self.listening:
            return f"{self.process}[{self.pid}] {self.family} LISTEN {local}"
        remote = _endpoint(self.remote_address, self.remote_port)
        return f"{self.process}[{self.pid}] {self.family} {self.state} {local} -> {remote}"

    def to_dict(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "process": self.process,
            "family": self.family,
            "state": self.state,
            "local": _endpoint(self.local_address, self.local_port),
            "remote": None if self.listening else _endpoint(self.remote_address, self.remote_port),
        }

    @staticmethod
    def from_dict(data: Mapping[str, object]) -> ObservedSocket:
        """The inverse of :meth:`to_dict` (a rank's own sockets travel in its report)."""
        family = str(data["family"])
        if family not in ("ipv4", "ipv6"):
            raise ValueError(f"unknown socket family {family!r}")
        local_address, local_port = _split_endpoint(str(data["local"]))
        remote = data.get("remote")
        # a listener's remote end, as the kernel's table has it
        unspecified = ("0.0.0.0" if family == "ipv4" else "::", 0)
        remote_address, remote_port = _split_endpoint(str(remote)) if remote is not None else unspecified
        return ObservedSocket(
            pid=int(str(data["pid"])),
            process=str(data["process"]),
            family=cast(Family, family),
            local_address=local_address,
            local_port=local_port,
            remote_address=remote_address,
            remote_port=remote_port,
            state=str(data["state"]),
        )


def _endpoint(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _split_endpoint(endpoint: str) -> tuple[str, int]:
    address, _, port = endpoint.rpartition(":")
    return address.removeprefix("[").removesuffix("]"), int(port)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # the process exited between listing and reading
        return None


def _parent_map(proc: Path) -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read(entry / "stat")
        if stat is None:
            continue
        # "pid (comm) state ppid ..." — comm may contain spaces and parentheses.
        after_comm = stat[stat.rfind(")") + 2 :].split()
        if len(after_comm) >= 2 and after_comm[1].isdigit():
            parents[int(entry.name)] = int(after_comm[1])
    return parents


def process_tree(root: int, proc: Path = Path("/proc")) -> set[int]:
    """``root`` and all its live descendants."""
    parents = _parent_map(proc)
    if root not in parents:
        return set()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def socket_inodes(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """The inodes of the sockets ``pid`` holds (empty when it is gone or not readable)."""
    inodes: set[int] = set()
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _netns_key(pid: int, proc: Path) -> str:
    try:
        return os.readlink(proc / str(pid) / "ns" / "net")
    except OSError:
        return f"pid:{pid}"


def sample_once(pids: Iterable[int], proc: Path = Path("/proc")) -> set[ObservedSocket]:
    """The TCP sockets (IPv4 and IPv6, every state) held right now by ``pids``."""
    owner: dict[str, dict[int, int]] = {}  # netns -> inode -> pid
    table_pid: dict[str, int] = {}
    comms: dict[int, str] = {}
    for pid in pids:
        inodes = socket_inodes(pid, proc)
        if not inodes:
            continue
        netns = _netns_key(pid, proc)
        table_pid.setdefault(netns, pid)
        comms[pid] = (_read(proc / str(pid) / "comm") or "?").strip()
        owner.setdefault(netns, {}).update(dict.fromkeys(inodes, pid))
    observed: set[ObservedSocket] = set()
    for netns, by_inode in owner.items():
        net = proc / str(table_pid[netns]) / "net"
        tables: tuple[tuple[str, Family], ...] = (("tcp", "ipv4"), ("tcp6", "ipv6"))
        for name, family in tables:
            text = _read(net / name)
            if text is None:
                continue
            for entry in parse_tcp_table(text, family):
                holder = by_inode.get(entry.inode)
                if holder is None or entry.inode == 0:
                    continue
                observed.add(
                    ObservedSocket(
                        pid=holder,
                        process=comms[holder],
                        family=entry.family,
                        local_address=entry.local_address,
                        local_port=entry.local_port,
                        remote_address=entry.remote_address,
                        remote_port=entry.remote_port,
                        state=entry.state,
                    )
                )
    return observed


@dataclass
class PortSampler:
    """Poll the TCP sockets of ``root``'s process tree from a background thread.

    Use as a context manager around the lifetime of the watched process; ``observed`` is the union
    of all samples, ``processes`` every pid (with its comm) seen in the tree.
    """

    root: int
    interval: float = 0.02
    proc: Path = Path("/proc")
    observed: set[ObservedSocket] = field(default_factory=set)
    processes: dict[int, str] = field(default_factory=dict)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sample(self) -> None:
        """Take one sample now (also called by the thread)."""
        pids = process_tree(self.root, self.proc)
        sockets = sample_once(pids, self.proc)
        with self._lock:
            for pid in pids:
                if pid not in self.processes:
                    comm = _read(self.proc / str(pid) / "comm")
                    if comm is not None:
                        self.processes[pid] = comm.strip()
            self.observed |= sockets
            self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except OSError as exc:  # /proc vanished under us; keep polling
                log.debug("sample failed: %s", exc)
            self._stop.wait(self.interval)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"port-sampler-{self.root}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def snapshot(self) -> tuple[frozenset[ObservedSocket], dict[int, str]]:
        with self._lock:
            return frozenset(self.observed), dict(self.processes)

    def __enter__(self) -> PortSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __iter__(self) -> Iterator[ObservedSocket]:
        return iter(self.snapshot()[0])
