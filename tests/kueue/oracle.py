"""An independent implementation of Kueue's admission ceiling, written from Kueue v0.19.2's code
for the property tests (it shares nothing with ``mpigate.kueue``): it reads the Kueue objects as
Kubernetes manifests (ClusterQueues, Cohorts, ResourceFlavors, the namespace's LimitRange) and
answers whether a workload's pod sets could ever be admitted.

Transcribed from:

* pkg/cache/scheduler/resource_node.go: ``updateClusterQueueResourceNode``,
  ``updateCohortResourceNode``, ``accumulateFromChild``, ``localQuota``, ``potentialAvailable``;
  and, for what is free now, ``addUsage`` (a workload's usage added to its ClusterQueue, bubbling
  past ``LocalAvailable`` to the cohorts, one workload at a time as the cache admits them — not the
  recomputation mpigate does), ``available`` and ``LocalAvailable``, with
  clusterqueue_snapshot.go ``(*ClusterQueueSnapshot).Available`` (never below 0);
* pkg/scheduler/flavorassigner/flavorassigner.go: ``assignFlavors``, ``findFlavorForPodSets``,
  ``checkFlavorForPodSets``, ``flavorSelector``, ``fitsResourceQuota`` (the ``val >
  maxCapacity`` branch: NoFit) — on an empty cluster, where ``available == potentialAvailable``;
* pkg/workload/resources.go ``AdjustResources`` (LimitRange ``defaultRequest`` first, then limits
  as missing requests) and k8s.io/component-helpers ``resource.PodRequests`` (containers +
  restartable init containers vs. the largest init container, plus overhead), then
  ``totalRequestsFromPodSets`` (per pod × count; CPU in milli, others rounded up).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from mpigate.config import parse_quantity

Manifest = Mapping[str, Any]


def _value(resource: str, quantity: Any) -> int:
    q = Fraction(quantity) if isinstance(quantity, int | Fraction) else parse_quantity(quantity)
    if resource == "cpu":
        q *= 1000
    return math.ceil(q)


@dataclass
class Node:
    name: str
    parent: str | None
    quotas: dict[tuple[str, str], dict[str, int | None]]
    children: list[str]
    subtree: dict[tuple[str, str], int]
    usage: dict[tuple[str, str], int] = field(default_factory=dict)


class Kueue:
    def __init__(self, cluster_queues: list[Manifest], cohorts: list[Manifest], flavors: list[Manifest]):
        self.nodes: dict[str, Node] = {}
        self.cqs: dict[str, Manifest] = {cq["metadata"]["name"]: cq for cq in cluster_queues}
        self.flavor_labels = {f["metadata"]["name"]: dict(f["spec"].get("nodeLabels") or {}) for f in flavors}
        for cohort in cohorts:
            spec = cohort.get("spec") or {}
            self._node(
                "cohort:" + cohort["metadata"]["name"], spec.get("parentName"), spec.get("resourceGroups")
            )
        for name, cq in self.cqs.items():
            self._node("cq:" + name, cq["spec"].get("cohortName"), cq["spec"]["resourceGroups"])
        for node in list(self.nodes.values()):
            if node.parent is not None and node.parent not in self.nodes:
                self._node(node.parent, None, None)  # an implicit cohort
            if node.parent is not None:
                self.nodes[node.parent].children.append(node.name)
        for node in self.nodes.values():
            if node.parent is None:
                self._update(node)

    def _node(self, key: str, parent: str | None, groups: Any) -> None:
        quotas: dict[tuple[str, str], dict[str, int | None]] = {}
        for group in groups or []:
            for flavor in group["flavors"]:
                for res in flavor["resources"]:
                    r = res["name"]
                    quotas[(flavor["name"], r)] = {
                        "nominal": _value(r, res["nominalQuota"]),
                        "borrowingLimit": _value(r, res["borrowingLimit"])
                        if "borrowingLimit" in res
                        else None,
                        "lendingLimit": _value(r, res["lendingLimit"]) if "lendingLimit" in res else None,
                    }
        self.nodes[key] = Node(key, "cohort:" + parent if parent else None, quotas, [], {})

    def local_quota(self, node: Node, fr: tuple[str, str]) -> int:
        lending = node.quotas.get(fr, {}).get("lendingLimit")
        if lending is not None:
            return max(0, node.subtree.get(fr, 0) - lending)
        return 0

    def _update(self, node: Node) -> None:
        node.subtree = {fr: q["nominal"] for fr, q in node.quotas.items()}  # type: ignore[misc]
        for child_name in node.children:
            child = self.nodes[child_name]
            self._update(child)
            for fr, child_quota in child.subtree.items():
                node.subtree[fr] = node.subtree.get(fr, 0) + child_quota - self.local_quota(child, fr)

    def potential_available(self, node: Node, fr: tuple[str, str]) -> int:
        if node.parent is None:
            return node.subtree.get(fr, 0)
        avail = self.local_quota(node, fr) + self.potential_available(self.nodes[node.parent], fr)
        borrowing = node.quotas.get(fr, {}).get("borrowingLimit")
        if borrowing is not None:
            avail = min(node.subtree.get(fr, 0) + borrowing, avail)
        return avail

    def cq_potential(self, cq: str, fr: tuple[str, str]) -> int:
        return self.potential_available(self.nodes["cq:" + cq], fr)

    # -- usage: what is free now -------------------------------------------------------------------

    def _local_available(self, node: Node, fr: tuple[str, str]) -> int:
        return max(0, self.local_quota(node, fr) - node.usage.get(fr, 0))

    def add_usage(self, cq: str, fr: tuple[str, str], val: int) -> None:
        """One admitted workload's usage of ``fr`` in ClusterQueue ``cq``."""
        self._add_usage(self.nodes["cq:" + cq], fr, val)

    def _add_usage(self, node: Node, fr: tuple[str, str], val: int) -> None:
        local = self._local_available(node, fr)
        node.usage[fr] = node.usage.get(fr, 0) + val
        if node.parent is not None and val > local:
            self._add_usage(self.nodes[node.parent], fr, val - local)

    def _available(self, node: Node, fr: tuple[str, str]) -> int:
        if node.parent is None:
            return node.subtree.get(fr, 0) - node.usage.get(fr, 0)
        parent = self._available(self.nodes[node.parent], fr)
        borrowing = node.quotas.get(fr, {}).get("borrowingLimit")
        if borrowing is not None:
            lq = self.local_quota(node, fr)
            stored = node.subtree.get(fr, 0) - lq
            used = max(0, node.usage.get(fr, 0) - lq)
            parent = min(stored - used + borrowing, parent)
        return self._local_available(node, fr) + parent

    def cq_available(self, cq: str, fr: tuple[str, str]) -> int:
        return max(0, self._available(self.nodes["cq:" + cq], fr))

    # -- flavor assignment on an empty cluster ---------------------------------------------------

    def _selector_matches(self, flavor: str, pod_spec: Manifest) -> bool:
        labels = self.flavor_labels.get(flavor)
        if labels is None:
            return False
        keys = set(labels)
        for k, v in (pod_spec.get("nodeSelector") or {}).items():
            if k in keys and labels[k] != v:
                return False
        required = (
            ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"
            )
            or {}
        ).get("nodeSelectorTerms")
        if required is None:
            return True
        terms = []
        for term in required:
            exps = [e for e in term.get("matchExpressions") or [] if e["key"] in keys]
            if not exps:
                return True
            terms.append(exps)
        if not terms:
            return True

        def ok(e: Manifest) -> bool:
            has, val, vals = e["key"] in labels, labels.get(e["key"]), e.get("values") or []
            match e["operator"]:
                case "In":
                    return has and val in vals
                case "NotIn":
                    return not has or val not in vals
                case "Exists":
                    return has
                case "DoesNotExist":
                    return not has
                case "Gt" | "Lt":
                    try:
                        a, b = int(val or ""), int(vals[0])
                    except (ValueError, IndexError):
                        return False
                    return has and len(vals) == 1 and (a > b if e["operator"] == "Gt" else a < b)
            return False

        return any(all(ok(e) for e in term) for term in terms)

    def admissible(
        self, cq_name: str, podsets: list[tuple[str, int, Manifest]], limit_range: Manifest | None
    ) -> bool:
        """Whether the workload (pod sets as (name, count, pod spec)) could ever be admitted."""
        cq = self.cqs[cq_name]
        groups = cq["spec"]["resourceGroups"]

        def group_of(resource: str) -> Manifest | None:
            return next((g for g in groups if resource in g["coveredResources"]), None)

        assumed: dict[tuple[str, str], int] = {}
        for _name, count, spec in podsets:
            per_pod = pod_requests(spec, limit_range)
            requests = {r: _value(r, q) * count for r, q in per_pod.items()}
            if group_of("pods") is not None:
                requests["pods"] = count
            chosen: dict[str, str] = {}
            for resource, quantity in requests.items():
                if resource in chosen:
                    continue
                group = group_of(resource)
                if group is None:
                    if quantity == 0:
                        continue
                    return False
                wanted = {r: q for r, q in requests.items() if r in group["coveredResources"]}
                found = None
                for flavor in group["flavors"]:
                    name = flavor["name"]
                    if not self._selector_matches(name, spec):
                        continue
                    if all(
                        assumed.get((name, r), 0) + q <= self.cq_potential(cq_name, (name, r))
                        for r, q in wanted.items()
                    ):
                        found = name
                        break
                if found is None:
                    return False
                for r in wanted:
                    chosen[r] = found
            for r, flavor in chosen.items():
                assumed[(flavor, r)] = assumed.get((flavor, r), 0) + requests[r]
        return True


