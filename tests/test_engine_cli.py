"""``mpigate explain`` and ``mpigate test`` through click's runner."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mpigate.cli import cli
from tests.conftest import FIXTURES, REPO

EX = REPO / "examples" / "trainjobs"
NOW = ["--now", "2026-11-22T12:00:00Z"]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def explain(runner: CliRunner, *args: str) -> tuple[int, str]:
    result = runner.invoke(cli, ["explain", "--config", str(REPO), *NOW, *args])
    return result.exit_code, result.output


def test_explain_denied_prints_rule_path_and_fix(runner: CliRunner) -> None:
    code, out = explain(runner, str(EX / "deny-over-quota.yaml"))
    assert code == 1
    assert "TrainJob nlp-team/llm-pretrain-huge" in out and "DENIED" in out
    assert "[MPG-Q001] (enforce) spec.trainer" in out
    assert (
        "fix: Set spec.trainer.numNodes to 2 or fewer, or ask #nlp-admins to raise quotas/nlp-team.yaml."
        in out
    )
    assert (
        "demand: 4 pods (node 3 × 8 nvidia.com/gpu, launcher 1 × 8 nvidia.com/gpu), 32 nvidia.com/gpu" in out
    )


def test_explain_allowed_shows_patch_and_mutated_object(runner: CliRunner) -> None:
    code, out = explain(runner, str(EX / "minimal.yaml"))
    assert code == 0 and "ALLOWED" in out
    assert "patch (JSONPatch):" in out and "path: /metadata/labels/kueue.x-k8s.io~1queue-name" in out
    assert "mutated object:" in out and "mpigate.io/team: nlp-team" in out


def test_explain_json_many_files_and_documents(runner: CliRunner, tmp_path: Path) -> None:
    multi = tmp_path / "two.yaml"
    multi.write_text(
        (EX / "minimal.yaml").read_text(encoding="utf-8")
        + "\n---\n"
        + (REPO / "examples" / "runtimes" / "deny-root-runtime.yaml").read_text(encoding="utf-8")
        + "\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
        encoding="utf-8",
    )
    code, out = explain(runner, str(multi), str(EX / "warn-latest-tag.yaml"), "-o", "json")
    assert code == 1
    data = json.loads(out[out.index("[") :])
    assert [(d["decision"]["kind"], d["decision"]["decision"]) for d in data] == [
        ("TrainJob", "allowed"),
        ("ClusterTrainingRuntime", "denied"),
        ("TrainJob", "allowed-with-warnings"),
    ]
    assert data[0]["mutated"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "nlp-team"
    assert "skipped ConfigMap" in out


def test_explain_update_delete_and_live(runner: CliRunner, tmp_path: Path) -> None:
    old = yaml.safe_load((EX / "minimal.yaml").read_text(encoding="utf-8"))
    new = json.loads(json.dumps(old))
    new["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "cv-team"
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old), encoding="utf-8")
    (tmp_path / "new.yaml").write_text(yaml.safe_dump(new), encoding="utf-8")
    code, out = explain(
        runner, str(tmp_path / "new.yaml"), "--operation", "UPDATE", "--old", str(tmp_path / "old.yaml")
    )
    assert code == 1 and "[MPG-LIFE-003]" in out
    code, out = explain(
        runner, str(EX / "minimal.yaml"), "--operation", "DELETE", "--user", "lena", "-o", "yaml"
    )
    data = yaml.safe_load(out)
    assert (
        code == 0
        and data[0]["decision"]["violations"][0]["message"] == "DELETE of TrainJob nlp-team/minimal by lena."
    )
    code, out = explain(
        runner, str(EX / "queue-full.yaml"), "--active-jobs", "5", "--gpus-in-use", "a100-eu=12"
    )
    assert code == 1 and "[MPG-Q007]" in out and "Warning: [MPG-Q008]" in out


def test_explain_judges_an_external_runtime_given_with_runtime(runner: CliRunner, tmp_path: Path) -> None:
    """The webhook reads an external runtime from the cluster; explain takes it from --runtime."""
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "ds", "namespace": "cv-team", "labels": {"mpigate.io/cost-center": "cc-2200"}},
        "spec": {
            "runtimeRef": {"name": "deepspeed-distributed"},
            "trainer": {
                "numNodes": 2,
                "image": "quay.io/acme/ds:1.0",
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
            },
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    code, out = explain(runner, str(tmp_path / "job.yaml"))
    assert code == 1 and "[MPG-RT-003] (enforce) spec.runtimeRef.name" in out
    runtime = yaml.safe_load((REPO / "policies" / "runtimes" / "mpi-openmpi-gpu.yaml").read_text())
    runtime["metadata"]["name"] = "deepspeed-distributed"
    (tmp_path / "runtime.yaml").write_text(yaml.safe_dump(runtime))
    code, out = explain(
        runner, str(tmp_path / "job.yaml"), "--runtime", str(tmp_path / "runtime.yaml"), "-o", "json"
    )
    assert code == 0, out
    (result,) = json.loads(out)
    managers = [p["manager"] for p in result["mutated"]["spec"]["runtimePatches"]]
    assert managers == ["mpigate.io/admission"]
    assert [j["name"] for j in result["decision"]["demand"]["jobs"]] == ["node", "launcher"]
    code, out = explain(runner, str(tmp_path / "job.yaml"), "--runtime", str(tmp_path / "job.yaml"))
    assert code == 2 and "expected a ClusterTrainingRuntime or TrainingRuntime" in out


def test_explain_usage_and_input_errors_exit_2(runner: CliRunner, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: v1\nkind: TrainJob\nmetadata: {name: x\n", encoding="utf-8")
    code, out = explain(runner, str(broken))
    assert code == 2 and f"{broken}:" in out and "Traceback" not in out
    code, out = explain(runner, str(EX / "minimal.yaml"), "--operation", "UPDATE")
    assert code == 2 and "UPDATE needs --old" in out
    code, out = explain(runner, str(EX / "minimal.yaml"), "--gpus-in-use", "lots")
    assert code == 2 and "FLAVOR=COUNT" in out
    result = runner.invoke(cli, ["explain", "--config", str(tmp_path), str(EX / "minimal.yaml")])
    assert result.exit_code == 2 and f"{tmp_path}: not an mpigate config tree" in result.output


@pytest.mark.parametrize("text", ["", "# nothing here yet\n", "---\n", "---\n# a comment\n---\n"])
def test_explain_an_empty_file_says_so_and_exits_2(runner: CliRunner, tmp_path: Path, text: str) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text(text, encoding="utf-8")
    for args, stdout in (([str(empty)], ""), ([str(empty), "-o", "json"], "[]\n")):
        result = runner.invoke(cli, ["explain", "--config", str(REPO), *NOW, *args])
        assert result.exit_code == 2, result.output
        assert result.stderr == (
            f"{empty}:1:1: (document): holds no TrainJob or training runtime: the file has no YAML "
            "document at all (it is empty, or only comments and `---`) (hint: check that this is the "
            "file you meant)\n1 input file not judged (see the errors above)\n"
        )
        assert result.stdout == stdout
    # the stored object for UPDATE is read the same way
    update = ["--operation", "UPDATE", "--old", str(empty)]
    result = runner.invoke(cli, ["explain", "--config", str(REPO), str(EX / "minimal.yaml"), *update])
    assert result.exit_code == 2 and f"{empty}:1:1: (document): holds no TrainJob" in result.stderr


def test_explain_goes_on_after_a_broken_file(runner: CliRunner, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: TrainJob\nmetadata:\n\tname: x\n", encoding="utf-8")
    files = [str(broken), str(EX / "minimal.yaml"), str(EX / "deny-over-quota.yaml")]
    result = runner.invoke(cli, ["explain", "--config", str(REPO), *NOW, *files, "-o", "json"])
    assert result.exit_code == 2, result.output  # unreadable input wins over a denial
    assert result.stderr.startswith(f"{broken}:3:1: ")
    assert result.stderr.endswith("1 input file not judged (see the errors above)\n")
    judged = json.loads(result.stdout)
    assert [(Path(j["file"]).name, j["decision"]["allowed"]) for j in judged] == [
        ("minimal.yaml", True),
        ("deny-over-quota.yaml", False),
    ]


def not_a_tree(where: str, point_at: str) -> str:
    return (
        f"{where}: not an mpigate config tree (it holds no OrgPolicy document). Run this inside your "
        f"config tree or {point_at}; `mpigate init PATH` creates a new one.\n"
    )


def test_outside_a_config_tree_explain_and_test_say_so(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = shutil.copy(EX / "minimal.yaml", tmp_path / "job.yaml")  # no tree above it either
    result = runner.invoke(cli, ["explain", str(job)])
    assert result.exit_code == 2
    assert result.stderr == not_a_tree(".", "pass one with --config PATH")
    result = runner.invoke(cli, ["test"])
    assert result.exit_code == 2
    assert result.stderr == not_a_tree(".", "pass its path (`mpigate test PATH`)")
    # a file in it that does not parse may be the OrgPolicy: shown, not hidden behind the note
    (tmp_path / "org.yaml").write_text("kind: OrgPolicy\nspec: {x: 1\n", encoding="utf-8")
    result = runner.invoke(cli, ["explain", "--config", str(tmp_path), str(EX / "minimal.yaml")])
    assert result.exit_code == 2
    assert result.stderr.startswith("org.yaml:") and "invalid YAML" in result.stderr
    assert result.stderr.endswith(not_a_tree(str(tmp_path), "pass one with --config PATH"))
    assert "no GPUFlavors" not in result.stderr


def test_an_incomplete_tree_still_lists_its_problems(runner: CliRunner, tmp_path: Path) -> None:
    shutil.copytree(REPO / "policies", tmp_path / "policies")
    result = runner.invoke(cli, ["explain", "--config", str(tmp_path), str(EX / "minimal.yaml")])
    assert result.exit_code == 2
    assert f"{tmp_path}: (tree): no GPUFlavors document found" in result.stderr
    assert result.stderr.endswith(f" error(s); run `mpigate check {tmp_path}`\n")
    assert f"{tmp_path}: the config tree has " in result.stderr
    assert "not an mpigate config tree" not in result.stderr


def test_test_command_passes_on_the_example_org(runner: CliRunner, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    result = runner.invoke(cli, ["test", str(REPO), "--junit", str(junit)])
    assert result.exit_code == 0, result.output
    assert "PASS a well-formed job is admitted" in result.output
    assert "cases passed in 9 suites" in result.output
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "0" and int(root.get("tests") or 0) >= 50


def test_test_command_fails_with_the_difference(runner: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "org"
    shutil.copytree(FIXTURES / "config" / "base", root)
    suite = root / "policies" / "tests" / "alpha.yaml"
    suite.write_text(
        suite.read_text(encoding="utf-8").replace("allowed: true", "allowed: false"), encoding="utf-8"
    )
    result = runner.invoke(cli, ["test", str(root)])
    assert result.exit_code == 1
    assert "FAIL hello is admitted (policies/tests/alpha.yaml:" in result.output
    assert "allowed: expected False, got True" in result.output
    assert "1 of 1 cases failed" in result.output
    data = json.loads(runner.invoke(cli, ["test", str(root), "-o", "json"]).output)
    assert data["ok"] is False and data["suites"][0]["cases"][0]["differences"] == [
        "allowed: expected False, got True"
    ]
