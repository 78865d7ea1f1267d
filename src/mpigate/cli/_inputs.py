"""Reading the objects a command judges (``explain``, ``review``): one loader for all of them, the
config layer's, so a broken or empty file reads the same everywhere (``file:line:col: message``)."""

from __future__ import annotations

from pathlib import Path

from mpigate.config import Document, Location, Problem, parse_file

__all__ = ["EMPTY_INPUT", "read_objects"]

EMPTY_INPUT = "input.empty"


def read_objects(path: Path) -> tuple[list[Document], list[Problem]]:
    """The documents of one input file and its problems (syntax errors, duplicate keys, ...).

    A file without any document (empty, only comments or only ``---``) is a problem too: it was
    named to be judged, and saying nothing would read as "all allowed".
    """
    documents, problems = parse_file(str(path), display=str(path))
    if not documents and not problems:
        problems = [
            Problem(
                Location(str(path), 1, 1),
                "(document)",
                "holds no TrainJob or training runtime: the file has no YAML document at all "
                "(it is empty, or only comments and `---`)",
                EMPTY_INPUT,
                hint="check that this is the file you meant",
            )
        ]
    return documents, problems
