"""The per-team smoke TrainJob that runs the preflight on the cluster.

It is built the way a team would submit a job — in the team's namespace, on the org's MPI runtime,
with the team's queue and required labels — and deliberately *without* the pinned-port
environment: the mutating webhook must inject it, and the preflight's ``--expect-pinned`` makes the
job fail when it did not (or when a rank listens outside the ranges). So one green smoke job proves
admission, Kueue, the NetworkPolicy and OpenMPI's ports together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpigate.config import Config

from .checks import PreflightSettings
from .launch import preflight_program

__all__ = [
    "DATA_CLASSIFICATION_LABEL",
    "DEFAULT_RUNTIME",
    "SmokeJobError",
    "build_smoke_trainjob",
]

DEFAULT_RUNTIME = "mpi-openmpi-gpu"
DATA_CLASSIFICATION_LABEL = "mpigate.io/data-classification"
# Value for required labels nobody supplied (e.g. the cost center): preflight costs stay visible
# as their own line in chargeback reports.
PLACEHOLDER_LABEL_VALUE = "mpigate-preflight"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"


class SmokeJobError(ValueError):
    """The smoke job cannot be built for this team (message says why and what to pass)."""


def _runtime_image(config: Config, runtime: str, namespace: str) -> str | None:
    found = config.runtime("ClusterTrainingRuntime", runtime) or config.runtime(
        "TrainingRuntime", runtime, namespace
    )
    if found is None:
        return None
    manifest: Any = found.manifest
    jobs = manifest.get("spec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", [])
    for wanted in ("launcher", "node"):
        for job in jobs:
            if job.get("name") != wanted:
                continue
            containers = (
                job.get("template", {})
                .get("spec", {})
                .get("template", {})
                .get("spec", {})
                .get("containers", [])
            )
            for container in containers:
                if container.get("name") == "node" and container.get("image"):
                    return str(container["image"])
    return None


def _data_classification(config: Config, team: str) -> str | None:
    """A classification the team may use, preferring one without residency or digest demands."""
    allowed = config.teams[team].data_classifications
    names = list(allowed) if allowed is not None else list(config.org.data_classifications)
    if not names:
        return None

    def strictness(name: str) -> tuple[int, int]:
        cls = config.org.data_classifications.get(name)
        if cls is None:
            return (0, names.index(name))
        demands = sum(map(bool, (cls.regions, cls.network_profile, cls.require_digest)))
        return (demands, names.index(name))

    return min(names, key=strictness)


def build_smoke_trainjob(
    config: Config,
    team: str,
    *,
    image: str | None = None,
    name: str = "mpigate-preflight",
    num_nodes: int | None = None,
    proc_per_node: int = 1,
    runtime: str = DEFAULT_RUNTIME,
    labels: Mapping[str, str] | None = None,
    settings: PreflightSettings | None = None,
    active_deadline_seconds: int = 900,
    python: str = "python3",
    mpirun_args: Sequence[str] = (),
) -> dict[str, Any]:
    """The smoke TrainJob for ``team`` as a plain dict (YAML-ready, deterministic key order).

    ``image`` defaults to the runtime's own image; it must contain Python 3.11+ and
    ``mpigate[mpi]``. Raises SmokeJobError when the team, runtime or image is unknown.
    """
    if team not in config.teams:
        known = ", ".join(sorted(config.teams)) or "none"
        raise SmokeJobError(f"unknown team {team!r} (teams: {known})")
    t = config.teams[team]
    namespace = t.namespaces[0]
    if t.runtimes is not None and runtime not in t.runtimes:
        raise SmokeJobError(
            f"team {team!r} may not use runtime {runtime!r} (allowed: {', '.join(t.runtimes)})"
        )
    image = image or _runtime_image(config, runtime, namespace)
    if image is None:
        raise SmokeJobError(f"runtime {runtime!r} is not in the config tree; pass the image explicitly")
    nodes = num_nodes if num_nodes is not None else min(2, t.max_nodes_per_job)
    if not 1 <= nodes <= t.max_nodes_per_job:
        raise SmokeJobError(f"team {team!r} may use 1..{t.max_nodes_per_job} nodes per job, not {nodes}")
    job_labels: dict[str, str] = {
        "app.kubernetes.io/name": "mpigate-preflight",
        "app.kubernetes.io/component": "smoke-test",
        "app.kubernetes.io/managed-by": "mpigate",
        "kueue.x-k8s.io/queue-name": t.default_queue,
    }
    if t.default_priority_class:
        job_labels["kueue.x-k8s.io/priority-class"] = t.default_priority_class
    required = (*config.org.lifecycle.required_labels, *t.required_labels)
    for key in required:
        if key == DATA_CLASSIFICATION_LABEL:
            value = _data_classification(config, team)
            if value is not None:
                job_labels[key] = value
                continue
        job_labels.setdefault(key, PLACEHOLDER_LABEL_VALUE)
    job_labels.update(labels or {})
    # The profile the job will really get (a data classification can tighten the team's).
    profile, _ = config.job_network_profile(team, job_labels.get(DATA_CLASSIFICATION_LABEL))
    pinned = profile.mode == "pinned-ports"
    base = settings or PreflightSettings(hold=5.0)
    settings = PreflightSettings(
        sizes=base.sizes,
        iterations=base.iterations,
        hold=base.hold,
        max_latency_us=base.max_latency_us,
        min_bandwidth_mbs=base.min_bandwidth_mbs,
        expect_pinned=base.expect_pinned or pinned,
    )

    program = preflight_program(settings, python)
    # Text output: the job's log is read by people (`kubectl logs`); -o json stays available.
    program[program.index("-o") + 1] = "text"
    command = ["mpirun", "--hostfile", "/etc/mpi/hostfile", *mpirun_args, *program]
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(sorted(job_labels.items())),
            "annotations": {
                "mpigate.io/purpose": (
                    f"network preflight of team {team} "
                    f"({'pinned-ports' if pinned else 'isolated'} profile): allreduce, ring, ping-pong, ports"
                ),
            },
        },
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": runtime,
            },
            "activeDeadlineSeconds": active_deadline_seconds,
            "trainer": {
                "numNodes": nodes,
                "numProcPerNode": proc_per_node,
                "image": image,
                "command": command,
                "resourcesPerNode": {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "limits": {"cpu": "1", "memory": "1Gi"},
                },
            },
        },
    }
