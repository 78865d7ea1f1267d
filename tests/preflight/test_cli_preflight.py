"""``mpigate preflight`` through click's runner and, for the MPI modes, real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from mpigate.cli import cli
from mpigate.config import Config
from mpigate.preflight import build_smoke_trainjob, launch_environment
from tests.conftest import REPO


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_trainjob_yaml_is_the_builders_job(runner: CliRunner, example_org: Config) -> None:
    result = runner.invoke(cli, ["preflight", "--trainjob", "--team", "research-team", "--config", str(REPO)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output) == build_smoke_trainjob(example_org, "research-team")


def test_trainjob_json_with_options(runner: CliRunner) -> None:
    result = runner.invoke(
        cli,
        ["preflight", "--trainjob", "--team", "cv-team", "--config", str(REPO), "--nodes", "3", "-o", "json",
         "--image", "registry.acme.internal/cv/preflight:2", "--name", "cv-smoke"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    job = json.loads(result.output)
    assert (job["metadata"]["name"], job["spec"]["trainer"]["numNodes"]) == ("cv-smoke", 3)
    assert job["spec"]["trainer"]["image"] == "registry.acme.internal/cv/preflight:2"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--local", "--trainjob"], "--local and --trainjob exclude each other"),
        (["--trainjob"], "--trainjob needs --team NAME"),
        (["--trainjob", "--team", "ghost"], "unknown team 'ghost'"),
        (["--local", "--profile", "open"], "no network profile 'open' (profiles: isolated, pinned-ports)"),
        (["--sizes", "8,x"], "comma-separated byte counts"),
    ],
)
def test_usage_errors_exit_2(runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(cli, ["preflight", "--config", str(REPO), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_broken_config_exits_2(runner: CliRunner, tmp_path: os.PathLike[str]) -> None:
    result = runner.invoke(cli, ["preflight", "--trainjob", "--team", "x", "--config", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path}: not an mpigate config tree" in result.output
    assert "pass one with --config PATH" in result.output


@pytest.mark.mpi
@pytest.mark.usefixtures("openmpi")
def test_local_json_reports_ranks_and_ports(runner: CliRunner) -> None:
    """--port-base auto: the example org's ranges moved to a free window (its 40000s may be in use
    by a demo or another run on this machine)."""
    result = runner.invoke(
        cli,
        ["preflight", "--local", "-np", "2", "--config", str(REPO), "--sizes", "8,65536", "--iterations", "3",
         "--hold", "0.3", "--port-base", "auto", "-o", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ok"] is True
    btl = int(data["environment"]["OMPI_MCA_btl_tcp_port_min_v4"])
    assert data["environment"]["OMPI_MCA_btl_tcp_port_range_v4"] == "100"  # the profile's size
    assert data["environment"]["OMPI_MCA_oob_tcp_static_ipv4_ports"] == f"{btl + 200}-{btl + 210}"
    assert data["environment"]["OMPI_MCA_btl"] == "self,tcp"
    assert data["preflight"]["verdict"] == "PASS" and data["preflight"]["size"] == 2
    assert data["ports"]["ok"] is True
    assert data["ports"]["usedPorts"]["oob"] == [btl + 200]
    assert data["ports"]["usedPorts"]["btl"] and all(
        btl <= p <= btl + 99 for p in data["ports"]["usedPorts"]["btl"]
    )


@pytest.mark.mpi
@pytest.mark.usefixtures("openmpi")
def test_module_entry_point_runs_as_a_singleton() -> None:
    """Without mpirun, MPI starts one rank: point-to-point checks are skipped, the run passes."""
    env, _ = launch_environment(None, transport="tcp")
    done = subprocess.run(
        [sys.executable, "-m", "mpigate.preflight", "-o", "json", "--sizes", "8"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["verdict"], data["size"]) == ("PASS", 1)
    statuses = {c["name"]: c["status"] for c in data["ranks"][0]["checks"]}
    assert statuses == {"allreduce": "pass", "ring": "skip", "pingpong": "skip", "ports": "skip"}


@pytest.mark.mpi
@pytest.mark.usefixtures("openmpi")
def test_a_rank_imports_no_config_loader() -> None:
    """Every rank of every preflight runs ``python -m mpigate.preflight`` and none loads a config
    tree: the loader with its schemas and the CEL environment (0.2 s of CPU per rank) stay out."""
    env, _ = launch_environment(None, transport="tcp")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mpigate.preflight", "-o", "json", "--sizes", "8"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"] == "PASS"
    imported = {
        line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    assert "mpi4py.MPI" in imported and "mpigate.preflight.checks" in imported  # the rank's own
    heavy = {"mpigate.config.loader", "mpigate.config.crossfile", "mpigate.cel", "jsonschema"}
    assert imported & heavy == set()
