"""explain/test find the config tree as git finds its repository; a directory holding several
trees is refused with one clear problem each; --namespace for objects that name none (issue 21
item 4)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mpigate.cli import cli
from mpigate.config import check_tree
from mpigate.config.discovery import find_config_root, is_tree_root
from tests.conftest import REPO, copy_org

JOB = "examples/trainjobs/llm-finetune.yaml"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A parent directory holding two trees (two checkouts side by side, as /work does)."""
    for name in ("a", "b"):
        copy_org(tmp_path / name)
    return tmp_path


@pytest.fixture
def chdir(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    return monkeypatch.chdir


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_find_config_root_walks_up_like_git(workspace: Path) -> None:
    a = workspace / "a"
    assert is_tree_root(a) and not is_tree_root(workspace) and not is_tree_root(a / "examples")
    assert find_config_root(a / JOB) == a.resolve()
    assert find_config_root(a / "policies" / "tests") == a.resolve()
    assert find_config_root(workspace) is None or find_config_root(workspace) != workspace.resolve()


def test_explain_from_the_parent_uses_the_tree_above_the_file(
    workspace: Path, chdir: Callable[[Path], None]
) -> None:
    """Before: every YAML below . was loaded, and each kind was 'defined twice' (exit 2)."""
    chdir(workspace)
    code, output = run("explain", f"a/{JOB}")
    assert code == 0, output
    assert output.splitlines()[0] == "config tree: a"
    assert f"TrainJob nlp-team/llm-finetune (a/{JOB}:" in output
    assert "defined twice" not in output


def test_explain_inside_a_tree_uses_it_wherever_the_file_is(
    workspace: Path, chdir: Callable[[Path], None]
) -> None:
    chdir(workspace / "b" / "policies")
    code, output = run("explain", str(workspace / "a" / JOB), "-o", "json")
    assert code == 0, output
    assert output.splitlines()[0] == f"config tree: {(workspace / 'b').resolve()}"  # from b's policies/


def test_a_directory_holding_two_trees_is_refused_with_one_problem(workspace: Path) -> None:
    result = check_tree(workspace)
    assert [p.code for p in result.errors] == ["nested.tree"], [str(p) for p in result.errors]
    [problem] = result.errors
    assert problem.location.file == "b/policies/org.yaml" and problem.location.line >= 1
    assert problem.message == (
        "a second config tree: b/ has its own OrgPolicy (so has a/policies/org.yaml); "
        "one directory holds one config tree"
    )
    assert "--config b" in problem.hint and ".mpigateignore" in problem.hint


def test_check_of_the_parent_names_the_trees(workspace: Path) -> None:
    code, output = run("check", str(workspace))
    assert code == 1
    assert "a second config tree: b/ has its own OrgPolicy" in output
    assert "defined twice" not in output


def test_a_tree_inside_a_tree_listed_in_mpigateignore_is_left_alone(tmp_path: Path) -> None:
    outer = copy_org(tmp_path / "outer")
    copy_org(outer / "demo")
    assert [p.code for p in check_tree(outer).errors] == ["nested.tree"]
    (outer / ".mpigateignore").write_text("demo/\n")
    assert check_tree(outer).ok


def test_two_org_policies_in_one_tree_are_still_a_duplicate(tmp_path: Path) -> None:
    tree = copy_org(tmp_path / "t")
    shutil.copy(tree / "policies" / "org.yaml", tree / "policies" / "org-copy.yaml")
    codes = {p.code for p in check_tree(tree).errors}
    assert "nested.tree" not in codes and codes


def test_test_command_from_a_subdirectory_finds_the_tree(
    workspace: Path, chdir: Callable[[Path], None]
) -> None:
    chdir(workspace / "a" / "policies" / "tests")
    code, output = run("test")
    assert code == 0, output
    assert output.splitlines()[0] == f"config tree: {(workspace / 'a').resolve()}"
    assert "cases passed" in output


NO_NAMESPACE = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "sdk-job"},
    "spec": {"runtimeRef": {"name": "mpi-openmpi-gpu"}, "trainer": {"numNodes": 1}},
}


@pytest.fixture
def sdk_job(tmp_path: Path) -> Path:
    path = tmp_path / "sdk-job.yaml"
    path.write_text(yaml.safe_dump(NO_NAMESPACE))
    return path


def test_a_job_without_namespace_is_told_how_to_give_one(sdk_job: Path) -> None:
    code, output = run("explain", str(sdk_job), "--config", str(REPO))
    assert code == 1
    assert "the TrainJob names no namespace, so it belongs to no team" in output
    assert "mpigate explain --namespace NAMESPACE" in output
    assert "(none)" not in output


def test_namespace_option_places_the_object(sdk_job: Path) -> None:
    code, output = run(
        "explain", str(sdk_job), "--config", str(REPO), "--namespace", "nlp-team", "-o", "yaml"
    )
    data = yaml.safe_load(output)
    decision = data[0]["decision"]
    assert (decision["namespace"], decision["team"]) == ("nlp-team", "nlp-team")
    assert "MPG-TEAM-001" not in {v["id"] for v in decision["violations"]}
    assert data[0]["mutated"]["metadata"]["namespace"] == "nlp-team"
    assert code in (0, 1)


def test_namespace_option_refuses_an_object_in_another_namespace(tmp_path: Path) -> None:
    code, output = run(
        "explain", str(REPO / "examples" / "trainjobs" / "llm-finetune.yaml"), "--config", str(REPO),
        "-n", "cv-team",
    )  # fmt: skip
    assert code == 2
    assert "the object's namespace 'nlp-team' does not match --namespace 'cv-team'" in output
