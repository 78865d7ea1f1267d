"""Every command through click's runner (in process) plus one real subprocess run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from codeowners import CodeOwners

from mpigate.cli import COMMANDS, cli
from mpigate.config import KINDS, check_tree
from tests.conftest import FIXTURES, REPO

BASE = FIXTURES / "config" / "base"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_check_ok_text(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["check", str(REPO)])
    assert result.exit_code == 0, result.output
    assert "ok: 3 teams (cv-team, nlp-team, research-team)" in result.output
    assert "0 errors" in result.output


def test_check_json(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["check", str(BASE), "-o", "json"])
    data = json.loads(result.output)
    assert result.exit_code == 0
    assert data["ok"] is True and data["teams"] == ["alpha", "beta"]
    assert data["builtinDefaults"] == ["Personas"]
    assert data["problems"] == [] or all(p["severity"] == "warning" for p in data["problems"])


def test_check_problems_exit_1_with_locations(runner: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(BASE, root)
    quota = root / "quotas" / "beta.yaml"
    quota.write_text(quota.read_text().replace("nominal: 4", 'nominal: "4"'))
    result = runner.invoke(cli, ["check", str(root)])
    assert result.exit_code == 1
    assert (
        'quotas/beta.yaml:9:23: spec.gpus.gpu-us.nominal: expected an integer, got string "4"'
        in result.output
    )
    data = json.loads(runner.invoke(cli, ["check", str(root), "-o", "json"]).output)
    assert data["ok"] is False
    assert data["problems"][0]["line"] == 9 and data["problems"][0]["code"] == "schema.type"


def test_check_yaml_output(runner: CliRunner) -> None:
    import yaml

    result = runner.invoke(cli, ["check", str(BASE), "-o", "yaml"])
    assert yaml.safe_load(result.output)["teams"] == ["alpha", "beta"]


def test_check_missing_path_is_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["check", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "does not exist" in result.output


NOT_A_TREE = (
    "not an mpigate config tree (it holds no OrgPolicy document). Run this inside your config tree "
    "or pass its path (`mpigate check PATH`); `mpigate init PATH` creates a new one."
)


def test_check_outside_a_tree_says_so_and_keeps_the_details(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["check", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{tmp_path}: (tree): no OrgPolicy document found" in result.stdout
    assert f"{tmp_path}: (tree): no GPUFlavors document found" in result.stdout
    assert f"{tmp_path}: {NOT_A_TREE}\n" in result.stderr
    assert json.loads(runner.invoke(cli, ["check", str(tmp_path), "-o", "json"]).stdout)["errors"] == 2


def test_check_an_incomplete_tree_names_what_is_missing_precisely(runner: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(BASE, root)
    flavors = [f for f in root.rglob("*.yaml") if "kind: GPUFlavors" in f.read_text(encoding="utf-8")]
    assert flavors
    for file in flavors:
        file.unlink()
    result = runner.invoke(cli, ["check", str(root)])
    assert result.exit_code == 1
    assert f"{root}: (tree): no GPUFlavors document found" in result.stdout
    assert "not an mpigate config tree" not in result.output


def test_check_strict_fails_on_warnings(runner: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(BASE, root)
    (root / "rbac" / "beta.yaml").unlink()  # → warning: team without access
    assert runner.invoke(cli, ["check", str(root)]).exit_code == 0
    assert runner.invoke(cli, ["check", str(root), "--strict"]).exit_code == 1


def test_init_new_tree_passes_check(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "org"
    result = runner.invoke(cli, ["init", str(target), "--org", "acme", "--team", "vision"])
    assert result.exit_code == 0, result.output
    checked = check_tree(target)
    assert checked.problems == ()
    assert checked.config is not None
    assert list(checked.config.teams) == ["vision"]
    assert checked.config.org.name == "acme"
    assert checked.builtin_defaults == ()  # personas and profiles are written out
    assert (target / "CODEOWNERS").is_file()
    assert "# " in (target / "policies" / "org.yaml").read_text()  # commented starter


def test_init_adds_a_team(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "org"
    assert runner.invoke(cli, ["init", str(target)]).exit_code == 0
    result = runner.invoke(cli, ["init", str(target), "--team", "speech", "--namespace", "speech-prod"])
    assert result.exit_code == 0, result.output
    config = check_tree(target).config
    assert config is not None
    assert sorted(config.teams) == ["ml-team", "speech"]
    assert config.team_for_namespace("speech-prod").name == "speech"
    assert config.access["speech"].members
    # each scaffolded team comes with a policy test suite that passes as written
    tested = runner.invoke(cli, ["test", str(target)])
    assert tested.exit_code == 0, tested.output
    assert "all 4 cases passed in 2 suites" in tested.output
    # config errors exit 2, as the README says
    again = runner.invoke(cli, ["init", str(target), "--team", "speech"])
    assert again.exit_code == 2 and "already exists" in again.output
    bad = runner.invoke(cli, ["init", str(target), "--team", "Bad_Name"])
    assert bad.exit_code == 2 and "DNS-1123" in bad.output
    clash = runner.invoke(cli, ["init", str(target), "--team", "other", "--namespace", "ml-team"])
    assert clash.exit_code == 2 and "already belongs to team 'ml-team'" in clash.output


def test_init_team_in_another_region_guides_the_admin(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "org"
    assert runner.invoke(cli, ["init", str(target)]).exit_code == 0
    unknown = runner.invoke(cli, ["init", str(target), "--team", "cv-team", "--region", "us"])
    assert unknown.exit_code == 2  # a config error (was 1)
    assert "region 'us' is not defined (known: eu)" in unknown.output
    assert "policies/org.yaml" in unknown.output
    org = target / "policies" / "org.yaml"
    text = org.read_text()
    org.write_text(
        text.replace(
            "  dataClassifications:",
            "    us:\n      nodeLabels: {topology.kubernetes.io/region: us-east-1}\n"
            '      dataLocations: ["s3://example-us-"]\n  dataClassifications:',
        )
    )
    no_flavor = runner.invoke(cli, ["init", str(target), "--team", "cv-team", "--region", "us"])
    assert no_flavor.exit_code == 2
    assert "region 'us' has no GPU flavor" in no_flavor.output
    assert "a100-us: {region: us" in no_flavor.output
    assert not (target / "quotas" / "cv-team.yaml").exists()  # nothing half-written
    flavors = target / "quotas" / "flavors.yaml"
    flavors.write_text(
        flavors.read_text().replace(
            "  cohorts:", "    a100-us: {region: us, gpu: nvidia.com/gpu, gpusPerNode: 8}\n  cohorts:"
        )
    )
    added = runner.invoke(cli, ["init", str(target), "--team", "cv-team", "--region", "us"])
    assert added.exit_code == 0, added.output
    config = check_tree(target).config
    assert config is not None
    assert [q.flavor for q in config.teams["cv-team"].gpus.values()] == ["a100-us"]
    tested = runner.invoke(cli, ["test", str(target)])
    assert tested.exit_code == 0, tested.output


def _set_capacity(tree: Path, gpus: int) -> None:
    flavors = tree / "quotas" / "flavors.yaml"
    text = flavors.read_text()
    flavors.write_text(
        text.replace("      gpusPerNode: 8\n", f"      gpusPerNode: 8\n      capacity: {gpus}\n", 1)
    )


def test_init_team_never_leaves_a_tree_that_fails_check(runner: CliRunner, tmp_path: Path) -> None:
    """Before: the files of a team over the flavor's capacity were written, then init said
    'the scaffolded tree does not pass `mpigate check`; please report this'."""
    target = tmp_path / "org"
    assert runner.invoke(cli, ["init", str(target)]).exit_code == 0  # ml-team: 8 GPUs
    _set_capacity(target, 20)
    second = runner.invoke(cli, ["init", str(target), "--team", "speech"])
    assert second.exit_code == 0, second.output
    assert (
        "team speech: namespace speech, region eu, 8 GPUs of a100-eu, cohort shared-pool, " in second.output
    )
    assert "priority classes standard, network profile isolated" in second.output
    # 4 GPUs are left: init takes those rather than a node's 8, and says so
    third = runner.invoke(cli, ["init", str(target), "--team", "vision"])
    assert third.exit_code == 0, third.output
    assert "4 GPUs of a100-eu" in third.output
    before = sorted(p.relative_to(target) for p in target.rglob("*"))
    # nothing left: refused with the reason, nothing written
    full = runner.invoke(cli, ["init", str(target), "--team", "audio"])
    assert full.exit_code == 2
    assert "flavor a100-eu has no GPU capacity left: its capacity is 20" in full.output
    assert "ml-team 8, speech 8, vision 4" in full.output
    # an explicit quota over the capacity: the would-be tree fails check, nothing written
    over = runner.invoke(cli, ["init", str(target), "--team", "audio", "--gpus", "8"])
    assert over.exit_code == 2
    assert "adding team 'audio' would leave a tree that fails `mpigate check`, so nothing was written" in (
        over.output
    )
    assert "adds up to 28 GPUs, above its capacity 20" in over.output
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before
    assert check_tree(target).ok
    # --gpus 0 is a team without GPU quota (check warns, it does not fail)
    assert runner.invoke(cli, ["init", str(target), "--team", "audio", "--gpus", "0"]).exit_code == 0
    assert check_tree(target).ok


def test_init_team_takes_cohort_and_priority_classes(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "org"
    assert runner.invoke(cli, ["init", str(target)]).exit_code == 0
    unknown = runner.invoke(cli, ["init", str(target), "--team", "speech", "--cohort", "nope"])
    assert unknown.exit_code == 2 and "cohort 'nope' is not defined (known: shared-pool)" in unknown.output
    bad_class = runner.invoke(
        cli, ["init", str(target), "--team", "speech", "--priority-class", "nope-class"]
    )
    assert bad_class.exit_code == 2 and "priority class 'nope-class' is not defined" in bad_class.output
    fresh = runner.invoke(cli, ["init", str(tmp_path / "new"), "--cohort", "x"])
    assert fresh.exit_code == 2 and "apply when adding a team" in fresh.output
    ok = runner.invoke(
        cli, ["init", str(target), "--team", "speech", "--gpus", "2", "--cohort", "shared-pool"]
    )
    assert ok.exit_code == 0, ok.output
    config = check_tree(target).config
    assert config is not None
    assert [q.nominal for q in config.teams["speech"].gpus.values()] == [2]


def test_init_team_in_a_tree_with_errors_says_which(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "org"
    assert runner.invoke(cli, ["init", str(target)]).exit_code == 0
    quota = target / "quotas" / "ml-team.yaml"
    quota.write_text(quota.read_text().replace("maxConcurrentJobs: 5", "maxConcurrentJobs: many"))
    result = runner.invoke(cli, ["init", str(target), "--team", "speech"])
    assert result.exit_code == 2
    assert "has 1 config error(s), and init adds a team only to a tree that passes `mpigate check`" in (
        result.output
    )
    assert "quotas/ml-team.yaml:" in result.output and "maxConcurrentJobs" in result.output
    assert not (target / "quotas" / "speech.yaml").exists()


def test_check_warns_about_a_team_without_gpu_quota(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "org"
    assert runner.invoke(cli, ["init", str(target)]).exit_code == 0
    quota = target / "quotas" / "ml-team.yaml"
    lines = quota.read_text().splitlines()
    start = lines.index("  gpus:")
    quota.write_text("\n".join([*lines[:start], "  gpus: {}", *lines[start + 2 :]]) + "\n")
    result = runner.invoke(cli, ["check", str(target)])
    assert result.exit_code == 0, result.output
    assert "spec.gpus: the team has no GPU quota" in result.output
    assert "a100-eu: {nominal: 8" in result.output
    assert runner.invoke(cli, ["check", str(target), "--strict"]).exit_code == 1


def test_init_refuses_to_overwrite(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "org"
    assert runner.invoke(cli, ["init", str(target)]).exit_code == 0
    result = runner.invoke(cli, ["init", str(target)])
    assert result.exit_code == 2 and "already holds a config tree" in result.output


def test_init_example_copies_the_example_org(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "demo"
    result = runner.invoke(cli, ["init", str(target), "--example"])
    assert result.exit_code == 0, result.output
    config = check_tree(target).config
    assert config is not None and sorted(config.teams) == ["cv-team", "nlp-team", "research-team"]
    assert (target / "examples" / "trainjobs" / "llm-finetune.yaml").is_file()


def test_init_install_base_writes_the_kustomize_base(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "org"
    assert runner.invoke(cli, ["init", str(target)]).exit_code == 0
    result = runner.invoke(cli, ["init", str(target), "--install-base"])
    assert result.exit_code == 0, result.output
    shipped = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "webhooks").rglob("*") if p.is_file())
    written = sorted(
        p.relative_to(target).as_posix() for p in (target / "webhooks").rglob("*") if p.is_file()
    )
    assert written == shipped and "webhooks/base/webhookconfigurations.yaml" in written
    assert (target / "webhooks" / "kustomization.yaml").read_text() == (
        REPO / "webhooks" / "kustomization.yaml"
    ).read_text()
    assert check_tree(target).problems == ()  # webhooks/ is not read as config
    again = runner.invoke(cli, ["init", str(target), "--install-base"])
    assert again.exit_code == 2 and "already exists (use --force to overwrite)" in again.output
    deploy = tmp_path / "deploy-repo"  # not a config tree: only the base is written
    (deploy / "rendered").mkdir(parents=True)
    alone = runner.invoke(cli, ["init", str(deploy), "--install-base"])
    assert alone.exit_code == 0, alone.output
    assert sorted(p.name for p in deploy.iterdir()) == ["rendered", "webhooks"]
    assert f"kubectl apply -k {deploy / 'webhooks'}" in alone.output
    rendered = tmp_path / "rendered"  # render would delete files it did not write
    assert runner.invoke(cli, ["render", str(target), "-o", str(rendered)]).exit_code == 0
    into_render = runner.invoke(cli, ["init", str(rendered), "--install-base"])
    assert into_render.exit_code == 2 and "is a `mpigate render` output" in into_render.output
    assert not (rendered / "webhooks").exists()
    fresh = tmp_path / "demo"
    both = runner.invoke(cli, ["init", str(fresh), "--example", "--install-base"])
    assert both.exit_code == 0, both.output
    assert (fresh / "webhooks" / "base" / "webhook.yaml").is_file()


def test_schema_command(runner: CliRunner) -> None:
    listed = runner.invoke(cli, ["schema", "--list"])
    assert listed.output.split() == list(KINDS)
    result = runner.invoke(cli, ["schema", "teamquota"])
    schema = json.loads(result.output)
    assert schema["title"] == "TeamQuota"
    assert "$defs" in schema
    bad = runner.invoke(cli, ["schema", "Nope"])
    assert bad.exit_code == 2


def _commands() -> dict[str, click.Command]:
    """Every command of ``mpigate`` (imported: the group loads them only when looked up)."""
    ctx = click.Context(cli)
    found = {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}
    assert all(command is not None for command in found.values())
    return {name: command for name, command in found.items() if command is not None}


def test_every_command_has_help_with_an_example(runner: CliRunner) -> None:
    for name, command in _commands().items():
        if hasattr(command, "commands"):
            subs = [(f"{name} {s}", [name, s]) for s in command.commands]  # type: ignore[attr-defined]
        else:
            subs = [(name, [name])]
        for label, args in subs:
            result = runner.invoke(cli, [*args, "--help"])
            assert result.exit_code == 0, label
            assert "mpigate " in result.output.split("Options:")[0], f"{label} --help shows no example"


def test_top_level_help_lists_every_command_with_its_own_short_help(runner: CliRunner) -> None:
    """``mpigate --help`` lists the commands from COMMANDS without importing them: the table must
    say what each command's own help says, at any width (an eager group is the reference)."""
    commands = _commands()
    for name, command in commands.items():
        assert command.name == name
        assert COMMANDS[name][2] == command.get_short_help_str(limit=10**6), name
    eager = click.Group(
        cli.name, commands, params=cli.params, help=cli.help, context_settings=cli.context_settings
    )
    for width in (60, 80, 100):
        lazy = runner.invoke(cli, ["--help"], terminal_width=width)
        assert lazy.exit_code == 0
        assert lazy.output == runner.invoke(eager, ["--help"], terminal_width=width).output


