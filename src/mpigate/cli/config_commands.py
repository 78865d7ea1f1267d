"""``mpigate check``, ``mpigate init`` and ``mpigate schema``."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from mpigate.config import KINDS, Config, Location, Problem, Severity, check_tree, is_config_tree, kind_schema
from mpigate.render import RenderError, render
from mpigate.render.backstop import backstop_problems
from mpigate.runtime_admission import RuntimeVerdict, judge_runtimes
from mpigate.scaffold import ScaffoldError, Written, add_team, copy_example, copy_install_base, init_tree

from ._output import OUTPUT_OPTION, dump, echo_problems, not_a_tree_note

__all__ = ["check_command", "init_command", "schema_command"]


@click.command("check")
@click.argument("path", default=".", type=click.Path(path_type=Path))
@OUTPUT_OPTION
@click.option("--strict", is_flag=True, help="Treat warnings as problems (exit 1).")
def check_command(path: Path, output: str, strict: bool) -> None:
    """Validate a config tree: schemas, then cross-file rules. Reports every problem at once.

    The tree's approved runtimes are judged as the webhook judges their installation (a CREATE);
    for each it would deny, check prints a JSONPatch that makes it compliant.

    \b
    Example:
      $ mpigate check .
      quotas/nlp-team.yaml:11:5: spec.gpus["a100-eu"].nominal: expected an integer, got string "16"
        (hint: write the number without quotes)
      1 error, 0 warnings in 16 files

    Exit status: 0 valid, 1 problems found, 2 usage error (e.g. PATH does not exist).
    """
    if not path.exists():
        raise click.BadParameter(f"{path} does not exist", param_hint="PATH")
    result = check_tree(path)
    if result.config is not None and not result.errors:
        result = dataclasses.replace(result, problems=(*result.problems, *_reliance_problems(result.config)))
    # The approved runtimes, judged by the webhook's own engine as their installation would be.
    verdicts = judge_runtimes(result.config) if result.config is not None else []
    denied = [v for v in verdicts if v.denied]
    if denied:
        result = dataclasses.replace(result, problems=(*result.problems, *map(_runtime_problem, denied)))
    failed = bool(result.errors) or (strict and bool(result.warnings))
    if output != "text":
        config = result.config
        data = {
            "ok": not failed,
            "root": str(path),
            "revision": config.revision if config else None,
            "files": list(result.files),
            "documents": result.documents,
            "teams": sorted(config.teams) if config else [],
            "builtinDefaults": list(result.builtin_defaults),
            "ignoredDocuments": list(result.ignored),
            "errors": len(result.errors),
            "warnings": len(result.warnings),
            "problems": [p.to_dict() for p in result.problems],
            "runtimes": [_runtime_data(v) for v in verdicts],
        }
        click.echo(dump(data, output), nl=False)
    else:
        echo_problems(result.problems)
        for verdict in denied:
            _echo_runtime_fix(verdict)
        if not is_config_tree(result.problems):
            click.echo(not_a_tree_note(path, "pass its path (`mpigate check PATH`)"), err=True)
        config = result.config
        summary = (
            f"{len(result.errors)} error{'s' if len(result.errors) != 1 else ''}, "
            f"{len(result.warnings)} warning{'s' if len(result.warnings) != 1 else ''} "
            f"in {len(result.files)} files"
        )
        if config is not None and not result.errors:
            teams = ", ".join(sorted(config.teams)) or "none"
            click.echo(
                f"ok: {len(config.teams)} teams ({teams}), {len(config.flavors)} GPU flavors, "
                f"{len(config.runtimes)} runtimes, {len(config.exceptions)} exceptions, "
                f"{sum(len(t.cases) for t in config.tests)} policy test cases; revision {config.revision}"
            )
            if result.builtin_defaults:
                click.echo(f"using built-in defaults for: {', '.join(result.builtin_defaults)}")
        click.echo(summary, err=failed)
    sys.exit(1 if failed else 0)


def _reliance_problems(config: Config) -> list[Problem]:
    """What the rendered tree must carry for the gate to hold (render/backstop.py): the tree is
    rendered in memory, as `mpigate render` would write it."""
    try:
        rendering = render(config)
    except RenderError as exc:
        return [
            Problem(
                Location(config.root),
                "(render)",
                f"the tree does not render, so the namespaces' labels cannot be checked: {exc}",
                "reliance.render",
                Severity.WARNING,
                "run `mpigate render` to see where",
            )
        ]
    # The objects render would write that near the API server's size limits (the config bundle
    # grows with the tree): said here, before a pull request merges, not when kubectl apply fails.
    sizes = [
        Problem(
            Location(config.root),
            "(render)",
            warning,
            "render.size",
            Severity.WARNING,
            "docs/rendering.md#the-config-bundle",
        )
        for warning in rendering.size_warnings
    ]
    return [*sizes, *backstop_problems(config, rendering)]


def _runtime_problem(verdict: RuntimeVerdict) -> Problem:
    runtime = verdict.runtime
    rules = sorted({v.rule for v in verdict.decision.violations if v.denies})
    hint = (
        "the patch below makes it compliant"
        if verdict.patch_complies
        else "the patch below fixes what it can; the rest needs a change by hand"
        if verdict.patch
        else "see the fixes below"
    )
    return Problem(
        runtime.source,
        "(runtime)",
        f"the webhook would deny installing {runtime.kind} {runtime.name} ({', '.join(rules)})",
        "runtime.denied",
        hint=hint,
    )


def _echo_runtime_fix(verdict: RuntimeVerdict) -> None:
    runtime = verdict.runtime
    click.echo(f"  {runtime.kind} {runtime.name}: what the webhook answers to its CREATE")
    for violation in verdict.decision.violations:
        if violation.denies:
            click.echo(f"    [{violation.rule}] {violation.path}: {violation.message}")
    if verdict.patch:
        state = "makes it compliant" if verdict.patch_complies else "fixes these (the engine re-judged it)"
        click.echo(f"  JSONPatch that {state} (`kubectl patch --type json`, or edit {runtime.source.file}):")
        for line in yaml.safe_dump(list(verdict.patch), sort_keys=False, width=110).splitlines():
            click.echo(f"    {line}")
    if not verdict.patch_complies:
        click.echo("  still to change by hand:")
        for violation in verdict.by_hand:
            click.echo(f"    [{violation.rule}] {violation.path}: {violation.fix or violation.message}")


def _runtime_data(verdict: RuntimeVerdict) -> dict[str, Any]:
    runtime = verdict.runtime
    return {
        "kind": runtime.kind,
        "name": runtime.name,
        "file": str(runtime.source),
        "allowed": verdict.decision.allowed,
        "violations": [v.to_dict() for v in verdict.decision.violations if v.denies],
        "patch": list(verdict.patch),
        "compliantAfterPatch": verdict.patch_complies if verdict.denied else None,
        "byHand": [v.to_dict() for v in verdict.by_hand] if verdict.denied else [],
    }


@click.command("init")
@click.argument("directory", default=".", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--team", help="Team to create (default for a new tree: ml-team). In an existing tree: add this team."
)
@click.option("--org", default="example", show_default=True, help="Org name for a new tree.")
@click.option("--region", help="Region of the team (default: eu for a new tree, the first region otherwise).")
@click.option("--namespace", help="Namespace of a new team (default: the team name).")
@click.option(
    "--gpus",
    type=click.IntRange(0),
    help="Adding a team: its nominal GPU quota (default: one node's GPUs, less when the flavor's "
    "capacity has less left).",
)
@click.option("--cohort", help="Adding a team: its Kueue cohort (default: the tree's first).")
@click.option(
    "--priority-class",
    "priority_classes",
    multiple=True,
    help="Adding a team: a priority class it may use (repeatable; default: the org's first).",
)
@click.option("--example", is_flag=True, help="Copy the full example org (three teams) instead.")
@click.option(
    "--install-base",
    is_flag=True,
    help="Write webhooks/, the kustomize base that installs the webhook and controller (without "
    "--team or --example: only that, into any directory).",
)
@click.option("--force", is_flag=True, help="Overwrite existing files.")
def init_command(
    directory: Path,
    team: str | None,
    org: str,
    region: str | None,
    namespace: str | None,
    gpus: int | None,
    cohort: str | None,
    priority_classes: tuple[str, ...],
    example: bool,
    install_base: bool,
    force: bool,
) -> None:
    """Scaffold a config tree, or add a team to one.

    \b
    Examples:
      mpigate init my-org                    # starter org + team ml-team
      mpigate init my-org --team nlp-team    # add nlp-team to an existing tree
      mpigate init demo --example            # the example org from the docs
      mpigate init my-org --install-base     # add webhooks/ (`kubectl apply -k my-org/webhooks`)

    Adding a team writes nothing unless the tree with it still passes `mpigate check` (and the
    tree must pass it before); init says what it chose (GPUs, cohort, priority classes).

    Exit status: 0 written, 2 usage or config error (nothing written).
    """
    base_only = install_base and not (team or example)  # into any directory, no tree needed
    try:
        if example:
            written = copy_example(directory, force=force)
        elif base_only:
            written = Written(())
        elif team and directory.is_dir() and _has_org(directory):
            written = add_team(
                directory,
                team,
                namespace=namespace,
                region=region,
                gpus=gpus,
                cohort=cohort,
                priority_classes=priority_classes,
                force=force,
            )
        else:
            if namespace and namespace != (team or "ml-team"):
                raise ScaffoldError("--namespace applies when adding a team to an existing tree")
            if cohort or priority_classes:
                raise ScaffoldError(
                    "--cohort and --priority-class apply when adding a team to an existing tree "
                    "(a new tree has one cohort, shared-pool, and the priority class standard)"
                )
            written = init_tree(
                directory, org=org, team=team or "ml-team", region=region or "eu", gpus=gpus, force=force
            )
        if install_base:
            written = Written(written.files + copy_install_base(directory, force=force).files)
    except ScaffoldError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)
    for path in written.files:
        click.echo(f"wrote {path}")
    if written.chosen:
        click.echo(written.chosen)
    if base_only:
        click.echo(f"install with `kubectl apply -k {directory / 'webhooks'}` (see docs/operations.md)")
        return
    result = check_tree(directory)
    echo_problems(result.problems)
    if not result.ok:  # pragma: no cover - the scaffold is tested to pass check
        raise click.ClickException("the scaffolded tree does not pass `mpigate check`; please report this")
    click.echo(f"{directory}: {len(result.files)} config files, `mpigate check` passes")


def _has_org(directory: Path) -> bool:
    result = check_tree(directory)
    return is_config_tree(result.problems)


@click.command("schema")
@click.argument("kind", required=False, type=click.Choice(KINDS, case_sensitive=False))
@click.option("--list", "list_kinds", is_flag=True, help="List the kinds.")
def schema_command(kind: str | None, list_kinds: bool) -> None:
    """Print the JSON Schema (draft 2020-12) of a config kind, for editors and yaml-language-server.

    \b
    Example (VS Code, yaml-language-server):
      mpigate schema TeamQuota > .schemas/teamquota.json
      # then in quotas/nlp-team.yaml:
      # yaml-language-server: $schema=../.schemas/teamquota.json
    """
    if list_kinds or kind is None:
        for name in KINDS:
            click.echo(name)
        return
    canonical = next(k for k in KINDS if k.lower() == kind.lower())
    click.echo(json.dumps(kind_schema(canonical), indent=2))
