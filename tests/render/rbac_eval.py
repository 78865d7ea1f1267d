"""A small model of the Kubernetes RBAC authorizer, to evaluate rendered RBAC offline.

It follows the authorizer's rules: a request (user, groups, verb, API group, resource[/subresource],
namespace) is allowed when some rule of a role bound to the user allows it. ClusterRoleBindings
apply everywhere; RoleBindings only in their namespace (and never to cluster-scoped requests).
Aggregated ClusterRoles get the rules of every ClusterRole their ``aggregationRule`` selects, as
the clusterrole-aggregation controller does. Service accounts authenticate as
``system:serviceaccount:<ns>:<name>`` with the groups ``system:serviceaccounts`` and
``system:serviceaccounts:<ns>``; everyone is in ``system:authenticated``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Identity:
    user: str
    groups: tuple[str, ...] = ()

    @staticmethod
    def service_account(namespace: str, name: str) -> Identity:
        return Identity(
            f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
        )

    @property
    def all_groups(self) -> frozenset[str]:
        return frozenset((*self.groups, "system:authenticated"))


def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


class Authorizer:
    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        objects = list(objects)
        self.cluster_roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
        self.roles = {
            (o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects if o["kind"] == "Role"
        }
        self.cluster_role_bindings = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
        self.role_bindings = [o for o in objects if o["kind"] == "RoleBinding"]

    def cluster_role_rules(self, name: str) -> list[Mapping[str, Any]]:
        role = self.cluster_roles.get(name)
        if role is None:
            return []
        aggregation = role.get("aggregationRule")
        if aggregation is None:
            return list(role.get("rules") or [])
        rules: list[Mapping[str, Any]] = []
        for other_name, other in sorted(self.cluster_roles.items()):
            if other_name == name:
                continue
            labels = other["metadata"].get("labels") or {}
            if any(_selector_matches(s, labels) for s in aggregation.get("clusterRoleSelectors") or ()):
                rules.extend(other.get("rules") or [])
        return rules

    def unresolved_role_refs(self) -> list[str]:
        missing = []
        for binding in [*self.cluster_role_bindings, *self.role_bindings]:
            ref = binding["roleRef"]
            if ref["kind"] == "ClusterRole" and ref["name"] not in self.cluster_roles:
                missing.append(f"{binding['kind']} {binding['metadata']['name']} → ClusterRole {ref['name']}")
            if ref["kind"] == "Role" and (binding["metadata"]["namespace"], ref["name"]) not in self.roles:
                missing.append(f"{binding['kind']} {binding['metadata']['name']} → Role {ref['name']}")
        return missing

    @staticmethod
    def _subject_matches(subject: Mapping[str, Any], who: Identity) -> bool:
        kind = subject["kind"]
        if kind == "User":
            return bool(subject["name"] == who.user)
        if kind == "Group":
            return subject["name"] in who.all_groups
        if kind == "ServiceAccount":
            return who.user == f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
        return False

    def _rules_for(self, binding: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        ref = binding["roleRef"]
        if ref["kind"] == "ClusterRole":
            return self.cluster_role_rules(ref["name"])
        role = self.roles.get((binding["metadata"]["namespace"], ref["name"]))
        return list(role.get("rules") or []) if role else []

    @staticmethod
    def _rule_allows(rule: Mapping[str, Any], verb: str, group: str, resource: str) -> bool:
        if rule.get("resourceNames") or rule.get("nonResourceURLs"):
            return False
        verbs = rule.get("verbs") or []
        groups = rule.get("apiGroups") or []
        resources = rule.get("resources") or []
        base = resource.split("/")[0]
        resource_ok = (
            "*" in resources or resource in resources or ("/" in resource and f"{base}/*" in resources)
        )
        return ("*" in verbs or verb in verbs) and ("*" in groups or group in groups) and resource_ok

    def allowed(self, who: Identity, verb: str, group: str, resource: str, namespace: str | None) -> bool:
        """Would the API server allow ``who`` to ``verb`` the resource (``pods/log`` style) in
        ``namespace`` (None: a cluster-scoped request)?"""
        bindings = list(self.cluster_role_bindings)
        if namespace is not None:
            bindings += [b for b in self.role_bindings if b["metadata"]["namespace"] == namespace]
        for binding in bindings:
            if not any(self._subject_matches(s, who) for s in binding.get("subjects") or ()):
                continue
            if any(self._rule_allows(r, verb, group, resource) for r in self._rules_for(binding)):
                return True
        return False
