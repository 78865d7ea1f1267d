"""Which owners' concerns a pull request touches, for ``mpigate diff``.

The config tree is owned per concern through CODEOWNERS, and ``mpigate check`` keeps each kind in
its owners' folder. A reviewer still has to notice when a pull request that looks like a team's
quota change also touches another concern; this lists the changed files of the tree grouped by
the owners CODEOWNERS gives them (as GitHub matches it: the last matching line wins), or by
top-level folder when the tree has no CODEOWNERS.

Against a git ref the whole tree is compared (what ``git`` would commit: tracked and untracked,
not ignored), and the owners are those of the ref's CODEOWNERS, as GitHub takes them from the pull
request's base branch: a pull request that rewrites CODEOWNERS does not choose its own reviewers.
Against a rendered directory only the config files its config bundle carries are compared, with
the tree's own CODEOWNERS (a rendering has none). Lines GitHub would skip as invalid are skipped
and named.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from codeowners import CodeOwners

from mpigate.config.bundle import bundle_files

from .bundle import bundle_key
from .diff import _git, git_tree
from .manifests import FastLoader

__all__ = [
    "CODEOWNERS_PATHS",
    "Concern",
    "FileChange",
    "Owners",
    "changed_files",
    "concerns",
    "read_codeowners",
]

# Where GitHub looks for the file, in its order (GitLab: the same places).
CODEOWNERS_PATHS = (".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS")
_BUNDLE_FILE = Path("mpigate") / "config-bundle.yaml"

Change = Literal["added", "removed", "changed"]


@dataclass(frozen=True)
class FileChange:
    file: str
    change: Change


@dataclass(frozen=True)
class Concern:
    """Changed files with the same owners; ``owners`` is empty for files CODEOWNERS gives nobody,
    ``folder`` names the group when the tree has no CODEOWNERS."""

    owners: tuple[str, ...]
    folder: str | None
    files: tuple[FileChange, ...]

    @property
    def title(self) -> str:
        if self.folder is not None:
            return f"{self.folder} (no CODEOWNERS)"
        return " ".join(self.owners) or "no owner in CODEOWNERS"

    def to_dict(self) -> dict[str, Any]:
        return {
            "owners": list(self.owners),
            "folder": self.folder,
            "files": [{"file": f.file, "change": f.change} for f in self.files],
        }


@dataclass(frozen=True)
class Owners:
    """A CODEOWNERS file: its rules, the tree's folder inside the repository its patterns are
    relative to (``""`` or ``"config/"``), and the lines skipped as invalid (``file:line: why``)."""

    rules: CodeOwners
    prefix: str
    skipped: tuple[str, ...]

    def of(self, file: str) -> tuple[str, ...]:
        """The owners of ``file`` (relative to the tree)."""
        return tuple(owner for _, owner in self.rules.of(self.prefix + file))


def _parse(text: str, where: str) -> tuple[CodeOwners, tuple[str, ...]]:
    """CODEOWNERS rules; a line that does not parse is skipped, as GitHub skips invalid lines."""
    kept: list[str] = []
    skipped: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            CodeOwners(line)
        except ValueError as exc:
            skipped.append(f"{where}:{number}: {exc}")
            line = ""
        kept.append(line)
    return CodeOwners("\n".join(kept)), tuple(skipped)


def read_codeowners(root: Path, tree: str = "") -> Owners | None:
    """The CODEOWNERS of the repository checked out at ``root`` where GitHub looks for it, the
    config tree lying at ``tree`` inside it (``"config/"``, or ``""``); failing that, one kept in the
    tree's own folder (patterns relative to the tree). None without either."""
    places = [(root, tree)] + ([(root / tree, "")] if tree else [])
    for base, prefix in places:
        for rel in CODEOWNERS_PATHS:
            try:
                text = (base / rel).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            rules, skipped = _parse(text, rel if base is root else tree + rel)
            return Owners(rules, prefix, skipped)
    return None


