"""Shared output helpers: machine formats and problem lists."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from mpigate.config import Problem, Severity, is_config_tree

__all__ = ["OUTPUT_OPTION", "dump", "echo_config_failure", "echo_problems", "not_a_tree_note"]

OUTPUT_OPTION = click.option(
    "-o",
    "--output",
    "output",
    type=click.Choice(["text", "json", "yaml"]),
    default="text",
    show_default=True,
    help="Output format: human-readable text, or json/yaml for machines.",
)


def dump(data: Any, fmt: str) -> str:
    """Serialise ``data`` as JSON or YAML with stable key order."""
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n"
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def echo_problems(problems: Iterable[Problem], *, err: bool = False) -> None:
    for problem in problems:
        color = "red" if problem.severity is Severity.ERROR else "yellow"
        click.secho(str(problem), fg=color, err=err)


def not_a_tree_note(path: Path, point_at: str) -> str:
    """What to say when ``path`` holds no OrgPolicy: it is no config tree, so say where to find one.

    ``point_at`` is how this command is given a tree, e.g. ``pass one with --config PATH``.
    """
    return (
        f"{path}: not an mpigate config tree (it holds no OrgPolicy document). Run this inside your "
        f"config tree or {point_at}; `mpigate init PATH` creates a new one."
    )


def echo_config_failure(path: Path, problems: Sequence[Problem], *, point_at: str) -> None:
    """Why the config tree at ``path`` cannot be used, on stderr.

    An incomplete tree gets every problem and a pointer to `mpigate check`; a path that is no tree
    at all gets one line saying so (the kinds it lacks would only be noise) plus any problems in its
    files, which may be the reason its OrgPolicy was not recognised.
    """
    if is_config_tree(problems):
        echo_problems(problems, err=True)
        errors = sum(1 for p in problems if p.severity is Severity.ERROR)
        click.secho(
            f"{path}: the config tree has {errors} error(s); run `mpigate check {path}`", fg="red", err=True
        )
        return
    echo_problems(
        [p for p in problems if not (p.path == "(tree)" and p.code.startswith("missing."))], err=True
    )
    click.secho(not_a_tree_note(path, point_at), fg="red", err=True)
