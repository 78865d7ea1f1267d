"""The engine's contract: what goes in (:class:`AdmissionInput`, :class:`LiveContext`) and what
comes out (:class:`Decision`). Plain, frozen, serialisable values shared by the webhook, the CLI
(`explain`, `test`), the audit trail and the reports.

The evaluation entry point is :func:`mpigate.policy.evaluate` (see ``engine.py``)::

    decision = evaluate(config, request, live=None, now=datetime.now(UTC))

It is pure: no I/O, deterministic for the same inputs, safe to call from many threads.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "AdmissionInput",
    "AppliedException",
    "Decision",
    "Demand",
    "JobDemand",
    "LiveContext",
    "Mode",
    "Operation",
    "UserInfo",
    "Violation",
]

Mode = Literal["enforce", "warn", "audit"]
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


@dataclass(frozen=True, slots=True)
class UserInfo:
    """Who asked (AdmissionReview ``request.userInfo``)."""

    username: str = ""
    groups: tuple[str, ...] = ()
    uid: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass(frozen=True, slots=True)
class AdmissionInput:
    """One admission request, transport-free.

    ``kind`` is ``TrainJob``, ``TrainingRuntime`` or ``ClusterTrainingRuntime``. ``obj`` is the
    object as sent (``None`` on DELETE), ``old_obj`` the stored one (UPDATE/DELETE). Both are
    plain JSON-like dicts and are never mutated by the engine.
    """

    operation: Operation
    kind: str
    namespace: str | None
    name: str
    obj: Mapping[str, Any] | None
    old_obj: Mapping[str, Any] | None = None
    user: UserInfo = field(default_factory=UserInfo)
    uid: str = ""
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class LiveContext:
    """What the webhook could read from the cluster within its deadline (all optional).

    ``active_jobs``: TrainJobs and MPIJobs of the namespace's team that are not finished.
    ``queue_usage``: per ClusterQueue, flavor and resource, the quota reserved by admitted
    workloads (Kueue ``status.flavorsReservation``), in Kueue's units (milli-CPU for ``cpu``, whole
    units otherwise) - every queue of the team's cohort, so that what the cohort can lend is known.
    ``gpus_in_use``: per flavor, GPUs reserved in the team's own ClusterQueue (the short form that
    ``explain --gpus-in-use`` and PolicyTest ``live.gpusInUse`` give; ``queue_usage`` wins for the
    team's queue when both are set). ``source`` names where it came from, for messages.
    ``runtimes``: (Cluster)TrainingRuntime manifests read from the cluster, keyed by
    ``(kind, namespace or None, name)``; used for runtimes approved as ``external`` whose manifest
    is not in the config tree (the reviewed manifest in the tree always wins); ``runtime_reason``:
    why such a runtime could not be read (MPG-RT-003 names it).
    """

    active_jobs: int | None = None
    gpus_in_use: Mapping[str, int] | None = None
    queue_usage: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None
    source: str = "cluster"
    unavailable_reason: str | None = None
    runtimes: Mapping[tuple[str, str | None, str], Mapping[str, Any]] | None = None
    runtime_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Violation:
    """One rule hit. ``mode`` says what it does: ``enforce`` denies, ``warn`` warns, ``audit``
    is only recorded. ``waived_by`` names the PolicyException that waived it (then it does not
    deny). ``path`` is where it is, as a user reads it (``spec.trainer.numNodes`` or
    ``runtime mpi-openmpi-gpu: spec.template...``); ``fix`` says what to do."""

    rule: str
    mode: Mode
    path: str
    message: str
    fix: str = ""
    controls: tuple[str, ...] = ()
    waived_by: str | None = None
    #: a custom, library or ValidatingAdmissionPolicy rule's expression digest (the catalogue's
    #: rules are fixed by mpigate's version): which CEL judged, with the record's config revision
    digest: str = ""

    @property
    def denies(self) -> bool:
        return self.mode == "enforce" and self.waived_by is None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.rule,
            "mode": self.mode,
            "path": self.path,
            "message": self.message,
        }
        if self.fix:
            out["fix"] = self.fix
        out["controls"] = list(self.controls)
        if self.waived_by:
            out["waivedBy"] = self.waived_by
        if self.digest:
            out["digest"] = self.digest
        return out


@dataclass(frozen=True, slots=True)
class AppliedException:
    name: str
    rules: tuple[str, ...]
    approver: str
    ticket: str
    expires: dt.date
    justification: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rules": list(self.rules),
            "approver": self.approver,
            "ticket": self.ticket,
            "expires": self.expires.isoformat(),
            "justification": self.justification,
        }


@dataclass(frozen=True, slots=True)
class JobDemand:
    """Demand of one replicated job: pods and per-pod resources (requests, as Kueue counts)."""

    name: str
    pods: int
    gpus_per_pod: Mapping[str, int]
    cpu_per_pod: str | None
    memory_per_pod: str | None
    slots_per_pod: int | None = None
    # the images of the job's pods as admitted (after mpigate's patch): the report's inventory
    images: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Demand:
    """What a TrainJob asks for in total."""

    pods: int
    gpus: Mapping[str, int]
    cpu: str | None
    memory: str | None
    jobs: tuple[JobDemand, ...]
    region: str | None = None

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "pods": self.pods,
            "gpus": self.total_gpus,
            "gpusByResource": dict(self.gpus),
            "cpu": self.cpu,
            "memory": self.memory,
            "region": self.region,
            "jobs": [
                {
                    "name": j.name,
                    "pods": j.pods,
                    "gpusPerPod": dict(j.gpus_per_pod),
                    "cpuPerPod": j.cpu_per_pod,
                    "memoryPerPod": j.memory_per_pod,
                    "slotsPerPod": j.slots_per_pod,
                    "images": list(j.images),
                }
                for j in self.jobs
            ],
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """The engine's verdict on one request — identical in the webhook, ``explain`` and ``test``.

    ``allowed`` is False when any violation denies. ``patch`` is the JSONPatch (RFC 6902) the
    mutating webhook returns (empty unless CREATE mutated something); validation ran on the
    patched object. ``warnings`` are the texts for ``response.warnings``. ``message`` is the
    denial text for ``response.status.message`` (empty when allowed).
    """

    allowed: bool
    operation: Operation
    kind: str
    namespace: str | None
    name: str
    team: str | None
    revision: str
    violations: tuple[Violation, ...] = ()
    warnings: tuple[str, ...] = ()
    patch: tuple[Mapping[str, Any], ...] = ()
    exceptions: tuple[AppliedException, ...] = ()
    demand: Demand | None = None
    message: str = ""
    #: the ValidatingAdmissionPolicies' auditAnnotations (``<policy>/<key>``, value), as the API
    #: server would add them to its audit event; mpigate writes them into its audit record
    audit_annotations: tuple[tuple[str, str], ...] = ()

    @classmethod
    def bare(
        cls, request: AdmissionInput, revision: str, *, allowed: bool = True, message: str = ""
    ) -> Decision:
        """A decision on ``request`` as sent, with no team, violations or patch (a kind mpigate does
        not judge, an internal error, a stand-in engine)."""
        return cls(
            allowed=allowed,
            operation=request.operation,
            kind=request.kind,
            namespace=request.namespace,
            name=request.name,
            team=None,
            revision=revision,
            message=message,
        )

    @property
    def denying(self) -> tuple[Violation, ...]:
        return tuple(v for v in self.violations if v.denies)

    @property
    def rule_ids(self) -> tuple[str, ...]:
        """IDs of every rule hit, sorted and unique (for ``mpigate.io/rules``)."""
        return tuple(sorted({v.rule for v in self.violations}))

    @property
    def outcome(self) -> str:
        """``denied``, ``allowed-with-warnings`` or ``allowed`` (``mpigate.io/decision``)."""
        if not self.allowed:
            return "denied"
        if self.warnings:
            return "allowed-with-warnings"
        return "allowed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "allowed": self.allowed,
            "decision": self.outcome,
            "operation": self.operation,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "team": self.team,
            "revision": self.revision,
            "message": self.message,
            "violations": [v.to_dict() for v in self.violations],
            "warnings": list(self.warnings),
            "patch": [dict(p) for p in self.patch],
            "exceptions": [e.to_dict() for e in self.exceptions],
            "demand": self.demand.to_dict() if self.demand else None,
            **({"auditAnnotations": dict(self.audit_annotations)} if self.audit_annotations else {}),
        }
