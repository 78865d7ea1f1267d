"""A simulation harness for the controller's chargeback and placement evidence (issue 20).

The real :class:`Reconciler` against the fake API (kmock, through its HTTP API as a real client would
talk to an API server), with a scripted clock. Watch events are delivered by hand, so that a test
decides their order, which of them a controller misses while it is down, and what a restarted one
lists first. A restart or a leader change is a new Reconciler over the same cluster, the same audit
records and the same ledger; a crash skips the ledger write a clean stop makes.

Pods are written as the kubelet shows them (container states with start and finish times), so that
each timeline's expected GPU-hours are computed by hand: GPUs × pod run time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kmock as kmock_lib
from tests.controller.conftest import example_job, example_mpijob
from tests.controller.kube import EVENTS, PODS, Api, alive

from mpigate.admission.kube import KubeClient, KubeError
from mpigate.audit import AuditEntry, AuditWriteError
from mpigate.config import Config
from mpigate.controller.api import ControllerApi
from mpigate.controller.events import EventPoster
from mpigate.controller.kinds import MPIJOB, TRAINJOB, JobKind
from mpigate.controller.metrics import ControllerMetrics
from mpigate.controller.reconciler import Reconciler
from mpigate.report import ReportBuilder, ReportOptions

NAMESPACE = "nlp-team"
LEDGER = ("mpigate-system", "mpigate-controller-ledger")
SEAL_KEY = b"a test key of the controller seal"
CONFIGMAPS = "v1/configmaps"


def t(hhmmss: str, day: int = 22) -> dt.datetime:
    """A time on 2026-11-<day> (UTC)."""
    return dt.datetime.fromisoformat(f"2026-11-{day:02d}T{hhmmss}+00:00")


def ts(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def seconds(start: str, end: str, day: int = 22, end_day: int | None = None) -> float:
    return (t(end, end_day or day) - t(start, day)).total_seconds()


def seal(data: bytes) -> str:
    return hmac.new(SEAL_KEY, data, hashlib.sha256).hexdigest()


# ---------------------------------------------------------------------- what the kubelet shows


def running(
    start: dt.datetime, *, restarts: int = 0, last: tuple[dt.datetime, dt.datetime] | None = None
) -> Any:
    status: dict[str, Any] = {
        "name": "node",
        "restartCount": restarts,
        "state": {"running": {"startedAt": ts(start)}},
    }
    if last is not None:
        status["lastState"] = {
            "terminated": {"startedAt": ts(last[0]), "finishedAt": ts(last[1]), "exitCode": 1}
        }
    return status


def waiting(*, restarts: int = 0, last: tuple[dt.datetime, dt.datetime] | None = None) -> Any:
    status: dict[str, Any] = {"name": "node", "restartCount": restarts, "state": {"waiting": {"reason": "x"}}}
    if last is not None:
        status["lastState"] = {
            "terminated": {"startedAt": ts(last[0]), "finishedAt": ts(last[1]), "exitCode": 1}
        }
    return status


def finished(start: dt.datetime, end: dt.datetime, *, exit_code: int = 0, restarts: int = 0) -> Any:
    return {
        "name": "node",
        "restartCount": restarts,
        "state": {"terminated": {"startedAt": ts(start), "finishedAt": ts(end), "exitCode": exit_code}},
    }


def pod_status(
    container: Any, *, phase: str | None = None, start_time: dt.datetime | None = None, **extra: Any
) -> Any:
    state = container["state"] if container else {}
    if phase is None:
        phase = (
            "Pending" if not container or ("waiting" in state and "lastState" not in container) else "Running"
        )
        if "terminated" in state:
            phase = "Succeeded" if state["terminated"]["exitCode"] == 0 else "Failed"
    status: dict[str, Any] = {"phase": phase, "containerStatuses": [container] if container else []}
    if start_time is not None:
        status["startTime"] = ts(start_time)
    status.update(extra)
    return status


def condition(kind: str, status: str, at: dt.datetime, reason: str = "", message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": ts(at),
    }


# ---------------------------------------------------------------------- the audit trail


class Records:
    """The audit trail: records kept in memory across controller restarts (with the time each was
    written, as the audit writer stamps it); appends can fail."""

    def __init__(self, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.entries: list[Mapping[str, Any]] = []
        self.times: list[dt.datetime] = []
        self.clock = clock
        self.fail_next = 0

    async def append(self, entry: Mapping[str, Any]) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise AuditWriteError("disk full", "ENOSPC")
        self.entries.append(entry)
        self.times.append(self.clock())

    def chargeback(self, **options: Any) -> dict[str, Any]:
        """The report's chargeback section over these records (``options``: ReportOptions)."""
        builder = ReportBuilder(ReportOptions(**options))
        for seq, (entry, time) in enumerate(zip(self.entries, self.times, strict=True)):
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z")
            builder.add_entry(AuditEntry("controller", seq, stamp, entry["stage"], "f", seq, entry, b""))
        section: dict[str, Any] = builder.finish()["chargeback"]
        return section

    def charged(self, **options: Any) -> float:
        """GPU-seconds the report charges (every team and cost center)."""
        return float(sum(row["gpuSeconds"] for row in self.chargeback(**options)["byTeamAndCostCenter"]))

    @property
    def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def lifecycle(self, job: str | None = None) -> list[Mapping[str, Any]]:
        return [
            r["lifecycle"]
            for r in self.entries
            if r["stage"] == "lifecycle" and (job is None or r["object"]["name"] == job)
        ]

    def events(self, job: str | None = None) -> list[tuple[str, int]]:
        return [(r["event"], r["segment"]) for r in self.lifecycle(job)]

    def closing(self, job: str | None = None) -> list[Mapping[str, Any]]:
        return [
            r for r in self.lifecycle(job) if r["event"] in ("suspended", "succeeded", "failed", "deleted")
        ]

    def evidence(self, job: str | None = None) -> list[Mapping[str, Any]]:
        return [
            r["evidence"]
            for r in self.entries
            if r["stage"] == "evidence" and (job is None or r["object"]["name"] == job)
        ]


