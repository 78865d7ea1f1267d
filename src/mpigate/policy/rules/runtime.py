"""MPG-RT-001 (approved runtime) and MPG-RT-002 (MPI sanity of a runtime, a TrainJob or an MPIJob)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mpigate.config import Config, thaw
from mpigate.config.model import Team
from mpigate.config.mpienv import Implementation
from mpigate.policy.context import as_int, as_list, as_mapping, as_str
from mpigate.policy.findings import Finding
from mpigate.policy.shapes import TRAINJOB, JobShape
from mpigate.trainjob import EffectiveJob, Resolution
from mpigate.trainjob.defaults import with_runtime_defaults
from mpigate.trainjob.resolve import MPIGATE_MANAGER

__all__ = ["check_managed_by", "check_mpi_sanity", "check_runtime_approval", "check_runtime_drift"]

TRAINER_GROUP = "trainer.kubeflow.org"


def check_runtime_approval(
    config: Config, team: Team | None, ref: Mapping[str, Any], namespace: str, *, in_tree: bool
) -> Iterator[Finding]:
    """MPG-RT-001 for a TrainJob's ``spec.runtimeRef``."""
    name = ref.get("name")
    kind = ref.get("kind", "ClusterTrainingRuntime")
    group = ref.get("apiGroup", TRAINER_GROUP)
    approved = [a for a in config.org.runtimes if team is None or a.allows_team(team.name)]
    choices = ", ".join(sorted({a.name for a in approved})) or "none"
    if not isinstance(name, str) or not name:
        yield Finding(
            "MPG-RT-001",
            "spec.runtimeRef.name",
            "names no training runtime.",
            f"Set spec.runtimeRef.name to an approved runtime: {choices}.",
            "spec.runtimeRef.name is missing",
        )
        return
    if group != TRAINER_GROUP or kind not in ("ClusterTrainingRuntime", "TrainingRuntime"):
        yield Finding(
            "MPG-RT-001",
            "spec.runtimeRef",
            f"refers to {kind} in API group {group}; only Trainer's ClusterTrainingRuntime and "
            "TrainingRuntime "
            f"({TRAINER_GROUP}) are supported.",
            f"Use kind ClusterTrainingRuntime with one of: {choices}.",
            f"unsupported runtimeRef {group}/{kind}",
        )
        return
    approval = config.org.runtime_approval(name, kind)
    what = f"{kind} {namespace + '/' if kind == 'TrainingRuntime' else ''}{name}"
    if approval is None:
        yield Finding(
            "MPG-RT-001",
            "spec.runtimeRef.name",
            f"{what} is not an approved runtime.",
            f"Use one of: {choices}; or ask the security team to review it and list it under "
            "spec.runtimes.allowed in policies/org.yaml.",
            f"{what} is not approved (approved: {choices})",
        )
        return
    if team is not None and not approval.allows_team(team.name):
        yield Finding(
            "MPG-RT-001",
            "spec.runtimeRef.name",
            f"{what} is approved only for {', '.join(approval.teams or ())}, not {team.name}.",
            f"Use one of: {choices}.",
            f"{what} is not approved for {team.name}",
        )
        return
    if team is not None and team.runtimes is not None and name not in team.runtimes:
        yield Finding(
            "MPG-RT-001",
            "spec.runtimeRef.name",
            f"{team.name} may only use {', '.join(team.runtimes)} ({team.source.file}).",
            f"Use one of: {', '.join(team.runtimes)}.",
            f"{team.name} may only use {', '.join(team.runtimes)}",
        )
        return
    if not in_tree and not approval.external:
        yield Finding(
            "MPG-RT-001",
            "spec.runtimeRef.name",
            f"{what} is approved by name but its reviewed manifest is not in the config tree, so its pods "
            "cannot be checked.",
            "Add the runtime manifest to policies/runtimes/ (or mark the approval external: true).",
            f"{what} has no reviewed manifest",
        )


# Trainer's CRD (pkg/apis/trainer/v1alpha1/trainjob_types.go, TrainJobSpec.ManagedBy) accepts exactly
# these; Trainer's controller skips every other value (pkg/util/trainjob IsManagedByExternalController).
TRAINER_CONTROLLER = "trainer.kubeflow.org/trainjob-controller"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"


