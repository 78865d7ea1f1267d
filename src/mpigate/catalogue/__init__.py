"""The rule catalogue: stable rule IDs, titles and compliance controls (``rules.yaml``).

This is data that every layer may read: ``config`` checks that exceptions and enforcement overrides
name real rules, ``policy`` attaches titles and controls to violations, ``report`` maps controls to
evidence, and the docs have one page per rule.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

__all__ = [
    "LibraryRule",
    "RuleInfo",
    "all_rules",
    "expand_rule_pattern",
    "library_rule_ids",
    "library_rules",
    "rule",
    "rule_ids",
]


@dataclass(frozen=True, slots=True)
class RuleInfo:
    """One catalogue entry."""

    id: str
    family: str
    title: str
    applies: tuple[str, ...]
    mutates: str
    controls: tuple[str, ...]
    pss_check: str | None = None
    pss_level: str | None = None
    advisory: bool = False


@cache
def all_rules() -> Mapping[str, RuleInfo]:
    """Every rule, by ID, in catalogue order."""
    text = resources.files(__package__).joinpath("rules.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)["rules"]
    rules: dict[str, RuleInfo] = {}
    for entry in raw:
        pss = entry.get("pss") or {}
        info = RuleInfo(
            id=entry["id"],
            family=entry["family"],
            title=entry["title"],
            applies=tuple(entry["applies"]),
            mutates=entry.get("mutates", ""),
            controls=tuple(entry.get("controls", ())),
            pss_check=pss.get("check"),
            pss_level=pss.get("level"),
            advisory=bool(entry.get("advisory", False)),
        )
        if info.id in rules:  # pragma: no cover - guarded by tests/catalogue
            raise ValueError(f"duplicate rule id {info.id} in rules.yaml")
        rules[info.id] = info
    return MappingProxyType(rules)


def rule_ids() -> tuple[str, ...]:
    """All rule IDs in catalogue order."""
    return tuple(all_rules())


def rule(rule_id: str) -> RuleInfo:
    """The catalogue entry of ``rule_id`` (KeyError when unknown)."""
    return all_rules()[rule_id]


def expand_rule_pattern(pattern: str, ids: Iterable[str] | None = None) -> tuple[str, ...]:
    """Rule IDs named by ``pattern``.

    A pattern is an exact ID (``MPG-Q001``), a family prefix that ends at a dash boundary
    (``MPG-SEC`` matches ``MPG-SEC-RUNASNONROOT`` but ``MPG-Q00`` matches nothing), or a shell glob
    (``MPG-SEC-CAP*``).
    """
    candidates = tuple(ids) if ids is not None else rule_ids()
    if any(ch in pattern for ch in "*?["):
        return tuple(i for i in candidates if fnmatch.fnmatchcase(i, pattern))
    return tuple(i for i in candidates if i == pattern or i.startswith(pattern + "-"))


@dataclass(frozen=True, slots=True)
class LibraryRule:
    """A rule of the library (``library/<name>.yaml``): a CustomRule document shipped with mpigate,
    judged only where an OrgPolicy enables it (``spec.rules.library``) with its parameters."""

    name: str
    id: str
    title: str
    controls: tuple[str, ...]
    #: the CustomRule document as shipped (``spec.paramsSchema`` gives the parameters and defaults)
    document: Mapping[str, Any]


@cache
def library_rules() -> Mapping[str, LibraryRule]:
    """Every library rule, by name (the file's name without ``.yaml``), in name order."""
    folder = resources.files(__package__).joinpath("library")
    rules: dict[str, LibraryRule] = {}
    for item in sorted(folder.iterdir(), key=lambda i: i.name):
        if not item.name.endswith(".yaml"):
            continue
        document = yaml.safe_load(item.read_text(encoding="utf-8"))
        name = item.name[: -len(".yaml")]
        spec = document["spec"]
        if document["metadata"]["name"] != name:  # pragma: no cover - guarded by tests/catalogue
            raise ValueError(f"library/{item.name} names itself {document['metadata']['name']}")
        rules[name] = LibraryRule(name, spec["id"], spec["title"], tuple(spec.get("controls", ())), document)
    return MappingProxyType(rules)


def library_rule_ids() -> tuple[str, ...]:
    """The IDs of every library rule (enabled or not), in name order."""
    return tuple(r.id for r in library_rules().values())
