"""What every cross-file rule works with: the dispatched documents, a problem collector and the
tree's name sets."""

from __future__ import annotations

import datetime as dt
import difflib
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpigate.catalogue import rule_ids
from mpigate.config.problems import PathPart, Problem, Severity, format_path
from mpigate.config.yamlsource import Document

__all__ = ["Collector", "Entry", "Tree", "check_unique", "did_you_mean", "name_of", "team_of", "where_of"]


@dataclass(frozen=True)
class Entry:
    """One config document, dispatched by kind; ``data`` has defaults applied when ``valid``."""

    kind: str
    doc: Document
    data: Any
    valid: bool = True
    builtin: bool = False


class Collector:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def error(self, entry: Entry, path: Sequence[PathPart], message: str, code: str, hint: str = "") -> None:
        self.problems.append(
            Problem(entry.doc.locate(tuple(path)), format_path(path), message, code, hint=hint)
        )

    def warning(
        self, entry: Entry, path: Sequence[PathPart], message: str, code: str, hint: str = ""
    ) -> None:
        self.problems.append(
            Problem(entry.doc.locate(tuple(path)), format_path(path), message, code, Severity.WARNING, hint)
        )

    def ref(
        self,
        entry: Entry,
        path: Sequence[PathPart],
        value: str,
        known: Iterable[str] | None,
        message: str,
        code: str,
    ) -> None:
        """A reference to something that must exist; ``known=None`` means the target document is
        missing or invalid (already reported), so the reference is not judged."""
        if known is None:
            return
        names = set(known)
        if value not in names:
            self.error(entry, path, message, code, did_you_mean(value, names))


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    options = sorted(set(choices))
    close = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    if not options:
        return ""
    shown = ", ".join(options[:8]) + (", ..." if len(options) > 8 else "")
    return f"known: {shown}"


def name_of(entry: Entry) -> str | None:
    meta = entry.data.get("metadata") if isinstance(entry.data, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def where_of(entry: Entry) -> str:
    return f"{entry.doc.file}:{entry.doc.line}"


def check_unique(
    c: Collector, entries: Iterable[Entry], key_of: Any, what: str, path: list[PathPart]
) -> None:
    seen: dict[Any, Entry] = {}
    for entry in entries:
        key = key_of(entry)
        if key is None:
            continue
        if key in seen:
            c.error(
                entry,
                path,
                f"{what} {key if isinstance(key, str) else '/'.join(str(k) for k in key if k)!s} "
                f"is defined twice (first in {where_of(seen[key])})",
                "duplicate.name",
                hint="rename or remove one of them",
            )
        else:
            seen[key] = entry


@dataclass(frozen=True)
class Tree:
    """What the cross-file rules look things up in. A name set is ``None`` when the document that
    defines it is missing or invalid: references into it are then not judged (one broken
    document must not cascade into many errors)."""

    root: Path
    org: Entry | None
    flavors_doc: Entry | None
    personas_doc: Entry | None
    profiles_doc: Entry | None
    quotas: list[Entry]
    team_names: set[str]
    today: dt.date
    #: IDs of the tree's CustomRules (overrides and exceptions may name them)
    custom_rule_ids: tuple[str, ...] = ()

    @property
    def rule_ids(self) -> tuple[str, ...]:
        """Every rule a pattern may name: the catalogue's and the tree's custom rules."""
        return (*rule_ids(), *self.custom_rule_ids)

    # Cached (the tree does not change while it is checked): rules ask once per team or exception,
    # and recomputing made a 5,000-team check quadratic.
    @functools.cached_property
    def valid_quotas(self) -> list[Entry]:
        return [e for e in self.quotas if e.valid]

    @property
    def org_spec(self) -> dict[str, Any]:
        return self.org.data["spec"] if self.org else {}

    @property
    def regions(self) -> set[str] | None:
        return set(self.org_spec["regions"]) if self.org else None

    @property
    def classifications(self) -> dict[str, Any] | None:
        return dict(self.org_spec["dataClassifications"]) if self.org else None

    @property
    def priority_classes(self) -> set[str] | None:
        return set(self.org_spec["priorityClasses"]) if self.org else None

    @property
    def approved_runtimes(self) -> set[str] | None:
        if not self.org:
            return None
        return {a if isinstance(a, str) else a["name"] for a in self.org_spec["runtimes"]["allowed"]}

    @property
    def flavors(self) -> dict[str, Any] | None:
        return dict(self.flavors_doc.data["spec"]["flavors"]) if self.flavors_doc else None

    @property
    def cohorts(self) -> set[str] | None:
        return set(self.flavors_doc.data["spec"]["cohorts"]) if self.flavors_doc else None

    @property
    def personas(self) -> set[str] | None:
        return set(self.personas_doc.data["spec"]["personas"]) if self.personas_doc else None

    @property
    def profiles(self) -> dict[str, Any] | None:
        return dict(self.profiles_doc.data["spec"]["profiles"]) if self.profiles_doc else None

    @property
    def egress_lists(self) -> set[str] | None:
        return set(self.profiles_doc.data["spec"]["egress"]) if self.profiles_doc else None

    @functools.cached_property
    def team_namespaces(self) -> dict[str, set[str]]:
        return {e.data["metadata"]["name"]: set(e.data["spec"]["namespaces"]) for e in self.valid_quotas}


def team_of(entry: Entry) -> str:
    return str(entry.data["spec"]["team"])
