"""Kueue's flavor assignment of a workload's pod sets to a ClusterQueue's flavors.

Mirrors Kueue v0.19.2 ``pkg/scheduler/flavorassigner/flavorassigner.go``:

* ``assignFlavors``: pod sets in order; a CQ that covers ``pods`` gets each pod set's count as a
  ``pods`` request; a resource no resource group covers makes the pod set unschedulable unless its
  quantity is zero (``quotaCheckStrategy: BlockUndeclared``, the default); each resource group is
  assigned once per pod set, all its covered resources to **one** flavor; what earlier pod sets
  took counts against later ones (``assignmentUsage``).
* ``findFlavorForPodSets``: the group's flavors in order; a flavor must match the pod's node
  selector and required node affinity on the flavor's own label keys (``checkFlavorForPodSets``,
  ``flavorSelector``); then each requested resource goes through ``fitsResourceQuota``: more than
  ``potentialAvailable`` never fits, at most ``available`` fits now, in between waits for quota
  (or preemption). With the default ``flavorFungibility`` (``whenCanBorrow: MayStopSearch``,
  ``whenCanPreempt: TryNextFlavor``) the first flavor that fits now is taken, borrowing or not;
  otherwise the first flavor that could fit after waiting.

Left out, because mpigate renders none of it: topology-aware scheduling, ResourceFlavor
``nodeTaints``, admission checks, partial admission, workload slices, resource transformations
and ``excludeResourcePrefixes``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from .quota import FlavorResource, QuotaTree, Usage

__all__ = [
    "Assignment",
    "Attempt",
    "Failure",
    "Flavor",
    "PodSet",
    "Requirement",
    "Shortfall",
    "assign",
    "flavor_matches",
]

_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Requirement:
    """A ``matchExpressions`` entry of a required node affinity term."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Flavor:
    """A ResourceFlavor: the node labels Kueue matches pods against."""

    name: str
    node_labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class PodSet:
    """A workload's pod set: ``requests`` is the whole pod set's (per pod × count), in Kueue units."""

    name: str
    count: int
    requests: Mapping[str, int]
    node_selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms (ORed), None when unset
    affinity: tuple[tuple[Requirement, ...], ...] | None = None


@dataclass(frozen=True, slots=True)
class Attempt:
    """A flavor that could never take a pod set's resource group, and why: ``affinity`` (the pods
    do not select its nodes), ``missing`` (no such ResourceFlavor) or ``quota`` (``requested`` —
    earlier pod sets' share included — is above ``maximum``, the ``potentialAvailable``)."""

    flavor: str
    reason: Literal["affinity", "missing", "quota"]
    resource: str = ""
    requested: int = 0
    maximum: int = 0


@dataclass(frozen=True, slots=True)
class Failure:
    """A pod set's resource group that no flavor can ever take (Kueue: NoFit), or a resource no
    group covers (``uncovered``)."""

    podset: str
    resources: tuple[str, ...]
    uncovered: bool
    attempts: tuple[Attempt, ...] = ()


@dataclass(frozen=True, slots=True)
class Shortfall:
    """A resource that fits the chosen flavor's quota but not its free quota right now."""

    podset: str
    flavor: str
    resource: str
    requested: int
    available: int
    maximum: int

    @property
    def needed(self) -> int:
        return self.requested - self.available


@dataclass(frozen=True, slots=True)
class Assignment:
    """The result for a whole workload. ``flavors``: per pod set, resource → flavor (pod sets that
    failed get what could be assigned). Admissible when there is no failure; admitted now when
    there is also no shortfall."""

    flavors: tuple[tuple[str, Mapping[str, str]], ...]
    failures: tuple[Failure, ...]
    shortfalls: tuple[Shortfall, ...]
    usage: Mapping[FlavorResource, int]

    @property
    def admissible(self) -> bool:
        return not self.failures

    @property
    def fits_now(self) -> bool:
        return not self.failures and not self.shortfalls


