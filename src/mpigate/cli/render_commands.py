"""``mpigate render`` and ``mpigate diff``."""

from __future__ import annotations

import datetime as dt
import sys
from collections import Counter
from pathlib import Path
from typing import NoReturn

import click

from mpigate.config import Config, check_tree
from mpigate.render import (
    RenderError,
    Rendering,
    baseline_objects,
    collect_bundle,
    diff_objects,
    render,
    rendering_objects,
    write_tree,
)
from mpigate.render.concerns import Concern, changed_files, concerns

from ._output import OUTPUT_OPTION, dump, echo_config_failure

__all__ = ["diff_command", "render_command"]

_TEMPLATES_OPTION = click.option(
    "--templates",
    "template_dirs",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Extra template folder searched before the config repo's templates/ and the built-in "
    "ones (repeatable; the first given wins).",
)
_TODAY_OPTION = click.option(
    "--today",
    type=click.DateTime(formats=["%Y-%m-%d"]),
    default=None,
    help="Judge PolicyException expiry on this day (YYYY-MM-DD) instead of today (UTC).",
)


def _fail(message: str) -> NoReturn:
    click.secho(message, fg="red", err=True)
    sys.exit(2)


def _load(path: Path, command: str) -> Config:
    if not path.exists():
        _fail(f"error: {path} does not exist")
    result = check_tree(path)
    if result.config is None:
        echo_config_failure(path, result.problems, point_at=f"pass its path (`mpigate {command} PATH`)")
        sys.exit(2)
    return result.config


def _render(config: Config, template_dirs: tuple[Path, ...], today: dt.datetime | None) -> Rendering:
    try:
        rendering = render(config, template_dirs=template_dirs, today=today.date() if today else None)
    except RenderError as exc:
        for problem in exc.problems:
            click.secho(f"error: {problem}", fg="red", err=True)
        _fail(f"render failed: {len(exc.problems)} problem(s)")
    for warning in rendering.warnings:
        click.secho(f"warning: {warning}", fg="yellow", err=True)
    return rendering


def _summary(rendering: Rendering) -> dict[str, dict[str, int]]:
    """Objects by kind for each output directory."""
    by_dir: dict[str, Counter[str]] = {}
    for obj in rendering.objects:
        directory = obj.file.rpartition("/")[0]
        by_dir.setdefault(directory, Counter())[obj.key.kind] += 1
    return {
        d: dict(sorted(c.items())) for d, c in sorted(by_dir.items(), key=lambda i: (i[0] != "cluster", i[0]))
    }


@click.command("render")
@click.argument("path", default=".", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Output directory (created; a directory rendered before is replaced).",
)
@_TEMPLATES_OPTION
@_TODAY_OPTION
@click.option("--summary", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True)
def render_command(
    path: Path, out_dir: Path, template_dirs: tuple[Path, ...], today: dt.datetime | None, summary: str
) -> None:
    """Render the config tree into a kustomize tree for Argo CD / Flux.

    \b
    Writes OUT/cluster (ResourceFlavors, ClusterQueues, Cohorts, WorkloadPriorityClasses,
    persona ClusterRoles), OUT/teams/<team> (Namespaces, ResourceQuota, LimitRange, LocalQueues,
    RBAC, NetworkPolicies, alerts), OUT/mpigate (config bundle, alerts, dashboard) and a
    kustomization.yaml at each level. Templates: the config repo's templates/ overrides the
    built-in ones by relative path; --templates DIR overrides both.

    \b
    Example:
      $ mpigate render . -o deploy
      rendered revision 3299a64 into deploy: 87 objects, 33 files (33 written, 0 unchanged, 0 removed)
        cluster: 4 ClusterQueue...

    Exit status: 0 rendered, 2 config, template or output error.
    """
    config = _load(path, "render")
    rendering = _render(config, template_dirs, today)
    try:
        stats = write_tree(rendering, out_dir)
    except RenderError as exc:
        _fail("\n".join(f"error: {p}" for p in exc.problems))
    by_dir = _summary(rendering)
    if summary != "text":
        data = {
            "revision": rendering.revision,
            "out": str(out_dir),
            "objects": len(rendering.objects),
            "files": len(rendering.files),
            "written": list(stats.written),
            "unchanged": len(stats.unchanged),
            "removed": list(stats.removed),
            "kinds": by_dir,
            "warnings": list(rendering.warnings),
        }
        click.echo(dump(data, summary), nl=False)
        return
    click.echo(
        f"rendered revision {rendering.revision} into {out_dir}: {len(rendering.objects)} objects, "
        f"{len(rendering.files)} files ({len(stats.written)} written, {len(stats.unchanged)} unchanged, "
        f"{len(stats.removed)} removed)"
    )
    for directory, kinds in by_dir.items():
        click.echo(f"  {directory}: " + ", ".join(f"{n} {kind}" for kind, n in kinds.items()))


