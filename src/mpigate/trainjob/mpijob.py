"""The effective pods of a ``kubeflow.org/v2beta1`` MPIJob, as the MPI Operator builds them, in the
structures the rules already read (:class:`Resolution`, :class:`EffectiveJob`, :class:`Layer`), so
that quota, Pod Security, images, credentials, residency, network and service-account rules judge
an MPIJob exactly as they judge a TrainJob.

Followed from kubeflow/mpi-operator v0.8 (``pkg/controller/mpi_job_controller.go``):

- ``(*MPIJobController).newLauncherPodTemplate``: the Launcher replica's template with the
  operator's labels (``defaultLabels``), ``hostname``/``subdomain``, ``K_MPI_JOB_ROLE=launcher`` and
  the implementation's env on the *first* container (OpenMPI: ``ompiEnvVars`` and
  ``OMPI_MCA_orte_set_default_slots``; Intel: ``intelEnvVars`` and ``I_MPI_PERHOST``; MPICH:
  ``mpichEnvVars``), ``NVIDIA_VISIBLE_DEVICES``/``NVIDIA_DRIVER_CAPABILITIES`` emptied unless
  ``runLauncherAsWorker``, the hostfile ConfigMap volume mounted at ``/etc/mpi``, and
  ``restartPolicy`` from the replica (``setRestartPolicy``; ``ExitCode`` runs as ``Never``);
- ``(*MPIJobController).newWorker``: the Worker template for each index, ``sshd -De`` as the first
  container's command when it has neither command nor args, ``K_MPI_JOB_ROLE=worker``;
- ``setupSSHOnPod``: the SSH key Secret volume mounted at ``sshAuthMountPath`` on the first
  container of both.

API defaults are ``pkg/apis/kubeflow/v2beta1/default.go`` ``SetDefaults_MPIJob`` (slotsPerWorker 1,
sshAuthMountPath /root/.ssh, mpiImplementation OpenMPI, Launcher replicas 1); what the operator
refuses is ``pkg/apis/kubeflow/validation`` ``ValidateMPIJob`` (a Launcher is required and has
exactly 1 replica, a Worker has replicas ≥ 1, every replica has a container, restartPolicy is
Never or OnFailure, implementation one of three): such an MPIJob never runs, and mpigate refuses
it (a problem, not an absent field). Pod counts are what Kueue charges: one PodSet per replica
type, ``replicas`` pods each (kueue ``pkg/controller/jobs/mpijob`` ``(*MPIJob).PodSets``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .jsontypes import is_mapping
from .model import EffectiveJob, Layer, MLPolicy, Problem, Resolution
from .paths import PathPart
from .reading import Recorder, listed, mapping
from .shapes import POD_TEMPLATE, checked

__all__ = [
    "LAUNCHER_ROLE",
    "LAUNCHER_TYPE",
    "MPIJOB_API_VERSION",
    "WORKERS_PATH",
    "WORKER_ROLE",
    "WORKER_TYPE",
    "resolve_mpijob",
]

MPIJOB_API_VERSION: Final = "kubeflow.org/v2beta1"
LAUNCHER_TYPE: Final = "Launcher"
WORKER_TYPE: Final = "Worker"
#: The effective jobs' names (the operator's ``launcher``/``worker`` roles).
LAUNCHER_ROLE: Final = "launcher"
WORKER_ROLE: Final = "worker"
WORKERS_PATH: Final = "spec.mpiReplicaSpecs.Worker.replicas"

# mpi_job_controller.go constants and env.
_CONFIG_VOLUME: Final = "mpi-job-config"
_CONFIG_MOUNT: Final = "/etc/mpi"
_SSH_VOLUME: Final = "ssh-auth"
_ROOT_SSH: Final = "/root/.ssh"
_IMPLEMENTATIONS: Final = ("OpenMPI", "Intel", "MPICH")
# validation.go validRestartPolicies
_RESTART_POLICIES: Final = ("Never", "OnFailure")
_HOSTFILE: Final = f"{_CONFIG_MOUNT}/hostfile"
_IMPLEMENTATION_ENV: Final[Mapping[str, tuple[tuple[str, str], ...]]] = {
    "OpenMPI": (
        ("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
        ("OMPI_MCA_orte_default_hostfile", _HOSTFILE),
        ("OMPI_MCA_plm_rsh_args", "-o ConnectionAttempts=10"),
    ),
    "Intel": (
        ("I_MPI_HYDRA_HOST_FILE", _HOSTFILE),
        ("I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", "-o ConnectionAttempts=10"),
    ),
    "MPICH": (
        ("HYDRA_HOST_FILE", _HOSTFILE),
        ("HYDRA_LAUNCH_EXTRA_ARGS", "-o ConnectionAttempts=10"),
    ),
}
_SLOTS_ENV: Final[Mapping[str, str]] = {
    "OpenMPI": "OMPI_MCA_orte_set_default_slots",
    "Intel": "I_MPI_PERHOST",
}


def resolve_mpijob(mpijob: Mapping[str, Any]) -> Resolution:
    """The Launcher and Worker pods of ``mpijob`` (a plain or frozen MPIJob), never raising: a wrong
    type, or a value the MPI Operator refuses, is a :class:`Problem` naming the field."""
    rec = Recorder()
    meta = mapping(mpijob.get("metadata"))
    name = meta.get("name") if isinstance(meta.get("name"), str) else meta.get("generateName")
    job_name = name if isinstance(name, str) else ""
    spec = rec.typed(mpijob.get("spec"), Mapping, ("spec",)) or {}

    slots_raw = rec.typed(spec.get("slotsPerWorker"), int, ("spec", "slotsPerWorker"))
    if slots_raw is not None and slots_raw < 0:
        rec.add(
            ("spec", "slotsPerWorker"), f"must be 0 or more, got {slots_raw}; the MPI Operator rejects it"
        )
    slots = slots_raw if slots_raw is not None and slots_raw >= 0 else 1
    launcher_as_worker = bool(
        rec.typed(spec.get("runLauncherAsWorker"), bool, ("spec", "runLauncherAsWorker"))
    )
    implementation = rec.typed(spec.get("mpiImplementation"), str, ("spec", "mpiImplementation"))
    if implementation is not None and implementation not in _IMPLEMENTATIONS:
        rec.add(
            ("spec", "mpiImplementation"),
            f"must be one of {', '.join(_IMPLEMENTATIONS)}, got {implementation!r}; "
            "the MPI Operator rejects it",
        )
    implementation = implementation or "OpenMPI"
    ssh_path = rec.typed(spec.get("sshAuthMountPath"), str, ("spec", "sshAuthMountPath")) or _ROOT_SSH
    rec.typed(spec.get("runPolicy"), Mapping, ("spec", "runPolicy"))

    replica_specs = rec.typed(spec.get("mpiReplicaSpecs"), Mapping, ("spec", "mpiReplicaSpecs"))
    if replica_specs is None and spec.get("mpiReplicaSpecs") is None:
        rec.add(("spec", "mpiReplicaSpecs"), "is required; the MPI Operator runs no MPIJob without it")
    replica_specs = replica_specs or {}
    for key in replica_specs:
        if key not in (LAUNCHER_TYPE, WORKER_TYPE):  # ignored by the operator and by Kueue: a note
            rec.problems.append(
                Problem(
                    ("spec", "mpiReplicaSpecs", str(key)),
                    f"spec.mpiReplicaSpecs.{key} is not a replica type the MPI Operator runs "
                    f"({LAUNCHER_TYPE}, {WORKER_TYPE}); it is ignored",
                    advisory=True,
                )
            )

    jobs: list[EffectiveJob] = []
    workers = 0
    for rtype, role in ((LAUNCHER_TYPE, LAUNCHER_ROLE), (WORKER_TYPE, WORKER_ROLE)):
        base: tuple[PathPart, ...] = ("spec", "mpiReplicaSpecs", rtype)
        raw = replica_specs.get(rtype)
        if raw is None:
            if rtype == LAUNCHER_TYPE and replica_specs:
                rec.add(base, "is required; the MPI Operator runs no MPIJob without a Launcher")
            continue
        replica = rec.typed(raw, Mapping, base)
        if replica is None:
            continue
        replicas = _replicas(replica.get("replicas"), rtype, (*base, "replicas"), rec)
        if rtype == WORKER_TYPE:
            workers = replicas
        restart = rec.typed(replica.get("restartPolicy"), str, (*base, "restartPolicy"))
        if restart is not None and restart not in _RESTART_POLICIES:
            rec.add(
                (*base, "restartPolicy"),
                f"must be Never or OnFailure, got {restart!r}; the MPI Operator rejects it",
            )
        # Malformed is refused, never absent: a part of the wrong type is a problem and is left out
        # (the pod-template types of trainjob/shapes.py, as for a runtime's and a patch's templates).
        template = checked(replica.get("template"), POD_TEMPLATE, (*base, "template"), rec) or {}
        pod_spec = mapping(template.get("spec"))
        containers = pod_spec.get("containers")
        if not containers or not is_mapping(containers[0]):
            rec.add(
                (*base, "template", "spec", "containers"),
                "needs a first container (the MPI Operator runs the job in it); the MPI Operator rejects "
                "a replica without one",
            )
        default_restart = "OnFailure" if rtype == LAUNCHER_TYPE else "Never"  # default.go
        pod, added = _operator_pod(
            template,
            job_name,
            role,
            implementation,
            slots,
            ssh_path,
            launcher_as_worker,
            restart or default_restart,
        )
        layers = (Layer("patch", template, (*base, "template")), Layer("operator", added, ()))
        # one replica of N pods, as a JobSet job of parallelism N (what gpus_for_nodes scales)
        jobs.append(EffectiveJob(role, None, 1, replicas, pod, layers, len(jobs)))

    ml = MLPolicy(
        num_nodes=workers + (1 if launcher_as_worker else 0),
        kind="mpi",
        mpi=True,
        run_launcher_as_node=launcher_as_worker,
        num_proc_per_node=slots,
        mpi_implementation=implementation,
        ssh_auth_mount_path=ssh_path,
    )
    return Resolution(
        runtime_kind="MPIJob",
        runtime_name=job_name,
        ml_policy=ml,
        num_nodes=ml.num_nodes,
        num_nodes_path=WORKERS_PATH,
        jobs=tuple(jobs),
        slots=slots,
        problems=tuple(rec.problems),
        trainer_job=None,
    )


def _replicas(raw: Any, rtype: str, path: tuple[PathPart, ...], rec: Recorder) -> int:
    """The pods of one replica type, as Kueue charges them (``ptr.Deref(replicas, 1)``); what the
    operator's validation refuses is recorded."""
    value = rec.count(raw, path, "; the MPI Operator rejects it")  # an int32 of at least 1
    if rtype == LAUNCHER_TYPE:
        if value is not None and value != 1:
            rec.add(path, f"must be 1, got {value}; the MPI Operator rejects any other Launcher count")
        return 1
    if raw is None:
        rec.add(
            path,
            "is required: the MPI Operator defaults it to 0 and then rejects the job "
            "(a Worker needs 1 or more replicas)",
        )
    return value if value is not None else 1


