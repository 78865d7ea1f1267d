"""Ownership: each kind only in its owners' folder, and a team's file speaks only for its team.

The tree is owned per concern through CODEOWNERS (security owns ``policies/`` and ``rbac/``, the
capacity team ``quotas/``, each team's admins their own team files). That only protects something
if a document counts where its owners keep it: a ``PolicyException`` appended to a team's quota
file, a ``Personas`` document in a team's access file or a runtime in a new folder would
otherwise be read like any other. ``OrgPolicy.spec.layout`` says which folder keeps which kinds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import Collector, Entry, Tree

__all__ = ["TEAM_KINDS", "check_ownership", "layout_applies", "owning_folder"]

# Kinds that belong to one team, and where each names it.
TEAM_KINDS: Mapping[str, tuple[str, ...]] = {
    "TeamQuota": ("metadata", "name"),
    "TeamAccess": ("spec", "team"),
    "TeamNetwork": ("spec", "team"),
}
_SUFFIXES = (".yaml", ".yml")
# A rendered config bundle carries its revision in this file (mpigate.config.loader.REVISION_FILE;
# not imported: the loader imports this package); a mounted ConfigMap has the kubelet's ..data link.
_BUNDLE_MARKERS = (".mpigate-revision", "..data")


def layout_applies(root: Path, files: Iterable[str]) -> bool:
    """Whether the tree at ``root`` has folders to judge: not a single file (one file has one
    owner) and not a rendered config bundle, which is flat (``policies__org.yaml``) and made by
    ``render`` from a tree that passed ``check`` (it has a revision file, or is a mounted
    ConfigMap). Those marks alone do not make a bundle: a tree with folders is judged whatever else
    it holds."""
    if not root.is_dir():
        return False
    mounted = any((root / marker).exists() for marker in _BUNDLE_MARKERS)
    return not (mounted and all("/" not in f for f in files))


def owning_folder(file: str, layout: Mapping[str, Sequence[str]]) -> str | None:
    """The most specific folder of ``layout`` that holds ``file`` (a path relative to the root)."""
    best: str | None = None
    for folder in layout:
        if file.startswith(folder + "/") and (best is None or len(folder) > len(best)):
            best = folder
    return best


def _team_of_file(file: str, folder: str, teams: set[str]) -> str | None:
    """The team whose file ``file`` is: ``<folder>/<team>.yaml`` or anything under
    ``<folder>/<team>/``, for a team that exists."""
    rest = file[len(folder) + 1 :]
    head, sep, _ = rest.partition("/")
    if not sep:
        head = next((head[: -len(s)] for s in _SUFFIXES if head.endswith(s)), head)
    return head if head in teams else None


def _named_team(entry: Entry) -> str | None:
    value: Any = entry.data
    for key in TEAM_KINDS[entry.kind]:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) else None


def _where_kept(kind: str, layout: Mapping[str, Sequence[str]]) -> str:
    folders = [f"{folder}/" for folder, kinds in layout.items() if kind in kinds]
    if not folders:
        return "nowhere: the layout (OrgPolicy spec.layout) lists it in no folder"
    return " or ".join(folders)


def check_ownership(c: Collector, tree: Tree, entries: Iterable[Entry]) -> None:
    """Every document in a folder that keeps its kind; team kinds in their own team's file, and
    nothing org-wide in a team's file."""
    if tree.org is None:
        return  # no (valid) OrgPolicy, no layout to judge by: already an error
    real = [e for e in entries if not e.builtin]
    if not layout_applies(tree.root, (e.doc.file for e in real)):
        return
    layout: Mapping[str, Sequence[str]] = tree.org_spec["layout"]
    team_folders = {f for f, kinds in layout.items() if any(k in TEAM_KINDS for k in kinds)}
    for entry in real:
        file = entry.doc.file
        folder = owning_folder(file, layout)
        kept = _where_kept(entry.kind, layout)
        if folder is None:
            c.error(
                entry,
                ["kind"],
                f"{entry.kind} is kept in {kept}; {file} is in no folder of the layout",
                "ownership.folder",
                "move it to its owners' folder (CODEOWNERS gives each folder its reviewers)",
            )
            continue
        if entry.kind not in layout[folder]:
            c.error(
                entry,
                ["kind"],
                f"{entry.kind} is kept in {kept}, not in {folder}/ "
                f"({folder}/ holds {', '.join(layout[folder]) or 'nothing'})",
                "ownership.folder",
                "move it to its owners' folder (CODEOWNERS gives each folder its reviewers)",
            )
            continue
        if not entry.valid:
            continue  # its names may be what is wrong (already reported)
        file_team = _team_of_file(file, folder, tree.team_names) if folder in team_folders else None
        if entry.kind in TEAM_KINDS:
            team = _named_team(entry)
            if team is None or team == file_team or team not in tree.team_names:
                continue  # a team that does not exist is reported as such (ref.team)
            whose = f"{file} is team {file_team}'s file" if file_team else f"{file} is no team's file"
            c.error(
                entry,
                list(TEAM_KINDS[entry.kind]),
                f"a {entry.kind} for team {team} is kept in {folder}/{team}.yaml or {folder}/{team}/; "
                f"{whose}",
                "ownership.team",
                "a team's file speaks only for that team: move the document to the team's own file",
            )
        elif file_team is not None:
            c.error(
                entry,
                ["kind"],
                f"{entry.kind} is org-wide and cannot be kept in team {file_team}'s file "
                f"{file} (the team's admins may edit it)",
                "ownership.team-file",
                f"keep it in {folder}/ in a file that is named after no team "
                f"(e.g. {folder}/{entry.kind.lower()}.yaml)",
            )
