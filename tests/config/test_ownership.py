"""Issue 18, item 1: each kind is accepted only where its owner keeps it, and a team file speaks only
for its own team. Every bypass of the issue is reproduced on a copy of the example org, through
``check`` (the problem, its file:line and the owning folder) and ``render`` (which refuses)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mpigate.cli import cli
from mpigate.config import Problem, Severity, check_tree
from mpigate.render.manifests import FastLoader
from mpigate.scaffold import copy_example
from tests.conftest import TODAY

# The waiver: every rule, every job of the team, approved by the team's own admin.
WAIVE_ALL = """\
---
apiVersion: mpigate.io/v1alpha1
kind: PolicyException
metadata:
  name: waive-all
spec:
  team: {team}
  rules: ["MPG-*"]
  match: {{}}
  justification: we know what we do
  approver: lena@acme.example
  expires: "2026-12-31"
"""

RUNTIME = """\
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: mpi-openmpi-gpu-root
spec:
  mlPolicy: {numNodes: 1, mpi: {mpiImplementation: OpenMPI}}
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            spec:
              template:
                spec:
                  containers:
                    - {name: node, image: registry.acme.internal/base:1, securityContext: {privileged: true}}
"""

PERSONAS = """\
---
apiVersion: mpigate.io/v1alpha1
kind: Personas
metadata:
  name: personas
spec:
  personas:
    data-scientist:
      rules:
        - apiGroups: [""]
          resources: [pods/exec, secrets]
          verbs: [get, create]
    mlops-engineer:
      rules: []
    team-admin:
      rules: []
    viewer:
      rules: []
"""


@pytest.fixture
def org(tmp_path: Path) -> Path:
    root = tmp_path / "org"
    copy_example(root)
    return root


def append(path: Path, text: str) -> int:
    """Append ``text`` to ``path``; returns the line of the appended document's first key."""
    before = path.read_text(encoding="utf-8")
    path.write_text(before.rstrip("\n") + "\n" + text, encoding="utf-8")
    return before.rstrip("\n").count("\n") + 3


def errors(root: Path, code_prefix: str = "ownership.") -> list[Problem]:
    result = check_tree(root, today=TODAY)
    return [p for p in result.problems if p.severity is Severity.ERROR and p.code.startswith(code_prefix)]


def render_refuses(root: Path, tmp_path: Path, *needles: str) -> None:
    out = tmp_path / "deploy"
    result = CliRunner().invoke(cli, ["render", str(root), "-o", str(out)])
    assert result.exit_code == 2, result.output
    for needle in needles:
        assert needle in result.output
    assert not (out / "teams").exists()


def test_the_example_org_keeps_every_kind_in_its_owners_folder(org: Path) -> None:
    assert errors(org) == []


def test_an_exception_in_a_team_quota_file(org: Path, tmp_path: Path) -> None:
    line = append(org / "quotas" / "nlp-team.yaml", WAIVE_ALL.format(team="nlp-team"))
    (problem,) = errors(org)
    assert problem.code == "ownership.folder"
    assert (problem.location.file, problem.location.line) == ("quotas/nlp-team.yaml", line + 1)
    assert "PolicyException" in problem.message and "policies/" in problem.message
    assert "quotas/ holds GPUFlavors, TeamQuota" in problem.message
    render_refuses(org, tmp_path, "quotas/nlp-team.yaml", "policies/")


def test_an_exception_for_another_team_from_a_team_file(org: Path) -> None:
    append(org / "quotas" / "nlp-team.yaml", WAIVE_ALL.format(team="cv-team"))
    assert [p.code for p in errors(org)] == ["ownership.folder"]


def test_a_new_file_in_a_new_folder(org: Path, tmp_path: Path) -> None:
    (org / "waivers").mkdir()
    (org / "waivers" / "x.yaml").write_text(WAIVE_ALL.format(team="nlp-team"), encoding="utf-8")
    (problem,) = errors(org)
    assert problem.code == "ownership.folder"
    assert problem.location.file == "waivers/x.yaml"
    assert "in no folder of the layout" in problem.message and "policies/" in problem.message
    render_refuses(org, tmp_path, "waivers/x.yaml")


def test_a_file_at_the_root_of_the_tree(org: Path) -> None:
    (org / "x.yaml").write_text(WAIVE_ALL.format(team="nlp-team"), encoding="utf-8")
    assert [(p.code, p.location.file) for p in errors(org)] == [("ownership.folder", "x.yaml")]


def test_a_runtime_manifest_in_a_team_quota_file(org: Path, tmp_path: Path) -> None:
    append(org / "quotas" / "cv-team.yaml", RUNTIME)
    (problem,) = errors(org)
    assert problem.code == "ownership.folder" and problem.location.file == "quotas/cv-team.yaml"
    assert "ClusterTrainingRuntime" in problem.message
    render_refuses(org, tmp_path, "quotas/cv-team.yaml")


