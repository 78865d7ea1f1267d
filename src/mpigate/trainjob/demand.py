"""Resource arithmetic of effective pods, as the scheduler and Kueue count it.

* A container's request for a resource defaults to its limit when only the limit is given
  (Kubernetes API defaulting); extended resources such as GPUs must have requests = limits.
* A pod's request is ``max(Σ containers + Σ restartable init containers, max(init containers))``
  per resource (the effective-request rule of the scheduler and Kueue), plus ``spec.overhead``.
* A replicated job asks ``pods × per-pod``; a TrainJob asks the sum over its replicated jobs
  (initializers included: Kueue admits the JobSet's pod sets together).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from mpigate.config import parse_quantity

from .jsontypes import is_mapping
from .paths import Key, PathPart
from .resolve import EffectiveJob

__all__ = [
    "ContainerResources",
    "PodResources",
    "container_resources",
    "format_quantity",
    "kueue_pod_requests",
    "pod_resources",
]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    """Requests (defaulted from limits) and limits of one container, exact."""

    name: str
    list_field: str
    index: int
    requests: Mapping[str, Fraction]
    limits: Mapping[str, Fraction]
    explicit_requests: Mapping[str, Fraction]
    invalid: tuple[tuple[tuple[PathPart, ...], str], ...] = ()


@dataclass(frozen=True, slots=True)
class PodResources:
    """The effective requests of one pod of a replicated job."""

    requests: Mapping[str, Fraction]
    containers: tuple[ContainerResources, ...]

    @property
    def invalid(self) -> tuple[tuple[tuple[PathPart, ...], str], ...]:
        return tuple(item for c in self.containers for item in c.invalid)


# Quantities ("8", "64Gi", "500m", 4) recur across every container and job: parse each once
# (a pure function of the string or int; Fractions are immutable; failures are not cached).
_parse_quantity_text = lru_cache(maxsize=4096)(parse_quantity)


def _quantity(value: Any) -> Fraction:
    kind = type(value)
    return _parse_quantity_text(value) if kind is str or kind is int else parse_quantity(value)


def _quantities(
    raw: Any, path: tuple[PathPart, ...]
) -> tuple[dict[str, Fraction], list[tuple[tuple[PathPart, ...], str]]]:
    values: dict[str, Fraction] = {}
    invalid: list[tuple[tuple[PathPart, ...], str]] = []
    if raw is None:
        return values, invalid
    if not is_mapping(raw):
        invalid.append((path, "expected a map of resource quantities"))
        return values, invalid
    for name, value in raw.items():
        try:
            quantity = _quantity(value)
        except (ValueError, TypeError, ZeroDivisionError, OverflowError):
            invalid.append(((*path, str(name)), f"{value!r} is not a Kubernetes quantity"))
            continue
        if quantity.numerator < 0:  # the sign, without Fraction's rich comparison (hot path)
            invalid.append(((*path, str(name)), "must not be negative"))
            continue
        values[str(name)] = quantity
    return values, invalid


def container_resources(list_field: str, index: int, container: Mapping[str, Any]) -> ContainerResources:
    """Requests/limits of one container (pod paths use ``containers[index]``)."""
    name = str(container.get("name", index))
    resources = container.get("resources")
    resources = resources if is_mapping(resources) else {}
    base: tuple[PathPart, ...] = ("spec", list_field, index, "resources")
    limits, bad_limits = _quantities(resources.get("limits"), (*base, "limits"))
    explicit, bad_requests = _quantities(resources.get("requests"), (*base, "requests"))
    requests = dict(limits)
    requests.update(explicit)
    return ContainerResources(
        name, list_field, index, requests, limits, explicit, tuple(bad_limits + bad_requests)
    )


def _add(into: dict[str, Fraction], values: Mapping[str, Fraction]) -> None:
    for name, value in values.items():
        current = into.get(name)
        if current is None:
            into[name] = value
        elif current.denominator == 1 and value.denominator == 1:
            # Whole quantities (the common case): integer arithmetic, the same exact value (speed).
            into[name] = Fraction(current.numerator + value.numerator)
        else:
            into[name] = current + value


def pod_resources(job: EffectiveJob) -> PodResources:
    """Effective requests of one pod of ``job`` (computed once per job)."""
    found = job.memo.get("pod_resources")
    if found is None:
        found = job.memo["pod_resources"] = _pod_resources(job)
    assert isinstance(found, PodResources)
    return found


def _pod_resources(job: EffectiveJob) -> PodResources:
    containers: list[ContainerResources] = []
    for list_field in ("initContainers", "containers"):
        items = job.spec.get(list_field)
        if not isinstance(items, list):
            continue
        for index, container in enumerate(items):
            if is_mapping(container):
                containers.append(container_resources(list_field, index, container))
    total = _pod_total(job.spec, containers, [c.requests for c in containers])
    return PodResources(total, tuple(containers))


def _pod_total(
    spec: Mapping[str, Any],
    containers: Sequence[ContainerResources],
    requests: Sequence[Mapping[str, Fraction]],
) -> dict[str, Fraction]:
    """``max(Σ containers + Σ restartable init containers, max(init containers))`` per resource,
    plus ``spec.overhead`` (k8s.io/component-helpers resource ``PodRequests``); ``requests[i]`` is
    what ``containers[i]`` counts with."""
    regular: dict[str, Fraction] = {}
    init_max: dict[str, Fraction] = {}
    sidecars: dict[str, Fraction] = {}
    init_items = spec.get("initContainers")
    for res, counted in zip(containers, requests, strict=True):
        if res.list_field == "containers":
            _add(regular, counted)
            continue
        item = init_items[res.index] if isinstance(init_items, list) else None
        if is_mapping(item) and item.get("restartPolicy") == "Always":
            _add(sidecars, counted)
        else:
            # An init container runs while the sidecars started before it keep running.
            for name, value in counted.items():
                running = value + sidecars.get(name, Fraction(0))
                init_max[name] = max(init_max.get(name, Fraction(0)), running)
    _add(regular, sidecars)
    total = dict(regular)
    for name, value in init_max.items():
        total[name] = max(total.get(name, Fraction(0)), value)
    overhead, _ = _quantities(spec.get("overhead"), ("spec", "overhead"))
    _add(total, overhead)
    return total


def kueue_pod_requests(job: EffectiveJob, default_requests: Mapping[str, Fraction]) -> Mapping[str, Fraction]:
    """One pod's requests as Kueue counts them for its workload: each container's requests, the
    namespace LimitRange's ``defaultRequest`` for resources it does not request — even when it
    states a limit —, then its limits for the rest (Kueue v0.19.2 pkg/workload/resources.go
    ``AdjustResources``: ``handlePodLimitRange`` before ``handleLimitsToRequests``), summed as
    :func:`pod_resources` does. Computed once per job and defaults."""
    # Keyed by the defaults' identity: callers pass one mapping per config (a job lives for one
    # request), and hashing the quantities on every call would cost more than the lookup saves.
    key = ("kueue_pod_requests", id(default_requests))
    found = job.memo.get(key)
    if found is None:
        pod = pod_resources(job)
        counted: list[Mapping[str, Fraction]] = []
        for res in pod.containers:
            missing = [k for k in default_requests if k not in res.explicit_requests]
            if missing:
                adjusted = dict(res.requests)
                for k in missing:
                    adjusted[k] = default_requests[k]
                counted.append(adjusted)
            else:
                counted.append(res.requests)
        found = job.memo[key] = MappingProxyType(_pod_total(job.spec, pod.containers, counted))
    assert isinstance(found, MappingProxyType)
    return found


_BINARY_SUFFIXES = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def format_quantity(value: Fraction | None, resource: str) -> str | None:
    """A canonical Kubernetes quantity: ``32``, ``500m`` for CPU; ``256Gi`` for memory."""
    if value is None:
        return None
    binary = resource == "memory" or resource.startswith("hugepages-") or resource == "ephemeral-storage"
    # Only a whole number of bytes can be a whole number of KiB..EiB: integer arithmetic.
    if binary and value.denominator == 1:
        whole = value.numerator
        for suffix, size in _BINARY_SUFFIXES:
            if whole >= size and whole % size == 0:
                return f"{whole // size}{suffix}"
        return str(whole)
    if value.denominator == 1:
        return str(value.numerator)
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return f"{float(value):.6g}"


def keyed_container_path(res: ContainerResources) -> tuple[PathPart, ...]:
    """``spec.containers[name=node]`` for messages that do not go through a job's origin."""
    return ("spec", res.list_field, Key("name", res.name))


def sum_by_resource(items: Iterable[tuple[int, Mapping[str, Fraction]]]) -> dict[str, Fraction]:
    """Σ pods × per-pod, by resource."""
    total: dict[str, Fraction] = {}
    for pods, per_pod in items:
        for name, value in per_pod.items():
            total[name] = total.get(name, Fraction(0)) + pods * value
    return total