# ---------------------------------------------------------------------- the cluster and the controller


@dataclass
class Sim:
    kmock: kmock_lib.KubernetesEmulator
    session: aiohttp.ClientSession
    client: KubeClient
    org: Config
    now: dt.datetime = field(default_factory=lambda: t("09:00:00"))
    records: Records = field(default_factory=Records)
    controller: Reconciler | None = None
    metrics: ControllerMetrics | None = None
    ledger: bool = True
    sealed: bool = True
    #: The kind of the jobs the timelines run (the controller looks after TrainJobs and MPIJobs).
    kind: JobKind = TRAINJOB
    _uids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.records.clock = self.clock

    @property
    def api(self) -> Api:
        return Api(self.session)

    def clock(self) -> dt.datetime:
        return self.now

    @property
    def resource(self) -> str:
        """kmock's name of the jobs' resource."""
        return f"{self.kind.api_version}/{self.kind.plural}"

    def at(self, when: dt.datetime) -> None:
        assert when >= self.now, f"the clock goes forward only ({self.now} → {when})"
        self.now = when

    # -------------------------------------------------------------- the controller's life

    def new_controller(self, identity: str = "a") -> Reconciler:
        api = ControllerApi(self.client)  # caches (node labels) are the new process's own
        self.metrics = ControllerMetrics()
        return Reconciler(
            config=lambda: self.org,
            api=api,
            recorder=self.records,
            metrics=self.metrics,
            events=EventPoster(api, self.metrics, identity),
            clock=self.clock,
            kinds=(TRAINJOB, MPIJOB),
            sealer=seal if self.sealed else None,
            ledger=LEDGER if self.ledger else None,
        )

    async def start(self, *, identity: str = "a", pods_first: bool = False) -> Reconciler:
        """A controller takes over: it reads the ledger, closes jobs that are gone, then gets the
        initial listing (jobs before pods, unless ``pods_first``) as kopf would deliver it."""
        self.controller = self.new_controller(identity)
        await self.controller.start()
        jobs = self._objects(self.resource)
        pods = self._objects(PODS)
        for kind, items in (
            (("pods", pods), ("jobs", jobs)) if pods_first else (("jobs", jobs), ("pods", pods))
        ):
            for obj in items:
                if kind == "jobs":
                    await self.controller.on_job_event(self.kind, None, obj)
                else:
                    await self.controller.on_pod_event(None, obj)
        return self.controller

    def fail_next_annotation(self) -> None:
        """The controller's next annotation patch of a job fails (the API answers 503)."""
        assert self.controller is not None
        api = self.controller.api
        original = api.merge_patch

        async def failing(path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
            if f"/{self.kind.plural}/" in path:
                api.merge_patch = original  # type: ignore[method-assign]
                raise KubeError(f"PATCH {path}: HTTP 503", status=503)
            return await original(path, patch)

        api.merge_patch = failing  # type: ignore[method-assign]

    def crash(self) -> None:
        """The controller dies (its memory is gone; nothing more is written)."""
        self.controller = None

    async def stop(self) -> None:
        """A clean stop (SIGTERM, a rollout): the ledger is written once more."""
        assert self.controller is not None
        await self.controller.save_ledger()
        self.controller = None

    async def save_ledger(self) -> None:
        """The runner's periodic ledger write."""
        assert self.controller is not None
        await self.controller.save_ledger()

    async def resync(self) -> tuple[int, int]:
        assert self.controller is not None
        return await self.controller.resync()

    def _objects(self, resource: str) -> list[dict[str, Any]]:
        out = []
        for key in list(self.kmock.objects.keys()):
            if key[0] == resource or str(key[0]) == resource:
                obj = alive(self.kmock, resource, key[1], key[2])
                if obj is not None:
                    out.append(obj)
        return out

    # ---------------------------------------------------------- jobs, as users, Kueue and Trainer change them

    async def _deliver_job(self, event: str, obj: Any) -> None:
        if self.controller is not None:
            await self.controller.on_job_event(self.kind, event, obj)

    async def _deliver_pod(self, event: str, obj: Any) -> None:
        if self.controller is not None:
            await self.controller.on_pod_event(event, obj)

    async def create_job(
        self, example: str = "llm-finetune", *, name: str | None = None, suspend: bool = True
    ) -> str:
        if self.kind is MPIJOB:
            job = example_mpijob("mpi-allreduce" if example == "llm-finetune" else example)
            job["metadata"]["uid"] = f"job-{next(self._uids)}"
        else:
            job = example_job(example, uid=f"job-{next(self._uids)}")
        if name:
            job["metadata"]["name"] = name
        job["metadata"]["creationTimestamp"] = ts(self.now)
        if suspend:  # Kueue's webhook suspends it; Trainer (the MPI Operator) reports it
            where = job["spec"]
            for key in self.kind.suspend_path[1:-1]:
                where = where.setdefault(key, {})
            where[self.kind.suspend_path[-1]] = True
            job["status"] = {"conditions": [condition("Suspended", "True", self.now, "Suspended")]}
        created = await self.api.create(self.resource, NAMESPACE, job)
        await self._deliver_job("ADDED", created)
        return str(job["metadata"]["name"])

    def job(self, name: str) -> dict[str, Any]:
        found = alive(self.kmock, self.resource, NAMESPACE, name)
        assert found is not None, name
        return found  # type: ignore[no-any-return]

    async def patch_job(self, name: str, patch: dict[str, Any], *, deliver: bool = True) -> Any:
        updated = await self.api.patch(self.resource, NAMESPACE, name, patch)
        if deliver:
            await self._deliver_job("MODIFIED", updated)
        return updated

    def _suspend_spec(self, value: bool) -> dict[str, Any]:
        """A spec (patch) with ``suspend`` where the kind keeps it (a TrainJob's spec, an MPIJob's
        runPolicy)."""
        spec: dict[str, Any] = {self.kind.suspend_path[-1]: value}
        for key in reversed(self.kind.suspend_path[1:-1]):
            spec = {key: spec}
        return spec

    async def admit(self, name: str, *, deliver: bool = True) -> None:
        """Kueue admits the job now (Trainer turns Suspended to False); ``deliver=False``: the
        watch event is late (delivered by the caller, or never)."""
        await self.patch_job(
            name,
            {
                "spec": self._suspend_spec(False),
                "status": {"conditions": [condition("Suspended", "False", self.now, "Resumed")]},
            },
            deliver=deliver,
        )

    async def suspend(self, name: str, *, why: str = "Preempted by urgent-run") -> None:
        await self.patch_job(
            name,
            {
                "spec": self._suspend_spec(True),
                "status": {"conditions": [condition("Suspended", "True", self.now, "Suspended", why)]},
            },
        )

    async def complete(self, name: str, *, failed: bool = False) -> None:
        conditions = list(self.job(name).get("status", {}).get("conditions", []))
        # Trainer: JobsCompleted; mpi-operator pkg/controller/mpi_job_controller.go mpiJobSucceededReason
        done = "JobsCompleted" if self.kind is TRAINJOB else "MPIJobSucceeded"
        kind, reason = ("Failed", "BackoffLimitExceeded") if failed else (self.kind.complete_condition, done)
        conditions.append(condition(kind, "True", self.now, reason))
        await self.patch_job(name, {"status": {"conditions": conditions}})

    async def delete_job(self, name: str) -> None:
        """The job is deleted; the garbage collector deletes its pods with it."""
        last = self.job(name)
        await self.api.delete(self.resource, NAMESPACE, name)
        await self._deliver_job("DELETED", last)
        for pod in self._objects(PODS):
            if self.kind.job_of_pod(pod["metadata"]["labels"]) == name:
                await self.delete_pod(pod["metadata"]["name"])

    # ---------------------------------------------------------- pods, as JobSet and the kubelet change them

    async def create_pod(
        self,
        job: str,
        name: str,
        role: str,
        node: str | None,
        container: Any = None,
        *,
        gpus: int = 8,
        node_selector: dict[str, str] | None = None,
        **status: Any,
    ) -> str:
        uid = f"pod-{next(self._uids)}"
        spec: dict[str, Any] = {
            "containers": [{"name": "node", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        }
        if node:
            spec["nodeName"] = node
        if node_selector:
            spec["nodeSelector"] = node_selector
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": uid,
                "labels": {**self.kind.pod_selector(job), self.kind.role_label: role},
            },
            "spec": spec,
            "status": pod_status(container, **status),
        }
        created = await self.api.create(PODS, NAMESPACE, body)
        await self._deliver_pod("ADDED", created)
        return uid

    def pod(self, name: str) -> dict[str, Any]:
        found = alive(self.kmock, PODS, NAMESPACE, name)
        assert found is not None, name
        return found  # type: ignore[no-any-return]

    async def set_pod(self, name: str, container: Any, *, deliver: bool = True, **status: Any) -> None:
        updated = await self.api.patch(PODS, NAMESPACE, name, {"status": pod_status(container, **status)})
        if deliver:
            await self._deliver_pod("MODIFIED", updated)

    async def patch_pod(self, name: str, patch: dict[str, Any]) -> None:
        updated = await self.api.patch(PODS, NAMESPACE, name, patch)
        await self._deliver_pod("MODIFIED", updated)

    async def delete_pod(self, name: str, *, deliver: bool = True) -> None:
        last = self.pod(name)
        await self.api.delete(PODS, NAMESPACE, name)
        if deliver:
            await self._deliver_pod("DELETED", last)

    async def scheduled_event(self, pod: str, uid: str, node: str) -> None:
        """The scheduler's Event for a pod (kept an hour by the API server)."""
        await self.api.create(
            EVENTS,
            NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{pod}.{next(self._uids):x}", "namespace": NAMESPACE},
                "involvedObject": {"kind": "Pod", "namespace": NAMESPACE, "name": pod, "uid": uid},
                "reason": "Scheduled",
                "type": "Normal",
                "message": f"Successfully assigned {NAMESPACE}/{pod} to {node}",
                "firstTimestamp": ts(self.now),
                "lastTimestamp": ts(self.now),
                "source": {"component": "default-scheduler"},
            },
        )

    # -------------------------------------------------------------- nodes

    def add_node(self, name: str, labels: dict[str, str]) -> None:
        self.kmock.objects["v1/nodes", None, name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"node-{name}", "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }

    def remove_node(self, name: str) -> None:
        self.kmock.objects["v1/nodes", None, name].delete()

    # -------------------------------------------------------------- what was charged

    def metric(self, name: str, **labels: str) -> float:
        assert self.metrics is not None
        return self.metrics.registry.get_sample_value(name, labels) or 0.0
