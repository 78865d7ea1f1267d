"""TeamQuota: namespaces, references, GPU quota against flavors and capacity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpigate.config.problems import PathPart
from mpigate.config.units import parse_quantity

from .base import Collector, Entry, Tree, check_unique, did_you_mean, name_of


def check_quotas(c: Collector, tree: Tree) -> None:
    check_unique(c, tree.quotas, name_of, "team", ["metadata", "name"])
    nominal_by_flavor: dict[str, list[tuple[Entry, int]]] = {}
    flavors = tree.flavors
    for entry in tree.valid_quotas:
        spec = entry.data["spec"]
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
            teams = ", ".join(f"{name_of(e)}={n}" for e, n in uses)
            c.error(
                tree.flavors_doc,
                ["spec", "flavors", flavor_name, "capacity"],
                f"teams' nominal quota on {flavor_name} adds up to {total} GPUs, "
                f"above its capacity {capacity} ({teams})",
                "capacity.flavor",
                "lower nominal quotas or raise capacity",
            )


def _check_gpu_quota(
    c: Collector,
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
                did_you_mean(flavor_name, flavors),
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


def _check_quantity(c: Collector, entry: Entry, path: list[PathPart], value: Any) -> None:
    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        c.error(entry, path, str(exc), "value.quantity")
        return
    if amount < 0:
        c.error(entry, path, f"{value!r} is negative", "value.quantity")