def pod_requests(spec: Manifest, limit_range: Manifest | None) -> dict[str, Fraction]:
    defaults: dict[str, Any] = {}
    for item in (limit_range or {}).get("spec", {}).get("limits", []):
        if item.get("type") == "Container":
            defaults.update(item.get("defaultRequest") or {})

    def container(c: Manifest) -> dict[str, Fraction]:
        resources = c.get("resources") or {}
        requests = {k: parse_quantity(v) for k, v in (resources.get("requests") or {}).items()}
        for k, v in defaults.items():
            requests.setdefault(k, parse_quantity(v))
        for k, v in (resources.get("limits") or {}).items():
            requests.setdefault(k, parse_quantity(v))
        return requests

    total: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        for k, v in container(c).items():
            total[k] = total.get(k, Fraction(0)) + v
    init_max: dict[str, Fraction] = {}
    sidecars: dict[str, Fraction] = {}
    for c in spec.get("initContainers") or []:
        req = container(c)
        if c.get("restartPolicy") == "Always":
            for k, v in req.items():
                sidecars[k] = sidecars.get(k, Fraction(0)) + v
                total[k] = total.get(k, Fraction(0)) + v
        else:
            for k, v in req.items():
                init_max[k] = max(init_max.get(k, Fraction(0)), v + sidecars.get(k, Fraction(0)))
    for k, v in init_max.items():
        total[k] = max(total.get(k, Fraction(0)), v)
    for k, v in (spec.get("overhead") or {}).items():
        total[k] = total.get(k, Fraction(0)) + parse_quantity(v)
    return total