def test_importing_the_cli_imports_no_command(tmp_path: Path) -> None:
    """``mpigate --version`` (0.73 s with every command imported at start, issue 21) and any one
    command load only what they use: the server, controller, engine and CEL modules are imported
    by the command that runs, never by ``import mpigate.cli``."""
    probe = (
        "import sys, mpigate.cli; from mpigate._build import compiled; compiled(); "
        "print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(done.stdout.split())
    heavy = {"aiohttp", "kopf", "cel_expr_python", "yaml", "jsonschema", "cryptography", "mpigate.config"}
    heavy |= {"mpigate.policy", "mpigate.policy.engine", "mpigate.cel", "mpigate.admission", "mpigate.audit"}
    assert sorted(heavy & loaded) == []
    assert not any(name.startswith("mpigate.cli.") for name in loaded), sorted(loaded)


def test_version_and_module_entry() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mpigate", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
    assert done.stdout.startswith("mpigate, version ")


def test_scaffolded_codeowners_gives_every_path_an_owner(runner: CliRunner, tmp_path: Path) -> None:
    """Issue 18: a catch-all owner, CODEOWNERS owned by security, each folder by its concern and a
    team's own files also by the team's admins (matched as GitHub does, last line wins)."""
    target = tmp_path / "org"
    assert runner.invoke(cli, ["init", str(target), "--org", "acme", "--team", "nlp"]).exit_code == 0
    added = runner.invoke(cli, ["init", str(target), "--team", "speech", "--namespace", "speech-prod"])
    assert added.exit_code == 0, added.output
    owners = CodeOwners((target / "CODEOWNERS").read_text(encoding="utf-8"))

    def of(path: str) -> list[str]:
        return [name for _, name in owners.of(path)]

    assert of("CODEOWNERS") == ["@acme/security"]
    assert of("anything/new/file.yaml") == ["@acme/platform"]
    assert of(".mpigateignore") == ["@acme/security"]
    assert of("policies/exceptions/x.yaml") == ["@acme/security"]
    assert of("rbac/personas.yaml") == ["@acme/security"]
    assert of("quotas/flavors.yaml") == ["@acme/capacity"]
    assert of("quotas/nlp.yaml") == ["@acme/capacity", "@acme/nlp-admins"]
    assert of("rbac/speech.yaml") == ["@acme/security", "@acme/speech-admins"]
    assert of("networkpolicies/speech.yaml") == ["@acme/network", "@acme/speech-admins"]
    assert of("quotas/speech-extra.yaml") == ["@acme/capacity"]
    for file in check_tree(target).files:
        assert of(file), f"{file} has no owner"


def test_init_refuses_a_team_the_org_does_not_allow_and_writes_nothing(
    runner: CliRunner, tmp_path: Path
) -> None:
    target = tmp_path / "org"
    assert runner.invoke(cli, ["init", str(target)]).exit_code == 0
    before = {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    result = runner.invoke(cli, ["init", str(target), "--team", "speech", "--namespace", "argocd"])
    assert result.exit_code == 2  # a config error (README: exit 2)
    assert "the org does not allow team 'speech' as asked; nothing was written" in result.output
    assert "quotas/speech.yaml:7:16: spec.namespaces[0]: namespace 'argocd' is reserved" in result.output
    after = {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert after == before
