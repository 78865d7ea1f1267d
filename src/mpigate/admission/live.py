"""Live cluster context for quota rules MPG-Q007/MPG-Q008, read within a budget.

Two sources, each with the access pattern that suits it:

- **Active jobs** (TrainJobs and MPIJobs) per namespace come from one watch-backed cache per kind
  (:class:`JobCache`): a paginated LIST (pages decoded one at a time into the few fields that
  decide whether a job is active, only names kept), then a WATCH from its ``resourceVersion``
  (bookmarks on), re-watching from the last seen version when the server ends the stream and
  relisting on ``410 Gone``. A lookup is a dictionary read; counting every admission with a LIST
  would load the API server. MPIJobs are optional: where the MPI Operator's CRD is not installed
  (LIST answers 404) there are none, and the cache lists again after the longest backoff.
- **The team's Kueue ClusterQueue** (spec quota, ``status.flavorsReservation``) is read with a
  GET through the LocalQueue the job is submitted to, cached briefly so that a burst of
  submissions costs one request. Kueue updates reservations continuously; a watch of every
  ClusterQueue would deliver far more than the webhook needs.

Every lookup is bounded by the caller's budget. What cannot be read in time is reported in
:attr:`LiveContext.unavailable_reason`; the engine then judges on static config only, and the
server adds the warning ``live quota context unavailable: ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

import msgspec

from mpigate.config import Config, parse_quantity
from mpigate.config.queueing import kueue_amount
from mpigate.policy.decision import AdmissionInput, LiveContext

from .kube import KubeClient, KubeError
from .logjson import fields

__all__ = [
    "MPIJOBS",
    "TRAINJOBS",
    "JobCache",
    "JobKind",
    "KubeLiveSource",
    "KueueReader",
    "LiveSource",
    "QueueUsage",
    "is_active",
    "reservations",
]

log = logging.getLogger(__name__)

TRAINER_API: Final = "/apis/trainer.kubeflow.org/v1alpha1"
TRAINJOBS_PATH: Final = f"{TRAINER_API}/trainjobs"
MPIJOBS_PATH: Final = "/apis/kubeflow.org/v2beta1/mpijobs"
KUEUE_API: Final = "/apis/kueue.x-k8s.io/v1beta2"
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
COHORT_LABEL: Final = "mpigate.io/cohort"  # on the ClusterQueues mpigate renders into a cohort

ErrorHook = Callable[[str, str], None]
T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")


async def _none() -> None:
    return None


async def _both(first: Coroutine[Any, Any, A], second: Coroutine[Any, Any, B]) -> tuple[A, B]:
    """Both lookups' results, run concurrently. The first to fail cancels the other, which is
    awaited, and is raised as it is: no read outlives the call (``asyncio.gather`` left the other
    running, and a review answered while its read went on)."""
    try:
        async with asyncio.TaskGroup() as group:
            a = group.create_task(first)
            b = group.create_task(second)
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return a.result(), b.result()


class LiveSource(Protocol):
    """Gives the live context for one request within ``timeout`` seconds."""

    async def context(
        self, config: Config, request: AdmissionInput, timeout: float, *, quota: bool = True
    ) -> LiveContext | None:
        """``quota=False``: only what the engine needs to resolve the job (an external runtime's
        manifest), not Kueue's quota context."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class JobKind:
    """A kind of job MPG-Q007 counts: where to list it, the conditions that end it, the ``source``
    its lookup errors are counted under, and whether its CRD may be missing (then there are none)."""

    kind: str
    path: str
    finished: tuple[str, ...]
    source: str
    optional: bool = False


# Trainer: pkg/apis/trainer/v1alpha1/trainjob_types.go TrainJobComplete, TrainJobFailed.
TRAINJOBS: Final = JobKind("TrainJob", TRAINJOBS_PATH, ("Complete", "Failed"), "trainjobs")
# MPI Operator: pkg/apis/kubeflow/v2beta1/types.go JobSucceeded, JobFailed. Optional: an install
# without the MPI Operator has no MPIJobs.
MPIJOBS: Final = JobKind("MPIJob", MPIJOBS_PATH, ("Succeeded", "Failed"), "mpijobs", optional=True)


