"""README's quick start, run as written: every `mpigate ...` command it shows runs in a fresh
directory with the exit status and the output the README promises, and a command added to the
quick start is either run here or named below with the reason it is not."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from mpigate.cli import cli
from tests.conftest import REPO

README = REPO / "README.md"

# Commands of the quick start that this test does not run, and why (tests elsewhere run them).
NOT_RUN = {
    "mpigate audit verify /var/lib/mpigate/audit --public-key audit.pub --k8s-audit audit.log": (
        "needs a webhook's trail and an API-server log (tests/test_getting_started.py, tests/audit)"
    ),
    "mpigate report --audit … --k8s-audit … --framework soc2,hipaa --format html -o report.html": (
        "elided arguments (tests/report)"
    ),
    "mpigate preflight --local -np 4 --profile pinned-ports --config acme-config": (
        "a real mpirun (tests/preflight, make demo)"
    ),
    "mpigate certs": "named, not a command line (tests/admission)",
    "mpigate controller": "named, not a command line (tests/controller)",
}


def quick_start_commands() -> list[str]:
    """The `mpigate …` code spans of the README's quick start, in order, whitespace folded."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    spans = (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", section))
    return [span for span in spans if span.startswith("mpigate ")]


def run(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.mark.skipif(shutil.which("git") is None, reason="mpigate diff --against a revision needs git")
def test_the_quick_start_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commands = quick_start_commands()
    assert commands[0] == "mpigate init acme-config --org acme --team nlp-team", commands
    monkeypatch.chdir(tmp_path)
    ran = []
    for command in commands:
        if command in NOT_RUN:
            continue
        args = command.split()[1:]
        cwd = tmp_path
        if args[0] == "explain":
            # "mpigate explain job.yaml", in the tree the admin scaffolded (found as git finds it)
            cwd = tmp_path / "acme-config"
            shutil.copy(cwd / "examples" / "trainjobs" / "hello-nlp-team.yaml", cwd / "job.yaml")
        if args[0] == "diff":
            # "--against origin/main": the scaffolded tree committed, as a pull request's base
            _git(tmp_path, "init", "-q")
            _git(tmp_path, "add", "acme-config")
            _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "base")
            _git(tmp_path, "update-ref", "refs/remotes/origin/main", "HEAD")
        monkeypatch.chdir(cwd)
        result = run(args)
        monkeypatch.chdir(tmp_path)
        assert result.exit_code == 0, f"{command}:\n{result.output}"
        ran.append((command, result.output))
    assert not set(NOT_RUN) - set(commands), "NOT_RUN names a command the quick start no longer has"

    outputs = dict(ran)
    tree = tmp_path / "acme-config"
    # 1-2. "writes a commented starter tree: policies/org.yaml, quotas/flavors.yaml and
    # quotas/nlp-team.yaml, rbac/, networkpolicies/, a runtime and a first TrainJob"
    for path in (
        "policies/org.yaml",
        "quotas/flavors.yaml",
        "quotas/nlp-team.yaml",
        "rbac",
        "networkpolicies",
    ):
        assert (tree / path).exists(), path
    assert list((tree / "policies" / "runtimes").glob("*.yaml"))
    assert list((tree / "examples" / "trainjobs").glob("*.yaml"))
    # "says what it chose — GPUs, cohort, priority classes"
    added = outputs["mpigate init acme-config --team cv-team"]
    for chosen in ("GPUs", "cohort", "priority classes"):
        assert chosen in added, added
    # "three teams: nlp-team ..., cv-team ..., research-team"
    quotas = sorted(p.stem for p in (tmp_path / "demo" / "quotas").glob("*-team.yaml"))
    assert quotas == ["cv-team", "nlp-team", "research-team"]
    # 3. check passes the tree init wrote, with the runtimes judged; schema prints JSON Schema
    assert "0 errors" in outputs["mpigate check acme-config"]
    assert '"title": "TeamQuota"' in outputs["mpigate schema TeamQuota"]
    # 4. explain shows the webhook's answer with its JSONPatch
    explained = outputs["mpigate explain job.yaml"]
    assert "ALLOWED" in explained and "patch (JSONPatch)" in explained, explained
    # 5-7. what render, init --install-base and keygen write
    assert (tmp_path / "deploy" / "kustomization.yaml").is_file()
    assert (tree / "webhooks" / "kustomization.yaml").is_file()
    assert (tmp_path / "audit.key").is_file() and (tmp_path / "audit.pub").is_file()


def test_a_team_in_a_region_the_tree_lacks_is_told_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "`--region us` once region `us` and a GPU flavor for it are in the tree; `init` tells you
    what is missing" — and writes nothing, exit 2 (a config error)."""
    monkeypatch.chdir(tmp_path)
    assert run(["init", "acme-config", "--org", "acme", "--team", "nlp-team"]).exit_code == 0
    before = sorted(p.as_posix() for p in Path("acme-config").rglob("*"))
    result = run(["init", "acme-config", "--team", "cv-team", "--region", "us"])
    assert result.exit_code == 2, result.output
    assert "region 'us' is not defined" in result.output and "spec.regions" in result.output
    assert "GPU flavor" in result.output
    assert sorted(p.as_posix() for p in Path("acme-config").rglob("*")) == before


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)
