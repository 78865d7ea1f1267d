"""Writing a :class:`Rendering` to a directory, and reading a rendered directory back.

The output directory is owned by mpigate: a render replaces its whole content, so that a team or
template that disappears from the config also disappears from what Argo CD / Flux apply. To keep
that from ever deleting someone else's files, a non-empty directory is only written into when it
carries the marker file of an earlier render. Hidden entries (``.git`` of a deploy repository) are
left alone. Unchanged files are not rewritten.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import RenderError, RenderProblem
from .manifests import KUSTOMIZATION_KIND, load_documents
from .renderer import MARKER_FILE, Rendering

__all__ = ["WriteStats", "read_objects", "write_tree"]


@dataclass(frozen=True)
class WriteStats:
    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]


def _visible_files(root: Path) -> list[str]:
    found = []
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for filename in sorted(filenames):
            if filename.startswith("."):
                continue
            found.append((Path(directory) / filename).relative_to(root).as_posix())
    return found


def write_tree(rendering: Rendering, out_dir: str | os.PathLike[str]) -> WriteStats:
    """Make ``out_dir`` hold exactly ``rendering.files`` (hidden entries aside)."""
    root = Path(out_dir)
    if root.exists() and not root.is_dir():
        raise RenderError((RenderProblem(str(root), 0, "output path exists and is not a directory"),))
    existing = _visible_files(root) if root.is_dir() else []
    if existing and not (root / MARKER_FILE).is_file():
        raise RenderError(
            (
                RenderProblem(
                    str(root),
                    0,
                    f"refusing to replace the content of a non-empty directory without {MARKER_FILE} "
                    "(it was not written by mpigate render); choose an empty or new directory",
                ),
            )
        )
    written, unchanged = [], []
    existed: dict[Path, bool] = {}  # directory → did it exist before this write
    for rel, text in rendering.files.items():
        path = root / rel
        data = text.encode("utf-8")
        try:
            if path.parent not in existed:
                existed[path.parent] = path.parent.is_dir()
                path.parent.mkdir(parents=True, exist_ok=True)
            if existed[path.parent] and path.is_file() and path.read_bytes() == data:
                unchanged.append(rel)
                continue
            # write then rename: a GitOps agent reading the tree never sees half a file
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            raise RenderError((RenderProblem(str(path), 0, f"cannot write: {exc.strerror}"),)) from None
        written.append(rel)
    removed = []
    for rel in existing:
        if rel not in rendering.files:
            (root / rel).unlink()
            removed.append(rel)
    # drop the directories that the removals emptied, deepest first
    emptied = {
        parent
        for rel in removed
        for parent in (root / rel).parents
        if parent != root and root in parent.parents
    }
    for directory in sorted(emptied, key=lambda p: -len(p.parts)):
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    return WriteStats(tuple(written), tuple(unchanged), tuple(removed))


def objects_in_files(files: Iterable[tuple[str, str]]) -> list[tuple[str, dict[str, object]]]:
    """The Kubernetes objects in (relative path, YAML text) pairs, skipping kustomizations and
    files that are not YAML. Raises :class:`RenderError` naming every file that does not parse."""
    out: list[tuple[str, dict[str, object]]] = []
    problems = []
    for rel, text in files:
        if not rel.endswith((".yaml", ".yml")):
            continue
        try:
            documents = load_documents(text)
        except yaml.YAMLError as exc:
            problems.append(RenderProblem(rel, 0, f"cannot read: {exc}"))
            continue
        for doc in documents:
            if isinstance(doc, dict) and doc.get("kind") != KUSTOMIZATION_KIND and "metadata" in doc:
                out.append((rel, doc))
    if problems:
        raise RenderError(tuple(problems))
    return out


def read_objects(directory: str | os.PathLike[str]) -> list[tuple[str, dict[str, object]]]:
    """The Kubernetes objects of a rendered (or any kustomize-style) directory as (file, object),
    skipping kustomization files and hidden entries."""
    root = Path(directory)
    texts: list[tuple[str, str]] = []
    problems = []
    for rel in _visible_files(root):
        if not rel.endswith((".yaml", ".yml")):
            continue
        try:
            texts.append((rel, (root / rel).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(RenderProblem(str(root / rel), 0, f"cannot read: {exc}"))
    if problems:
        raise RenderError(tuple(problems))
    return objects_in_files(texts)