def flavor_matches(flavor: Flavor, podset: PodSet) -> bool:
    """Whether the pods may run on the flavor's nodes, judged only on the flavor's own label keys
    (Kueue ``flavorSelector`` + kube-scheduler ``RequiredNodeAffinity.Match`` on a node that has
    exactly the flavor's labels)."""
    labels = flavor.node_labels
    for key, value in podset.node_selector.items():
        if key in labels and labels[key] != value:
            return False
    if podset.affinity is None:
        return True
    terms: list[tuple[Requirement, ...]] = []
    for term in podset.affinity:
        kept = tuple(r for r in term if r.key in labels)
        if not kept:
            # A term left empty matches every flavor: the terms are ORed, so affinity is dropped.
            return True
        terms.append(kept)
    if not terms:
        return True
    return any(all(_requirement_matches(r, labels) for r in term) for term in terms)


def _requirement_matches(req: Requirement, labels: Mapping[str, str]) -> bool:
    """k8s.io/apimachinery ``labels.Requirement.Matches`` for node selector operators."""
    present = req.key in labels
    value = labels.get(req.key, "")
    op = req.operator
    if op == "In":
        return present and value in req.values
    if op == "NotIn":
        return not present or value not in req.values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(req.values) != 1:
            return False
        try:
            have, want = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False  # an unknown operator is an error in Kueue: the flavor is not taken


def assign(
    tree: QuotaTree,
    queue: str,
    podsets: Sequence[PodSet],
    flavors: Mapping[str, Flavor],
    usage: Usage | None = None,
) -> Assignment:
    """Assign ``podsets`` to the flavors of ClusterQueue ``queue``; ``usage`` is the current usage
    of the tree (``None``: an empty cluster, where whatever is admissible fits)."""
    groups = tree.groups(queue)
    counts_pods = "pods" in groups
    assumed: dict[FlavorResource, int] = {}
    per_podset: list[tuple[str, Mapping[str, str]]] = []
    failures: list[Failure] = []
    shortfalls: list[Shortfall] = []
    for podset in podsets:
        requests = dict(podset.requests)
        if counts_pods:
            requests["pods"] = podset.count
        assigned: dict[str, str] = {}
        failed = False
        for resource in sorted(requests):
            if resource in assigned:
                continue
            group = groups.get(resource)
            if group is None:
                if requests[resource] == 0:
                    continue
                failures.append(Failure(podset.name, (resource,), True))
                failed = True
                continue
            wanted = {r: requests[r] for r in group.covered if r in requests}
            chosen, attempts, pending = _find_flavor(
                tree, queue, group.flavors, wanted, podset, flavors, assumed, usage
            )
            if chosen is None:
                failures.append(Failure(podset.name, tuple(sorted(wanted)), False, attempts))
                failed = True
                continue
            for r in wanted:
                assigned[r] = chosen
            shortfalls.extend(pending)
        per_podset.append((podset.name, assigned))
        if not failed:
            for resource, flavor in assigned.items():
                fr = (flavor, resource)
                assumed[fr] = assumed.get(fr, 0) + requests[resource]
    return Assignment(tuple(per_podset), tuple(failures), tuple(shortfalls), MappingProxyType(assumed))


def _find_flavor(
    tree: QuotaTree,
    queue: str,
    names: Iterable[str],
    wanted: Mapping[str, int],
    podset: PodSet,
    flavors: Mapping[str, Flavor],
    assumed: Mapping[FlavorResource, int],
    usage: Usage | None,
) -> tuple[str | None, tuple[Attempt, ...], list[Shortfall]]:
    attempts: list[Attempt] = []
    waiting: tuple[str, list[Shortfall]] | None = None
    for name in names:
        flavor = flavors.get(name)
        if flavor is None:
            attempts.append(Attempt(name, "missing"))
            continue
        if not flavor_matches(flavor, podset):
            attempts.append(Attempt(name, "affinity"))
            continue
        over: Attempt | None = None
        short: list[Shortfall] = []
        for resource in sorted(wanted):
            fr = (name, resource)
            value = assumed.get(fr, 0) + wanted[resource]
            maximum = tree.potential_available(queue, fr)
            if value > maximum:
                over = Attempt(name, "quota", resource, value, maximum)
                break
            if usage is not None:
                free = tree.available(queue, fr, usage)
                if value > free:
                    short.append(Shortfall(podset.name, name, resource, value, free, maximum))
        if over is not None:
            attempts.append(over)
            continue
        if not short:
            return name, (), []
        if waiting is None:
            waiting = (name, short)
    if waiting is not None:
        return waiting[0], (), waiting[1]
    return None, tuple(attempts), []
