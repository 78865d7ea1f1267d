"""Kueue's quota arithmetic over a tree of Cohorts and ClusterQueues.

Mirrors Kueue v0.19.2 ``pkg/cache/scheduler/resource_node.go``: ``SubtreeQuota`` accumulated from
the leaves (``updateCohortResourceNode``, ``accumulateFromChild``), ``localQuota`` (what lending
limits keep inside a subtree), ``potentialAvailable`` (the most a ClusterQueue could ever be
admitted: its own quota plus what its ancestors can lend, capped by borrowing limits) and
``available`` (the same with the current usage taken off, usage bubbling up past ``localQuota``).

Quantities are Kueue's integers (``resources.Amount`` / ``ResourceValue``): milli-CPU for ``cpu``,
whole units (bytes, pods, GPUs) otherwise. Python integers do not overflow, so Kueue's saturation at
``math.MaxInt64`` (``Unlimited``) never matters for the quotas mpigate renders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

__all__ = [
    "ClusterQueue",
    "Cohort",
    "CohortCycleError",
    "FlavorResource",
    "Quota",
    "QuotaTree",
    "ResourceGroup",
    "Usage",
]

FlavorResource = tuple[str, str]
"""``(flavor, resource)``: Kueue's ``resources.FlavorResource``."""

_EMPTY: Final[Mapping[FlavorResource, int]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Quota:
    """One ``resources[]`` entry of a flavor in a resource group (``ResourceQuota``)."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    """``spec.resourceGroups[]``: the resources it covers and its flavors, in the order Kueue
    tries them."""

    covered: tuple[str, ...]
    flavors: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClusterQueue:
    name: str
    cohort: str | None
    resource_groups: tuple[ResourceGroup, ...]
    quotas: Mapping[FlavorResource, Quota]

    def group_for(self, resource: str) -> ResourceGroup | None:
        """The resource group covering ``resource`` (``ClusterQueueSnapshot.RGByResource``)."""
        for group in self.resource_groups:
            if resource in group.covered:
                return group
        return None


@dataclass(frozen=True, slots=True)
class Cohort:
    """A Cohort object (``spec.parentName``, ``spec.resourceGroups``); a cohort that only
    ClusterQueues name is implicit: no parent, no quota."""

    name: str
    parent: str | None = None
    quotas: Mapping[FlavorResource, Quota] = field(default_factory=lambda: MappingProxyType({}))


class CohortCycleError(ValueError):
    """Cohorts whose parents form a cycle (Kueue marks their ClusterQueues inactive)."""


@dataclass(frozen=True, slots=True)
class _Node:
    name: str
    parent: str | None  # a cohort's key in the tree
    quotas: Mapping[FlavorResource, Quota]
    subtree: Mapping[FlavorResource, int]

    def local_quota(self, fr: FlavorResource) -> int:
        """``resourceNode.localQuota``: capacity a lending limit keeps inside this subtree."""
        quota = self.quotas.get(fr)
        if quota is None or quota.lending_limit is None:
            return 0
        return max(0, self.subtree.get(fr, 0) - quota.lending_limit)


def _cq_key(name: str) -> str:
    return "cq/" + name


def _cohort_key(name: str) -> str:
    return "cohort/" + name


@dataclass(frozen=True, slots=True)
class Usage:
    """Usage per node of a :class:`QuotaTree` (ClusterQueues' own; cohorts' as Kueue accumulates
    it: what children use past their ``localQuota``)."""

    by_node: Mapping[str, Mapping[FlavorResource, int]]

    def of(self, key: str, fr: FlavorResource) -> int:
        return self.by_node.get(key, _EMPTY).get(fr, 0)


class QuotaTree:
    """ClusterQueues and their Cohorts, with every node's ``SubtreeQuota`` computed once."""

    __slots__ = ("_depth", "_groups", "_nodes", "_potential", "queues")

    def __init__(self, queues: Iterable[ClusterQueue], cohorts: Iterable[Cohort] = ()) -> None:
        self.queues: dict[str, ClusterQueue] = {q.name: q for q in queues}
        declared = {c.name: c for c in cohorts}
        # Implicit cohorts: named by a ClusterQueue or as a parent, without a Cohort object.
        for queue in self.queues.values():
            if queue.cohort is not None and queue.cohort not in declared:
                declared[queue.cohort] = Cohort(queue.cohort)
        for cohort in list(declared.values()):
            if cohort.parent is not None and cohort.parent not in declared:
                declared[cohort.parent] = Cohort(cohort.parent)
        _check_cycles(declared)
        children: dict[str | None, list[str]] = {}
        raw: dict[str, tuple[str | None, Mapping[FlavorResource, Quota]]] = {}
        for cohort in declared.values():
            parent = _cohort_key(cohort.parent) if cohort.parent is not None else None
            raw[_cohort_key(cohort.name)] = (parent, cohort.quotas)
            children.setdefault(parent, []).append(_cohort_key(cohort.name))
        for queue in self.queues.values():
            parent = _cohort_key(queue.cohort) if queue.cohort is not None else None
            raw[_cq_key(queue.name)] = (parent, queue.quotas)
            children.setdefault(parent, []).append(_cq_key(queue.name))
        nodes: dict[str, _Node] = {}
        for root in children.get(None, ()):
            _accumulate(root, raw, children, nodes)
        self._nodes = nodes
        self._depth: dict[str, int] = {}
        for key in nodes:
            depth, parent = 0, nodes[key].parent
            while parent is not None:
                depth, parent = depth + 1, nodes[parent].parent
            self._depth[key] = depth
        self._potential: dict[tuple[str, FlavorResource], int] = {}
        self._groups: dict[str, dict[str, ResourceGroup]] = {}
        for queue in self.queues.values():
            by_resource: dict[str, ResourceGroup] = {}
            for group in queue.resource_groups:
                for resource in group.covered:
                    by_resource.setdefault(resource, group)
            self._groups[queue.name] = by_resource

    # -- reading the tree ------------------------------------------------------------------------

    def groups(self, queue: str) -> Mapping[str, ResourceGroup]:
        """Resource → the queue's resource group covering it (``group_for``, prepared once)."""
        return self._groups[queue]

    def subtree_quota(self, key: str, fr: FlavorResource) -> int:
        return self._nodes[key].subtree.get(fr, 0)

    def ancestors(self, queue: str) -> tuple[str, ...]:
        """Cohort names from the queue's cohort up to the root."""
        out: list[str] = []
        parent = self._nodes[_cq_key(queue)].parent
        while parent is not None:
            out.append(parent[len("cohort/") :])
            parent = self._nodes[parent].parent
        return tuple(out)

    # -- Kueue's functions -----------------------------------------------------------------------

    def potential_available(self, queue: str, fr: FlavorResource) -> int:
        """The most of ``fr`` the ClusterQueue could ever be admitted, with no usage anywhere
        (Kueue: ``potentialAvailable`` in resource_node.go, used by the flavor assigner's
        ``fitsResourceQuota`` as the maximum capacity). Memoised: the tree is immutable."""
        key = (queue, fr)
        found = self._potential.get(key)
        if found is None:
            found = self._potential[key] = self._potential_of(_cq_key(queue), fr)
        return found

    def _potential_of(self, key: str, fr: FlavorResource) -> int:
        node = self._nodes[key]
        if node.parent is None:
            return node.subtree.get(fr, 0)
        avail = node.local_quota(fr) + self._potential_of(node.parent, fr)
        quota = node.quotas.get(fr)
        if quota is not None and quota.borrowing_limit is not None:
            avail = min(node.subtree.get(fr, 0) + quota.borrowing_limit, avail)
        return avail

    def usage(self, per_queue: Mapping[str, Mapping[FlavorResource, int]]) -> Usage:
        """Every node's usage from the ClusterQueues' (Kueue: ``accumulateFromChild``: a cohort
        holds what its children use past their ``localQuota``). Queues the tree does not know
        are ignored. Only the given queues and their ancestors are visited (deepest first), so
        the cost follows the queues given, not the size of the tree."""
        by_node: dict[str, dict[FlavorResource, int]] = {}
        touched: set[str] = set()
        for name, used in per_queue.items():
            if name not in self.queues:
                continue
            key = _cq_key(name)
            by_node[key] = {fr: v for fr, v in used.items() if v}
            while key not in touched:
                touched.add(key)
                parent = self._nodes[key].parent
                if parent is None:
                    break
                key = parent
        for key in sorted(touched, key=lambda k: -self._depth[k]):
            node = self._nodes[key]
            if node.parent is None:
                continue
            for fr, value in by_node.get(key, {}).items():
                delta = max(0, value - node.local_quota(fr))
                if delta:
                    into = by_node.setdefault(node.parent, {})
                    into[fr] = into.get(fr, 0) + delta
        return Usage(MappingProxyType({k: MappingProxyType(v) for k, v in by_node.items()}))

    def available(self, queue: str, fr: FlavorResource, usage: Usage) -> int:
        """What the ClusterQueue can be admitted now without preempting anyone, never negative
        (Kueue: ``ClusterQueueSnapshot.Available`` = ``max(0, available(...))``)."""
        return max(0, self._available_of(_cq_key(queue), fr, usage))

    def _available_of(self, key: str, fr: FlavorResource, usage: Usage) -> int:
        node = self._nodes[key]
        subtree = node.subtree.get(fr, 0)
        used = usage.of(key, fr)
        if node.parent is None:
            return subtree - used
        parent_available = self._available_of(node.parent, fr, usage)
        quota = node.quotas.get(fr)
        local = node.local_quota(fr)
        if quota is not None and quota.borrowing_limit is not None:
            stored_in_parent = subtree - local
            used_in_parent = max(0, used - local)
            parent_available = min(
                stored_in_parent - used_in_parent + quota.borrowing_limit, parent_available
            )
        local_available = max(0, local - used)
        return local_available + parent_available


def _check_cycles(cohorts: Mapping[str, Cohort]) -> None:
    for start in cohorts:
        seen = {start}
        parent = cohorts[start].parent
        while parent is not None:
            if parent in seen:
                raise CohortCycleError(f"cohort {start} is in a cycle of parents")
            seen.add(parent)
            parent = cohorts[parent].parent


def _accumulate(
    key: str,
    raw: Mapping[str, tuple[str | None, Mapping[FlavorResource, Quota]]],
    children: Mapping[str | None, list[str]],
    nodes: dict[str, _Node],
) -> _Node:
    """``updateCohortResourceNode`` / ``accumulateFromChild``: a node's SubtreeQuota is its own
    nominal quota plus what each child does not keep local."""
    parent, quotas = raw[key]
    subtree: dict[FlavorResource, int] = {fr: q.nominal for fr, q in quotas.items()}
    for child_key in children.get(key, ()):
        child = _accumulate(child_key, raw, children, nodes)
        for fr, value in child.subtree.items():
            subtree[fr] = subtree.get(fr, 0) + value - child.local_quota(fr)
    node = _Node(key, parent, quotas, MappingProxyType(subtree))
    nodes[key] = node
    return node
