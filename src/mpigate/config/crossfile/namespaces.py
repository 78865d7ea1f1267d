"""The namespaces a TeamQuota claims: never the cluster's or mpigate's, only what the org allows
(``OrgPolicy.spec.teamNamespaces``), and each for exactly one team.

A team's admins edit its quota file; the namespaces listed there get the team's labels, Pod
Security level, quotas and RoleBindings from ``render``, so claiming ``argocd`` or
``gpu-operator`` would hand the team another system's namespace."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Collector, Entry, Tree

__all__ = ["SYSTEM_NAMESPACES", "check_namespaces"]

# Namespaces no team may claim, whatever the org allows: the cluster's own and mpigate's.
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


def _is_system_namespace(ns: str) -> bool:
    return ns in SYSTEM_NAMESPACES or ns.startswith(_SYSTEM_PREFIXES)


def _namespace_owners(quotas: Sequence[Entry]) -> dict[str, tuple[str, Entry, int]]:
    """Which team a namespace belongs to when several claim it: the team named like the namespace
    (``nlp-team`` owns namespace ``nlp-team``), else the first claim in file order. The others get
    the error, so adding ``nlp-team`` to cv-team's list blames cv-team's file, not nlp-team's."""
    claims: dict[str, list[tuple[str, Entry, int]]] = {}
    for entry in quotas:
        for i, ns in enumerate(entry.data["spec"]["namespaces"]):
            claims.setdefault(ns, []).append((entry.data["metadata"]["name"], entry, i))
    return {ns: next((claim for claim in found if claim[0] == ns), found[0]) for ns, found in claims.items()}


def _allowed_for(team: str, policy: Mapping[str, Any]) -> list[str]:
    """The globs ``team`` may claim: the org's patterns with ``{team}`` filled in, and its own."""
    return [p.replace("{team}", team) for p in policy["patterns"]] + list(policy["teams"].get(team, ()))


def _refusal(ns: str, team: str, policy: Mapping[str, Any] | None) -> tuple[str, str, str] | None:
    """(message, code, hint) when ``team`` may not claim ``ns``; ``policy`` is None without a
    valid OrgPolicy (then only the system namespaces are judged)."""
    if _is_system_namespace(ns):
        return (
            f"namespace {ns!r} is a system namespace",
            "value.system-namespace",
            "teams may not claim cluster or mpigate namespaces",
        )
    if policy is None:
        return None
    reserved = next((r for r in policy["reserved"] if fnmatch.fnmatchcase(ns, r)), None)
    if reserved is not None:
        return (
            f"namespace {ns!r} is reserved for other purposes (OrgPolicy spec.teamNamespaces.reserved: "
            f"{reserved!r})",
            "value.reserved-namespace",
            "a team namespace is labelled, quota'd and bound to the team by render: pick a new one",
        )
    allowed = _allowed_for(team, policy)
    if any(fnmatch.fnmatchcase(ns, pattern) for pattern in allowed):
        return None
    return (
        f"team {team!r} may not claim namespace {ns!r} (allowed: {', '.join(allowed) or 'none'})",
        "value.namespace-not-allowed",
        f"name it after the team (e.g. {team}-{ns}), or have the OrgPolicy's owners allow it under "
        f"spec.teamNamespaces.teams.{team}",
    )


def check_namespaces(c: Collector, tree: Tree) -> None:
    policy = tree.org_spec["teamNamespaces"] if tree.org else None
    if tree.org is not None and policy is not None:
        for team in policy["teams"]:
            c.ref(
                tree.org,
                ["spec", "teamNamespaces", "teams", team],
                team,
                tree.team_names,
                f"team {team!r} does not exist",
                "ref.team",
            )
    owners = _namespace_owners(tree.valid_quotas)
    for entry in tree.valid_quotas:
        team = entry.data["metadata"]["name"]
        for i, ns in enumerate(entry.data["spec"]["namespaces"]):
            other, other_entry, j = owners[ns]
            refused = _refusal(ns, team, policy)
            # another team's namespace: the conflict below says it better than "not allowed"
            if refused is not None and (other == team or refused[1] != "value.namespace-not-allowed"):
                c.error(entry, ["spec", "namespaces", i], *refused)
            if other != team:
                where = other_entry.doc.locate(("spec", "namespaces", j))
                c.error(
                    entry,
                    ["spec", "namespaces", i],
                    f"namespace {ns!r} is already claimed by team {other!r} ({where})",
                    "conflict.namespace",
                    "a namespace belongs to exactly one team; remove it here or there",
                )