def _operator_pod(
    template: Mapping[str, Any],
    job_name: str,
    role: str,
    implementation: str,
    slots: int,
    ssh_path: str,
    launcher_as_worker: bool,
    restart_policy: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod the operator creates from a replica's template, and what it added (the ``operator``
    layer). The template is not modified: the pod, its metadata, labels, spec, volumes, the first
    container and its env and mounts are new; everything else is shared (read-only)."""
    pod: dict[str, Any] = dict(template)
    metadata = dict(mapping(template.get("metadata")))
    labels = dict(mapping(metadata.get("labels")))
    # defaultLabels(): operator name, job name and role (the role's index label is per pod).
    added_labels = {
        "training.kubeflow.org/operator-name": "mpi-operator",
        "training.kubeflow.org/job-name": job_name,
        "training.kubeflow.org/job-role": role,
    }
    labels.update(added_labels)
    metadata["labels"] = labels
    pod["metadata"] = metadata
    spec = dict(mapping(template.get("spec")))
    pod["spec"] = spec
    volume: dict[str, Any] = {
        "name": _SSH_VOLUME,
        "secret": {
            "secretName": f"{job_name}-ssh",
            **({"defaultMode": 0o600} if ssh_path == _ROOT_SSH else {}),
        },
    }
    mounts: list[dict[str, Any]] = [{"name": _SSH_VOLUME, "mountPath": ssh_path}]
    volumes: list[dict[str, Any]] = [volume]
    env: list[dict[str, Any]] = [{"name": "K_MPI_JOB_ROLE", "value": role}]
    if role == LAUNCHER_ROLE:
        env += [{"name": n, "value": v} for n, v in _IMPLEMENTATION_ENV.get(implementation, ())]
        slots_env = _SLOTS_ENV.get(implementation)
        if slots_env is not None:
            env.append({"name": slots_env, "value": str(slots)})
        if not launcher_as_worker:
            env += [{"name": "NVIDIA_VISIBLE_DEVICES"}, {"name": "NVIDIA_DRIVER_CAPABILITIES"}]
        volumes.append(
            {
                "name": _CONFIG_VOLUME,
                "configMap": {
                    "name": f"{job_name}-config",
                    "items": [
                        {"key": "hostfile", "path": "hostfile", "mode": 0o444},
                        {"key": "discover_hosts.sh", "path": "discover_hosts.sh", "mode": 0o555},
                    ],
                },
            }
        )
        mounts.append({"name": _CONFIG_VOLUME, "mountPath": _CONFIG_MOUNT})
    spec["volumes"] = [*listed(spec.get("volumes")), *volumes]
    spec["restartPolicy"] = restart_policy
    added_spec: dict[str, Any] = {"volumes": volumes, "restartPolicy": restart_policy}
    containers = listed(spec.get("containers"))
    if containers and is_mapping(containers[0]):
        first = dict(containers[0])
        added_container: dict[str, Any] = {"env": env, "volumeMounts": mounts}
        if "name" in first:
            added_container["name"] = first["name"]
        if role == WORKER_ROLE and not first.get("command") and not first.get("args"):
            first["command"] = added_container["command"] = ["/usr/sbin/sshd", "-De"]
        first["env"] = [*listed(first.get("env")), *env]
        first["volumeMounts"] = [*listed(first.get("volumeMounts")), *mounts]
        spec["containers"] = [first, *containers[1:]]
        added_spec["containers"] = [added_container]
    return pod, {"metadata": {"labels": added_labels}, "spec": added_spec}