def is_active(obj: Mapping[str, Any], kind: JobKind = TRAINJOBS) -> bool:
    """A job counts against ``maxConcurrentJobs`` until its kind's finished condition (TrainJob:
    Complete or Failed; MPIJob: Succeeded or Failed) is True (queued and suspended jobs count: they
    hold a place in the team's queue) or it is being deleted."""
    meta = obj.get("metadata") or {}
    if isinstance(meta, dict) and meta.get("deletionTimestamp"):
        return False
    status = obj.get("status") or {}
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return not any(
        isinstance(cond, dict) and _ends(kind, cond.get("type"), cond.get("status"))
        for cond in conditions or []
    )


def _ends(kind: JobKind, condition: object, status: object) -> bool:
    """Whether a condition ``condition`` with ``status`` ends a job of ``kind``."""
    return condition in kind.finished and status == "True"


# What the job cache keeps of a listed job: msgspec decodes a LIST page into these and skips every
# other field (spec, managedFields, the rest of the status) without making objects of them
# (KubeClient.list_pages). Not tracked by the garbage collector: they hold no cycles.
class _Condition(msgspec.Struct, gc=False):
    # Any JSON value, as is_active reads them: a condition whose type or status is not the string
    # expected does not end the job (it keeps counting) instead of failing every job's list.
    type: Any = ""
    status: Any = ""


class _JobStatus(msgspec.Struct, gc=False):
    conditions: list[_Condition] | None = None


class _JobMeta(msgspec.Struct, gc=False):
    namespace: str | None = None
    name: str | None = None
    deletionTimestamp: str | None = None


class _ListedJob(msgspec.Struct, gc=False):
    metadata: _JobMeta = msgspec.field(default_factory=_JobMeta)
    status: _JobStatus | None = None


def _active_names(items: list[_ListedJob], kind: JobKind = TRAINJOBS) -> list[tuple[str, str]]:
    """``(namespace, name)`` of the active jobs of ``kind`` among a LIST page's items (as
    :func:`is_active` judges them)."""
    out: list[tuple[str, str]] = []
    for item in items:
        meta = item.metadata
        if meta.namespace is None or meta.name is None or meta.deletionTimestamp:
            continue
        conditions = item.status.conditions if item.status is not None else None
        if not any(_ends(kind, cond.type, cond.status) for cond in conditions or ()):
            out.append((meta.namespace, meta.name))
    return out


