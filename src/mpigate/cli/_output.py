"""Shared output helpers: machine formats and problem lists."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from mpigate.config import Problem, Severity

__all__ = [
    "OUTPUT_OPTION",
    "dump",
    "echo_config_failure",
    "echo_problems",
    "file_format",
    "not_a_tree_note",
]

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
    from mpigate.config import is_config_tree  # the loader: not for commands that never load a tree

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


# Words people pass to -o meaning "this format" (kubectl's convention, and mpigate's own -o on most
# commands), and file types no mpigate command writes.
_FORMAT_WORDS = frozenset(
    {"json", "jsonl", "yaml", "yml", "text", "txt", "html", "md", "markdown", "csv", "openreports", "pdf"}
)
_FOREIGN_SUFFIXES = frozenset(
    {".pdf", ".doc", ".docx", ".xls", ".xlsx", ".odt", ".ods", ".xml", ".png", ".jpg"}
)


def file_format(
    output: str,
    given: str | None,
    *,
    suffixes: Mapping[str, str],
    default: str,
    formats: Sequence[str],
) -> str:
    """The format to write the ``-o`` file in: ``--format`` when given, else the one the file's
    suffix names, else ``default``. Where ``-o`` is an output *file* (``report``, ``audit export``),
    refuse what would silently write the wrong thing: ``-o json`` (a format word, as ``-o`` means on
    other commands), a suffix that names another format than ``--format``, and a file type none of
    ``formats`` is (``.pdf``). Raises :class:`click.UsageError` naming the fix."""
    if output == "-":
        return given or default
    path = Path(output)
    choices = ", ".join(formats)
    if output.lower() in _FORMAT_WORDS and not path.exists():
        raise click.UsageError(
            f"-o names the output file here, not the format; use --format ({choices}) and -o FILE, "
            f"or -o ./{output} to write a file named {output!r}"
        )
    suffix = path.suffix.lower()
    implied = suffixes.get(suffix)
    if given is not None and implied is not None and implied != given:
        raise click.UsageError(
            f"--format {given} but -o {output} names a {implied} file; make them agree "
            f"(or leave out --format: the suffix decides)"
        )
    if implied is None and suffix in _FOREIGN_SUFFIXES:
        known = ", ".join(sorted(suffixes))
        raise click.UsageError(
            f"cannot write a {suffix} file: the formats are {choices} (--format, or a file ending in {known})"
        )
    return given or implied or default