def _compare(old: Mapping[str, bytes], new: Mapping[str, bytes]) -> list[FileChange]:
    out = []
    for rel in sorted(old.keys() | new.keys()):
        if rel not in old:
            out.append(FileChange(rel, "added"))
        elif rel not in new:
            out.append(FileChange(rel, "removed"))
        elif old[rel] != new[rel]:
            out.append(FileChange(rel, "changed"))
    return out


def _read_files(root: Path, rels: Iterable[str]) -> dict[str, bytes]:
    out = {}
    for rel in rels:
        path = root / rel
        if path.is_file() and not path.is_symlink():
            out[rel] = path.read_bytes()
    return out


def _git_files(tree: Path) -> dict[str, bytes]:
    """The files of ``tree`` (inside a git work tree) that git would see: tracked and untracked but
    not ignored, relative to ``tree``."""
    listed = _git(tree, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".")
    return _read_files(tree, (name for name in listed.decode("utf-8", "replace").split("\0") if name))


def _extracted_files(tree: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _, filenames in os.walk(tree):
        for name in filenames:
            path = Path(dirpath) / name
            out[path.relative_to(tree).as_posix()] = path.read_bytes()
    return out


def _bundle_data(directory: Path) -> dict[str, bytes] | None:
    try:
        documents = list(
            yaml.load_all((directory / _BUNDLE_FILE).read_text(encoding="utf-8"), Loader=FastLoader)
        )
    except (OSError, yaml.YAMLError):
        return None
    for doc in documents:
        files = bundle_files(doc) if isinstance(doc, dict) and doc.get("kind") == "ConfigMap" else None
        if files is not None:  # plain keys or the compressed archive
            return {k: v.encode("utf-8") for k, v in files.items() if not k.startswith(".")}
    return None


def changed_files(
    path: str | os.PathLike[str], against: str, config_files: Iterable[str], bundle: Mapping[str, str]
) -> tuple[list[FileChange], Owners | None] | None:
    """Files of the tree at ``path`` that differ from ``against`` and the owners to group them by:
    a git ref (the whole tree; that ref's CODEOWNERS), or a rendered directory whose config bundle
    is compared with ``bundle`` (this tree's, rendered now; ``config_files`` name its keys' files;
    the tree's CODEOWNERS). None when that directory carries no config bundle."""
    tree = Path(path)
    base = tree if tree.is_dir() else tree.parent
    if Path(against).is_dir():
        old = _bundle_data(Path(against))
        if old is None:
            return None
        new = {k: v.encode("utf-8") for k, v in bundle.items() if not k.startswith(".")}
        files = {bundle_key(rel): rel for rel in config_files}
        changes = [
            FileChange(files.get(c.file, c.file.replace("__", "/")), c.change) for c in _compare(old, new)
        ]
        return changes, read_codeowners(base)
    with git_tree(path, against) as (old_tree, _):
        old_base = old_tree if tree.is_dir() else old_tree.parent
        old_files = _extracted_files(old_base) if old_base.is_dir() else {}
        # the tree's folder in the repository (``org/``): the checkout of the ref is that far up
        prefix = _git(base, "rev-parse", "--show-prefix").decode("utf-8", "replace").strip()
        old_top = old_base
        for _ in Path(prefix).parts:
            old_top = old_top.parent
        owners = read_codeowners(old_top, prefix)
    return _compare(old_files, _git_files(base)), owners


def concerns(files: Iterable[FileChange], owners: Owners | None) -> list[Concern]:
    """``files`` grouped by their owners (or top-level folder without CODEOWNERS), in order of
    first appearance."""
    groups: dict[tuple[tuple[str, ...], str | None], list[FileChange]] = {}
    for change in files:
        if owners is not None:
            key: tuple[tuple[str, ...], str | None] = (owners.of(change.file), None)
        else:
            head, sep, _ = change.file.partition("/")
            key = ((), f"{head}/" if sep else "(root)")
        groups.setdefault(key, []).append(change)
    return [Concern(who, folder, tuple(found)) for (who, folder), found in groups.items()]