class JobCache:
    """Active jobs of one kind per namespace, kept current by LIST + WATCH (an informer)."""

    def __init__(
        self,
        client: KubeClient,
        kind: JobKind = TRAINJOBS,
        *,
        on_error: ErrorHook | None = None,
        watch_timeout: int = 300,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self._client = client
        self.kind = kind
        self._path = kind.path
        self._on_error = on_error or (lambda source, reason: None)
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._active: dict[str, set[str]] = {}
        self._rv = ""
        self._synced = False
        self.last_error: str | None = "not listed yet"
        self.lists = 0  # how often the cache (re)listed, for tests and logs
        self.absent = False  # an optional kind whose CRD the API server does not serve
        self._task: asyncio.Task[None] | None = None

    @property
    def synced(self) -> bool:
        return self._synced

    def active_jobs(self, namespaces: tuple[str, ...], exclude: tuple[str, str] | None = None) -> int:
        """Active jobs in ``namespaces``, not counting ``exclude`` (namespace, name)."""
        total = 0
        for ns in namespaces:
            names = self._active.get(ns, ())
            total += len(names)
            if exclude is not None and exclude[0] == ns and exclude[1] in names:
                total -= 1
        return total

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"mpigate-{self.kind.source}-cache")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _apply(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace"), meta.get("name")
        if not isinstance(ns, str) or not isinstance(name, str):
            return
        names = self._active.setdefault(ns, set())
        if not deleted and is_active(obj, self.kind):
            names.add(name)
        else:
            names.discard(name)

    async def _list(self) -> None:
        # Paginated, each page decoded into the few fields of _ListedJob and reduced to the active
        # jobs' names before the next is read (KubeClient.list_pages): the loop answering
        # admissions waits at most for one page's decode, and only (namespace, name) pairs outlive
        # it. Lookups keep reading the previous list until the new one is complete, then see it
        # whole.
        active: dict[str, set[str]] = {}
        rv = ""
        try:
            async for page in self._client.list_pages(
                self._path, _ListedJob, functools.partial(_active_names, kind=self.kind)
            ):
                if page.restarted:
                    active = {}
                    continue
                for ns, name in page.items:
                    active.setdefault(ns, set()).add(name)
                rv = page.resource_version
        except KubeError as exc:
            if not (self.kind.optional and exc.status == 404):
                raise
            # The CRD is not installed: there are no such jobs (listed again later, see _run).
            if not self.absent:
                log.info("%s: %s not served (HTTP 404): counting none", self._path, self.kind.kind)
            self._active = {}
            self._synced = True
            self.absent = True
            self.last_error = None
            self.lists += 1
            return
        self.absent = False
        self._active = active
        self._rv = rv
        self._synced = True
        self.last_error = None
        self.lists += 1
        log.debug("listed %ss at resourceVersion %s", self.kind.kind, self._rv)

    async def _watch(self) -> bool:
        """Watch until the stream ends. Returns True to relist (410 Gone), False to re-watch."""
        async for event in self._client.watch(self._path, self._rv, timeout_seconds=self._watch_timeout):
            kind = event.get("type")
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            if kind == "ERROR":
                code = obj.get("code")
                if code == 410:
                    log.info("%s watch expired (410 Gone at %s): relisting", self.kind.kind, self._rv)
                    return True
                raise KubeError(f"WATCH {self._path}: {obj.get('message') or 'error event'}", status=code)
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if isinstance(rv, str) and rv:
                self._rv = rv
            if kind in ("ADDED", "MODIFIED"):
                self._apply(obj)
            elif kind == "DELETED":
                self._apply(obj, deleted=True)
            # BOOKMARK: only the resourceVersion moves.
        return False

    async def _run(self) -> None:
        delay = self._backoff[0]
        relist = True
        while True:
            try:
                if relist:
                    await self._list()
                    if self.absent:  # an optional CRD not installed: look again later
                        await asyncio.sleep(self._backoff[1])
                        continue
                    relist = False
                started = self._rv
                relist = await self._watch()
                if relist and self._rv == started:
                    # Gone again right after a fresh LIST: do not hammer the API server.
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._backoff[1])
                else:
                    delay = self._backoff[0]
            except asyncio.CancelledError:
                raise
            except KubeError as exc:
                self._fail(str(exc), exc.kind)
                relist = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff[1])
            except Exception as exc:  # never let the cache task die silently
                log.exception("%s cache failed", self.kind.kind)
                self._fail(f"{type(exc).__name__}: {exc}", "internal")
                relist = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff[1])

    def _fail(self, message: str, reason: str) -> None:
        # Counts may have drifted while the watch was down: stop answering from them until a
        # fresh LIST succeeded.
        self._synced = False
        self.last_error = message
        self._on_error(self.kind.source, reason)
        log.warning(
            "%s cache: %s", self.kind.kind, message, extra=fields(event="live_error", source=self.kind.source)
        )


