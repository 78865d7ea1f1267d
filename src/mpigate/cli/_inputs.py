"""Reading the objects a command judges (``explain``, ``review``): one loader for all of them, the
config layer's, so a broken file reads the same everywhere (``file:line:col: message``)."""

from __future__ import annotations

from pathlib import Path

from mpigate.config import Document, Problem, parse_file

__all__ = ["read_objects"]


def read_objects(path: Path) -> tuple[list[Document], list[Problem]]:
    """The documents of one input file and its problems (syntax errors, duplicate keys, ...)."""
    return parse_file(str(path), display=str(path))
