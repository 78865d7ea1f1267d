"""Rules that span documents: references, uniqueness, capacity, expiry (CONFIG.md)."""

from __future__ import annotations

import datetime as dt
import difflib
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpigate.catalogue import expand_rule_pattern, rule_ids

from .problems import Location, PathPart, Problem, Severity, format_path
from .units import parse_duration
from .yamlsource import Document, parse_file

__all__ = ["SYSTEM_NAMESPACES", "Entry", "cross_file_problems"]

# Namespaces no team may claim: the cluster's own and mpigate's.
SYSTEM_NAMESPACES = frozenset(
    {
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "mpigate-system",
        "kueue-system",
        "kubeflow-system",
        "cert-manager",
    }
)
_SYSTEM_PREFIXES = ("kube-", "openshift", "mpigate-")


@dataclass(frozen=True)
class Entry:
    """One config document, dispatched by kind; ``data`` has defaults applied when ``valid``."""

    kind: str
    doc: Document
    data: Any
    valid: bool = True
    builtin: bool = False


class _Collector:
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


def _did_you_mean(value: str, choices: Iterable[str]) -> str:
    options = sorted(set(choices))
    close = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    if not options:
        return ""
    shown = ", ".join(options[:8]) + (", ..." if len(options) > 8 else "")
    return f"known: {shown}"


