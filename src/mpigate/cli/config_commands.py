"""``mpigate check``, ``mpigate init`` and ``mpigate schema``."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from mpigate.config import KINDS, Config, Location, Problem, Severity, check_tree, is_config_tree, kind_schema
from mpigate.render import RenderError, render
from mpigate.render.backstop import backstop_problems
from mpigate.scaffold import ScaffoldError, Written, add_team, copy_example, copy_install_base, init_tree

from ._output import OUTPUT_OPTION, dump, echo_problems, not_a_tree_note

__all__ = ["check_command", "init_command", "schema_command"]


@click.command("check")
@click.argument("path", default=".", type=click.Path(path_type=Path))
@OUTPUT_OPTION
@click.option("--strict", is_flag=True, help="Treat warnings as problems (exit 1).")
def check_command(path: Path, output: str, strict: bool) -> None:
    """Validate a config tree: schemas, then cross-file rules. Reports every problem at once.

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
        }
        click.echo(dump(data, output), nl=False)
    else:
        echo_problems(result.problems)
        if not is_config_tree(result.problems):
            click.echo(not_a_tree_note(path, "pass its path (`mpigate check PATH`)"), err=True)
        config = result.config
        summary = (
            f"{len(result.errors)} error{'s' if len(result.errors) != 1 else ''}, "
            f"{len(result.warnings)} warning{'s' if len(result.warnings) != 1 else ''} "
            f"in {len(result.files)} files"
        )
        if config is not None:
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
    return backstop_problems(config, rendering)


@click.command("init")
@click.argument("directory", default=".", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--team", help="Team to create (default for a new tree: ml-team). In an existing tree: add this team."
)
@click.option("--org", default="example", show_default=True, help="Org name for a new tree.")
@click.option("--region", help="Region of the team (default: eu for a new tree, the first region otherwise).")
@click.option("--namespace", help="Namespace of a new team (default: the team name).")
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
    """
    base_only = install_base and not (team or example)  # into any directory, no tree needed
    try:
        if example:
            written = copy_example(directory, force=force)
        elif base_only:
            written = Written(())
        elif team and directory.is_dir() and _has_org(directory):
            written = add_team(directory, team, namespace=namespace, region=region, force=force)
        else:
            if namespace and namespace != (team or "ml-team"):
                raise ScaffoldError("--namespace applies when adding a team to an existing tree")
            written = init_tree(
                directory, org=org, team=team or "ml-team", region=region or "eu", force=force
            )
        if install_base:
            written = Written(written.files + copy_install_base(directory, force=force).files)
    except ScaffoldError as exc:
        raise click.ClickException(str(exc)) from None
    for path in written.files:
        click.echo(f"wrote {path}")
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