def check_managed_by(spec: Mapping[str, Any]) -> Iterator[Finding]:
    """MPG-RT-001 for ``spec.managedBy``. A TrainJob is judged the same whoever runs it: Trainer
    here, or MultiKueue, which copies the spec verbatim to a worker cluster, clearing only
    ``managedBy`` and Kueue's own runtime patch (Kueue: pkg/controller/jobs/trainjob/
    trainjob_multikueue_adapter.go (*multiKueueAdapter).SyncJob). Any other controller would build
    pods mpigate never judged, so it is refused."""
    if "managedBy" not in spec:
        return
    value = spec.get("managedBy")
    if value in (TRAINER_CONTROLLER, MULTIKUEUE):
        return
    shown = value if isinstance(value, str) else f"a {type(value).__name__}"
    yield Finding(
        "MPG-RT-001",
        "spec.managedBy",
        f"{shown} is not a controller mpigate can vouch for: only Trainer ({TRAINER_CONTROLLER}) and "
        f"MultiKueue ({MULTIKUEUE}, which runs the same spec on a worker cluster) build the pods mpigate "
        "judges.",
        f"Remove spec.managedBy (Trainer runs the job), or set it to {MULTIKUEUE} for MultiKueue.",
        f"spec.managedBy {shown} is not Trainer or MultiKueue",
    )


def check_runtime_drift(
    config: Config, obj: Mapping[str, Any], kind: str, namespace: str | None, name: str
) -> Iterator[Finding]:
    """MPG-RT-001 for a runtime object: an approved name must carry the reviewed manifest's spec."""
    approval = config.org.runtime_approval(name, kind)
    reviewed = config.runtime(kind, name, namespace)
    if approval is None or reviewed is None:
        return
    # Compare modulo the CRD defaults the API server adds (groupName, replicas, port protocol ...).
    if with_runtime_defaults(thaw(reviewed.manifest.get("spec"))) != with_runtime_defaults(obj.get("spec")):
        yield Finding(
            "MPG-RT-001",
            "spec",
            f"{kind} {name} is an approved runtime, but this spec differs from the reviewed manifest in "
            f"{reviewed.source.file}; TrainJobs on it would run unreviewed pods.",
            f"Change the runtime through {reviewed.source.file} (review, then render/apply), or use "
            "a new name.",
            f"spec differs from the reviewed {reviewed.source.file}",
        )


def _run_as(
    job: EffectiveJob, container: Mapping[str, Any], index: int
) -> tuple[int | None, bool, tuple[Any, ...]]:
    """(uid, runAsNonRoot, pod path of the uid) of a container, container settings first."""
    pod_sc = as_mapping(job.spec.get("securityContext"))
    sc = as_mapping(container.get("securityContext"))
    if as_int(sc.get("runAsUser")) is not None:
        return (
            as_int(sc.get("runAsUser")),
            sc.get("runAsNonRoot") is True,
            ("spec", "containers", index, "securityContext", "runAsUser"),
        )
    non_root = sc.get("runAsNonRoot") is True or (
        sc.get("runAsNonRoot") is None and pod_sc.get("runAsNonRoot") is True
    )
    return as_int(pod_sc.get("runAsUser")), non_root, ("spec", "securityContext", "runAsUser")


def _defaulted(job: EffectiveJob, index: int) -> bool:
    """runAsNonRoot comes only from mpigate's own security defaults (the runtime does not say who it
    runs as, so the SSH path cannot be judged)."""
    own = f"spec.runtimePatches[manager={MPIGATE_MANAGER}]"
    container_sc = as_mapping(as_mapping(job.spec.get("containers", [{}])[index]).get("securityContext"))
    if "runAsNonRoot" in container_sc:
        return job.origin(("spec", "containers", index, "securityContext", "runAsNonRoot")).startswith(own)
    return job.origin(("spec", "securityContext", "runAsNonRoot")).startswith(own)


