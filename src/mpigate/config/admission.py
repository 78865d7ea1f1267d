"""The cluster's ValidatingAdmissionPolicies in the config tree: which objects a policy and its
binding select, the binding's parameter objects, its rule ID and mode.

Pure functions of the documents, shared by ``mpigate check`` (:mod:`.crossfile.admissionpolicies`),
the model (:func:`admission_rules`, one :class:`~mpigate.config.model.CustomRule` per binding) and
the engine (:func:`binding_matches`, :mod:`mpigate.policy.custom`). The matching follows
k8s.io/apiserver pkg/admission/plugin/policy/matching/matching.go ``(*Matcher).Matches`` (namespace
selector, object selector, excluded rules, then resource rules) and
pkg/admission/plugin/webhook/predicates/rules/rules.go ``(*Matcher).Matches`` (scope, operation,
group, version, resource); the parameters follow
pkg/admission/plugin/policy/generic/policy_dispatcher.go ``CollectParams``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ADMISSION_API",
    "ADMISSION_KINDS",
    "NAMESPACE_NAME_LABEL",
    "POD_CREATOR",
    "RESOURCES",
    "BindingParams",
    "ParamObject",
    "admission_mode",
    "admission_rule_id",
    "binding_matches",
    "collect_params",
    "param_object",
    "selector_matches",
]

ADMISSION_API = "admissionregistration.k8s.io/v1"
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# The label the API server sets on every namespace (the only one mpigate knows without the cluster).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# What mpigate judges, as the API server's (group, version, resource) of the admission request.
RESOURCES: Mapping[str, tuple[str, str, str]] = {
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    "MPIJob": ("kubeflow.org", "v2beta1", "mpijobs"),
    "TrainingRuntime": ("trainer.kubeflow.org", "v1alpha1", "trainingruntimes"),
    "ClusterTrainingRuntime": ("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes"),
    "Pod": ("", "v1", "pods"),
}
# Who creates a TrainJob's pods: JobSet creates Jobs, and the Job controller creates their pods
# (kube-controller-manager's service account for it, with the groups the API server adds).
POD_CREATOR: Mapping[str, Any] = {
    "username": "system:serviceaccount:kube-system:job-controller",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
}
_ID_PART = re.compile(r"[^A-Z0-9]+")


def admission_rule_id(policy: str, binding: str) -> str:
    """The rule ID of ``binding`` of ``policy`` in decisions, audit records, reports, overrides and
    exceptions: ``VAP-<POLICY>--<BINDING>`` (names upper-cased, other characters as ``-``), so that
    ``VAP-<POLICY>`` as a prefix names every binding of the policy."""

    def part(name: str) -> str:
        return _ID_PART.sub("-", name.upper()).strip("-") or "X"

    return f"VAP-{part(policy)}--{part(binding)}"


def admission_mode(actions: Sequence[str]) -> str:
    """The mpigate mode of a binding's validationActions: Deny denies (``enforce``), Warn admits
    with a warning (``warn``), Audit only records (``audit``)."""
    if "Deny" in actions:
        return "enforce"
    return "warn" if "Warn" in actions else "audit"


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy a metav1.LabelSelector (absent or empty: everything).

    k8s.io/apimachinery pkg/apis/meta/v1/helpers.go ``LabelSelectorAsSelector`` and
    pkg/labels/selector.go ``(Requirement).Matches``."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for requirement in selector.get("matchExpressions") or ():
        key, operator = requirement.get("key"), requirement.get("operator")
        values = requirement.get("values") or ()
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _rule_matches(
    rule: Mapping[str, Any], resource: tuple[str, str, str], operation: str, namespace: str, name: str
) -> bool:
    # rules.go (*Matcher).Matches: scope, operation, group, version, resource (no subresource)
    scope = rule.get("scope", "*")
    if scope == "Namespaced" and not namespace:
        return False
    if scope == "Cluster" and namespace:
        return False
    operations = rule.get("operations") or ()
    if "*" not in operations and operation not in operations:
        return False
    group, version, plural = resource
    if not any(g in ("*", group) for g in rule.get("apiGroups") or ()):
        return False
    if not any(v in ("*", version) for v in rule.get("apiVersions") or ()):
        return False
    # "pods" and "pods/*" select the pod itself, "*/status" only a subresource (never judged here)
    if not any(
        res in ("*", plural) and sub in ("", "*")
        for res, _, sub in (str(r).partition("/") for r in rule.get("resources") or ())
    ):
        return False
    names = rule.get("resourceNames") or ()
    return not names or name in names


def _constraints_match(
    match: Mapping[str, Any] | None,
    resource: tuple[str, str, str],
    operation: str,
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    namespace_labels: Mapping[str, str],
) -> bool:
    if match is None:
        return True
    # a cluster-scoped object matches any namespaceSelector (namespace.Matcher.MatchNamespaceSelector)
    if namespace and not selector_matches(match.get("namespaceSelector"), namespace_labels):
        return False
    if not selector_matches(match.get("objectSelector"), labels):
        return False
    if any(
        _rule_matches(r, resource, operation, namespace, name)
        for r in match.get("excludeResourceRules") or ()
    ):
        return False
    rules = match.get("resourceRules") or ()
    # matchPolicy Equivalent widens a rule to other versions of the same resource; mpigate judges
    # one version of each, so Exact and Equivalent select the same requests here
    return not rules or any(_rule_matches(r, resource, operation, namespace, name) for r in rules)


def binding_matches(
    constraints: Sequence[Mapping[str, Any] | None],
    kind: str,
    operation: str,
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    namespace_labels: Mapping[str, str] | None = None,
) -> bool:
    """Whether an admission request of ``kind`` (a key of :data:`RESOURCES`) is selected by every
    one of ``constraints`` (the policy's matchConstraints, then the binding's matchResources; an
    absent one selects everything). The policy's matchConstraints must name resources: with no
    resourceRules it selects nothing (the API server requires them)."""
    resource = RESOURCES.get(kind)
    if resource is None or not constraints or not (constraints[0] or {}).get("resourceRules"):
        return False
    ns_labels = namespace_labels if namespace_labels is not None else {NAMESPACE_NAME_LABEL: namespace}
    return all(
        _constraints_match(c, resource, operation, namespace, name, labels, ns_labels) for c in constraints
    )


@dataclass(frozen=True, slots=True)
class ParamObject:
    """A document of the tree that a binding may take as its parameters."""

    api_version: str
    kind: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    data: Any


def param_object(data: Any) -> ParamObject | None:
    """``data`` as a possible parameter object (a mapping with apiVersion, kind and a name)."""
    if not isinstance(data, dict):
        return None
    meta = data.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    raw_labels = meta.get("labels")
    labels = {str(k): str(v) for k, v in raw_labels.items()} if isinstance(raw_labels, dict) else {}
    raw_namespace = meta.get("namespace")
    namespace = raw_namespace if isinstance(raw_namespace, str) else ""
    return ParamObject(api_version, kind, namespace, str(meta["name"]), labels, data)


@dataclass(frozen=True, slots=True)
class BindingParams:
    """The parameter objects a binding may use. ``by_request_namespace``: the objects are
    namespaced and paramRef names no namespace, so a request uses those of its own namespace
    (CollectParams); ``deny_missing``: finding none is an error (parameterNotFoundAction Deny)."""

    objects: tuple[ParamObject, ...]
    by_request_namespace: bool
    deny_missing: bool

    def for_namespace(self, namespace: str) -> tuple[ParamObject, ...]:
        if not self.by_request_namespace:
            return self.objects
        return tuple(o for o in self.objects if o.namespace == namespace)

    def missing(self, namespace: str) -> str:
        """The configuration error of a request in ``namespace`` that finds no parameters."""
        if not self.deny_missing or self.for_namespace(namespace):
            return ""
        return "no params found for policy binding with `Deny` parameterNotFoundAction"


def collect_params(
    param_kind: Mapping[str, Any] | None,
    param_ref: Mapping[str, Any] | None,
    objects: Iterable[ParamObject],
) -> BindingParams | None:
    """The parameter objects of a binding (None: the policy takes none — no paramKind, or the
    binding no paramRef — and ``params`` is null): the tree's objects of ``paramKind`` that
    ``paramRef`` names, by name or by label selector, in ``paramRef.namespace`` when it names one
    (k8s.io/apiserver pkg/admission/plugin/policy/generic/policy_dispatcher.go ``CollectParams``)."""
    if not param_kind or not param_ref:
        return None
    found = [
        o
        for o in objects
        if o.api_version == param_kind.get("apiVersion") and o.kind == param_kind.get("kind")
    ]
    if param_ref.get("namespace"):
        found = [o for o in found if o.namespace == param_ref["namespace"]]
    if param_ref.get("name"):
        found = [o for o in found if o.name == param_ref["name"]]
    else:
        found = [o for o in found if selector_matches(param_ref.get("selector") or {}, o.labels)]
    namespaced = not param_ref.get("namespace") and any(o.namespace for o in found)
    return BindingParams(tuple(found), namespaced, param_ref.get("parameterNotFoundAction", "Deny") == "Deny")
