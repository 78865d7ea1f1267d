"""The job kinds the controller looks after, and where each keeps what the controller reads.

A TrainJob (Kubeflow Trainer) and an MPIJob (the MPI Operator's ``kubeflow.org/v2beta1``) differ
only in names: which label marks their pods, which label names a pod's role (what its GPUs are
resolved by), which condition means success, where ``suspend`` lives, and the name and labels of the
per-job NetworkPolicy. Everything else — NetworkPolicy ownership, lifecycle records, GPU-seconds,
placement evidence — is the same code reading a :class:`JobKind`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "JOBSET_NAME_LABEL",
    "KINDS",
    "MPIJOB",
    "MPI_JOB_NAME_LABEL",
    "MPI_JOB_ROLE_LABEL",
    "MPI_OPERATOR_LABEL",
    "REPLICATED_JOB_LABEL",
    "TRAINJOB",
    "JobKind",
    "kind_of",
]

# Trainer's JobSet: every pod of a TrainJob carries the JobSet's (= the TrainJob's) name and its
# replicated job's name (jobset api/jobset/v1alpha2: JobSetNameKey, ReplicatedJobNameKey).
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"
# MPI Operator: mpi-operator pkg/controller/mpi_job_controller.go defaultLabels (JobNameLabel,
# JobRoleLabel "launcher"/"worker", OperatorNameLabel "mpi-operator").
MPI_JOB_NAME_LABEL: Final = "training.kubeflow.org/job-name"
MPI_JOB_ROLE_LABEL: Final = "training.kubeflow.org/job-role"
MPI_OPERATOR_LABEL: Final = "training.kubeflow.org/operator-name"


@dataclass(frozen=True, slots=True)
class JobKind:
    """Names of one job kind."""

    kind: str
    group: str
    version: str
    plural: str
    #: Per-job NetworkPolicies are ``policy_prefix + <job>`` (a dot: no rendered name, no job name).
    policy_prefix: str
    #: The label every pod of a job carries with the job's name.
    name_label: str
    #: The label naming a pod's role (a replicated job of a TrainJob, launcher/worker of an MPIJob).
    role_label: str
    #: The condition that means success (``Failed`` and ``Suspended`` are common to both).
    complete_condition: str
    #: Where ``suspend`` is in the spec.
    suspend_path: tuple[str, ...]
    #: On managed NetworkPolicies: the job's name and uid (with the managed-by label: ownership).
    job_label: str
    uid_label: str
    #: Labels every pod of a job carries besides the name label (selected together).
    pod_labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def resource(self) -> tuple[str, str, str]:
        """(group, version, plural), as kopf names a resource."""
        return self.group, self.version, self.plural

    def collection(self, namespace: str | None = None) -> str:
        """The API path of the kind's objects (in ``namespace``, or cluster-wide)."""
        base = f"/apis/{self.group}/{self.version}"
        return f"{base}/namespaces/{namespace}/{self.plural}" if namespace else f"{base}/{self.plural}"

    def path(self, namespace: str, name: str) -> str:
        return f"{self.collection(namespace)}/{name}"

    def pod_selector(self, name: str) -> dict[str, str]:
        """The labels that select every pod of job ``name`` (NetworkPolicy, pod listing)."""
        return {self.name_label: name, **self.pod_labels}

    def selects(self, pod_labels: Mapping[str, Any], name: str) -> bool:
        return all(pod_labels.get(k) == v for k, v in self.pod_selector(name).items())

    def job_of_pod(self, pod_labels: Mapping[str, Any]) -> str | None:
        """The name of the job a pod belongs to, by its labels (None: not a pod of this kind)."""
        name = pod_labels.get(self.name_label)
        if not isinstance(name, str) or not name:
            return None
        return name if all(pod_labels.get(k) == v for k, v in self.pod_labels.items()) else None

    def suspended(self, job: Mapping[str, Any]) -> bool:
        value: Any = job
        for key in self.suspend_path:
            value = value.get(key) if isinstance(value, Mapping) else None
        return value is True

    def policy_name(self, job: str) -> str:
        return f"{self.policy_prefix}{job}"


TRAINJOB: Final = JobKind(
    kind="TrainJob",
    group="trainer.kubeflow.org",
    version="v1alpha1",
    plural="trainjobs",
    policy_prefix="mpigate-trainjob.",
    name_label=JOBSET_NAME_LABEL,
    role_label=REPLICATED_JOB_LABEL,
    # Trainer pkg/apis/trainer/v1alpha1/trainjob_types.go: TrainJobComplete, TrainJobFailed
    complete_condition="Complete",
    suspend_path=("spec", "suspend"),
    job_label="mpigate.io/trainjob",
    uid_label="mpigate.io/trainjob-uid",
)
MPIJOB: Final = JobKind(
    kind="MPIJob",
    group="kubeflow.org",
    version="v2beta1",
    plural="mpijobs",
    policy_prefix="mpigate-mpijob.",
    name_label=MPI_JOB_NAME_LABEL,
    role_label=MPI_JOB_ROLE_LABEL,
    # mpi-operator pkg/apis/kubeflow/v2beta1/types.go: JobSucceeded, JobFailed, JobSuspended
    complete_condition="Succeeded",
    suspend_path=("spec", "runPolicy", "suspend"),
    job_label="mpigate.io/mpijob",
    uid_label="mpigate.io/mpijob-uid",
    # The training operator's PyTorchJobs etc. use the same job-name label: select the MPI
    # Operator's pods only.
    pod_labels={MPI_OPERATOR_LABEL: "mpi-operator"},
)
KINDS: Final = (TRAINJOB, MPIJOB)


def kind_of(obj: Mapping[str, Any]) -> JobKind | None:
    """The kind of a job object by its ``kind`` and ``apiVersion`` group."""
    api_version = obj.get("apiVersion")
    group = api_version.rpartition("/")[0] if isinstance(api_version, str) else ""
    for kind in KINDS:
        if obj.get("kind") == kind.kind and group == kind.group:
            return kind
    return None
