"""Which files make up a config tree."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

__all__ = [
    "IGNORE_FILE",
    "TOP_LEVEL_EXCLUDES",
    "discover",
    "find_config_root",
    "holds_org_policy",
    "is_tree_root",
]

# Folders at the top of a config repository that hold things other than config: example objects,
# Jinja templates, the install base, code, tests, build output. Config is recognised by
# apiVersion/kind, so an admin may reorganise everything else freely.
TOP_LEVEL_EXCLUDES = frozenset(
    {
        "examples",
        "templates",
        "webhooks",
        "tests",
        "docs",
        "benchmarks",
        "build",
        "deploy",
        "dist",
        "src",
        "node_modules",
        "venv",
    }
)
IGNORE_FILE = ".mpigateignore"
_SUFFIXES = (".yaml", ".yml")


def _read_ignore(root: Path) -> list[str]:
    try:
        text = (root / IGNORE_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            patterns.append(line.rstrip("/"))
    return patterns


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pattern in patterns:
        anchored = pattern.startswith("/")
        pat = pattern.lstrip("/")
        if fnmatch.fnmatchcase(rel, pat):
            return True
        # a pattern also ignores everything below a matching directory
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatchcase(prefix, pat) or (
                not anchored and "/" not in pat and fnmatch.fnmatchcase(parts[i - 1], pat)
            ):
                return True
        if not anchored and "/" not in pat and fnmatch.fnmatchcase(parts[-1], pat):
            return True
    return False


def discover(root: Path) -> list[Path]:
    """YAML files of the tree at ``root`` (or ``[root]`` when it is a file), sorted.

    Skipped: hidden files and folders (including ConfigMap mounts' ``..data``), the top-level
    folders in :data:`TOP_LEVEL_EXCLUDES` (unless ``root`` itself is such a folder), and paths
    matching ``.mpigateignore`` (gitignore-like globs, one per line).
    """
    if root.is_file():
        return [root]
    patterns = _read_ignore(root)
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        keep = []
        for d in sorted(dirnames):
            if d.startswith("."):
                continue
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            if rel_dir == "." and d in TOP_LEVEL_EXCLUDES:
                continue
            if _ignored(rel, patterns):
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            if name.startswith(".") or not name.endswith(_SUFFIXES):
                continue
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if _ignored(rel, patterns):
                continue
            found.append(here / name)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


# A line "kind: OrgPolicy" at the start of a line (a document's top level) in a file that names
# mpigate's API group: cheap enough to run on every YAML file of a few directories.
_ORG_POLICY = re.compile(r"^kind:[ \t]*[\"']?OrgPolicy[\"']?[ \t]*(#.*)?$", re.MULTILINE)
_SNIFF_BYTES = 1 << 20


def holds_org_policy(file: Path) -> bool:
    """Whether the YAML file ``file`` holds an mpigate OrgPolicy document (a textual sniff)."""
    try:
        with file.open("rb") as handle:
            text = handle.read(_SNIFF_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return False
    return "mpigate.io/" in text and _ORG_POLICY.search(text) is not None


def _yaml_files(directory: Path) -> list[Path]:
    try:
        return sorted(
            p for p in directory.iterdir() if p.name.endswith(_SUFFIXES) and not p.name.startswith(".")
        )
    except OSError:
        return []


def is_tree_root(directory: Path) -> bool:
    """Whether ``directory`` is the root of a config tree: an OrgPolicy in one of its own YAML
    files (a single-file bundle, a flat tree) or in ``policies/`` right below it (the layout
    ``mpigate init`` writes). Deeper OrgPolicies make deeper roots: a directory holding trees is
    not one."""
    return any(holds_org_policy(f) for f in (*_yaml_files(directory), *_yaml_files(directory / "policies")))


def find_config_root(start: Path) -> Path | None:
    """The config tree at or above ``start`` (a directory, or a file's directory), as git finds
    the repository a command runs in; None when there is none up to ``/``.

    The nearest directory that looks like a root is taken, and then its parents as long as they
    look like one too: ``policies/`` holding ``org.yaml`` is part of the tree above it.
    """
    here = start.resolve()
    if not here.is_dir():
        here = here.parent
    found: Path | None = None
    for directory in (here, *here.parents):
        if is_tree_root(directory):
            found = directory
        elif found is not None:
            break
    return found
