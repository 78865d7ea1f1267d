"""Where each kind of job keeps what the rules talk about.

The rules judge effective pods (:class:`~mpigate.trainjob.Resolution`), which look the same for a
TrainJob and an MPIJob. What differs is where the author writes the few things a message must name —
the node count, the run-time limit, the MPI settings — so a rule asks the job's :class:`JobShape`
instead of spelling a TrainJob path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from mpigate.trainjob.model import LAUNCHER, NODE

__all__ = ["MPIJOB", "TRAINJOB", "JobShape"]


@dataclass(frozen=True, slots=True)
class JobShape:
    """One kind of job, as the rules see it."""

    kind: str
    #: Where a demand finding points (the part of the object that sets pods and resources).
    demand: str
    #: The field that sets the number of nodes, and how to say "fewer nodes".
    nodes: str
    #: Where GPUs per pod are asked for.
    per_pod: str
    #: The run-time limit (a path of keys).
    deadline: tuple[str, ...]
    #: Where the job is suspended (Kueue un-suspends it on admission; a path of keys).
    suspend: tuple[str, ...]
    #: MPI slots per worker, implementation and SSH mount path ("" root: relative to the object).
    slots: str
    mpi_implementation: str
    ssh_auth_mount_path: str
    #: The effective job whose pod count the node count sets, and the job that runs mpirun.
    node_job: str
    launcher_job: str
    #: The container of those jobs that runs MPI ("" = the first container).
    mpi_container: str
    #: Where the pinned OpenMPI port environment belongs (mpigate's mutation writes it there).
    mpirun_env: str

    @property
    def deadline_path(self) -> str:
        return ".".join(self.deadline)


TRAINJOB: Final = JobShape(
    kind="TrainJob",
    demand="spec.trainer",
    nodes="spec.trainer.numNodes",
    per_pod="spec.trainer.resourcesPerNode",
    deadline=("spec", "activeDeadlineSeconds"),
    suspend=("spec", "suspend"),
    slots="spec.trainer.numProcPerNode",
    mpi_implementation="spec.mlPolicy.mpi.mpiImplementation",
    ssh_auth_mount_path="spec.mlPolicy.mpi.sshAuthMountPath",
    node_job=NODE,
    launcher_job=LAUNCHER,
    mpi_container=NODE,
    mpirun_env="spec.trainer.env",
)

MPIJOB: Final = JobShape(
    kind="MPIJob",
    demand="spec.mpiReplicaSpecs",
    nodes="spec.mpiReplicaSpecs.Worker.replicas",
    per_pod="the containers' resources in spec.mpiReplicaSpecs",
    deadline=("spec", "runPolicy", "activeDeadlineSeconds"),
    suspend=("spec", "runPolicy", "suspend"),  # Kueue: (*MPIJob).Suspend sets RunPolicy.Suspend
    slots="spec.slotsPerWorker",
    mpi_implementation="spec.mpiImplementation",
    ssh_auth_mount_path="spec.sshAuthMountPath",
    node_job="worker",
    launcher_job="launcher",
    mpi_container="",
    mpirun_env="spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].env",
)
