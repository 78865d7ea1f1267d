"""Everything a rule check needs about one request, computed once.

Rules receive a :class:`JobContext` (TrainJobs) or a :class:`RuntimeContext` (runtimes); they read
the object through the tolerant accessors here, so that a field of the wrong type reads as absent
instead of raising.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mpigate.config import Config
from mpigate.config.model import DataClassification, NetworkProfile, Region, Team
from mpigate.config.mpienv import DEFAULT_IMPLEMENTATION, Implementation, as_implementation
from mpigate.trainjob import Resolution
from mpigate.trainjob.jsontypes import is_mapping

from .decision import AdmissionInput, LiveContext, Operation, UserInfo
from .shapes import TRAINJOB, JobShape

__all__ = [
    "CLASSIFICATION_LABEL",
    "COST_CENTER_LABEL",
    "PRIORITY_LABEL",
    "QUEUE_LABEL",
    "TEAM_LABEL",
    "JobContext",
    "RuntimeContext",
    "as_int",
    "as_list",
    "as_mapping",
    "as_str",
    "labels_of",
    "request_identity",
    "request_object",
]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
CLASSIFICATION_LABEL = "mpigate.io/data-classification"
# Chargeback reads it (report/aggregate.py).
COST_CENTER_LABEL = "mpigate.io/cost-center"
TEAM_LABEL = "mpigate.io/team"


def as_mapping(value: Any) -> Mapping[str, Any]:
    return value if is_mapping(value) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """String labels of an object (non-string values are ignored)."""
    labels = as_mapping(as_mapping(obj.get("metadata")).get("labels"))
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


def request_object(request: AdmissionInput) -> Mapping[str, Any]:
    return request.obj if is_mapping(request.obj) else {}


def request_identity(request: AdmissionInput, obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = as_mapping(obj.get("metadata"))
    namespace = request.namespace or as_str(meta.get("namespace")) or ""
    name = request.name or as_str(meta.get("name")) or as_str(meta.get("generateName")) or ""
    return namespace, name


@dataclass(frozen=True, slots=True)
class JobContext:
    """A TrainJob or an MPIJob under evaluation (the mutated object on CREATE)."""

    config: Config
    operation: Operation
    obj: Mapping[str, Any]
    namespace: str
    name: str
    team: Team | None
    labels: Mapping[str, str]
    runtime_kind: str
    runtime_name: str
    runtime_known: bool
    resolution: Resolution | None
    classification: DataClassification | None
    region: Region | None
    profile: NetworkProfile | None
    gpu_resources: frozenset[str]
    require_digest: bool
    require_digest_reason: str
    live: LiveContext | None
    #: Where this kind of job keeps the fields messages name (TrainJob or MPIJob).
    shape: JobShape = TRAINJOB
    #: Who asked (the request's userInfo): personas decide service accounts and label changes.
    requester: UserInfo = field(default_factory=UserInfo)
    #: Managers whose runtime patch the rules may take as mpigate's own: mpigate's manager when its
    #: entry is exactly what mpigate writes for the job (or unchanged since an admitted CREATE),
    #: else none — a tenant's copy under mpigate's name is judged like any other patch.
    trusted_managers: frozenset[str] = frozenset()

    @property
    def spec(self) -> Mapping[str, Any]:
        return as_mapping(self.obj.get("spec"))

    @property
    def trainer(self) -> Mapping[str, Any]:
        return as_mapping(self.spec.get("trainer"))

    @property
    def team_name(self) -> str:
        return self.team.name if self.team else ""

    @property
    def implementation(self) -> Implementation:
        """The MPI implementation the job runs, whose pinned-port environment it gets: the
        runtime's ``mlPolicy.mpi.mpiImplementation`` (an MPIJob's ``spec.mpiImplementation``) where
        the job has one, else what the org's approved-runtimes entry declares (``mpiImplementation``:
        a runtime without Trainer's MPI policy that runs ``mpiexec.hydra`` itself), else Open MPI."""
        ml = self.resolution.ml_policy if self.resolution is not None else None
        if ml is not None and ml.mpi:
            return as_implementation(ml.mpi_implementation) or DEFAULT_IMPLEMENTATION
        if self.runtime_name:
            approval = self.config.org.runtime_approval(self.runtime_name, self.runtime_kind)
            if approval is not None and approval.mpi_implementation is not None:
                return approval.mpi_implementation
        return DEFAULT_IMPLEMENTATION

    @property
    def team_file(self) -> str:
        return self.team.source.file if self.team else "quotas/"

    @property
    def contact(self) -> str:
        return self.team.contact if self.team and self.team.contact else "the platform team"


@dataclass(frozen=True, slots=True)
class RuntimeContext:
    """A (Cluster)TrainingRuntime evaluated on its own."""

    config: Config
    operation: Operation
    obj: Mapping[str, Any]
    kind: str
    namespace: str | None
    name: str
    resolution: Resolution
