"""What the controller keeps of a job, a pod or an Event between watch events: only the fields it
reads (issue 25: full bodies cost ~19 KiB per TrainJob and ~30 KiB per pod — managedFields, kopf's
last-handled-configuration, pod templates, statuses of every replica).

A slim job (:class:`SlimJob`) keeps its identity, labels, the controller's own state annotations,
``suspend`` and the status conditions: enough to plan its lifecycle (:func:`.lifecycle.plan`),
its chargeback labels and its NetworkPolicy's profile. What needs the spec (the job's GPUs,
OpenMPI's pinned env) is computed from a full body — the watch event's, or one read from the API —
never from a slim one (:func:`is_slim`).

A slim pod keeps what :func:`.usage.observe`, :func:`.demand.pod_gpus` and the placement evidence
read: its identity, the kind's labels, node, node selector, container resources, the Ready
condition and the containers' states.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .jobstate import EVIDENCE_ANNOTATION, PODS_ANNOTATION, SEAL_ANNOTATION
from .kinds import JobKind
from .lifecycle import LIFECYCLE_ANNOTATION

__all__ = ["SlimJob", "is_slim", "slim_event", "slim_job", "slim_pod"]

STATE_ANNOTATIONS: Final = (LIFECYCLE_ANNOTATION, PODS_ANNOTATION, EVIDENCE_ANNOTATION, SEAL_ANNOTATION)
_JOB_META: Final = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "resourceVersion")
_POD_META: Final = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp")
_CONDITION: Final = ("type", "status", "reason", "message", "lastTransitionTime")
_CONTAINER_STATUS: Final = ("name", "restartCount", "state", "lastState")


class SlimJob(dict[str, Any]):
    """A job as the controller keeps it (a plain dict of the fields it reads; the type marks that
    the spec is gone)."""

    __slots__ = ()


def is_slim(job: Mapping[str, Any]) -> bool:
    return isinstance(job, SlimJob)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _pick(source: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: source[k] for k in keys if source.get(k) is not None}


def slim_job(kind: JobKind, job: Mapping[str, Any]) -> SlimJob:
    """The fields of ``job`` the controller reads after its first look (a slim job stays slim)."""
    if isinstance(job, SlimJob):
        return job
    meta = _mapping(job.get("metadata"))
    slim_meta = _pick(meta, _JOB_META)
    labels = meta.get("labels")
    if isinstance(labels, Mapping) and labels:
        slim_meta["labels"] = dict(labels)
    annotations = _mapping(meta.get("annotations"))
    kept = {k: annotations[k] for k in STATE_ANNOTATIONS if isinstance(annotations.get(k), str)}
    if kept:
        slim_meta["annotations"] = kept
    out = SlimJob(apiVersion=job.get("apiVersion") or kind.api_version, kind=kind.kind, metadata=slim_meta)
    if kind.suspended(job):
        spec: dict[str, Any] = out.setdefault("spec", {})
        for key in kind.suspend_path[1:-1]:
            spec = spec.setdefault(key, {})
        spec[kind.suspend_path[-1]] = True
    conditions = _mapping(job.get("status")).get("conditions")
    if isinstance(conditions, list):
        out["status"] = {"conditions": [_pick(c, _CONDITION) for c in conditions if isinstance(c, Mapping)]}
    return out


def slim_pod(kind: JobKind, pod: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``pod`` that its facts, GPUs and placement are computed from."""
    meta = _mapping(pod.get("metadata"))
    slim_meta = _pick(meta, _POD_META)
    labels = _mapping(meta.get("labels"))
    wanted = (kind.name_label, kind.role_label, *kind.pod_labels)
    slim_meta["labels"] = {k: labels[k] for k in wanted if k in labels}
    spec = _mapping(pod.get("spec"))
    slim_spec = _pick(spec, ("nodeName", "nodeSelector"))
    containers = spec.get("containers")
    if isinstance(containers, list):
        slim_spec["containers"] = [
            _pick(c, ("name", "resources")) for c in containers if isinstance(c, Mapping)
        ]
    status = _mapping(pod.get("status"))
    slim_status = _pick(status, ("reason", "startTime"))
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        slim_status["conditions"] = [
            _pick(c, _CONDITION) for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"
        ]
    for key in ("initContainerStatuses", "containerStatuses"):
        statuses = status.get(key)
        if isinstance(statuses, list):
            slim_status[key] = [_pick(s, _CONTAINER_STATUS) for s in statuses if isinstance(s, Mapping)]
    return {"metadata": slim_meta, "spec": slim_spec, "status": slim_status}


def slim_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """A scheduling Event's fields that place a pod that ran while no controller watched."""
    involved = _mapping(event.get("involvedObject"))
    out = _pick(event, ("reason", "message", "eventTime", "lastTimestamp", "firstTimestamp"))
    out["involvedObject"] = _pick(involved, ("kind", "name", "uid"))
    return out
