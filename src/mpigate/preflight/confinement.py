"""Judge observed TCP sockets against the pinned port ranges of the ``pinned-ports`` profile.

The question is the one a per-job NetworkPolicy asks: would every connection between the job's
pods reach a port it opens? So:

* a **listener** reachable from other pods (bound to a non-loopback or wildcard address, IPv4 or
  IPv6) must sit in a pinned range;
* a **connection** over the network must have its *server* end (the side whose port is a listener)
  in a pinned range — the client's ephemeral source port is irrelevant to a NetworkPolicy;
* anything bound to loopback only (PMIx between a daemon and its local ranks) never leaves the pod
  and is reported, not judged.

Pure functions over ``ObservedSocket`` values.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mpigate.config.model import NetworkProfile
from mpigate.config.mpienv import parse_pinned_ranges

from .portwatch import ObservedSocket

__all__ = [
    "RANGE_NAMES",
    "ConfinementReport",
    "PortRanges",
    "RangeName",
    "SocketVerdict",
    "analyse",
    "parse_port_list",
]

RangeName = Literal["btl", "oob", "ssh"]
RANGE_NAMES: tuple[RangeName, ...] = ("btl", "oob", "ssh")


def parse_port_list(text: str) -> tuple[tuple[int, int], ...]:
    """OpenMPI's port list syntax: ``40200-40210``, ``40200,40201`` or a mix. Raises ValueError."""
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if not 0 < first <= last <= 65535:
            raise ValueError(f"invalid port range {part!r}")
        ranges.append((first, last))
    return tuple(ranges)


@dataclass(frozen=True, slots=True)
class PortRanges:
    """Inclusive port ranges a job may use among its pods."""

    btl: tuple[tuple[int, int], ...]
    oob: tuple[tuple[int, int], ...]
    ssh: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def from_profile(profile: NetworkProfile) -> PortRanges:
        ssh, btl, oob = profile.port_ranges()
        return PortRanges(btl=(btl,), oob=(oob,), ssh=(ssh,))

    @staticmethod
    def from_env(env: Mapping[str, str]) -> PortRanges | None:
        """The ranges a process was pinned to by its MPI implementation's variables (None: not
        pinned): Open MPI's ``OMPI_MCA_*``/``PRTE_MCA_*``, MPICH's and Intel MPI's
        (``mpienv.parse_pinned_ranges``; their data ranges count as BTL, Hydra's as OOB).

        Raises ValueError for values the implementation would not accept either.
        """
        btl: list[tuple[int, int]] = []
        for family in ("v4", "v6"):
            low = env.get(f"OMPI_MCA_btl_tcp_port_min_{family}")
            if low is None:
                continue
            count = int(env.get(f"OMPI_MCA_btl_tcp_port_range_{family}", "64511"))
            btl.append((int(low), int(low) + count - 1))
        oob: list[tuple[int, int]] = []
        # OpenMPI 4 (ORTE) reads the OMPI_ names, OpenMPI 5's PRRTE the PRTE_ ones (openmpi_env).
        for prefix in ("OMPI_MCA_", "PRTE_MCA_"):
            for family in ("ipv4", "ipv6"):
                name = f"{prefix}oob_tcp_static_{family}_ports"
                if env.get(name):
                    oob.extend(parse_port_list(env[name]))
        data, daemon = parse_pinned_ranges(env)
        btl.extend(data)
        oob.extend(daemon)
        if not btl and not oob:
            return None
        return PortRanges(btl=tuple(dict.fromkeys(btl)), oob=tuple(dict.fromkeys(oob)))

    def _by_name(self) -> tuple[tuple[RangeName, tuple[tuple[int, int], ...]], ...]:
        return (("btl", self.btl), ("oob", self.oob), ("ssh", self.ssh))

    def range_of(self, port: int) -> RangeName | None:
        for name, ranges in self._by_name():
            if any(low <= port <= high for low, high in ranges):
                return name
        return None

    def describe(self) -> str:
        parts = []
        for name, ranges in (("BTL", self.btl), ("OOB", self.oob), ("SSH", self.ssh)):
            if ranges:
                parts.append(f"{name} " + ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges))
        return ", ".join(parts)

    def to_dict(self) -> dict[str, list[list[int]]]:
        return {
            "btl": [list(r) for r in self.btl],
            "oob": [list(r) for r in self.oob],
            "ssh": [list(r) for r in self.ssh],
        }