@click.command("diff")
@click.argument("path", default=".", type=click.Path(path_type=Path))
@click.option(
    "--against",
    required=True,
    metavar="GIT_REF|DIR",
    help="Compare with a directory rendered before, or with the same tree at a git revision.",
)
@_TEMPLATES_OPTION
@_TODAY_OPTION
@OUTPUT_OPTION
@click.option(
    "-U", "--unified", "context", type=click.IntRange(0), default=3, show_default=True, help="Context lines."
)
@click.option(
    "--include-revision",
    is_flag=True,
    help="Also report the config revision that the bundle carries (it differs for every commit).",
)
def diff_command(
    path: Path,
    against: str,
    template_dirs: tuple[Path, ...],
    today: dt.datetime | None,
    output: str,
    context: int,
    include_revision: bool,
) -> None:
    """Show what rendering PATH would change, object by object (for pull-request review).

    Objects are paired by apiVersion/kind/namespace/name; each added, removed or changed object
    is shown as a unified diff of its YAML. --against is a directory rendered before (e.g. the
    deploy repository) or a git revision (branch, tag or commit) of the repository that holds
    PATH, rendered with the same templates and options. In a pull-request job, fetch the base
    branch first (`git fetch origin main:refs/remotes/origin/main`): CI checkouts are often
    shallow or single-branch.

    First it lists the owners' concerns the change touches: the changed files grouped by their
    owners in CODEOWNERS (or by folder without one). Against a git ref every file of the tree
    counts and the owners are the ref's (GitHub reads the base branch's); against a rendered
    directory, the config files of its config bundle, with the tree's CODEOWNERS.

    \b
    Example (in CI for a pull request):
      $ mpigate diff . --against origin/main
      owners' concerns (2):
        @acme/capacity @acme/nlp-team-admins: quotas/nlp-team.yaml (changed)
        @acme/security: policies/exceptions/nlp-eval.yaml (added)
      ~ ClusterQueue nlp-team (kueue.x-k8s.io/v1beta2)
      --- a/cluster/clusterqueues.yaml
      +++ b/cluster/clusterqueues.yaml
      ...
      1 changed, 0 added, 0 removed

    Exit status: 0 no changes, 1 changes, 2 config, template or git error.
    """
    config = _load(path, "diff")
    rendering = _render(config, template_dirs, today)
    try:
        old = baseline_objects(
            path, against, template_dirs=template_dirs, today=today.date() if today else None
        )
    except RenderError as exc:
        _fail("\n".join(f"error: {p}" for p in exc.problems))
    changes = diff_objects(
        old, rendering_objects(rendering), context=context, ignore_revision=not include_revision
    )
    touched = _concerns(path, against, config)
    counts = Counter(c.change for c in changes)
    if output != "text":
        data = {
            "against": against,
            "revision": rendering.revision,
            "changed": counts["changed"],
            "added": counts["added"],
            "removed": counts["removed"],
            "changes": [c.to_dict() for c in changes],
            "concerns": None if touched is None else [c.to_dict() for c in touched],
        }
        click.echo(dump(data, output), nl=False)
    else:
        _echo_concerns(touched)
        marks = {"added": ("+", "green"), "removed": ("-", "red"), "changed": ("~", "yellow")}
        for change in changes:
            mark, color = marks[change.change]
            click.secho(f"{mark} {change.key}", fg=color, bold=True)
            for line in change.diff.splitlines():
                fg = "green" if line.startswith("+") else "red" if line.startswith("-") else None
                click.secho(line, fg=None if line.startswith(("+++", "---")) else fg)
        click.echo(f"{counts['changed']} changed, {counts['added']} added, {counts['removed']} removed")
    sys.exit(1 if changes else 0)


def _concerns(path: Path, against: str, config: Config) -> list[Concern] | None:
    """The owners' concerns the change touches (None when ``against`` is a rendered directory
    without a config bundle); CODEOWNERS lines skipped as invalid are warned about on stderr."""
    try:
        found = changed_files(path, against, config.files, collect_bundle(config).files)
    except RenderError as exc:
        _fail("\n".join(f"error: {p}" for p in exc.problems))
    if found is None:
        return None
    files, owners = found
    for skipped in owners.skipped if owners else ():
        click.echo(f"warning: {skipped} (skipped, as GitHub skips invalid lines)", err=True)
    return concerns(files, owners)


def _echo_concerns(touched: list[Concern] | None) -> None:
    if touched is None:
        click.echo("owners' concerns: unknown (the directory compared with carries no config bundle)")
        return
    if not touched:
        click.echo("owners' concerns: none (no file of the tree changed)")
        return
    click.secho(f"owners' concerns ({len(touched)}):", bold=True)
    for concern in touched:
        shown = ", ".join(f"{f.file} ({f.change})" for f in concern.files)
        click.echo(f"  {concern.title}: {shown}")
