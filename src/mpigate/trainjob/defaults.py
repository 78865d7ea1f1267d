"""The defaults the API server applies to (Cluster)TrainingRuntime specs (the CRD schema's
``default`` keywords, Trainer v2.3), so that a runtime as stored compares equal to its reviewed
manifest as written.

Only the defaults that can appear in a runtime's spec are listed; applying them is idempotent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .smp import copy_json

__all__ = ["with_runtime_defaults"]

_MPI = {
    "mpiImplementation": "OpenMPI",
    "numProcPerNode": 1,
    "runLauncherAsNode": False,
    "sshAuthMountPath": "/root/.ssh",
}
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
_REF_NAMES = (("valueFrom", "configMapKeyRef"), ("valueFrom", "secretKeyRef"))


def _defaults(node: Any, values: Mapping[str, Any]) -> None:
    if isinstance(node, dict):
        for key, value in values.items():
            node.setdefault(key, value)


def _container(container: Any) -> None:
    if not isinstance(container, dict):
        return
    for port in container.get("ports") or []:
        _defaults(port, {"protocol": "TCP"})
    for var in container.get("env") or []:
        if not isinstance(var, dict):
            continue
        for outer, inner in _REF_NAMES:
            _defaults(_get(var, outer, inner), {"name": ""})
        _defaults(_get(var, "valueFrom", "fileKeyRef"), {"optional": False})
    for source in container.get("envFrom") or []:
        if isinstance(source, dict):
            for kind in ("configMapRef", "secretRef"):
                _defaults(source.get(kind), {"name": ""})
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        _defaults(_get(container, probe, "grpc"), {"service": ""})


def with_runtime_defaults(spec: Any) -> Any:
    """A copy of a runtime ``spec`` with the CRD defaults applied."""
    out = copy_json(spec)
    if not isinstance(out, dict):
        return out
    policy = out.get("mlPolicy")
    if isinstance(policy, dict):
        _defaults(policy.get("mpi"), _MPI)
        _defaults(policy.get("flux"), {"numProcPerNode": 1})
    group = out.get("podGroupPolicy")
    if isinstance(group, dict):
        _defaults(group.get("coscheduling"), {"scheduleTimeoutSeconds": 60})
    template = out.get("template")
    tspec = template.get("spec") if isinstance(template, dict) else None
    if not isinstance(tspec, dict):
        return out
    _defaults(tspec.get("failurePolicy"), {"restartStrategy": "Recreate"})
    for job in tspec.get("replicatedJobs") or []:
        if not isinstance(job, dict):
            continue
        _defaults(job, {"groupName": "default", "replicas": 1})
        pod_spec = _get(job, "template", "spec", "template", "spec")
        if not isinstance(pod_spec, dict):
            continue
        for list_field in _CONTAINER_LISTS:
            for container in pod_spec.get(list_field) or []:
                _container(container)
        for volume in pod_spec.get("volumes") or []:
            if isinstance(volume, dict):
                _defaults(volume.get("configMap"), {"name": ""})
    return out


def _get(node: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node
