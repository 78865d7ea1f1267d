"""A TrainJob's Kueue workload: its pod sets, requests counted as Kueue counts them.

Kueue builds the workload of a TrainJob from the JobSet Trainer would create: one pod set per
replicated job, ``count`` pods (Kueue pkg/controller/jobs/trainjob/trainjob_controller.go
``podSets``, jobset ``PodSets``). Each pod's requests are adjusted as
pkg/workload/resources.go ``AdjustResources`` does — the namespace LimitRange's ``defaultRequest``
for resources a container does not request, then limits as missing requests — and summed by
``resource.PodRequests`` (:func:`mpigate.trainjob.kueue_pod_requests`); the pod set asks per-pod
× count in Kueue's integer units (``totalRequestsFromPodSets``).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from mpigate import kueue
from mpigate.config.queueing import kueue_amount
from mpigate.trainjob import EffectiveJob, Resolution, kueue_pod_requests
from mpigate.trainjob.jsontypes import is_mapping
from mpigate.trainjob.resolve import NODE

from .context import as_list, as_mapping

__all__ = ["pods_for_nodes", "workload_podsets"]


def pods_for_nodes(resolution: Resolution, job: EffectiveJob, nodes: int, node_job: str = NODE) -> int:
    """Pods of ``job`` with ``nodes`` nodes (Trainer's pod counts for ``spec.trainer.numNodes``: the
    MPI ``node`` job runs ``max(N-1, 1)`` with runLauncherAsNode, else ``N``; with other policies the
    trainer job runs ``N``. An MPIJob's ``node_job`` is its Worker: ``N-1`` workers with
    runLauncherAsWorker); other jobs keep theirs."""
    ml = resolution.ml_policy
    if ml is not None and ml.mpi and job.name == node_job:
        return job.replicas * (max(nodes - 1, 1) if ml.run_launcher_as_node else nodes)
    if (ml is None or not ml.mpi) and job.name == resolution.trainer_job:
        return nodes
    return job.pods


def _affinity(spec: Mapping[str, object]) -> tuple[tuple[kueue.Requirement, ...], ...] | None:
    node_affinity = as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not is_mapping(required):
        return None
    terms: list[tuple[kueue.Requirement, ...]] = []
    for term in as_list(required.get("nodeSelectorTerms")):
        requirements = []
        for expression in as_list(as_mapping(term).get("matchExpressions")):
            expression = as_mapping(expression)
            key, operator = expression.get("key"), expression.get("operator")
            if isinstance(key, str) and isinstance(operator, str):
                values = tuple(v for v in as_list(expression.get("values")) if isinstance(v, str))
                requirements.append(kueue.Requirement(key, operator, values))
        terms.append(tuple(requirements))
    return tuple(terms)


def _kueue_units(job: EffectiveJob, defaults: Mapping[str, Fraction]) -> Mapping[str, int]:
    """One pod's requests in Kueue's integer units (computed once per job and defaults: MPG-Q001
    asks for the pod sets again with other node counts)."""
    key = ("kueue_units", id(defaults))  # keyed as kueue_pod_requests keys its own memo
    found = job.memo.get(key)
    if found is None:
        per_pod = kueue_pod_requests(job, defaults)
        found = job.memo[key] = {r: kueue_amount(r, v) for r, v in per_pod.items()}
    assert isinstance(found, dict)
    return found


def workload_podsets(
    resolution: Resolution,
    defaults: Mapping[str, Fraction],
    nodes: int | None = None,
    *,
    node_job: str = NODE,
) -> tuple[kueue.PodSet, ...]:
    """The pod sets of the job's Kueue workload (``nodes``: as if the job had that many nodes), in
    replicated-job order."""
    out: list[kueue.PodSet] = []
    for job in resolution.jobs:
        count = job.pods if nodes is None else pods_for_nodes(resolution, job, nodes, node_job)
        if count <= 0:
            continue
        requests = {r: v * count for r, v in _kueue_units(job, defaults).items()}
        selector = job.spec.get("nodeSelector")
        labels = {k: v for k, v in selector.items() if isinstance(v, str)} if is_mapping(selector) else {}
        affinity = _affinity(job.spec) if "affinity" in job.spec else None
        # Plain dicts (read-only by contract, as the engine's other per-request values): no copies.
        out.append(kueue.PodSet(job.name, count, requests, labels, affinity))
    return tuple(out)