def _name(entry: Entry) -> str | None:
    meta = entry.data.get("metadata") if isinstance(entry.data, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def _where(entry: Entry) -> str:
    return f"{entry.doc.file}:{entry.doc.line}"


def _singleton(c: _Collector, entries: list[Entry], kind: str, required: bool, root: Path) -> Entry | None:
    real = [e for e in entries if not e.builtin]
    if not entries:
        if required:
            c.problems.append(
                Problem(
                    Location(str(root)),
                    "(tree)",
                    f"no {kind} document found",
                    f"missing.{kind}",
                    hint=f"add one (see `mpigate init` or `mpigate schema {kind}`)",
                )
            )
        return None
    for extra in real[1:]:
        c.error(
            extra,
            ["kind"],
            f"a second {kind}; exactly one is allowed (first in {_where(real[0])})",
            f"duplicate.{kind}",
            hint="merge the two documents",
        )
    first = entries[0]
    return first if first.valid else None


def _check_unique(
    c: _Collector, entries: Iterable[Entry], key_of: Any, what: str, path: list[PathPart]
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
                f"is defined twice (first in {_where(seen[key])})",
                "duplicate.name",
                hint="rename or remove one of them",
            )
        else:
            seen[key] = entry


def _is_system_namespace(ns: str) -> bool:
    return ns in SYSTEM_NAMESPACES or ns.startswith(_SYSTEM_PREFIXES)


def cross_file_problems(
    by_kind: Mapping[str, list[Entry]], root: Path, today: dt.date | None = None
) -> list[Problem]:
    """Every cross-file problem of a tree whose documents are grouped by kind.

    ``today`` (UTC) decides which exceptions have expired; tests pin it.
    """
    c = _Collector()
    org = _singleton(c, list(by_kind.get("OrgPolicy", [])), "OrgPolicy", True, root)
    flavors_doc = _singleton(c, list(by_kind.get("GPUFlavors", [])), "GPUFlavors", True, root)
    personas_doc = _singleton(c, list(by_kind.get("Personas", [])), "Personas", False, root)
    profiles_doc = _singleton(c, list(by_kind.get("NetworkProfiles", [])), "NetworkProfiles", False, root)

    quotas = list(by_kind.get("TeamQuota", []))
    team_names = {n for n in (_name(e) for e in quotas) if n}
    valid_quotas = [e for e in quotas if e.valid]

    regions: set[str] = set(org.data["spec"]["regions"]) if org else set()
    classifications: dict[str, Any] = dict(org.data["spec"]["dataClassifications"]) if org else {}
    priority_classes: set[str] = set(org.data["spec"]["priorityClasses"]) if org else set()
    flavors: dict[str, Any] = dict(flavors_doc.data["spec"]["flavors"]) if flavors_doc else {}
    cohorts: set[str] = set(flavors_doc.data["spec"]["cohorts"]) if flavors_doc else set()
    personas: set[str] = set(personas_doc.data["spec"]["personas"]) if personas_doc else set()
    profiles: dict[str, Any] = dict(profiles_doc.data["spec"]["profiles"]) if profiles_doc else {}
    egress_lists: set[str] = set(profiles_doc.data["spec"]["egress"]) if profiles_doc else set()
    known_rules = rule_ids()

    # ---------------------------------------------------------------- OrgPolicy
    if org:
        spec = org.data["spec"]
        for name, cls in classifications.items():
            for i, region in enumerate(cls.get("regions") or ()):
                if region not in regions:
                    c.error(
                        org,
                        ["spec", "dataClassifications", name, "regions", i],
                        f"region {region!r} is not defined in spec.regions",
                        "ref.region",
                        _did_you_mean(region, regions),
                    )
            profile = cls.get("networkProfile")
            if profile and profiles_doc and profile not in profiles:
                c.error(
                    org,
                    ["spec", "dataClassifications", name, "networkProfile"],
                    f"network profile {profile!r} does not exist",
                    "ref.profile",
                    _did_you_mean(profile, profiles),
                )
        for pattern in spec["enforcement"]["overrides"]:
            if not expand_rule_pattern(pattern, known_rules):
                c.error(
                    org,
                    ["spec", "enforcement", "overrides", pattern],
                    f"{pattern!r} names no rule",
                    "ref.rule",
                    _did_you_mean(pattern, known_rules),
                )
        life = spec["lifecycle"]
        if (
            "maxRuntime" in life
            and "defaultRuntime" in life
            and parse_duration(life["defaultRuntime"]) > parse_duration(life["maxRuntime"])
        ):
            c.error(
                org,
                ["spec", "lifecycle", "defaultRuntime"],
                f"defaultRuntime {life['defaultRuntime']} exceeds maxRuntime {life['maxRuntime']}",
                "value.runtime",
                "make defaultRuntime at most maxRuntime",
            )
        for i, allowed in enumerate(spec["runtimes"]["allowed"]):
            if isinstance(allowed, dict):
                for j, team in enumerate(allowed.get("teams") or ()):
                    if team not in team_names:
                        c.error(
                            org,
                            ["spec", "runtimes", "allowed", i, "teams", j],
                            f"team {team!r} does not exist",
                            "ref.team",
                            _did_you_mean(team, team_names),
                        )

    # ---------------------------------------------------------------- GPUFlavors
    if flavors_doc and org:
        for name, flavor in flavors.items():
            if flavor["region"] not in regions:
                c.error(
                    flavors_doc,
                    ["spec", "flavors", name, "region"],
                    f"region {flavor['region']!r} is not defined in the OrgPolicy",
                    "ref.region",
                    _did_you_mean(flavor["region"], regions),
                )

    # ---------------------------------------------------------------- TeamQuota
    _check_unique(c, quotas, _name, "team", ["metadata", "name"])
    claimed: dict[str, tuple[str, Entry]] = {}
    nominal_by_flavor: dict[str, list[tuple[Entry, int]]] = {}
    for entry in valid_quotas:
        team = entry.data["metadata"]["name"]
        spec = entry.data["spec"]
        for i, ns in enumerate(spec["namespaces"]):
            if _is_system_namespace(ns):
                c.error(
                    entry,
                    ["spec", "namespaces", i],
                    f"namespace {ns!r} is a system namespace",
                    "value.system-namespace",
                    "teams may not claim cluster or mpigate namespaces",
                )
            if ns in claimed and claimed[ns][0] != team:
                other, other_entry = claimed[ns]
                c.error(
                    entry,
                    ["spec", "namespaces", i],
                    f"namespace {ns!r} is already claimed by team {other!r} ({_where(other_entry)})",
                    "conflict.namespace",
                    "a namespace belongs to exactly one team",
                )
            else:
                claimed.setdefault(ns, (team, entry))
        if org and spec["region"] not in regions:
            c.error(
                entry,
                ["spec", "region"],
                f"region {spec['region']!r} is not defined in the OrgPolicy",
                "ref.region",
                _did_you_mean(spec["region"], regions),
            )
        if spec.get("cohort") and flavors_doc and spec["cohort"] not in cohorts:
            c.error(
                entry,
                ["spec", "cohort"],
                f"cohort {spec['cohort']!r} is not listed in GPUFlavors.spec.cohorts",
                "ref.cohort",
                _did_you_mean(spec["cohort"], cohorts),
            )
        for flavor_name, quota in spec["gpus"].items():
            if flavors_doc and flavor_name not in flavors:
                c.error(
                    entry,
                    ["spec", "gpus", flavor_name],
                    f"GPU flavor {flavor_name!r} does not exist",
                    "ref.flavor",
                    _did_you_mean(flavor_name, flavors),
                )
                continue
            if flavors_doc:
                flavor = flavors[flavor_name]
                if flavor["region"] != spec["region"]:
                    c.error(
                        entry,
                        ["spec", "gpus", flavor_name],
                        f"flavor {flavor_name!r} is in region {flavor['region']!r}, "
                        f"but the team is in {spec['region']!r}",
                        "conflict.region",
                        "use a flavor of the team's region",
                    )
                nominal_by_flavor.setdefault(flavor_name, []).append((entry, quota["nominal"]))
            lending = quota.get("lendingLimit")
            if lending is not None and lending > quota["nominal"]:
                c.error(
                    entry,
                    ["spec", "gpus", flavor_name, "lendingLimit"],
                    f"lendingLimit {lending} exceeds nominal {quota['nominal']}",
                    "value.lending",
                )
            if (quota["borrowingLimit"] or lending is not None) and not spec.get("cohort"):
                c.warning(
                    entry,
                    ["spec", "gpus", flavor_name],
                    "borrowing and lending only work inside a cohort",
                    "value.no-cohort",
                    "set spec.cohort or drop borrowingLimit/lendingLimit",
                )
        if spec.get("maxStoredJobs", spec["maxConcurrentJobs"]) < spec["maxConcurrentJobs"]:
            c.error(
                entry,
                ["spec", "maxStoredJobs"],
                f"maxStoredJobs {spec['maxStoredJobs']} is below "
                f"maxConcurrentJobs {spec['maxConcurrentJobs']}",
                "value.stored-jobs",
                "finished TrainJobs count against maxStoredJobs until deleted; make it larger",
            )
        for i, pc in enumerate(spec["priorityClasses"]):
            if org and pc not in priority_classes:
                c.error(
                    entry,
                    ["spec", "priorityClasses", i],
                    f"priority class {pc!r} is not defined in the OrgPolicy",
                    "ref.priority-class",
                    _did_you_mean(pc, priority_classes),
                )
        for i, cls in enumerate(spec.get("dataClassifications") or ()):
            if org and cls not in classifications:
                c.error(
                    entry,
                    ["spec", "dataClassifications", i],
                    f"data classification {cls!r} is not defined",
                    "ref.classification",
                    _did_you_mean(cls, classifications),
                )
        if org:
            approved = {
                a if isinstance(a, str) else a["name"] for a in org.data["spec"]["runtimes"]["allowed"]
            }
            for i, rt in enumerate(spec.get("runtimes") or ()):
                if rt not in approved:
                    c.error(
                        entry,
                        ["spec", "runtimes", i],
                        f"runtime {rt!r} is not approved in the OrgPolicy",
                        "ref.runtime",
                        _did_you_mean(rt, approved),
                    )
        if spec.get("cpu") is not None:
            _check_quantity(c, entry, ["spec", "cpu"], spec["cpu"])
        if spec.get("memory") is not None:
            _check_quantity(c, entry, ["spec", "memory"], spec["memory"])
    for flavor_name, uses in nominal_by_flavor.items():
        capacity = flavors[flavor_name].get("capacity")
        total = sum(n for _, n in uses)
        if capacity is not None and total > capacity and flavors_doc:
            teams = ", ".join(f"{_name(e)}={n}" for e, n in uses)
            c.error(
                flavors_doc,
                ["spec", "flavors", flavor_name, "capacity"],
                f"teams' nominal quota on {flavor_name} adds up to {total} GPUs, "
                f"above its capacity {capacity} ({teams})",
                "capacity.flavor",
                "lower nominal quotas or raise capacity",
            )

    # ---------------------------------------------------------------- Personas
    if personas_doc:
        for name, persona in personas_doc.data["spec"]["personas"].items():
            for i, rule in enumerate(persona["rules"]):
                groups = rule.get("apiGroups", [])
                resources = rule.get("resources", [])
                path: list[PathPart] = ["spec", "personas", name, "rules", i]
                if "*" in groups or "*" in resources or "*" in rule["verbs"]:
                    c.error(
                        personas_doc,
                        path,
                        "wildcards are not allowed in persona rules",
                        "rbac.wildcard",
                        "list apiGroups, resources and verbs explicitly",
                    )
                if any(g == "mpigate.io" or g.endswith(".mpigate.io") for g in groups):
                    c.error(
                        personas_doc,
                        path,
                        "personas may not grant rights on mpigate's own objects",
                        "rbac.forbidden",
                        "mpigate config changes go through Git",
                    )
                forbidden = {
                    "clusterqueues",
                    "cohorts",
                    "resourceflavors",
                    "roles",
                    "rolebindings",
                    "networkpolicies",
                    "resourcequotas/status",
                    "namespaces",
                }
                writes = set(rule["verbs"]) - {"get", "list", "watch"}
                bad = sorted(
                    r for r in resources if r.split("/")[0] in forbidden and (writes or r == "clusterqueues")
                )
                if bad:
                    c.error(
                        personas_doc,
                        path,
                        f"personas may not manage {', '.join(bad)}",
                        "rbac.forbidden",
                        "quota, RBAC and network objects are rendered from this repository",
                    )
                if rule.get("nonResourceURLs"):
                    c.error(
                        personas_doc,
                        [*path, "nonResourceURLs"],
                        "nonResourceURLs cannot be granted in a namespace",
                        "rbac.non-resource",
                    )

    # ---------------------------------------------------------------- TeamAccess
    access = list(by_kind.get("TeamAccess", []))
    _check_unique(
        c,
        [e for e in access if e.valid],
        lambda e: e.data["spec"]["team"],
        "TeamAccess for team",
        ["spec", "team"],
    )
    teams_with_access = set()
    for entry in access:
        if not entry.valid:
            continue
        team = entry.data["spec"]["team"]
        teams_with_access.add(team)
        if team not in team_names:
            c.error(
                entry,
                ["spec", "team"],
                f"team {team!r} does not exist (no TeamQuota)",
                "ref.team",
                _did_you_mean(team, team_names),
            )
        for persona in entry.data["spec"]["members"]:
            if personas_doc and persona not in personas:
                c.error(
                    entry,
                    ["spec", "members", persona],
                    f"persona {persona!r} does not exist",
                    "ref.persona",
                    _did_you_mean(persona, personas),
                )
    for entry in valid_quotas:
        name = entry.data["metadata"]["name"]
        if name not in teams_with_access:
            c.warning(
                entry,
                ["metadata", "name"],
                f"team {name!r} has no TeamAccess: nobody can submit its jobs",
                "missing.access",
                f"add rbac/{name}.yaml (`mpigate init --team {name}`)",
            )

    # ---------------------------------------------------------------- NetworkProfiles / TeamNetwork
    if profiles_doc:
        spec = profiles_doc.data["spec"]
        if spec["default"] not in profiles:
            c.error(
                profiles_doc,
                ["spec", "default"],
                f"default profile {spec['default']!r} is not defined",
                "ref.profile",
                _did_you_mean(spec["default"], profiles),
            )
        for name, profile in profiles.items():
            mpi = profile["openmpi"]
            if mpi["oobPortMin"] > mpi["oobPortMax"]:
                c.error(
                    profiles_doc,
                    ["spec", "profiles", name, "openmpi", "oobPortMax"],
                    "oobPortMax is below oobPortMin",
                    "value.ports",
                )
            btl = range(mpi["btlPortMin"], mpi["btlPortMin"] + mpi["btlPortRange"])
            if btl.stop - 1 > 65535:
                c.error(
                    profiles_doc,
                    ["spec", "profiles", name, "openmpi", "btlPortRange"],
                    f"BTL ports would end at {btl.stop - 1}, above 65535",
                    "value.ports",
                )
            oob = range(mpi["oobPortMin"], mpi["oobPortMax"] + 1)
            if profile["mode"] == "pinned-ports" and (
                set(btl) & set(oob) or profile["sshPort"] in btl or profile["sshPort"] in oob
            ):
                c.error(
                    profiles_doc,
                    ["spec", "profiles", name, "openmpi"],
                    "the BTL, OOB and SSH port ranges overlap",
                    "value.ports",
                    "give each its own range",
                )
        for list_name, rules in spec["egress"].items():
            for i, rule in enumerate(rules):
                _check_cidr(c, profiles_doc, ["spec", "egress", list_name, i], rule)
    networks = list(by_kind.get("TeamNetwork", []))
    _check_unique(
        c,
        [e for e in networks if e.valid],
        lambda e: e.data["spec"]["team"],
        "TeamNetwork for team",
        ["spec", "team"],
    )
    for entry in networks:
        if not entry.valid:
            continue
        spec = entry.data["spec"]
        if spec["team"] not in team_names:
            c.error(
                entry,
                ["spec", "team"],
                f"team {spec['team']!r} does not exist (no TeamQuota)",
                "ref.team",
                _did_you_mean(spec["team"], team_names),
            )
        if spec.get("profile") and profiles_doc and spec["profile"] not in profiles:
            c.error(
                entry,
                ["spec", "profile"],
                f"network profile {spec['profile']!r} does not exist",
                "ref.profile",
                _did_you_mean(spec["profile"], profiles),
            )
        for i, name in enumerate(spec["egressLists"]):
            if profiles_doc and name not in egress_lists:
                c.error(
                    entry,
                    ["spec", "egressLists", i],
                    f"egress list {name!r} does not exist",
                    "ref.egress",
                    _did_you_mean(name, egress_lists),
                )
        for i, rule in enumerate(spec["egress"]):
            _check_cidr(c, entry, ["spec", "egress", i], rule)

    # ---------------------------------------------------------------- PolicyException
    exceptions = list(by_kind.get("PolicyException", []))
    _check_unique(c, exceptions, _name, "exception", ["metadata", "name"])
    today = today or dt.datetime.now(dt.UTC).date()
    team_namespaces = {e.data["metadata"]["name"]: set(e.data["spec"]["namespaces"]) for e in valid_quotas}
    for entry in exceptions:
        if not entry.valid:
            continue
        spec = entry.data["spec"]
        if spec["team"] not in team_names:
            c.error(
                entry,
                ["spec", "team"],
                f"team {spec['team']!r} does not exist",
                "ref.team",
                _did_you_mean(spec["team"], team_names),
            )
        for i, pattern in enumerate(spec["rules"]):
            if not expand_rule_pattern(pattern, known_rules):
                c.error(
                    entry,
                    ["spec", "rules", i],
                    f"{pattern!r} names no rule",
                    "ref.rule",
                    _did_you_mean(pattern, known_rules),
                )
        for i, ns in enumerate(spec["match"].get("namespaces") or ()):
            owned = team_namespaces.get(spec["team"])
            if owned is not None and ns not in owned:
                c.error(
                    entry,
                    ["spec", "match", "namespaces", i],
                    f"namespace {ns!r} does not belong to team {spec['team']!r}",
                    "ref.namespace",
                    _did_you_mean(ns, owned),
                )
        try:
            expires = dt.date.fromisoformat(spec["expires"])
        except ValueError:
            c.error(
                entry,
                ["spec", "expires"],
                f"{spec['expires']!r} is not a date",
                "value.date",
                "use YYYY-MM-DD",
            )
            continue
        if expires < today:
            c.warning(
                entry,
                ["spec", "expires"],
                f"exception {_name(entry)!r} expired on {expires.isoformat()} and no longer applies",
                "expired.exception",
                "renew it with a new approval or delete it",
            )
        elif (expires - today).days > 366:
            c.warning(
                entry,
                ["spec", "expires"],
                f"exception {_name(entry)!r} runs for more than a year (until {expires.isoformat()})",
                "value.long-exception",
                "exceptions should be short-lived; review it at least yearly",
            )

    # ---------------------------------------------------------------- runtimes
    runtimes = [*by_kind.get("ClusterTrainingRuntime", []), *by_kind.get("TrainingRuntime", [])]
    present: set[tuple[str, str]] = set()
    all_namespaces = set().union(*team_namespaces.values()) if team_namespaces else set()
    for entry in runtimes:
        rt_name = _name(entry)
        if not rt_name:
            c.error(entry, ["metadata", "name"], f"{entry.kind} has no metadata.name", "runtime.name")
            continue
        if not isinstance(entry.data.get("spec"), dict) or not isinstance(
            entry.data["spec"].get("template"), dict
        ):
            c.error(
                entry,
                ["spec", "template"],
                f"{entry.kind} {rt_name!r} has no spec.template",
                "runtime.template",
                "a training runtime needs spec.template.spec.replicatedJobs",
            )
        present.add((entry.kind, rt_name))
        if entry.kind == "TrainingRuntime":
            ns = entry.data["metadata"].get("namespace")
            if not ns:
                c.error(
                    entry,
                    ["metadata"],
                    f"TrainingRuntime {rt_name!r} needs metadata.namespace",
                    "runtime.namespace",
                    "or make it a ClusterTrainingRuntime",
                )
            elif ns not in all_namespaces:
                c.error(
                    entry,
                    ["metadata", "namespace"],
                    f"namespace {ns!r} belongs to no team",
                    "ref.namespace",
                    _did_you_mean(ns, all_namespaces),
                )
    _check_unique(
        c,
        runtimes,
        lambda e: (
            (e.kind, (e.data.get("metadata") or {}).get("namespace") or "", _name(e)) if _name(e) else None
        ),
        "runtime",
        ["metadata", "name"],
    )
    if org:
        for i, allowed in enumerate(org.data["spec"]["runtimes"]["allowed"]):
            name, kind, external = (
                (allowed, "ClusterTrainingRuntime", False)
                if isinstance(allowed, str)
                else (allowed["name"], allowed["kind"], allowed["external"])
            )
            if not external and (kind, name) not in present:
                c.error(
                    org,
                    ["spec", "runtimes", "allowed", i],
                    f"approved runtime {name!r} ({kind}) is not in the config tree",
                    "ref.runtime",
                    "add its manifest (e.g. policies/runtimes/) or mark it `external: true`",
                )

    # ---------------------------------------------------------------- PolicyTest
    tests = list(by_kind.get("PolicyTest", []))
    _check_unique(c, tests, _name, "policy test", ["metadata", "name"])
    for entry in tests:
        if not entry.valid:
            continue
        base = Path(root if root.is_dir() else root.parent) / entry.doc.file
        for i, case in enumerate(entry.data["spec"]["cases"]):
            for field in ("object", "oldObject"):
                src = case.get(field)
                if isinstance(src, dict) and "file" in src:
                    _check_test_file(
                        c,
                        entry,
                        ["spec", "cases", i, field, "file"],
                        base.parent / src["file"],
                        src.get("document", 0),
                    )
            expect = case["expect"]
            for key in ("violations", "includes", "excludes", "warnings"):
                for j, rid in enumerate(expect.get(key) or ()):
                    if rid not in known_rules:
                        c.error(
                            entry,
                            ["spec", "cases", i, "expect", key, j],
                            f"unknown rule {rid!r}",
                            "ref.rule",
                            _did_you_mean(rid, known_rules),
                        )
        if entry.data["spec"].get("now"):
            try:
                dt.datetime.fromisoformat(entry.data["spec"]["now"].replace("Z", "+00:00"))
            except ValueError:
                c.error(
                    entry, ["spec", "now"], "not an RFC 3339 time", "value.time", "e.g. 2026-11-22T10:00:00Z"
                )

    return c.problems


def _check_quantity(c: _Collector, entry: Entry, path: list[PathPart], value: Any) -> None:
    from .units import parse_quantity

    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        c.error(entry, path, str(exc), "value.quantity")
        return
    if amount < 0:
        c.error(entry, path, f"{value!r} is negative", "value.quantity")


def _check_cidr(c: _Collector, entry: Entry, path: list[PathPart], rule: Mapping[str, Any]) -> None:
    try:
        net = ipaddress.ip_network(rule["cidr"], strict=True)
    except ValueError as exc:
        c.error(
            entry,
            [*path, "cidr"],
            f"{rule['cidr']!r} is not a CIDR: {exc}",
            "value.cidr",
            "e.g. 10.20.0.0/16 (host bits must be zero)",
        )
        return
    for i, ex in enumerate(rule.get("except") or ()):
        try:
            inner = ipaddress.ip_network(ex, strict=True)
        except ValueError as exc:
            c.error(entry, [*path, "except", i], f"{ex!r} is not a CIDR: {exc}", "value.cidr")
            continue
        if inner.version != net.version or not inner.subnet_of(net):  # type: ignore[arg-type]
            c.error(entry, [*path, "except", i], f"{ex} is not inside {net}", "value.cidr")


def _check_test_file(c: _Collector, entry: Entry, path: list[PathPart], file: Path, index: int) -> None:
    if not file.is_file():
        c.error(
            entry,
            path,
            f"file {file.as_posix()} does not exist",
            "ref.file",
            "paths are relative to the test file",
        )
        return
    docs, problems = parse_file(str(file))
    if problems:
        c.error(entry, path, f"file {file.as_posix()} does not parse: {problems[0].message}", "ref.file")
        return
    if index >= len(docs):
        c.error(
            entry,
            path,
            f"file {file.as_posix()} has {len(docs)} document(s); document {index} asked",
            "ref.file",
        )
