"""Personas and TeamAccess: what a persona may be granted, who gets which persona."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpigate.config.problems import PathPart

from .base import Collector, Entry, Tree, check_unique, team_of

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


def check_personas(c: Collector, tree: Tree) -> None:
    doc = tree.personas_doc
    if doc is None:
        return
    org_forbidden: Sequence[Mapping[str, Any]] = tree.org_spec["personas"]["forbidden"] if tree.org else ()
    names = set(doc.data["spec"]["personas"])
    for name, persona in doc.data["spec"]["personas"].items():
        for i, other in enumerate(persona.get("serviceAccountsFrom") or ()):
            c.ref(
                doc,
                ["spec", "personas", name, "serviceAccountsFrom", i],
                other,
                names,
                f"persona {other!r} does not exist",
                "ref.persona",
            )
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
            for entry in org_forbidden:
                held = _held(rule, entry)
                if held is not None:
                    c.error(
                        doc,
                        path,
                        f"personas may not hold {held}: {entry['reason']}",
                        "rbac.forbidden",
                        "OrgPolicy spec.personas.forbidden lists what no persona may hold",
                    )


def _resource_matches(granted: str, pattern: str) -> bool:
    if "*" in (granted, pattern) or granted == pattern:
        return True
    return pattern.endswith("/*") and granted.startswith(pattern[:-1])


def _held(rule: Mapping[str, Any], forbidden: Mapping[str, Any]) -> str | None:
    """What of ``forbidden`` the RBAC ``rule`` grants (``"get, list on secrets"``), or None: a rule
    holds an entry when it shares an API group, a resource and a verb with it (``*`` on either side
    matches all)."""
    groups = rule.get("apiGroups") or []
    if not ("*" in forbidden["apiGroups"] or "*" in groups or set(groups) & set(forbidden["apiGroups"])):
        return None
    resources = [
        r for r in rule.get("resources") or [] if any(_resource_matches(r, f) for f in forbidden["resources"])
    ]
    verbs = [v for v in rule["verbs"] if v == "*" or "*" in forbidden["verbs"] or v in forbidden["verbs"]]
    if not resources or not verbs:
        return None
    return f"{', '.join(verbs)} on {', '.join(resources)}"


def broad_subject(kind: str, name: str, namespaces: set[str]) -> str | None:
    """Why a TeamAccess subject reaches beyond the team, or None. Kubernetes reserves the
    ``system:`` prefix: its groups hold every authenticated or anonymous caller, every service
    account of the cluster or of a namespace; its users are anonymous callers and components."""
    if not name.startswith("system:"):
        return None
    parts = name.split(":")
    if kind == "groups":
        if len(parts) == 3 and parts[1] == "serviceaccounts" and parts[2] in namespaces:
            return None  # every service account of one of the team's own namespaces
        return "a cluster-wide group (Kubernetes' system: groups hold callers from every team)"
    if len(parts) == 4 and parts[1] == "serviceaccount":
        return None  # one service account, named as the API server names it
    return "a Kubernetes system user (anonymous callers or cluster components)"


def check_access(c: Collector, tree: Tree, access: list[Entry]) -> None:
    valid = [e for e in access if e.valid]
    check_unique(c, valid, team_of, "TeamAccess for team", ["spec", "team"])
    for entry in valid:
        team = team_of(entry)
        c.ref(
            entry,
            ["spec", "team"],
            team,
            tree.team_names,
            f"team {team!r} does not exist (no TeamQuota)",
            "ref.team",
        )
        namespaces = tree.team_namespaces.get(team, set())
        for persona, members in entry.data["spec"]["members"].items():
            c.ref(
                entry,
                ["spec", "members", persona],
                persona,
                tree.personas,
                f"persona {persona!r} does not exist",
                "ref.persona",
            )
            for kind in ("users", "groups"):
                for i, name in enumerate(members[kind]):
                    why = broad_subject(kind, name, namespaces)
                    if why is not None:
                        c.error(
                            entry,
                            ["spec", "members", persona, kind, i],
                            f"{name!r} is {why}; TeamAccess grants a persona to the team's own people",
                            "rbac.subject",
                            "name the team's users and groups, or its service accounts under serviceAccounts",
                        )
    with_access = {team_of(e) for e in valid}
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
