"""``spec.runtimePatches`` merged into the runtime's replicated jobs, as Trainer does
(``pkg/runtime/core/trainingruntime.go``, ``(*TrainingRuntime).mergeRuntimePatches``): each entry
in list order, strategic-merged copy-on-write (:mod:`mpigate.trainjob.smp`); patches Trainer's
JobSet plugin rejects (``(*JobSet).Validate``) are recorded as problems and not applied."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .jsontypes import is_mapping
from .model import RESERVED_ENV_CONTAINERS, Layer
from .paths import Key, PathPart, get_path
from .pods import JOB_TO_POD, pod_template
from .reading import Recorder, listed, mapping
from .shapes import METADATA, POD_TEMPLATE, checked
from .smp import merge_shared

__all__ = ["JOB_TEMPLATE_SHAPE", "apply_runtime_patches"]


def apply_runtime_patches(
    docs: dict[str, Mapping[str, Any]],
    layers: dict[str, list[Layer]],
    patches: Sequence[Any],
    runtime_name: str,
    exclude_managers: frozenset[str],
    rec: Recorder,
) -> None:
    """Merge ``patches`` into ``docs`` (job name → replicated job, replaced copy-on-write) and add
    each applied patch to its job's ``layers``."""
    names = tuple(docs)
    for index, entry in enumerate(patches):
        base: tuple[PathPart, ...] = ("spec", "runtimePatches", index)
        if not is_mapping(entry):
            rec.typed(entry, Mapping, base)
            continue
        manager = entry.get("manager")
        if not isinstance(manager, str) or not manager:
            rec.add((*base, "manager"), "every runtime patch needs a manager (domain-prefixed path)")
            continue
        if manager in exclude_managers:
            continue
        base = ("spec", "runtimePatches", Key("manager", manager))
        rjobs = _replicated_jobs(entry, base, rec)
        spec_path = (*base, "trainingRuntimeSpec", "template", "spec", "replicatedJobs")
        for position, rjob in enumerate(rjobs):
            if not is_mapping(rjob):
                rec.typed(rjob, Mapping, (*spec_path, position))
                continue
            if not isinstance(rjob.get("name"), str):
                rec.malformed((*spec_path, position, "name"), "each replicated job patch needs a string name")
                continue
            job_name = rjob["name"]
            job_path = (*spec_path, Key("name", job_name))
            if job_name not in docs:
                rec.add(
                    job_path,
                    f"runtime {runtime_name} has no replicated job {job_name!r} "
                    f"(it has {', '.join(names) or 'none'}); Trainer rejects this patch",
                )
                continue
            # Malformed parts are problems and stay out of the merge: the runtime's values remain,
            # so nothing beside them goes unjudged.
            template = checked(rjob.get("template"), JOB_TEMPLATE_SHAPE, (*job_path, "template"), rec)
            if not template:
                continue
            pod_patch = pod_template({"template": template})
            current = pod_template(docs[job_name])
            _check_patch_containers(pod_patch, current, (*job_path, *JOB_TO_POD), rec)
            template = _without_unknown_containers(template, current)
            docs[job_name] = merge_shared(docs[job_name], {"template": template})
            layers[job_name].append(Layer("patch", pod_patch, (*job_path, *JOB_TO_POD), "", manager))


# A replicated job's template in a patch: job metadata and the pod template (the TrainJob CRD has
# nothing else there).
JOB_TEMPLATE_SHAPE = {"metadata": METADATA, "spec": {"template": POD_TEMPLATE}}


def _replicated_jobs(entry: Mapping[str, Any], base: tuple[PathPart, ...], rec: Recorder) -> list[Any]:
    """``trainingRuntimeSpec.template.spec.replicatedJobs`` of a patch entry; a level of the wrong
    type is a problem (and the entry applies nothing)."""
    node: Any = entry
    path = base
    for key in ("trainingRuntimeSpec", "template"):
        path = (*path, key)
        node = rec.typed(node.get(key), Mapping, path)
        if node is None:
            return []
    checked(node.get("metadata"), METADATA, (*path, "metadata"), rec)
    spec = rec.typed(node.get("spec"), Mapping, (*path, "spec"))
    if spec is None:
        return []
    rjobs: list[Any] | None = rec.typed(spec.get("replicatedJobs"), list, (*path, "spec", "replicatedJobs"))
    return rjobs or []


def _check_patch_containers(
    pod_patch: Mapping[str, Any], runtime_pod: Mapping[str, Any], base: tuple[PathPart, ...], rec: Recorder
) -> None:
    spec = mapping(pod_patch.get("spec"))
    runtime_spec = mapping(runtime_pod.get("spec"))
    for list_field in ("initContainers", "containers"):
        items = spec.get(list_field)
        if not isinstance(items, list):  # most patches touch no containers
            continue
        existing = {c.get("name") for c in listed(runtime_spec.get(list_field)) if is_mapping(c)}
        for item in items:
            if not is_mapping(item) or not isinstance(item.get("name"), str):
                continue
            path = (*base, "spec", list_field, Key("name", item["name"]))
            if item["name"] not in existing:
                rec.add(
                    path, f"the runtime's job has no {list_field[:-1]} {item['name']!r}; Trainer rejects this"
                )
            elif item.get("env") and item["name"] in RESERVED_ENV_CONTAINERS:
                rec.add(
                    (*path, "env"),
                    f"Trainer rejects env patches on the {item['name']} container; "
                    "use spec.trainer.env or spec.initializer.*.env",
                )


def _without_unknown_containers(
    template: Mapping[str, Any], runtime_pod: Mapping[str, Any]
) -> Mapping[str, Any]:
    """The patch without containers the job lacks: Trainer rejects those patches, so they never apply
    (merging them would invent image-less containers). Only the path to the pod spec is new."""
    found, pod_spec = get_path(template, ("spec", "template", "spec"))
    if not found or not is_mapping(pod_spec):
        return template
    if not isinstance(pod_spec.get("initContainers"), list) and not isinstance(
        pod_spec.get("containers"), list
    ):
        return template  # nothing to clean (most patches): no copy
    runtime_spec = mapping(runtime_pod.get("spec"))
    cleaned = dict(pod_spec)
    for list_field in ("initContainers", "containers"):
        items = pod_spec.get(list_field)
        if not isinstance(items, list):
            continue
        existing = {c.get("name") for c in listed(runtime_spec.get(list_field)) if is_mapping(c)}
        cleaned[list_field] = [c for c in items if is_mapping(c) and c.get("name") in existing]
    # get_path found mappings all the way down: rebuild that path around the cleaned spec.
    job_spec = dict(template["spec"])
    pod = dict(job_spec["template"])
    pod["spec"] = cleaned
    job_spec["template"] = pod
    out = dict(template)
    out["spec"] = job_spec
    return out