@dataclass(frozen=True, slots=True)
class SocketVerdict:
    socket: ObservedSocket
    kind: Literal["listener", "connection"]
    scope: Literal["loopback", "network"]
    port: int | None  # the port a NetworkPolicy would have to open (None: unknown server end)
    range: RangeName | None
    ok: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.socket.to_dict(),
            "kind": self.kind,
            "scope": self.scope,
            "port": self.port,
            "range": self.range,
            "ok": self.ok,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class ConfinementReport:
    ranges: PortRanges
    verdicts: tuple[SocketVerdict, ...]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    @property
    def violations(self) -> tuple[SocketVerdict, ...]:
        return tuple(v for v in self.verdicts if not v.ok)

    def select(
        self,
        kind: Literal["listener", "connection"] | None = None,
        scope: Literal["loopback", "network"] | None = None,
    ) -> tuple[SocketVerdict, ...]:
        return tuple(
            v
            for v in self.verdicts
            if (kind is None or v.kind == kind) and (scope is None or v.scope == scope)
        )

    def ports(self, range_name: RangeName) -> tuple[int, ...]:
        """Distinct pinned ports of ``range_name`` that network listeners or connections used."""
        return tuple(sorted({v.port for v in self.verdicts if v.range == range_name and v.port is not None}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "ranges": self.ranges.to_dict(),
            "usedPorts": {name: list(self.ports(name)) for name in RANGE_NAMES},
            "violations": [v.to_dict() for v in self.violations],
            "sockets": [v.to_dict() for v in self.verdicts],
        }


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def _is_wildcard(address: str) -> bool:
    return ipaddress.ip_address(address).is_unspecified


def _sort_key(s: ObservedSocket) -> tuple[Any, ...]:
    return (not s.listening, s.process, s.pid, s.family, s.local_port, s.remote_address, s.remote_port)


def analyse(sockets: Iterable[ObservedSocket], ranges: PortRanges) -> ConfinementReport:
    """Judge every socket of a job's processes against ``ranges`` (see the module docstring)."""
    observed = sorted(set(sockets), key=_sort_key)
    listeners = [s for s in observed if s.listening]
    own_listen_ports = {(s.pid, s.local_port) for s in listeners}

    def serves(address: str, port: int) -> bool:
        return any(
            s.local_port == port and (_is_wildcard(s.local_address) or s.local_address == address)
            for s in listeners
        )

    verdicts: list[SocketVerdict] = []
    for s in observed:
        if s.listening:
            if _is_loopback(s.local_address):
                verdicts.append(
                    SocketVerdict(
                        s, "listener", "loopback", None, None, True, "loopback only, never leaves the pod"
                    )
                )
                continue
            name = ranges.range_of(s.local_port)
            reason = (
                f"in the {name.upper()} range"
                if name
                else "reachable from other pods, outside the pinned ranges"
            )
            verdicts.append(
                SocketVerdict(s, "listener", "network", s.local_port, name, name is not None, reason)
            )
            continue
        if s.state not in ("ESTABLISHED", "SYN_SENT", "SYN_RECV"):
            continue  # closing sockets were judged while they were open
        if s.loopback_only:
            verdicts.append(
                SocketVerdict(
                    s, "connection", "loopback", None, None, True, "loopback only, never leaves the pod"
                )
            )
            continue
        if (s.pid, s.local_port) in own_listen_ports:
            port: int | None = s.local_port  # accepted by this process' listener
        elif serves(s.remote_address, s.remote_port):
            port = s.remote_port  # connected to a listener of the job
        else:
            port = None
        if port is not None:
            name = ranges.range_of(port)
            reason = (
                f"server port {port} in the {name.upper()} range"
                if name
                else f"server port {port} outside the pinned ranges"
            )
            verdicts.append(SocketVerdict(s, "connection", "network", port, name, name is not None, reason))
            continue
        # A peer outside the watched processes: accept it only if one end is pinned.
        name = ranges.range_of(s.remote_port) or ranges.range_of(s.local_port)
        verdicts.append(
            SocketVerdict(
                s,
                "connection",
                "network",
                None,
                name,
                name is not None,
                "peer outside the job, a pinned port on one end"
                if name
                else "peer outside the job, no pinned port",
            )
        )
    return ConfinementReport(ranges, tuple(verdicts))
