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
            self.error(entry, path, message, code, _did_you_mean(value, names))


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


@dataclass(frozen=True)
class _Tree:
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

    @property
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

    @property
    def team_namespaces(self) -> dict[str, set[str]]:
        return {e.data["metadata"]["name"]: set(e.data["spec"]["namespaces"]) for e in self.valid_quotas}


def cross_file_problems(
    by_kind: Mapping[str, list[Entry]], root: Path, today: dt.date | None = None
) -> list[Problem]:
    """Every cross-file problem of a tree whose documents are grouped by kind.

    ``today`` (UTC) decides which exceptions have expired; tests pin it.
    """
    c = _Collector()
    quotas = list(by_kind.get("TeamQuota", []))
    tree = _Tree(
        root=root,
        org=_singleton(c, list(by_kind.get("OrgPolicy", [])), "OrgPolicy", True, root),
        flavors_doc=_singleton(c, list(by_kind.get("GPUFlavors", [])), "GPUFlavors", True, root),
        personas_doc=_singleton(c, list(by_kind.get("Personas", [])), "Personas", False, root),
        profiles_doc=_singleton(c, list(by_kind.get("NetworkProfiles", [])), "NetworkProfiles", False, root),
        quotas=quotas,
        team_names={n for n in (_name(e) for e in quotas) if n},
        today=today or dt.datetime.now(dt.UTC).date(),
    )
    _check_org(c, tree)
    _check_flavors(c, tree)
    _check_quotas(c, tree)
    _check_personas(c, tree)
    _check_access(c, tree, list(by_kind.get("TeamAccess", [])))
    _check_networks(c, tree, list(by_kind.get("TeamNetwork", [])))
    _check_exceptions(c, tree, list(by_kind.get("PolicyException", [])))
    _check_runtimes(
        c, tree, [*by_kind.get("ClusterTrainingRuntime", []), *by_kind.get("TrainingRuntime", [])]
    )
    _check_tests(c, tree, list(by_kind.get("PolicyTest", [])))
    return c.problems