def check_mpi_sanity(
    config: Config,
    resolution: Resolution,
    root: str,
    shape: JobShape = TRAINJOB,
    declared: Implementation | None = None,
) -> Iterator[Finding]:
    """MPG-RT-002: allowed MPI implementation; SSH keys mounted where the pods' user looks
    (``shape``: where the job kind keeps those settings and which jobs and container run MPI).

    A runtime with Trainer's MPI policy (or an MPIJob) says both itself: its implementation and
    ``sshAuthMountPath``, where Trainer or the MPI Operator mounts the keys. A runtime without it
    whose approved-runtimes entry ``declared`` an implementation (Intel MPI or MPICH running
    ``mpiexec.hydra -launcher ssh`` as a plain command) mounts its keys itself: every ``.../.ssh``
    volume mount of its containers is judged the same way, since Hydra's ssh launcher, like
    Open MPI's, runs ssh as the pods' user, which reads the keys in its own home."""
    ml = resolution.ml_policy
    policy = ml is not None and ml.mpi
    if ml is not None and policy:
        allowed = config.org.mpi_implementations
        if ml.mpi_implementation not in allowed:
            yield Finding(
                "MPG-RT-002",
                f"{root}{shape.mpi_implementation}",
                f"MPI implementation {ml.mpi_implementation} is not allowed ({', '.join(allowed)}).",
                f"Use mpiImplementation: {allowed[0] if allowed else 'OpenMPI'}.",
                f"MPI implementation {ml.mpi_implementation} not allowed",
            )
    elif declared is None:
        return
    for job in resolution.jobs:
        if policy and job.name not in (shape.launcher_job, shape.node_job):
            continue
        for list_field, index, container in job.containers():
            if list_field != "containers":
                continue
            if ml is not None and policy:
                if (container.get("name") != shape.mpi_container) if shape.mpi_container else index != 0:
                    continue
                mount = ml.ssh_auth_mount_path
                yield from _ssh_path(
                    job,
                    container,
                    index,
                    mount,
                    f"{root}{shape.ssh_auth_mount_path}",
                    f"sshAuthMountPath is {mount}",
                    f"{shape.mpi_container or 'first'} container",
                    "mpirun",
                )
                continue
            for m, volume in enumerate(as_list(container.get("volumeMounts"))):
                path = as_mapping(volume).get("mountPath")
                if isinstance(path, str) and path.rstrip("/").endswith("/.ssh"):
                    mount = path.rstrip("/")
                    where = job.origin(("spec", "containers", index, "volumeMounts", m, "mountPath"))
                    yield from _ssh_path(
                        job,
                        container,
                        index,
                        mount,
                        where,
                        f"the SSH keys are mounted at {mount}",
                        f"{as_str(container.get('name')) or 'first'} container",
                        "Hydra's ssh launcher (mpiexec.hydra -launcher ssh)",
                    )


def _ssh_path(
    job: EffectiveJob,
    container: Mapping[str, Any],
    index: int,
    mount: str,
    mount_path: str,
    mounted: str,
    which: str,
    launcher: str,
) -> Iterator[Finding]:
    """MPG-RT-002 when the user ``container`` runs as cannot read the keys at ``mount`` (set at
    ``mount_path``; ``mounted``, ``which`` container and ``launcher`` say so in the message)."""
    uid, non_root, uid_path = _run_as(job, container, index)
    problem = ""
    if mount == "/root/.ssh" and uid is not None and uid != 0:
        problem = f"runs as UID {uid}, but {mounted} (only root reads keys there)"
    elif mount == "/root/.ssh" and uid is None and non_root and not _defaulted(job, index):
        problem = f"must run as non-root, but {mounted} (only root reads keys there)"
    elif mount.startswith("/home/") and uid == 0:
        problem = f"runs as root (UID 0), but {mounted}; ssh as root reads /root/.ssh"
    if not problem:
        return
    where = job.origin(uid_path) if uid is not None else mount_path
    fix = (
        "Mount the keys in the home of the user the pods run as: sshAuthMountPath /home/<user>/.ssh "
        "for non-root images (mpiuser: /home/mpiuser/.ssh), /root/.ssh only for root images."
    )
    yield Finding(
        "MPG-RT-002",
        where,
        f"the {job.name} pods' {which} {problem}; {launcher} cannot reach the workers over SSH.",
        fix,
        f"{job.name}: {problem}",
    )
