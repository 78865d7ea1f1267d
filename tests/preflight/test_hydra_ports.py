"""MPICH and Intel MPI under their own Hydra ``mpiexec``, every TCP socket of the launcher, the
proxies and the ranks observed while the preflight runs.

The proof behind the MPICH and Intel MPI rows of docs/networking.md, with three installations
(``hydra_mpi`` fixture): Debian's ``mpich`` 4.0.2 (ch4:ucx, /usr/bin/mpiexec.hydra), PyPI's
``mpich`` 5.0.2 wheel (ch4:ucx and ofi) and PyPI's ``impi-rt`` 2021 wheel (Intel MPI over
libfabric), each with ``NetworkProfile.pinned_env`` for its implementation — the pairs the webhook
injects. Without them every one of them listens outside the ranges (so the first test can fail).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mpigate.cli import cli
from mpigate.config.model import NetworkProfile
from mpigate.preflight import LocalRun, PreflightSettings, run_local
from mpigate.preflight.launch import PORT_RACE
from tests.conftest import REPO

from .conftest import MpiInstall
from .test_mpi_ports import _describe

pytestmark = pytest.mark.mpi

SETTINGS = PreflightSettings(sizes=(8, 65536, 1 << 20), iterations=5, hold=0.5)
LIBRARY = {"MPICH": "MPICH Version:", "Intel": "Intel(R) MPI Library"}


def _run(
    install: MpiInstall,
    profile: NetworkProfile | None,
    pinned: NetworkProfile,
    *,
    extra_env: tuple[tuple[str, str], ...] = (),
    pods: int = 0,
) -> LocalRun:
    """One launch; relaunched (at most twice) only when MPI_Init lost libfabric's port race — two
    ranks of one pod bound the same port of the data range and the second could not listen
    (``mpigate.preflight.launch.PORT_RACE``: libfabric's behaviour, not what these tests judge; it
    failed a landing once at load ~5). Any other failure is returned at once."""
    for _ in range(3):
        run = run_local(
            4,
            profile,
            judge=pinned,
            settings=SETTINGS,
            timeout=120,
            python=install.python,
            mpirun=install.mpirun,
            implementation=install.implementation,
            extra_env=(*install.env.items(), *extra_env),
            pods=pods,
        )
        if PORT_RACE not in run.problems:
            break
    return run


def _assert_ran(run: LocalRun, install: MpiInstall, *, ports: str) -> None:
    """Every check passed on 4 ranks of ``install``'s library; the ranks' own ports check said
    ``ports`` (pass when pinned, skip when not)."""
    assert run.returncode == 0, _describe(run)
    assert run.report is not None and run.report.size == 4
    assert run.report.library.startswith(LIBRARY[install.implementation]), run.report.library
    statuses = {(c.name, c.status) for r in run.report.ranks for c in r.checks}
    assert statuses == {("allreduce", "pass"), ("ring", "pass"), ("pingpong", "pass"), ("ports", ports)}, (
        _describe(run)
    )
    assert "mpiexec.hydra" in set(run.processes.values())


def _btl(pinned: NetworkProfile) -> tuple[int, int]:
    return pinned.btl_port_min, pinned.btl_port_min + pinned.btl_port_range - 1


def test_pinned_env_confines_every_port(hydra_mpi: MpiInstall, pinned: NetworkProfile) -> None:
    run = _run(hydra_mpi, pinned, pinned)

    _assert_ran(run, hydra_mpi, ports="pass")
    conf = run.confinement
    assert conf is not None
    assert conf.ok, _describe(run)
    assert run.samples >= 5
    low, high = _btl(pinned)
    listeners = conf.select("listener", "network")
    # Every rank listens on the network inside the data (BTL) range (UCX or libfabric's tcp).
    rank_pids = {r.pid for r in run.report.ranks}  # type: ignore[union-attr]
    data = {v.socket.pid for v in listeners if v.socket.pid in rank_pids and v.range == "btl"}
    assert data == rank_pids, _describe(run)
    # Hydra's own sockets: MPICH's mpiexec reads MPIR_CVAR_CH3_PORT_RANGE first (the data range);
    # Intel MPI's mpiexec.hydra and hydra_pmi_proxy read I_MPI_PORT_RANGE (the daemon range). Every
    # one the watcher saw is in its implementation's range. Whether it sees one at all is sampling
    # luck (Hydra's control listener may be open only while the proxies connect; on a loaded machine
    # the first sample can come later: seen missed in 2 of ~20 runs), so seeing none is not a
    # failure; test_pinned_env_across_virtual_pods proves the control port through the proxies'
    # connections, which last the whole run.
    expected = "btl" if hydra_mpi.implementation == "MPICH" else "oob"
    hydra = {
        (v.socket.process, v.range)
        for v in listeners
        if v.socket.process in ("mpiexec.hydra", "hydra_pmi_proxy")
    }
    assert {rng for _, rng in hydra} <= {expected}, _describe(run)
    # The ranks really talked TCP over the network address, to data ports, IPv4.
    connections = [v for v in conf.select("connection", "network") if v.socket.pid in rank_pids]
    assert len(connections) >= 6, _describe(run)
    assert {v.range for v in connections} == {"btl"}
    assert all(v.port is not None and low <= v.port <= high for v in connections)
    assert {v.socket.family for v in connections} == {"ipv4"}


@pytest.mark.slow
def test_without_env_hydra_uses_ports_outside_the_ranges(
    hydra_mpi: MpiInstall, pinned: NetworkProfile
) -> None:
    run = _run(hydra_mpi, None, pinned)

    _assert_ran(run, hydra_mpi, ports="skip")
    conf = run.confinement
    assert conf is not None
    assert not conf.ok
    rank_pids = {r.pid for r in run.report.ranks}  # type: ignore[union-attr]
    outside = {v.socket.pid for v in conf.violations if v.kind == "listener"}
    assert rank_pids <= outside, _describe(run)  # every rank's data listener is unpinned
    assert any(v.kind == "connection" for v in conf.violations)


# MPICH's ch4 netmods each read their own variable: UCX_TCP_PORT_RANGE (ucx), FI_TCP_PORT_* (ofi's
# tcp provider). Each run sets Hydra's variable and ONE netmod's: the netmod it pins stays inside,
# the other one does not — so every pair of the MPICH environment does work of its own.
HYDRA_ONLY = "MPIR_CVAR_CH3_PORT_RANGE"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("netmod", "extra"), [("ucx", ()), ("ofi", (("MPIR_CVAR_CH4_NETMOD", "ofi"), ("FI_PROVIDER", "tcp")))]
)
def test_each_mpich_netmod_is_pinned_by_its_own_variables(
    mpich_wheel: MpiInstall, pinned: NetworkProfile, netmod: str, extra: tuple[tuple[str, str], ...]
) -> None:
    env = dict(pinned.pinned_env("MPICH"))
    own = ("UCX_TCP_PORT_RANGE",) if netmod == "ucx" else ("FI_TCP_PORT_LOW_RANGE", "FI_TCP_PORT_HIGH_RANGE")
    other = (
        ("FI_TCP_PORT_LOW_RANGE", "FI_TCP_PORT_HIGH_RANGE") if netmod == "ucx" else ("UCX_TCP_PORT_RANGE",)
    )

    pinned_run = _run(
        mpich_wheel, None, pinned, extra_env=(*extra, *((n, env[n]) for n in (HYDRA_ONLY, *own)))
    )
    other_run = _run(
        mpich_wheel, None, pinned, extra_env=(*extra, *((n, env[n]) for n in (HYDRA_ONLY, *other)))
    )

    assert pinned_run.confinement is not None and other_run.confinement is not None
    _assert_ran(pinned_run, mpich_wheel, ports="pass")
    assert pinned_run.confinement.ok, _describe(pinned_run)
    assert other_run.returncode == 1, _describe(other_run)  # the ranks' own ports check fails
    rank_pids = {r.pid for r in other_run.report.ranks}  # type: ignore[union-attr]
    outside = {v.socket.pid for v in other_run.confinement.violations if v.kind == "listener"}
    assert outside == rank_pids, _describe(other_run)  # only the ranks' data listeners


@pytest.mark.slow
@pytest.mark.usefixtures("netns")
def test_pinned_env_across_virtual_pods(hydra_mpi: MpiInstall, pinned: NetworkProfile) -> None:
    """mpiexec in the root namespace, a Hydra proxy and 2 ranks in each of 2 namespaces reached
    through the ssh-like agent with an EMPTY environment (MPICH -launcher ssh -launcher-exec,
    Intel MPI -bootstrap ssh -bootstrap-exec): Hydra forwards the pinning to the proxies and ranks."""
    run = _run(hydra_mpi, pinned, pinned, pods=2)

    _assert_ran(run, hydra_mpi, ports="pass")
    assert run.report is not None and run.confinement is not None
    conf = run.confinement
    assert conf.ok, _describe(run)
    hosts = [r.host for r in run.report.ranks]
    assert sorted(hosts.count(h) for h in set(hosts)) == [2, 2], hosts
    connections = conf.select("connection", "network")
    # Each pod's proxy dialled mpiexec's control port in the launcher's namespace, inside a range:
    # MPICH's in the data range (MPIR_CVAR_CH3_PORT_RANGE), Intel MPI's in the daemon range.
    launcher = [
        v
        for v in connections
        if v.socket.remote_address not in run.pods and v.socket.local_address in run.pods
    ]
    assert {v.socket.local_address for v in launcher} == set(run.pods), _describe(run)
    assert {v.range for v in launcher} == {"btl" if hydra_mpi.implementation == "MPICH" else "oob"}
    # Ranks in different pods talked across the bridge, to data ports.
    cross = [
        v
        for v in connections
        if v.socket.local_address in run.pods
        and v.socket.remote_address in run.pods
        and v.socket.local_address != v.socket.remote_address
    ]
    assert cross, _describe(run)
    assert {v.range for v in cross} == {"btl"}


def test_cli_runs_intel_mpi_under_its_own_mpiexec(impi_wheel: MpiInstall) -> None:
    """``mpigate preflight --local --mpi Intel --mpirun ... --python ...`` on a free window."""
    result = CliRunner().invoke(
        cli,
        ["preflight", "--local", "-np", "2", "--config", str(REPO), "--sizes", "8,65536", "--iterations", "3",
         "--hold", "0.3", "--port-base", "auto", "--mpi", "intel", "--mpirun", impi_wheel.mpirun,
         "--python", impi_wheel.python, "-o", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ok"] is True and data["command"][0] == impi_wheel.mpirun
    low, high = data["environment"]["I_MPI_PORT_RANGE"].split(":")
    assert data["environment"]["FI_TCP_PORT_HIGH_RANGE"] == str(int(low) - 101)  # the profile's layout
    assert not any(name.startswith("OMPI_") for name in data["environment"])
    assert data["ports"]["usedPorts"]["btl"] and data["ports"]["ok"] is True
    assert all(int(low) <= p <= int(high) for p in data["ports"]["usedPorts"]["oob"])


@pytest.mark.usefixtures("openmpi")
def test_cli_refuses_a_python_whose_mpi_is_another() -> None:
    """This venv's mpi4py loads Debian's Open MPI: asked for MPICH, preflight says so (exit 2)."""
    result = CliRunner().invoke(
        cli, ["preflight", "--local", "--mpi", "MPICH", "--config", str(REPO), "--port-base", "auto"]
    )
    assert result.exit_code == 2, result.output
    assert "mpi4py loads Open MPI v4.1" in result.output and result.output.rstrip().endswith("not MPICH")
