"""Virtual pods: Linux network namespaces on one bridge, so that one machine behaves like a job.

Each "pod" is a network namespace with its own ``eth0`` (a veth on a bridge in the root namespace)
and loopback, the way a Kubernetes pod has its own network stack. ``mpirun`` stays in the root
namespace (the launcher pod) and starts ``orted`` in each namespace through an ``rsh`` agent that
plays sshd: it enters the namespace and *clears the environment*, so that whatever reaches the
remote daemons and ranks is what OpenMPI itself forwards — exactly the situation of Trainer's
launcher pod ssh-ing into the node pods on port 2222. Each pod also has its own hostname (a UTS
namespace), as a Kubernetes pod does: OpenMPI names its session directories after the node
(``ompi.<host>.<uid>/jf.<family>``), and daemons that all believed they ran on the launcher's host
raced to create the same directories ("A call to mkdir was unable to create the desired
directory ... File exists", then "ORTE does not know how to route a message"; about one run in
twenty on a busy machine).

Needs root, iproute2 (``ip netns``) and util-linux's ``unshare``. Addresses come from
198.18.0.0/15 (RFC 2544, reserved for benchmarking) so that they cannot clash with a real network.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

__all__ = ["VirtualPods", "VirtualPodsError", "virtual_pods_unavailable"]

log = logging.getLogger(__name__)


class VirtualPodsError(RuntimeError):
    """The namespaces could not be set up (message says why)."""


def virtual_pods_unavailable() -> str | None:
    """Why virtual pods cannot be made here, or None when they can."""
    if not Path("/proc/self/ns/net").exists():
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2 'ip' not found (Debian package iproute2)"
    for tool, package in (("unshare", "util-linux"), ("hostname", "hostname")):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (Debian package {package})"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise VirtualPodsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def _free_subnet(start: int) -> int:
    """A /24 of 198.18.0.0/24-198.18.255.0/24 that no interface here has an address in, searched
    from ``start``: two virtual-pod sets on one machine (parallel runs) must not share a subnet,
    or the root namespace would route one set's traffic to the other's bridge."""
    done = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False)
    used = {int(m) for m in re.findall(r"inet 198\.18\.(\d+)\.", done.stdout)}
    for offset in range(256):
        subnet = (start + offset) % 256
        if subnet not in used:
            return subnet
    raise VirtualPodsError("every 198.18.X.0/24 subnet is in use on this machine")


_AGENT = """#!/bin/sh
# rsh agent for mpirun: "{agent} [ssh options] HOST COMMAND..." runs COMMAND in HOST's network
# namespace, under the pod's own hostname, with an empty environment, like sshd would.
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host="$1"; shift
case "$host" in
{cases}
  *) echo "rsh agent: unknown host $host" >&2; exit 255;;
esac
exec ip netns exec "$ns" unshare --uts /bin/sh -c \
  'hostname "$1" && exec env -i PATH="$3" HOME="$4" /bin/sh -c "$2"' agent "$ns" "$*" {path} {home}
"""


@dataclass
class VirtualPods:
    """``count`` namespaces with one address each; a context manager that always cleans up."""

    count: int
    slots: int = 2
    tag: str = field(default_factory=lambda: f"{secrets.randbelow(100000):05d}")  # unique names per instance
    addresses: list[str] = field(default_factory=list)
    launcher_address: str = ""
    hostfile: Path | None = None
    agent: Path | None = None
    _namespaces: list[str] = field(default_factory=list)
    _bridge: str = ""
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 250:
            raise ValueError("count must be between 1 and 250")

    def __enter__(self) -> VirtualPods:
        reason = virtual_pods_unavailable()
        if reason:
            raise VirtualPodsError(reason)
        subnet = _free_subnet(int(self.tag))
        self._bridge = f"mpgb{self.tag}"
        self.launcher_address = f"198.18.{subnet}.1"
        try:
            _ip("link", "add", self._bridge, "type", "bridge")
            _ip("addr", "add", f"{self.launcher_address}/24", "dev", self._bridge)
            _ip("link", "set", self._bridge, "up")
            for i in range(1, self.count + 1):
                ns, veth, address = f"mpg{self.tag}-{i}", f"mpgv{self.tag}x{i}", f"198.18.{subnet}.{i + 1}"
                _ip("netns", "add", ns)
                self._namespaces.append(ns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", veth, "master", self._bridge, "up")
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self.addresses.append(address)
            self._write_files()
        except BaseException:
            self.close()
            raise
        log.info(
            "virtual pods %s on bridge %s",
            dict(zip(self.addresses, self._namespaces, strict=True)),
            self._bridge,
        )
        return self

    def _write_files(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="mpigate-pods-")
        root = Path(self._tmp.name)
        cases = "\n".join(
            f"  {address}) ns={shlex.quote(ns)};;"
            for address, ns in zip(self.addresses, self._namespaces, strict=True)
        )
        self.agent = root / "rsh-agent"
        self.agent.write_text(
            _AGENT.format(
                agent=self.agent,
                cases=cases,
                path=shlex.quote(os.environ.get("PATH", "/usr/bin:/bin")),
                home=shlex.quote(os.environ.get("HOME", "/")),
            )
        )
        self.agent.chmod(0o755)
        self.hostfile = root / "hostfile"
        self.hostfile.write_text("".join(f"{a} slots={self.slots}\n" for a in self.addresses))
        # Hydra's host file format (mpich src/pm/hydra: "host:procs").
        (root / "hydra-hosts").write_text("".join(f"{a}:{self.slots}\n" for a in self.addresses))

    def mpirun_args(self, implementation: str = "OpenMPI") -> list[str]:
        """Options that make the launcher place ranks in the pods (via the agent)."""
        if self.hostfile is None or self.agent is None:
            raise VirtualPodsError("virtual pods are not set up")
        if implementation != "OpenMPI":
            # Hydra: MPICH's -launcher/-launcher-exec, Intel MPI's -bootstrap/-bootstrap-exec (MPICH
            # accepts these as synonyms too); -iface: the proxies in the pods dial mpiexec at the
            # bridge's address (the launcher pod's eth0), not at what its hostname resolves to.
            word = "bootstrap" if implementation == "Intel" else "launcher"
            return [
                "-f",
                str(self.hostfile.parent / "hydra-hosts"),
                f"-{word}",
                "ssh",
                f"-{word}-exec",
                str(self.agent),
                "-iface",
                self._bridge,
            ]
        # rtc_hwloc_vmhole=none: OpenMPI 4's orted otherwise maps the hwloc topology into shared
        # memory at a "hole" it reads from /proc/self/maps; with several orteds starting at once
        # on one host that write sometimes lands on a live mapping and the orted segfaults in
        # hwloc_shmem_topology_write (seen about 1 run in 12 here). The shared topology only saves
        # memory on big nodes; the daemons work without it.
        return [
            "--hostfile",
            str(self.hostfile),
            "--mca",
            "plm_rsh_agent",
            str(self.agent),
            "--mca",
            "rtc_hwloc_vmhole",
            "none",
        ]

    def close(self) -> None:
        for ns in reversed(self._namespaces):
            try:
                _ip("netns", "del", ns)  # also removes the veth pair
            except VirtualPodsError as exc:
                log.warning("cleanup: %s", exc)
        self._namespaces.clear()
        if self._bridge:
            try:
                _ip("link", "del", self._bridge)
            except VirtualPodsError as exc:
                log.warning("cleanup: %s", exc)
            self._bridge = ""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