@dataclass(frozen=True, slots=True)
class QueueUsage:
    """Kueue's reservations per ClusterQueue, flavor and resource (Kueue units), and which
    ClusterQueue the job's LocalQueue feeds."""

    cluster_queue: str
    reserved: Mapping[str, Mapping[str, Mapping[str, int]]]

    def gpus_in_use(self, config: Config, team: str) -> dict[str, int]:
        """GPUs reserved in ``team``'s own ClusterQueue per flavor (``LiveContext.gpus_in_use``):
        each flavor of the config with its GPU resource in Kueue's figures; other flavors and
        resources are left out."""
        own = self.reserved.get(team, {})
        return {
            f: used[config.flavors[f].gpu_resource]
            for f, used in own.items()
            if f in config.flavors and config.flavors[f].gpu_resource in used
        }


def reservations(cq: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """A ClusterQueue's ``status.flavorsReservation`` (v1beta2; ``flavorsUsage`` before) per flavor
    and resource, in Kueue's units (milli-CPU for ``cpu``): what its admitted workloads hold."""
    status = cq.get("status") or {}
    rows = status.get("flavorsReservation") or status.get("flavorsUsage") or []
    out: dict[str, dict[str, int]] = {}
    for row in rows if isinstance(rows, list) else []:
        name = (row or {}).get("name") if isinstance(row, dict) else None
        if not isinstance(name, str):
            continue
        for res in row.get("resources") or []:
            if isinstance(res, dict) and isinstance(res.get("name"), str):
                try:
                    total = parse_quantity(res.get("total", 0))
                except (ValueError, TypeError):
                    continue
                out.setdefault(name, {})[res["name"]] = kueue_amount(res["name"], total)
    return out


def _cohort_of(cq: Mapping[str, Any]) -> Any:
    """The ``mpigate.io/cohort`` label (the API server filters by it; a fake one may not)."""
    return ((cq.get("metadata") or {}).get("labels") or {}).get(COHORT_LABEL)


class KueueReader:
    """Reads ClusterQueues: the one a LocalQueue feeds, and those of a cohort."""

    def __init__(
        self, client: KubeClient, *, api: str = KUEUE_API, queue_ttl: float = 60.0, usage_ttl: float = 2.0
    ) -> None:
        self._client = client
        self._api = api
        self._queue_ttl = queue_ttl
        self._usage_ttl = usage_ttl
        self._queues: dict[tuple[str, str], tuple[float, str]] = {}
        self._usage: dict[str, tuple[float, dict[str, Any]]] = {}
        self._cohorts: dict[str, tuple[float, list[dict[str, Any]]]] = {}

    async def cluster_queue_of(self, namespace: str, local_queue: str) -> str:
        key = (namespace, local_queue)
        hit = self._queues.get(key)
        if hit and time.monotonic() - hit[0] < self._queue_ttl:
            return hit[1]
        lq = await self._client.get(f"{self._api}/namespaces/{namespace}/localqueues/{local_queue}")
        cq = (lq.get("spec") or {}).get("clusterQueue")
        if not isinstance(cq, str) or not cq:
            raise KubeError(
                f"LocalQueue {namespace}/{local_queue} names no clusterQueue", reason="bad-response"
            )
        self._queues[key] = (time.monotonic(), cq)
        return cq

    async def cluster_queue(self, name: str) -> dict[str, Any]:
        hit = self._usage.get(name)
        if hit and time.monotonic() - hit[0] < self._usage_ttl:
            return hit[1]
        cq = await self._client.get(f"{self._api}/clusterqueues/{name}")
        self._usage[name] = (time.monotonic(), cq)
        return cq

    async def cohort_queues(self, cohort: str) -> list[dict[str, Any]]:
        """The ClusterQueues mpigate rendered into ``cohort`` (label ``mpigate.io/cohort``)."""
        hit = self._cohorts.get(cohort)
        if hit and time.monotonic() - hit[0] < self._usage_ttl:
            return hit[1]
        body = await self._client.get(
            f"{self._api}/clusterqueues", params={"labelSelector": f"{COHORT_LABEL}={cohort}"}
        )
        items = [i for i in body.get("items") or [] if isinstance(i, dict) and _cohort_of(i) == cohort]
        self._cohorts[cohort] = (time.monotonic(), items)
        return items


class RuntimeReader:
    """Reads (Cluster)TrainingRuntimes approved as ``external`` (installed with Trainer, not kept
    in the config tree), cached: runtimes change rarely."""

    def __init__(self, client: KubeClient, *, ttl: float = 30.0) -> None:
        self._client = client
        self._ttl = ttl
        self._cache: dict[tuple[str, str | None, str], tuple[float, dict[str, Any]]] = {}

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        key = (kind, namespace, name)
        hit = self._cache.get(key)
        if hit and time.monotonic() - hit[0] < self._ttl:
            return hit[1]
        if kind == "TrainingRuntime":
            path = f"{TRAINER_API}/namespaces/{namespace}/trainingruntimes/{name}"
        else:
            path = f"{TRAINER_API}/clustertrainingruntimes/{name}"
        manifest = await self._client.get(path)
        self._cache[key] = (time.monotonic(), manifest)
        return manifest


def external_runtime(config: Config, request: AdmissionInput) -> tuple[str, str | None, str] | None:
    """The (kind, namespace, name) of the runtime a TrainJob uses, when the org approved it as
    external and the config tree does not carry its manifest; else None."""
    spec = (request.obj or {}).get("spec")
    ref = spec.get("runtimeRef") if isinstance(spec, dict) else None
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
        return None
    kind = ref.get("kind") or "ClusterTrainingRuntime"
    if kind not in ("ClusterTrainingRuntime", "TrainingRuntime"):
        return None
    name: str = ref["name"]
    if config.runtime(kind, name, request.namespace) is not None:
        return None
    approval = config.org.runtime_approval(name, kind)
    if approval is None or not approval.external:
        return None
    return (kind, request.namespace if kind == "TrainingRuntime" else None, name)


class KubeLiveSource:
    """The live context from a Kubernetes API server (see the module docstring)."""

    def __init__(
        self, client: KubeClient, *, on_error: ErrorHook | None = None, kueue_api: str = KUEUE_API
    ) -> None:
        self.client = client
        self._on_error = on_error or (lambda source, reason: None)
        self.jobs = JobCache(client, TRAINJOBS, on_error=self._on_error)
        self.mpijobs = JobCache(client, MPIJOBS, on_error=self._on_error)
        self.kueue = KueueReader(client, api=kueue_api)
        self.runtimes = RuntimeReader(client)

    @property
    def synced(self) -> bool:
        """Both job caches have listed (MPG-Q007 counts TrainJobs and MPIJobs)."""
        return self.jobs.synced and self.mpijobs.synced

    async def start(self) -> None:
        self.jobs.start()
        self.mpijobs.start()

    async def stop_caches(self) -> None:
        await self.jobs.stop()
        await self.mpijobs.stop()

    async def stop(self) -> None:
        await self.stop_caches()
        await self.client.close()

    async def context(
        self, config: Config, request: AdmissionInput, timeout: float, *, quota: bool = True
    ) -> LiveContext | None:
        """Live context for a TrainJob or an MPIJob; None when none applies. A TrainJob's external
        runtime's manifest is read for any namespace (an external runtime is judged in unmanaged
        namespaces too); Kueue's quota context, with ``quota``, for team namespaces."""
        if request.kind not in (TRAINJOBS.kind, MPIJOBS.kind) or not request.namespace:
            return None
        runtime_key = external_runtime(config, request)
        team = config.team_for_namespace(request.namespace)
        if not quota or team is None:
            if runtime_key is None:
                return None
            read = await self._bounded(self.runtimes.get(*runtime_key), timeout, "runtime")
            if isinstance(read, dict):
                return LiveContext(runtimes={runtime_key: read})
            reason = f"{runtime_key[0]} {runtime_key[2]} {read}"
            return LiveContext(unavailable_reason=reason, runtime_reason=reason)
        reasons: list[str] = []
        # MPG-Q007 counts the team's TrainJobs and MPIJobs; the job under review is not counted.
        active: int | None = 0
        for cache in (self.jobs, self.mpijobs):
            if not cache.synced:
                reasons.append(f"{cache.kind.kind} counts not synced ({cache.last_error})")
                active = None
            elif active is not None:
                exclude = (request.namespace, request.name) if request.kind == cache.kind.kind else None
                active += cache.active_jobs(team.namespaces, exclude=exclude)
        labels = ((request.obj or {}).get("metadata") or {}).get("labels") or {}
        local_queue = labels.get(QUEUE_LABEL) if isinstance(labels.get(QUEUE_LABEL), str) else None
        local_queue = local_queue or (team.queues[0] if team.queues else team.name)
        usage_read, runtime_read = await _both(
            self._bounded(
                queue_usage(self.kueue, config, request.namespace, local_queue), timeout, "clusterqueue"
            ),
            self._bounded(self.runtimes.get(*runtime_key), timeout, "runtime") if runtime_key else _none(),
        )
        usage = usage_read if isinstance(usage_read, QueueUsage) else None
        if isinstance(usage_read, str):
            reasons.append(f"Kueue ClusterQueue {usage_read}")
        runtimes: dict[tuple[str, str | None, str], Mapping[str, Any]] | None = None
        runtime_reason: str | None = None
        if runtime_key is not None:
            if isinstance(runtime_read, dict):
                runtimes = {runtime_key: runtime_read}
            else:
                runtime_reason = f"{runtime_key[0]} {runtime_key[2]} {runtime_read}"
                reasons.append(runtime_reason)
        return LiveContext(
            active_jobs=active,
            gpus_in_use=usage.gpus_in_use(config, team.name) if usage else None,
            queue_usage=usage.reserved if usage else None,
            source=f"cluster (ClusterQueue {usage.cluster_queue})" if usage else "cluster",
            unavailable_reason="; ".join(reasons) or None,
            runtimes=runtimes,
            runtime_reason=runtime_reason,
        )

    async def _bounded(self, lookup: Awaitable[T], timeout: float, source: str) -> T | str:
        """The lookup's result, or why there is none (``not read within 200 ms``, the error)."""
        try:
            return await asyncio.wait_for(lookup, timeout)
        except TimeoutError:
            self._on_error(source, "timeout")
            return f"not read within {timeout * 1000:.0f} ms"
        except KubeError as exc:
            self._on_error(source, exc.kind)
            return f"not read: {exc}"


async def queue_usage(kueue: KueueReader, config: Config, namespace: str, local_queue: str) -> QueueUsage:
    """Kueue's reservations in the ClusterQueue ``local_queue`` feeds and in its team's cohort, as
    the webhook and the controller's background audit read them."""
    team = config.team_for_namespace(namespace)
    try:
        cq_name = await kueue.cluster_queue_of(namespace, local_queue)
    except KubeError as exc:
        if exc.status != 404:
            raise
        # No such LocalQueue (yet): the team's ClusterQueue carries the team's name.
        cq_name = team.name if team else local_queue
    # Kueue's v1beta2 API not served answers the cohort LIST with 404 (the collection, not one
    # object): the context is unavailable, and the ClusterQueue GET is cancelled, not waited for.
    own, cohort = await _both(
        kueue.cluster_queue(cq_name),
        kueue.cohort_queues(team.cohort) if team is not None and team.cohort else _none(),
    )
    reserved: dict[str, Mapping[str, Mapping[str, int]]] = {}
    for cq in cohort or []:
        name = (cq.get("metadata") or {}).get("name")
        if isinstance(name, str):
            reserved[name] = reservations(cq)
    # The job's ClusterQueue is its team's (MPG-Q005), whatever it is called in the cluster.
    reserved[team.name if team is not None else cq_name] = reservations(own)
    return QueueUsage(cq_name, reserved)