def test_personas_in_a_team_access_file(org: Path, tmp_path: Path) -> None:
    (org / "rbac" / "personas.yaml").unlink()
    line = append(org / "rbac" / "nlp-team.yaml", PERSONAS)
    found = errors(org)
    assert [p.code for p in found] == ["ownership.team-file"]
    assert (found[0].location.file, found[0].location.line) == ("rbac/nlp-team.yaml", line + 1)
    assert "team nlp-team's file" in found[0].message
    render_refuses(org, tmp_path, "rbac/nlp-team.yaml")


def test_a_team_file_speaks_only_for_its_team(org: Path) -> None:
    access = org / "rbac" / "nlp-team.yaml"
    access.write_text(access.read_text(encoding="utf-8").replace("team: nlp-team", "team: cv-team"))
    network = org / "networkpolicies" / "cv-team.yaml"
    network.write_text(network.read_text(encoding="utf-8").replace("team: cv-team", "team: nlp-team"))
    found = {(p.location.file, p.code) for p in errors(org)}
    assert found == {
        ("rbac/nlp-team.yaml", "ownership.team"),
        ("networkpolicies/cv-team.yaml", "ownership.team"),
    }
    message = next(p.message for p in errors(org) if p.location.file == "rbac/nlp-team.yaml")
    assert "rbac/cv-team.yaml" in message


def test_a_team_kind_outside_a_team_file(org: Path) -> None:
    (org / "quotas" / "cv-team.yaml").rename(org / "quotas" / "teams.yaml")
    (problem,) = errors(org)
    assert problem.code == "ownership.team" and "quotas/cv-team.yaml" in problem.message


def test_a_team_folder_is_the_teams(org: Path) -> None:
    (org / "rbac" / "cv-team").mkdir()
    (org / "rbac" / "cv-team.yaml").rename(org / "rbac" / "cv-team" / "access.yaml")
    assert errors(org) == []


def test_an_org_declares_its_own_layout(org: Path) -> None:
    policy = org / "policies" / "org.yaml"
    layout = (
        "  layout:\n"
        "    policies: [OrgPolicy, PolicyTest, ClusterTrainingRuntime]\n"
        "    policies/exceptions: [PolicyException]\n"
        "    capacity: [GPUFlavors, TeamQuota]\n"
        "    rbac: [Personas, TeamAccess]\n"
        "    networkpolicies: [NetworkProfiles, TeamNetwork]\n"
    )
    policy.write_text(policy.read_text(encoding="utf-8") + layout, encoding="utf-8")
    found = errors(org)
    # quotas/ is no folder of this layout; an exception straight in policies/ is not allowed either
    assert {p.location.file for p in found} == {
        "quotas/cv-team.yaml",
        "quotas/flavors.yaml",
        "quotas/nlp-team.yaml",
        "quotas/research-team.yaml",
    }
    (org / "quotas").rename(org / "capacity")
    assert errors(org) == []
    (org / "policies" / "exceptions" / "cv-team-legacy-image.yaml").rename(org / "policies" / "waiver.yaml")
    (problem,) = errors(org)
    assert "policies/exceptions/" in problem.message


def test_a_single_file_and_a_rendered_bundle_have_no_layout(org: Path, tmp_path: Path) -> None:
    """A single file has one owner; a config bundle is rendered from a tree that passed check."""
    single = tmp_path / "all.yaml"
    single.write_text(
        "".join(
            "---\n" + p.read_text(encoding="utf-8")
            for folder in ("policies", "quotas", "rbac", "networkpolicies")
            for p in sorted((org / folder).rglob("*.yaml"))
            if "tests" not in p.parts
        ),
        encoding="utf-8",
    )
    assert check_tree(single, today=TODAY).errors == ()
    out = tmp_path / "deploy"
    assert CliRunner().invoke(cli, ["render", str(org), "-o", str(out)]).exit_code == 0
    (bundle,) = yaml.load_all((out / "mpigate" / "config-bundle.yaml").read_text(), Loader=FastLoader)
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for key, text in bundle["data"].items():
        (mounted / key).write_text(text, encoding="utf-8")
    assert check_tree(mounted, today=TODAY).errors == ()


def test_a_flat_tree_with_a_revision_file_is_still_checked(org: Path) -> None:
    """Only a flat directory is read as a bundle: a revision file in a source tree changes nothing."""
    (org / ".mpigate-revision").write_text("abc\n", encoding="utf-8")
    (org / "quotas" / "nlp-team.yaml").write_text(
        (org / "quotas" / "nlp-team.yaml").read_text(encoding="utf-8") + WAIVE_ALL.format(team="nlp-team")
    )
    assert [p.code for p in errors(org)] == ["ownership.folder"]
