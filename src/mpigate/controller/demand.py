"""GPUs of a job and of each of its pods, from the engine's resolution of the job.

The demand is computed exactly as at admission (:func:`mpigate.trainjob.resolve` on a TrainJob's
runtime, :func:`mpigate.trainjob.mpijob.resolve_mpijob` for an MPIJob, then
:func:`mpigate.policy.demand.build_demand`), so chargeback counts the GPUs that quota and admission
counted. A pod is matched to its replicated job by JobSet's label (an MPIJob's by the operator's
job-role label, ``launcher``/``worker``: the names of its effective jobs); when a TrainJob's runtime
is unknown (an external runtime not readable from the cluster), the pod's own GPU requests count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpigate.config import Config
from mpigate.policy.demand import build_demand, gpu_resources, is_gpu
from mpigate.trainjob import Resolution, container_resources, resolve
from mpigate.trainjob.mpijob import resolve_mpijob

__all__ = ["JobGpus", "job_gpus", "mpijob_gpus", "pod_gpus", "runtime_ref"]


@dataclass(frozen=True, slots=True)
class JobGpus:
    """GPUs of a job in total and per pod of each replicated job (None: runtime unknown)."""

    total: int | None
    per_pod: Mapping[str, int]


def runtime_ref(trainjob: Mapping[str, Any]) -> tuple[str, str]:
    """``(kind, name)`` of the job's runtime (kind defaults as Trainer does)."""
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    kind, name = ref.get("kind"), ref.get("name")
    return (
        kind if isinstance(kind, str) else "ClusterTrainingRuntime",
        name if isinstance(name, str) else "",
    )


def job_gpus(
    config: Config, trainjob: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
) -> JobGpus:
    """The job's GPUs on ``runtime`` (default: the runtime of the config tree)."""
    raw_namespace = (trainjob.get("metadata") or {}).get("namespace")
    namespace = raw_namespace if isinstance(raw_namespace, str) else None
    if runtime is None:
        kind, name = runtime_ref(trainjob)
        found = config.runtime(kind, name, namespace) if name else None
        runtime = found.manifest if found is not None else None
    if runtime is None:
        return JobGpus(None, {})
    return _gpus(config, resolve(trainjob, runtime), namespace)


def mpijob_gpus(config: Config, mpijob: Mapping[str, Any]) -> JobGpus:
    """An MPIJob's GPUs: its Launcher's and Workers' pods as the MPI Operator builds them (per pod of
    the ``launcher`` and ``worker`` roles)."""
    raw_namespace = (mpijob.get("metadata") or {}).get("namespace")
    return _gpus(config, resolve_mpijob(mpijob), raw_namespace if isinstance(raw_namespace, str) else None)


def _gpus(config: Config, resolution: Resolution, namespace: str | None) -> JobGpus:
    team = config.team_for_namespace(namespace) if namespace is not None else None
    demand = build_demand(resolution, gpu_resources(config), team.region if team else None)
    per_pod = {j.name: sum(j.gpus_per_pod.values()) for j in demand.jobs}
    return JobGpus(demand.total_gpus, per_pod)


def pod_gpus(pod: Mapping[str, Any], known: frozenset[str]) -> int:
    """GPU requests (defaulted from limits) of a pod's containers."""
    total = 0
    containers = (pod.get("spec") or {}).get("containers")
    for index, container in enumerate(containers if isinstance(containers, list) else []):
        if isinstance(container, Mapping):
            requests = container_resources("containers", index, container).requests
            total += sum(math.ceil(v) for r, v in requests.items() if is_gpu(r, known) and v > 0)
    return total
