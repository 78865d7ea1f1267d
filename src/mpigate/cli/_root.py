"""Which config tree a command judges with when it is not told: the nearest one at or above the
working directory, else at or above the first input file, the way git finds its repository."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from mpigate.config.discovery import find_config_root

__all__ = ["config_root"]


def config_root(explicit: Path | None, inputs: Sequence[Path] = ()) -> Path:
    """``explicit`` when given; otherwise the tree found from the working directory or, outside
    any tree, from the first input file (named on stderr when it is not the working directory).
    With no tree anywhere, ``.`` (the caller's 'not an mpigate config tree' message follows)."""
    if explicit is not None:
        return explicit
    cwd = Path.cwd()
    for start in (cwd, *(p.parent for p in inputs[:1])):
        root = find_config_root(start)
        if root is not None:
            if root != cwd.resolve():
                click.echo(f"config tree: {_shown(root, cwd)}", err=True)
            return root
    return Path(".")


def _shown(path: Path, cwd: Path) -> str:
    try:
        return path.resolve().relative_to(cwd.resolve()).as_posix() or "."
    except ValueError:
        return str(path)
