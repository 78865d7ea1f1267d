"""mpigate diff: object-level changes against a rendered directory or a git revision."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpigate.cli import cli
from mpigate.render import Rendering, diff_objects, rendering_objects
from tests.conftest import REPO

FOLDERS = ("policies", "quotas", "rbac", "networkpolicies", "examples")


def _org(tmp_path: Path) -> Path:
    tree = tmp_path / "org"
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, tree / folder)
    return tree


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_no_change_against_itself(example_rendering: Rendering) -> None:
    objects = rendering_objects(example_rendering)
    assert diff_objects(objects, objects) == []


def test_changed_added_and_removed_objects(example_rendering: Rendering) -> None:
    old = rendering_objects(example_rendering)
    new = [(f, dict(o)) for f, o in old if o["kind"] != "Cohort"]
    cq = next(o for _, o in new if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "nlp-team")
    cq["spec"] = dict(cq["spec"], queueingStrategy="StrictFIFO")
    new.append(
        (
            "cluster/extra.yaml",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "y"}},
        )
    )
    changes = diff_objects(old, new)
    assert [(c.change, str(c.key)) for c in changes] == [
        ("changed", "ClusterQueue nlp-team (kueue.x-k8s.io/v1beta2)"),
        ("removed", "Cohort research-pool (kueue.x-k8s.io/v1beta2)"),
        ("added", "ConfigMap y/x (v1)"),
    ]
    changed = changes[0].diff.splitlines()
    assert changed[:2] == ["--- a/cluster/clusterqueues.yaml", "+++ b/cluster/clusterqueues.yaml"]
    assert "-  queueingStrategy: BestEffortFIFO" in changed and "+  queueingStrategy: StrictFIFO" in changed
    assert changes[1].diff.splitlines()[1] == "+++ /dev/null"
    assert changes[2].diff.splitlines()[0] == "--- /dev/null"


def test_the_revision_alone_is_no_change_unless_asked(example_rendering: Rendering) -> None:
    old = rendering_objects(example_rendering)
    new = []
    for file, obj in old:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "mpigate-config":
            obj = dict(obj, data=dict(obj["data"], **{".mpigate-revision": "other\n"}))
            obj["metadata"] = dict(obj["metadata"], annotations={"mpigate.io/revision": "other"})
        new.append((file, obj))
    assert diff_objects(old, new) == []
    assert [c.change for c in diff_objects(old, new, ignore_revision=False)] == ["changed"]


def test_cli_diff_against_a_rendered_directory(tmp_path: Path) -> None:
    tree = _org(tmp_path)
    runner = CliRunner()
    deploy = tmp_path / "deploy"
    assert runner.invoke(cli, ["render", str(tree), "-o", str(deploy)]).exit_code == 0
    same = runner.invoke(cli, ["diff", str(tree), "--against", str(deploy)])
    assert same.exit_code == 0, same.output
    assert same.output.strip().endswith("0 changed, 0 added, 0 removed")

    _edit(tree / "quotas" / "research-team.yaml", "maxConcurrentJobs: 2", "maxConcurrentJobs: 3")
    changed = runner.invoke(cli, ["diff", str(tree), "--against", str(deploy)])
    assert changed.exit_code == 1, changed.output
    assert "~ ClusterQueue research-team (kueue.x-k8s.io/v1beta2)" in changed.output
    assert "~ ResourceQuota research/mpigate-team-quota (v1)" in changed.output
    # maxStoredJobs defaults to 4 × maxConcurrentJobs
    assert "-    count/trainjobs.trainer.kubeflow.org: '8'" in changed.output
    assert "+    count/trainjobs.trainer.kubeflow.org: '12'" in changed.output
    assert changed.output.strip().endswith("3 changed, 0 added, 0 removed")  # + the config bundle

    as_json = runner.invoke(cli, ["diff", str(tree), "--against", str(deploy), "-o", "json"])
    data = json.loads(as_json.output)
    assert (data["changed"], data["added"], data["removed"]) == (3, 0, 0)
    assert {c["kind"] for c in data["changes"]} == {"ClusterQueue", "ResourceQuota", "ConfigMap"}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def git_org(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        reason = "git is not installed (the Makefile's DEB_PACKAGES installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    repo = tmp_path / "config-repo"
    repo.mkdir()
    tree = repo / "org"  # the config tree lives in a subfolder of the repository
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, tree / folder)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "base")
    return tree


def test_cli_diff_against_a_git_ref(git_org: Path) -> None:
    runner = CliRunner()
    clean = runner.invoke(cli, ["diff", str(git_org), "--against", "HEAD"])
    assert clean.exit_code == 0, clean.output
    _edit(git_org / "quotas" / "nlp-team.yaml", "  cohort: research-pool\n", "")
    (git_org / "quotas" / "new-team.yaml").write_text(
        (git_org / "quotas" / "research-team.yaml")
        .read_text()
        .replace("research-team", "new-team")
        .replace("[research]", "[new-team-ns]"),
        encoding="utf-8",
    )
    result = runner.invoke(cli, ["diff", str(git_org), "--against", "main"])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert "+ ClusterQueue new-team (kueue.x-k8s.io/v1beta2)" in lines
    assert "+ Namespace new-team-ns (v1)" in lines
    assert "~ ClusterQueue nlp-team (kueue.x-k8s.io/v1beta2)" in lines
    assert "-  cohortName: research-pool" in lines
    assert "-        borrowingLimit: 0" in lines  # no cohort: no borrowing limits


def test_cli_diff_with_an_unknown_ref_is_a_clean_error(git_org: Path) -> None:
    def diff(ref: str) -> str:
        result = CliRunner().invoke(cli, ["diff", str(git_org), "--against", ref])
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and "fatal:" not in result.output
        return result.output

    unknown = diff("no-such-ref")
    assert "git ref 'no-such-ref' not found: pass a branch, tag or commit of this repository" in unknown
    no_remote = diff("origin/main")
    assert "git ref 'origin/main' not found: the repository has no remote (so no origin/...)" in no_remote
    _git(git_org.parent, "remote", "add", "origin", str(git_org.parent / "elsewhere"))
    unfetched = diff("origin/main")
    fetch = "`git fetch origin main:refs/remotes/origin/main`"
    assert f"git ref 'origin/main' not found: fetch it first ({fetch}" in unfetched
    other = diff("upstream/main")
    assert "git ref 'upstream/main' not found (remotes: origin)" in other


def test_cli_diff_outside_a_git_repository_says_what_against_needs(tmp_path: Path) -> None:
    tree = tmp_path / "org"
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, tree / folder)
    result = CliRunner().invoke(cli, ["diff", str(tree), "--against", "origin/main"])
    assert result.exit_code == 2, result.output
    assert f"{tree} is not inside a git repository: --against origin/main names a git ref" in result.output
    assert "(--against DIR)" in result.output and "fatal:" not in result.output


def test_cli_diff_without_git_installed(git_org: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(git_org))  # a PATH with no git on it
    result = CliRunner().invoke(cli, ["diff", str(git_org), "--against", "main"])
    assert result.exit_code == 2, result.output
    assert "git is not installed: --against GIT_REF needs it" in result.output


CODEOWNERS = """\
*                  @acme/platform
/policies/         @acme/security
/quotas/           @acme/capacity
/quotas/nlp-team.yaml  @acme/capacity @acme/nlp-team-admins
/CODEOWNERS        @acme/security
"""


def test_diff_lists_the_owners_concerns_a_pull_request_touches(git_org: Path) -> None:
    """Issue 18: a change that looks like a team's quota edit but also adds an exception shows
    both owners at once."""
    (git_org / "CODEOWNERS").write_text(CODEOWNERS, encoding="utf-8")
    _git(git_org.parent, "add", "-A")
    _git(git_org.parent, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "owners")
    runner = CliRunner()
    clean = runner.invoke(cli, ["diff", str(git_org), "--against", "HEAD"])
    assert "owners' concerns: none (no file of the tree changed)" in clean.output
    _edit(git_org / "quotas" / "nlp-team.yaml", "maxConcurrentJobs: 5", "maxConcurrentJobs: 6")
    (git_org / "policies" / "exceptions" / "nlp-eval.yaml").write_text(
        (git_org / "policies" / "exceptions" / "cv-team-legacy-image.yaml")
        .read_text()
        .replace("name: cv-team-legacy-image", "name: nlp-eval"),
        encoding="utf-8",
    )
    (git_org / "notes.md").write_text("scratch\n", encoding="utf-8")
    _edit(git_org / "examples" / "trainjobs" / "llm-finetune.yaml", "cc-4711", "cc-4712")
    result = runner.invoke(cli, ["diff", str(git_org), "--against", "HEAD"])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    start = lines.index("owners' concerns (3):")
    assert lines[start + 1 : start + 4] == [
        "  @acme/platform: examples/trainjobs/llm-finetune.yaml (changed), notes.md (added)",
        "  @acme/security: policies/exceptions/nlp-eval.yaml (added)",
        "  @acme/capacity @acme/nlp-team-admins: quotas/nlp-team.yaml (changed)",
    ]
    data = json.loads(runner.invoke(cli, ["diff", str(git_org), "--against", "HEAD", "-o", "json"]).output)
    by_owner = {tuple(c["owners"]): [f["file"] for f in c["files"]] for c in data["concerns"]}
    assert by_owner[("@acme/security",)] == ["policies/exceptions/nlp-eval.yaml"]
    assert by_owner[("@acme/capacity", "@acme/nlp-team-admins")] == ["quotas/nlp-team.yaml"]


def test_diff_concerns_by_folder_without_codeowners_and_against_a_rendered_directory(tmp_path: Path) -> None:
    tree = _org(tmp_path)
    runner = CliRunner()
    deploy = tmp_path / "deploy"
    assert runner.invoke(cli, ["render", str(tree), "-o", str(deploy)]).exit_code == 0
    _edit(tree / "quotas" / "research-team.yaml", "maxConcurrentJobs: 2", "maxConcurrentJobs: 3")
    (tree / "policies" / "exceptions" / "cv-team-legacy-image.yaml").unlink()
    result = runner.invoke(cli, ["diff", str(tree), "--against", str(deploy)])
    assert (
        "  policies/ (no CODEOWNERS): policies/exceptions/cv-team-legacy-image.yaml (removed)"
        in result.output
    )
    assert "  quotas/ (no CODEOWNERS): quotas/research-team.yaml (changed)" in result.output
    (deploy / "mpigate" / "config-bundle.yaml").unlink()
    unknown = runner.invoke(cli, ["diff", str(tree), "--against", str(deploy)])
    assert (
        "owners' concerns: unknown (the directory compared with carries no config bundle)" in unknown.output
    )


def test_the_owners_are_the_base_refs_where_github_reads_them(git_org: Path) -> None:
    """GitHub takes CODEOWNERS from the pull request's base branch, at the repository's root (or
    .github/, docs/), with paths relative to it: a pull request that rewrites it does not choose
    its own reviewers, and a tree in a subfolder is matched by its repository path. A line GitHub
    would skip as invalid is skipped and named."""
    repo = git_org.parent
    (repo / ".github").mkdir()
    owners = "*  @acme/platform\n/org/quotas/  @acme/capacity\n/.github/  @acme/security\n[bad  @acme/x\n"
    (repo / ".github" / "CODEOWNERS").write_text(owners, encoding="utf-8")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "owners")
    _edit(git_org / "quotas" / "cv-team.yaml", "maxConcurrentJobs: 10", "maxConcurrentJobs: 12")
    (repo / ".github" / "CODEOWNERS").write_text(
        owners.replace("/org/quotas/  @acme/capacity", "/org/quotas/  @acme/nlp-team-admins"),
        encoding="utf-8",
    )
    result = CliRunner().invoke(cli, ["diff", str(git_org), "--against", "HEAD"])
    assert result.exit_code == 1, result.output
    assert "owners' concerns (1):\n  @acme/capacity: quotas/cv-team.yaml (changed)\n" in result.stdout
    assert "warning: .github/CODEOWNERS:4: unterminated character class" in result.stderr


def test_a_tree_at_a_ref_is_read_with_its_links_inside_and_none_out_of_it(git_org: Path) -> None:
    # The tree at a ref may be a pull request's: a symbolic link out of it (a CI runner's secrets)
    # is refused, one inside it is kept. Python < 3.11.4 (the image's Debian 3.11.2) has no
    # extractall(filter="data"): mpigate checks the members itself.
    repo = git_org.parent
    (repo / "NOTES").write_text("notes\n", encoding="utf-8")
    (repo / "notes-link").symlink_to("NOTES")
    (git_org / "policies" / "link-up").symlink_to("../../NOTES")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "links inside")
    clean = CliRunner().invoke(cli, ["diff", str(git_org), "--against", "HEAD"])
    assert clean.exit_code == 0, clean.output
    from mpigate.render.diff import git_tree

    with git_tree(git_org, "HEAD") as (tree, _):
        assert (tree / "policies" / "link-up").read_text(encoding="utf-8") == "notes\n"
        assert (tree.parent / "notes-link").is_symlink()

    secret = repo.parent / "runner-secret"
    secret.write_text("token\n", encoding="utf-8")
    for name, target in (("absolute", str(secret)), ("relative", "../../../runner-secret")):
        link = git_org / "quotas" / f"{name}.yaml"
        link.symlink_to(target)
        _git(repo, "add", "-A")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", name)
        result = CliRunner().invoke(cli, ["diff", str(git_org), "--against", "HEAD"])
        assert result.exit_code != 0, result.output
        assert f"org/quotas/{name}.yaml is a symbolic link to {target}, outside the tree" in result.output
        assert "token" not in result.output
        link.unlink()
        _git(repo, "add", "-A")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", f"no {name}")


def test_an_archive_member_that_cannot_be_written_is_a_clean_problem(tmp_path: Path) -> None:
    # A name there twice (git archive writes none, a hostile tar could): named, no traceback.
    import io
    import tarfile

    from mpigate.render.diff import _extract

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for _ in range(2):
            info = tarfile.TarInfo("org/quotas/team.yaml")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"a: "))
    problem = _extract(raw.getvalue(), str(tmp_path))
    assert problem is not None and problem.startswith("org/quotas/team.yaml could not be written (")
    assert (tmp_path / "org" / "quotas" / "team.yaml").read_bytes() == b"a: "
