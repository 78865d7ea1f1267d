"""Reading the objects a command judges (``explain``, ``review``): one loader for all of them, the
config layer's, so a broken or empty file reads the same everywhere (``file:line:col: message``),
and one rule for which documents are judged (those the install base sends to the webhooks)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mpigate.admission.client import resource_of
from mpigate.config import Document, Location, Problem, parse_file

__all__ = ["EMPTY_INPUT", "read_objects", "unrouted"]

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


def unrouted(document: Document) -> str | None:
    """Why ``document`` is not judged — the install base does not send its group and kind to the
    webhooks (a ConfigMap, a Namespace) — or None when it is judged. ``explain`` and ``review``
    judge the same documents: every version of a routed kind, so that a version mpigate does not
    understand is answered (MPG-API-001) rather than skipped."""
    data: Any = document.data
    if isinstance(data, Mapping) and resource_of(data) is not None:
        return None
    if not isinstance(data, Mapping):
        return f"skipped a {type(data).__name__} (not a Kubernetes object)"
    kind, api_version = data.get("kind"), data.get("apiVersion")
    return (
        f"skipped {kind if isinstance(kind, str) else '(no kind)'} "
        f"{api_version if isinstance(api_version, str) else '(no apiVersion)'}: mpigate's webhooks are "
        "not sent this kind (they judge trainer.kubeflow.org TrainJobs and runtimes and kubeflow.org "
        "MPIJobs, every version)"
    )
