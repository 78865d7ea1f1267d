"""Control catalogues: SOC 2, HIPAA Security Rule, GDPR and PCI DSS v4.0.1 as data.

Each framework is a YAML file in ``controls/`` (``soc2.yaml``, ``hipaa.yaml``, ``gdpr.yaml``,
``pci-dss.yaml``). A control names the *record kinds* that evidence it; the *rules* that evidence
it are not repeated there but come from the rule catalogue (``rules.yaml`` lists the control IDs
of each rule), so the two can never disagree. ``tests/report/test_controls.py`` checks that every
control ID used in ``rules.yaml`` exists in a catalogue and that every catalogued control is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

from mpigate.catalogue import all_rules

__all__ = [
    "FRAMEWORK_FILES",
    "RECORD_KINDS",
    "Control",
    "Framework",
    "all_frameworks",
    "framework",
    "parse_frameworks",
]

# The evidence a control may name (docs/compliance.md describes each).
RECORD_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "validate": "admission decisions (mpigate validate records) on objects the control's rules judge; "
        "one per request",
        "mutate": "defaults and hardening the mutating webhook applied (mutate records; the same "
        "requests as their validate records, so shown but not added to the population)",
        "lifecycle": "job lifecycle records (admitted, started, suspended, succeeded, failed, deleted)",
        "evidence": "placement evidence (pod, node, region) written by the controller",
        "checkpoint": "signed checkpoints that certify the audit chain (tested with --key/--public-key)",
        "chain": "every record of every chain, verified (hashes, links, sequence, segments) while read",
        "config": "the config revisions in force during the period (the webhook's config records)",
        "images": "the images of admitted requests (demand.jobs[].images of validate records): the inventory",
        "k8s-activity": "API-server audit events: writes of TrainJobs and training runtimes",
        "k8s-rbac-denied": "API-server audit events: requests the authorizer refused (403, "
        "authorization forbid)",
        "k8s-workload": "API-server audit events: pods and workloads created or replaced in team "
        "namespaces, judged against the Pod Security level in force",
        "k8s-exec": "API-server audit events: exec, attach and port-forward into pods",
        "k8s-rbac-write": "API-server audit events: writes of RBAC roles and bindings",
        "k8s-secret": "API-server audit events: access to Secrets",
        "k8s-anonymous": "API-server audit events: writes by unauthenticated clients",
        "k8s-impersonation": "API-server audit events: requests made as another identity",
    }
)

# Framework name (as given to --framework) -> catalogue file.
FRAMEWORK_FILES: Mapping[str, str] = MappingProxyType(
    {"soc2": "soc2.yaml", "hipaa": "hipaa.yaml", "gdpr": "gdpr.yaml", "pci": "pci-dss.yaml"}
)
_ALIASES = {"pci-dss": "pci", "pcidss": "pci", "soc-2": "soc2"}


@dataclass(frozen=True, slots=True)
class Control:
    """One control: ``full_id`` (``SOC2-CC6.1``) is what rules.yaml uses; ``id`` (``CC6.1``) is
    what the framework calls it."""

    framework: str
    id: str
    full_id: str
    title: str
    description: str
    records: tuple[str, ...]
    gaps: str
    rules: tuple[str, ...]  # rule IDs whose catalogue entry lists full_id, in catalogue order


@dataclass(frozen=True, slots=True)
class Framework:
    name: str
    title: str
    prefix: str
    controls: tuple[Control, ...]


def _load(name: str) -> Framework:
    text = resources.files(__package__).joinpath("controls", FRAMEWORK_FILES[name]).read_text("utf-8")
    data: Mapping[str, Any] = yaml.safe_load(text)
    prefix = str(data["prefix"])
    controls: list[Control] = []
    for entry in data["controls"]:
        full_id = prefix + str(entry["id"])
        records = tuple(str(r) for r in entry.get("records", ()))
        unknown = [r for r in records if r not in RECORD_KINDS]
        if unknown:  # pragma: no cover - guarded by tests/report/test_controls.py
            raise ValueError(f"{FRAMEWORK_FILES[name]}: {full_id}: unknown record kinds {unknown}")
        rules = tuple(r.id for r in all_rules().values() if full_id in r.controls)
        controls.append(
            Control(
                framework=name,
                id=str(entry["id"]),
                full_id=full_id,
                title=str(entry["title"]),
                description=" ".join(str(entry["description"]).split()),
                records=records,
                gaps=str(entry.get("gaps", "")),
                rules=rules,
            )
        )
    if str(data["framework"]) != name:  # pragma: no cover - guarded by tests
        raise ValueError(f"{FRAMEWORK_FILES[name]} declares framework {data['framework']!r}, not {name!r}")
    return Framework(name=name, title=str(data["title"]), prefix=prefix, controls=tuple(controls))


@cache
def all_frameworks() -> Mapping[str, Framework]:
    """Every framework, by name, in a fixed order (soc2, hipaa, gdpr, pci)."""
    return MappingProxyType({name: _load(name) for name in FRAMEWORK_FILES})


def framework(name: str) -> Framework:
    """One framework by name (``soc2``, ``hipaa``, ``gdpr``, ``pci``/``pci-dss``)."""
    return all_frameworks()[_ALIASES.get(name, name)]


def parse_frameworks(values: Iterable[str]) -> tuple[str, ...]:
    """Framework names from ``--framework`` values (comma-separated, repeatable), in catalogue
    order without duplicates. Raises ValueError naming an unknown one."""
    wanted: set[str] = set()
    for value in values:
        for item in value.split(","):
            name = item.strip().lower()
            if not name:
                continue
            name = _ALIASES.get(name, name)
            if name == "all":
                wanted.update(FRAMEWORK_FILES)
            elif name not in FRAMEWORK_FILES:
                known = ", ".join([*FRAMEWORK_FILES, "all"])
                raise ValueError(f"unknown framework {item.strip()!r} (known: {known})")
            else:
                wanted.add(name)
    return tuple(name for name in FRAMEWORK_FILES if name in wanted)
