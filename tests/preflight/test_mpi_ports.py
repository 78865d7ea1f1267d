"""Real OpenMPI under mpirun, every TCP socket of mpirun/orted/ranks observed while it runs.

These tests are the proof behind the ``pinned-ports`` profile (docs/networking.md): with
``NetworkProfile.openmpi_env`` every network-reachable listener and every connection's server port
lies in the pinned ranges; without it, OpenMPI uses ports outside them (so the first test can fail).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

import pytest

from mpigate.config.model import NetworkProfile
from mpigate.preflight import LocalRun, PreflightSettings, run_local

from .processes import still_running

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("openmpi")]

# Long enough for ~25 samples at 20 ms while every connection is open; short enough for CI.
SETTINGS = PreflightSettings(sizes=(8, 65536, 1 << 20), iterations=5, hold=0.5)


# What docs/CONFIG.md first proposed: IPv4 pinned, IPv6 "disabled" (oob_tcp_disable_family does
# not even exist). Kept to show why the IPv6 ports must be pinned as well.
def first_proposal(profile: NetworkProfile) -> tuple[tuple[str, str], ...]:
    return (
        ("OMPI_MCA_btl_tcp_port_min_v4", str(profile.btl_port_min)),
        ("OMPI_MCA_btl_tcp_port_range_v4", str(profile.btl_port_range)),
        ("OMPI_MCA_oob_tcp_static_ipv4_ports", f"{profile.oob_port_min}-{profile.oob_port_max}"),
        ("OMPI_MCA_btl_tcp_disable_family", "6"),
        ("OMPI_MCA_oob_tcp_disable_family", "IPv6"),
    )


def _describe(run: LocalRun) -> str:
    assert run.confinement is not None
    lines = [v.socket.describe() + f"  [{v.reason}]" for v in run.confinement.verdicts]
    # A rank's own error comes first in stderr, mpirun's summary of the failure last: keep both.
    stderr = run.stderr if len(run.stderr) <= 6000 else f"{run.stderr[:3000]}\n[...]\n{run.stderr[-3000:]}"
    return "\n".join([*run.problems, f"stdout: {run.stdout[-2000:]}", stderr, *lines])


def _assert_preflight_passed(run: LocalRun, ranks: int) -> None:
    assert run.returncode == 0, _describe(run)
    assert run.report is not None
    assert run.report.size == ranks
    assert [r.rank for r in run.report.ranks] == list(range(ranks))
    for rank in run.report.ranks:
        statuses = {c.name: c.status for c in rank.checks}
        assert statuses == {"allreduce": "pass", "ring": "pass", "pingpong": "pass", "ports": "pass"}, rank
    # each rank reported its own sockets at the barrier, with its connections to other ranks open
    for rank in run.report.ranks:
        assert any(s.state == "ESTABLISHED" and not s.loopback_only for s in rank.sockets), rank
    # rank 0 measured every peer at every size
    measured = sorted((p.peer, p.size) for r in run.report.ranks for p in r.pingpong)
    assert measured == sorted((peer, size) for peer in range(1, ranks) for size in SETTINGS.sizes)


def test_pinned_env_confines_every_port(pinned: NetworkProfile) -> None:
    run = run_local(4, pinned, settings=SETTINGS, timeout=60)

    _assert_preflight_passed(run, 4)
    conf = run.confinement
    assert conf is not None
    assert conf.ok, _describe(run)
    assert run.samples >= 5
    btl_low, btl_high = pinned.btl_port_min, pinned.btl_port_min + pinned.btl_port_range - 1

    network_listeners = conf.select("listener", "network")
    rank_listeners = [v.socket for v in network_listeners if v.socket.process != "mpirun"]
    # Every rank holds an IPv4 and an IPv6 BTL listener, all inside the BTL range.
    assert {(s.pid, s.family) for s in rank_listeners} == {
        (r.pid, fam)
        for r in run.report.ranks
        for fam in ("ipv4", "ipv6")  # type: ignore[union-attr]
    }
    assert all(btl_low <= s.local_port <= btl_high for s in rank_listeners), _describe(run)
    # mpirun's OOB listens on the first static port only; its IPv6 twin collides with it and is gone.
    # (Sets: a sample can also catch mpirun's fork child, not yet exec'd, holding the same socket.)
    mpirun_listeners = [v.socket for v in network_listeners if v.socket.process == "mpirun"]
    assert {(s.family, s.local_port) for s in mpirun_listeners} == {("ipv4", pinned.oob_port_min)}
    assert not [v for v in network_listeners if v.socket.family == "ipv6" and v.range is None]

    # The ranks really talked TCP over the network address: every connection's server end is a
    # BTL port; no IPv6 connection at all.
    connections = conf.select("connection", "network")
    assert len(connections) >= 6, _describe(run)  # ring + ping-pong pairs, both ends each
    assert {v.range for v in connections} == {"btl"}
    assert all(v.port is not None and btl_low <= v.port <= btl_high for v in connections)
    assert all(v.socket.family == "ipv4" for v in connections)

    # Loopback only: mpirun's PMIx server and the ranks' connections to it.
    loopback = conf.select(scope="loopback")
    pmix_servers = [v.socket for v in loopback if v.kind == "listener"]
    assert {s.process for s in pmix_servers} == {"mpirun"}
    assert all(ipaddress.ip_address(s.local_address).is_loopback for s in pmix_servers)
    assert {v.socket.remote_port for v in loopback if v.socket.process != "mpirun"} == {
        pmix_servers[0].local_port
    }


@pytest.mark.slow
def test_without_env_openmpi_uses_ports_outside_the_ranges(pinned: NetworkProfile) -> None:
    run = run_local(4, None, judge=pinned, settings=SETTINGS, timeout=60)

    _assert_preflight_passed_except_ports(run)
    conf = run.confinement
    assert conf is not None
    assert not conf.ok
    outside = conf.violations
    processes = {v.socket.process for v in outside}
    assert processes == {"mpirun", "python"}, _describe(run)  # OOB and BTL both unpinned
    assert {v.socket.family for v in outside if v.kind == "listener"} == {"ipv4", "ipv6"}
    assert any(v.kind == "connection" for v in outside)


def _assert_preflight_passed_except_ports(run: LocalRun) -> None:
    assert run.returncode == 0, _describe(run)
    assert run.report is not None and run.report.ok
    # Unpinned, the ranks' own ports check has nothing to judge.
    assert {c.status for r in run.report.ranks for c in r.checks if c.name == "ports"} == {"skip"}


@pytest.mark.slow
def test_ipv4_only_pinning_leaves_ipv6_listeners_open(pinned: NetworkProfile) -> None:
    run = run_local(4, None, judge=pinned, settings=SETTINGS, timeout=60, extra_env=first_proposal(pinned))

    # Each rank's own ports check already sees its IPv6 listener outside the range and fails.
    assert run.returncode == 1, _describe(run)
    assert run.report is not None
    assert [(rank, c.name) for rank, c in run.report.failures] == [(r, "ports") for r in range(4)]
    btl = f"{pinned.btl_port_min}-{pinned.btl_port_min + pinned.btl_port_range - 1}"
    assert all(f"listening outside BTL {btl}" in c.detail for _, c in run.report.failures)
    conf = run.confinement
    assert conf is not None
    outside = conf.violations
    assert outside, _describe(run)
    # Everything left outside is an IPv6 listener; the IPv4 side is pinned.
    assert {(v.kind, v.socket.family) for v in outside} == {("listener", "ipv6")}
    assert {v.socket.process for v in outside} == {"mpirun", "python"}


@pytest.mark.slow
@pytest.mark.usefixtures("netns")
def test_pinned_env_across_virtual_pods(pinned: NetworkProfile) -> None:
    """mpirun in the root namespace, orted + 2 ranks in each of 2 namespaces reached via an
    ssh-like agent with an EMPTY environment: OpenMPI forwards the pinning itself."""
    run = run_local(4, pinned, settings=SETTINGS, pods=2, timeout=60)

    # the daemons skip hwloc's shared-memory topology (it segfaulted orted about 1 run in 12)
    assert "--mca rtc_hwloc_vmhole none" in " ".join(run.argv)
    _assert_preflight_passed(run, 4)
    conf = run.confinement
    assert conf is not None
    assert conf.ok, _describe(run)
    assert_pods_wired_through_pinned_ports(run, pinned, daemon="orted")


def assert_pods_wired_through_pinned_ports(run: LocalRun, pinned: NetworkProfile, *, daemon: str) -> None:
    """Two virtual pods, two ranks each: every ``daemon`` dialled the launcher's first OOB port
    from its own pod and listens there, and ranks in different pods talked to BTL ports."""
    assert run.report is not None and run.confinement is not None
    conf = run.confinement
    assert len(run.pods) == 2
    # Each pod has its own hostname (UTS namespace), two ranks in each, as in real pods.
    hosts = [r.host for r in run.report.ranks]
    assert sorted(hosts.count(h) for h in set(hosts)) == [2, 2], hosts

    connections = conf.select("connection", "network")
    # Every daemon dialled the launcher's OOB port from its own pod.
    oob = [v for v in connections if v.socket.process == daemon]
    dialled_launcher = {
        v.socket.local_address
        for v in oob
        if v.socket.remote_address not in run.pods and v.socket.remote_port == pinned.oob_port_min
    }
    assert dialled_launcher == set(run.pods), _describe(run)
    # Any other daemon traffic (a daemon may also wire up to its peer) is OOB too.
    assert {v.range for v in oob} == {"oob"}, _describe(run)
    listeners = [v.socket for v in conf.select("listener", "network") if v.socket.process == daemon]
    # Both daemons listen on the first OOB port, IPv4 only. (A sample can also catch a daemon's
    # short-lived fork child holding the same socket: at least one listener per daemon.)
    assert {(s.family, s.local_port) for s in listeners} == {("ipv4", pinned.oob_port_min)}
    assert len({s.pid for s in listeners}) >= 2
    # Ranks in different pods talked across the bridge, to BTL ports.
    cross = [
        v
        for v in connections
        if v.socket.process == "python" and v.socket.local_address != v.socket.remote_address
    ]
    assert cross, _describe(run)
    assert {v.range for v in cross} == {"btl"}


def test_failed_check_fails_the_run(pinned: NetworkProfile) -> None:
    impossible = PreflightSettings(sizes=(8, 1 << 20), iterations=2, min_bandwidth_mbs=1e12)
    run = run_local(2, pinned, settings=impossible, timeout=60)

    assert run.returncode == 1  # every rank exits with the broadcast verdict
    assert run.report is not None
    assert run.report.verdict == "FAIL"
    [(rank, check)] = run.report.failures
    assert (rank, check.name) == (1, "pingpong")
    assert "bandwidth" in check.detail and "< 1e+12 MB/s" in check.detail
    assert not run.ok


def test_a_hung_job_is_killed_with_all_its_processes(pinned: NetworkProfile) -> None:
    # The ranks hold for 10 minutes; killed while they run, the whole tree must go, ranks included
    # (ORTE puts them in process groups of their own). The caller's timeout starts short and
    # doubles until a run is killed with both ranks up: 2 s do on an idle machine, a loaded one
    # takes longer to start them (the test held the MPI lock for a fixed 15 s).
    stuck = PreflightSettings(sizes=(8,), iterations=1, hold=600)
    for timeout in (2.0, 4.0, 8.0, 16.0, 32.0):
        run = run_local(2, pinned, settings=stuck, timeout=timeout)
        assert run.timed_out and not run.ok
        assert run.problems[0] == f"mpirun did not finish within {timeout:g} s and was killed"
        _assert_gone(run.processes)  # whatever had started when the timeout struck
        if list(run.processes.values()).count("python") == 2:
            break
    else:
        pytest.fail("the two ranks had not both started when mpirun was killed after 32 s")
    assert "mpirun" in run.processes.values()


def _assert_gone(processes: Mapping[int, str]) -> None:
    # SIGKILL takes effect at once. (Open MPI 4's ranks also end soon after mpirun alone is killed:
    # their lifeline to it breaks. This test passes with mpirun alone killed too: test_kill_tree.py
    # checks descendants that outlive mpirun.)
    alive = still_running(processes)
    assert alive == [], {pid: processes[pid] for pid in alive}
