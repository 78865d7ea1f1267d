"""mpigate render through the CLI: summary, exit codes and clean errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from mpigate.cli import cli
from tests.conftest import FIXTURES, REPO


def test_render_writes_the_tree_and_summarises_it(tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    result = CliRunner().invoke(cli, ["render", str(REPO), "-o", str(out), "--today", "2026-11-22"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert (
        lines[0].startswith("rendered revision ")
        and "90 objects, 37 files (37 written, 0 unchanged, 0 removed)" in lines[0]
    )
    assert (
        lines[1]
        == "  cluster: 3 ClusterQueue, 8 ClusterRole, 1 Cohort, 4 ResourceFlavor, 3 WorkloadPriorityClass"
    )
    assert (
        "  teams/research-team: 2 ClusterRoleBinding, 1 LimitRange, 1 LocalQueue, 1 Namespace, "
        "6 NetworkPolicy, 1 PrometheusRule, 1 ResourceQuota, 2 RoleBinding, 1 ServiceAccount" in lines
    )
    assert (out / "teams" / "nlp-team" / "quota.yaml").is_file()

    again = CliRunner().invoke(cli, ["render", str(REPO), "-o", str(out), "--summary", "json"])
    data = json.loads(again.output)
    assert data["written"] == [] and data["unchanged"] == 37 and data["objects"] == 90
    assert data["kinds"]["mpigate"] == {"ConfigMap": 2, "PrometheusRule": 1}


def test_render_a_broken_config_exits_2_with_the_problems(tmp_path: Path) -> None:
    tree = tmp_path / "org"
    shutil.copytree(REPO / "policies", tree / "policies")
    result = CliRunner().invoke(cli, ["render", str(tree), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "GPUFlavors" in result.output and "run `mpigate check" in result.output
    assert not (tmp_path / "out").exists()


def test_render_outside_a_config_tree_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(cli, ["render", str(empty), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.stderr == (
        f"{empty}: not an mpigate config tree (it holds no OrgPolicy document). Run this inside your "
        "config tree or pass its path (`mpigate render PATH`); `mpigate init PATH` creates a new one.\n"
    )
    assert not (tmp_path / "out").exists()


def test_render_a_bad_template_exits_2_with_file_and_line(tmp_path: Path) -> None:
    bad = FIXTURES / "render" / "bad-templates" / "undefined"
    result = CliRunner().invoke(
        cli, ["render", str(REPO), "-o", str(tmp_path / "out"), "--templates", str(bad)]
    )
    assert result.exit_code == 2
    assert (
        "undefined/team/queues.yaml.j2:10: undefined value: 'dict object' has no attribute 'queue_names'"
        in result.output
    )
    assert "(rendering team cv-team, team nlp-team, team research-team)" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_render_refuses_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me\n")
    result = CliRunner().invoke(cli, ["render", str(REPO), "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert "refusing to replace the content of a non-empty directory" in result.output
    assert (tmp_path / "notes.txt").read_text() == "keep me\n"


def test_render_missing_path_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["render", str(tmp_path / "nope"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "does not exist" in result.output
