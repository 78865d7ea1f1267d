"""Personas and TeamAccess: what a persona may be granted, who gets which persona."""

from __future__ import annotations

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
        for persona in entry.data["spec"]["members"]:
            c.ref(
                entry,
                ["spec", "members", persona],
                persona,
                tree.personas,
                f"persona {persona!r} does not exist",
                "ref.persona",
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