def _check_org(c: _Collector, tree: _Tree) -> None:
    org = tree.org
    if org is None:
        return
    spec = tree.org_spec
    profiles = tree.profiles
    for name, cls in spec["dataClassifications"].items():
        for i, region in enumerate(cls.get("regions") or ()):
            c.ref(
                org,
                ["spec", "dataClassifications", name, "regions", i],
                region,
                tree.regions,
                f"region {region!r} is not defined in spec.regions",
                "ref.region",
            )
        profile = cls.get("networkProfile")
        if profile:
            c.ref(
                org,
                ["spec", "dataClassifications", name, "networkProfile"],
                profile,
                profiles,
                f"network profile {profile!r} does not exist",
                "ref.profile",
            )
    for pattern in spec["enforcement"]["overrides"]:
        if not expand_rule_pattern(pattern, rule_ids()):
            c.error(
                org,
                ["spec", "enforcement", "overrides", pattern],
                f"{pattern!r} names no rule",
                "ref.rule",
                _did_you_mean(pattern, rule_ids()),
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
                c.ref(
                    org,
                    ["spec", "runtimes", "allowed", i, "teams", j],
                    team,
                    tree.team_names,
                    f"team {team!r} does not exist",
                    "ref.team",
                )


def _check_flavors(c: _Collector, tree: _Tree) -> None:
    if tree.flavors_doc is None or tree.flavors is None:
        return
    for name, flavor in tree.flavors.items():
        c.ref(
            tree.flavors_doc,
            ["spec", "flavors", name, "region"],
            flavor["region"],
            tree.regions,
            f"region {flavor['region']!r} is not defined in the OrgPolicy",
            "ref.region",
        )


def _check_quotas(c: _Collector, tree: _Tree) -> None:
    _check_unique(c, tree.quotas, _name, "team", ["metadata", "name"])
    owners = _namespace_owners(tree.valid_quotas)
    nominal_by_flavor: dict[str, list[tuple[Entry, int]]] = {}
    flavors = tree.flavors
    for entry in tree.valid_quotas:
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
            other, other_entry, j = owners[ns]
            if other != team:
                where = other_entry.doc.locate(("spec", "namespaces", j))
                c.error(
                    entry,
                    ["spec", "namespaces", i],
                    f"namespace {ns!r} is already claimed by team {other!r} ({where})",
                    "conflict.namespace",
                    "a namespace belongs to exactly one team; remove it here or there",
                )
        c.ref(
            entry,
            ["spec", "region"],
            spec["region"],
            tree.regions,
            f"region {spec['region']!r} is not defined in the OrgPolicy",
            "ref.region",
        )
        if spec.get("cohort"):
            c.ref(
                entry,
                ["spec", "cohort"],
                spec["cohort"],
                tree.cohorts,
                f"cohort {spec['cohort']!r} is not listed in GPUFlavors.spec.cohorts",
                "ref.cohort",
            )
        for flavor_name, quota in spec["gpus"].items():
            _check_gpu_quota(c, entry, spec, flavor_name, quota, flavors, nominal_by_flavor)
        if not spec["gpus"] and spec["region"] in (tree.regions or ()):
            in_region = sorted(
                name for name, f in (flavors or {}).items() if f.get("region") == spec["region"]
            )
            example = in_region[0] if in_region else f"a100-{spec['region']}"
            c.warning(
                entry,
                ["spec", "gpus"],
                "the team has no GPU quota: every TrainJob that asks for GPUs will be denied (MPG-Q001)",
                "value.no-gpu-quota",
                f"add a flavor of region {spec['region']!r}, e.g. "
                f"`gpus: {{{example}: {{nominal: 8, borrowingLimit: 0}}}}`"
                + ("" if in_region else " (and define it in GPUFlavors)"),
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
            c.ref(
                entry,
                ["spec", "priorityClasses", i],
                pc,
                tree.priority_classes,
                f"priority class {pc!r} is not defined in the OrgPolicy",
                "ref.priority-class",
            )
        for i, cls in enumerate(spec.get("dataClassifications") or ()):
            c.ref(
                entry,
                ["spec", "dataClassifications", i],
                cls,
                tree.classifications,
                f"data classification {cls!r} is not defined",
                "ref.classification",
            )
        for i, rt in enumerate(spec.get("runtimes") or ()):
            c.ref(
                entry,
                ["spec", "runtimes", i],
                rt,
                tree.approved_runtimes,
                f"runtime {rt!r} is not approved in the OrgPolicy",
                "ref.runtime",
            )
        for field in ("cpu", "memory"):
            if spec.get(field) is not None:
                _check_quantity(c, entry, ["spec", field], spec[field])
    if tree.flavors_doc is None or flavors is None:
        return
    for flavor_name, uses in nominal_by_flavor.items():
        capacity = flavors[flavor_name].get("capacity")
        total = sum(n for _, n in uses)
        if capacity is not None and total > capacity:
            teams = ", ".join(f"{_name(e)}={n}" for e, n in uses)
            c.error(
                tree.flavors_doc,
                ["spec", "flavors", flavor_name, "capacity"],
                f"teams' nominal quota on {flavor_name} adds up to {total} GPUs, "
                f"above its capacity {capacity} ({teams})",
                "capacity.flavor",
                "lower nominal quotas or raise capacity",
            )


def _namespace_owners(quotas: Sequence[Entry]) -> dict[str, tuple[str, Entry, int]]:
    """Which team a namespace belongs to when several claim it: the team named like the namespace
    (``nlp-team`` owns namespace ``nlp-team``), else the first claim in file order. The others get
    the error, so adding ``nlp-team`` to cv-team's list blames cv-team's file, not nlp-team's."""
    claims: dict[str, list[tuple[str, Entry, int]]] = {}
    for entry in quotas:
        for i, ns in enumerate(entry.data["spec"]["namespaces"]):
            claims.setdefault(ns, []).append((entry.data["metadata"]["name"], entry, i))
    return {ns: next((claim for claim in found if claim[0] == ns), found[0]) for ns, found in claims.items()}


def _check_gpu_quota(
    c: _Collector,
    entry: Entry,
    spec: Mapping[str, Any],
    flavor_name: str,
    quota: Mapping[str, Any],
    flavors: Mapping[str, Any] | None,
    nominal_by_flavor: dict[str, list[tuple[Entry, int]]],
) -> None:
    if flavors is not None:
        if flavor_name not in flavors:
            c.error(
                entry,
                ["spec", "gpus", flavor_name],
                f"GPU flavor {flavor_name!r} does not exist",
                "ref.flavor",
                _did_you_mean(flavor_name, flavors),
            )
            return
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


# Namespaced objects that quota, RBAC and network posture are made of: rendered from Git, so no
# persona may manage them (reading is fine, except ClusterQueues, which are cluster-wide).
_PERSONA_FORBIDDEN = frozenset(
    {
        "clusterqueues",
        "cohorts",
        "resourceflavors",
        "roles",
        "rolebindings",
        "networkpolicies",
        "resourcequotas/status",
        "namespaces",
    }
)


def _check_personas(c: _Collector, tree: _Tree) -> None:
    doc = tree.personas_doc
    if doc is None:
        return
    for name, persona in doc.data["spec"]["personas"].items():
        for i, rule in enumerate(persona["rules"]):
            groups = rule.get("apiGroups", [])
            resources = rule.get("resources", [])
            path: list[PathPart] = ["spec", "personas", name, "rules", i]
            if "*" in groups or "*" in resources or "*" in rule["verbs"]:
                c.error(
                    doc,
                    path,
                    "wildcards are not allowed in persona rules",
                    "rbac.wildcard",
                    "list apiGroups, resources and verbs explicitly",
                )
            if any(g == "mpigate.io" or g.endswith(".mpigate.io") for g in groups):
                c.error(
                    doc,
                    path,
                    "personas may not grant rights on mpigate's own objects",
                    "rbac.forbidden",
                    "mpigate config changes go through Git",
                )
            writes = set(rule["verbs"]) - {"get", "list", "watch"}
            bad = sorted(
                r
                for r in resources
                if r.split("/")[0] in _PERSONA_FORBIDDEN and (writes or r == "clusterqueues")
            )
            if bad:
                c.error(
                    doc,
                    path,
                    f"personas may not manage {', '.join(bad)}",
                    "rbac.forbidden",
                    "quota, RBAC and network objects are rendered from this repository",
                )
            if rule.get("nonResourceURLs"):
                c.error(
                    doc,
                    [*path, "nonResourceURLs"],
                    "nonResourceURLs cannot be granted in a namespace",
                    "rbac.non-resource",
                )


def _team_of(entry: Entry) -> str:
    return str(entry.data["spec"]["team"])


def _check_access(c: _Collector, tree: _Tree, access: list[Entry]) -> None:
    valid = [e for e in access if e.valid]
    _check_unique(c, valid, _team_of, "TeamAccess for team", ["spec", "team"])
    for entry in valid:
        team = _team_of(entry)
        c.ref(
            entry,
            ["spec", "team"],
            team,
            tree.team_names,
            f"team {team!r} does not exist (no TeamQuota)",
            "ref.team",
        )
        for persona in entry.data["spec"]["members"]:
            c.ref(
                entry,
                ["spec", "members", persona],
                persona,
                tree.personas,
                f"persona {persona!r} does not exist",
                "ref.persona",
            )
    with_access = {_team_of(e) for e in valid}
    for entry in tree.valid_quotas:
        name = entry.data["metadata"]["name"]
        if name not in with_access:
            c.warning(
                entry,
                ["metadata", "name"],
                f"team {name!r} has no TeamAccess: nobody can submit its jobs",
                "missing.access",
                f"add a TeamAccess with `spec.team: {name}` (e.g. rbac/{name}.yaml; "
                "`mpigate schema TeamAccess` shows the fields)",
            )


def _check_networks(c: _Collector, tree: _Tree, networks: list[Entry]) -> None:
    profiles = tree.profiles
    if tree.profiles_doc is not None and profiles is not None:
        doc = tree.profiles_doc
        spec = doc.data["spec"]
        c.ref(
            doc,
            ["spec", "default"],
            spec["default"],
            profiles,
            f"default profile {spec['default']!r} is not defined",
            "ref.profile",
        )
        for name, profile in profiles.items():
            _check_ports(c, doc, name, profile)
        for list_name, rules in spec["egress"].items():
            for i, rule in enumerate(rules):
                _check_cidr(c, doc, ["spec", "egress", list_name, i], rule)
    valid = [e for e in networks if e.valid]
    _check_unique(c, valid, _team_of, "TeamNetwork for team", ["spec", "team"])
    for entry in valid:
        spec = entry.data["spec"]
        c.ref(
            entry,
            ["spec", "team"],
            spec["team"],
            tree.team_names,
            f"team {spec['team']!r} does not exist (no TeamQuota)",
            "ref.team",
        )
        if spec.get("profile"):
            c.ref(
                entry,
                ["spec", "profile"],
                spec["profile"],
                profiles,
                f"network profile {spec['profile']!r} does not exist",
                "ref.profile",
            )
        for i, name in enumerate(spec["egressLists"]):
            c.ref(
                entry,
                ["spec", "egressLists", i],
                name,
                tree.egress_lists,
                f"egress list {name!r} does not exist",
                "ref.egress",
            )
        for i, rule in enumerate(spec["egress"]):
            _check_cidr(c, entry, ["spec", "egress", i], rule)


def _check_ports(c: _Collector, doc: Entry, name: str, profile: Mapping[str, Any]) -> None:
    mpi = profile["openmpi"]
    path: list[PathPart] = ["spec", "profiles", name, "openmpi"]
    if mpi["oobPortMin"] > mpi["oobPortMax"]:
        c.error(doc, [*path, "oobPortMax"], "oobPortMax is below oobPortMin", "value.ports")
    btl = range(mpi["btlPortMin"], mpi["btlPortMin"] + mpi["btlPortRange"])
    if btl.stop - 1 > 65535:
        c.error(
            doc, [*path, "btlPortRange"], f"BTL ports would end at {btl.stop - 1}, above 65535", "value.ports"
        )
    oob = range(mpi["oobPortMin"], mpi["oobPortMax"] + 1)
    ssh = profile["sshPort"]
    if profile["mode"] == "pinned-ports" and (set(btl) & set(oob) or ssh in btl or ssh in oob):
        c.error(
            doc, path, "the BTL, OOB and SSH port ranges overlap", "value.ports", "give each its own range"
        )


def _check_exceptions(c: _Collector, tree: _Tree, exceptions: list[Entry]) -> None:
    _check_unique(c, exceptions, _name, "exception", ["metadata", "name"])
    team_namespaces = tree.team_namespaces
    for entry in exceptions:
        if not entry.valid:
            continue
        spec = entry.data["spec"]
        c.ref(
            entry,
            ["spec", "team"],
            spec["team"],
            tree.team_names,
            f"team {spec['team']!r} does not exist",
            "ref.team",
        )
        for i, pattern in enumerate(spec["rules"]):
            if not expand_rule_pattern(pattern, rule_ids()):
                c.error(
                    entry,
                    ["spec", "rules", i],
                    f"{pattern!r} names no rule",
                    "ref.rule",
                    _did_you_mean(pattern, rule_ids()),
                )
        for i, ns in enumerate(spec["match"].get("namespaces") or ()):
            c.ref(
                entry,
                ["spec", "match", "namespaces", i],
                ns,
                team_namespaces.get(spec["team"]),
                f"namespace {ns!r} does not belong to team {spec['team']!r}",
                "ref.namespace",
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
        if expires < tree.today:
            c.warning(
                entry,
                ["spec", "expires"],
                f"exception {_name(entry)!r} expired on {expires.isoformat()} and no longer applies",
                "expired.exception",
                "renew it with a new approval or delete it",
            )
        elif (expires - tree.today).days > 366:
            c.warning(
                entry,
                ["spec", "expires"],
                f"exception {_name(entry)!r} runs for more than a year (until {expires.isoformat()})",
                "value.long-exception",
                "exceptions should be short-lived; review it at least yearly",
            )


def _runtime_key(entry: Entry) -> tuple[str, str, str] | None:
    name = _name(entry)
    if not name:
        return None
    return (entry.kind, (entry.data.get("metadata") or {}).get("namespace") or "", name)


def _check_runtimes(c: _Collector, tree: _Tree, runtimes: list[Entry]) -> None:
    present: set[tuple[str, str]] = set()
    all_namespaces = set().union(*tree.team_namespaces.values())
    for entry in runtimes:
        rt_name = _name(entry)
        if not rt_name:
            c.error(entry, ["metadata", "name"], f"{entry.kind} has no metadata.name", "runtime.name")
            continue
        spec = entry.data.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("template"), dict):
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
            else:
                c.ref(
                    entry,
                    ["metadata", "namespace"],
                    ns,
                    all_namespaces,
                    f"namespace {ns!r} belongs to no team",
                    "ref.namespace",
                )
    _check_unique(c, runtimes, _runtime_key, "runtime", ["metadata", "name"])
    if tree.org is None:
        return
    for i, allowed in enumerate(tree.org_spec["runtimes"]["allowed"]):
        name, kind, external = (
            (allowed, "ClusterTrainingRuntime", False)
            if isinstance(allowed, str)
            else (allowed["name"], allowed["kind"], allowed["external"])
        )
        if not external and (kind, name) not in present:
            c.error(
                tree.org,
                ["spec", "runtimes", "allowed", i],
                f"approved runtime {name!r} ({kind}) is not in the config tree",
                "ref.runtime",
                "add its manifest (e.g. policies/runtimes/) or mark it `external: true`",
            )


def _check_tests(c: _Collector, tree: _Tree, tests: list[Entry]) -> None:
    _check_unique(c, tests, _name, "policy test", ["metadata", "name"])
    base_dir = tree.root if tree.root.is_dir() else tree.root.parent
    known_rules = rule_ids()
    for entry in tests:
        if not entry.valid:
            continue
        base = base_dir / entry.doc.file
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
                    c.ref(
                        entry,
                        ["spec", "cases", i, "expect", key, j],
                        rid,
                        known_rules,
                        f"unknown rule {rid!r}",
                        "ref.rule",
                    )
        if entry.data["spec"].get("now"):
            try:
                dt.datetime.fromisoformat(entry.data["spec"]["now"].replace("Z", "+00:00"))
            except ValueError:
                c.error(
                    entry, ["spec", "now"], "not an RFC 3339 time", "value.time", "e.g. 2026-11-22T10:00:00Z"
                )


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
