"""Shared output helpers: machine formats and problem lists."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import click
import yaml

from mpigate.config import Problem, Severity

__all__ = ["OUTPUT_OPTION", "dump", "echo_problems"]

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
