"""What the controller does for each TrainJob, independent of kopf (the handlers only call it).

- :meth:`Reconciler.ensure_network_policy`: create the job's NetworkPolicy, or repair it when it
  drifted (idempotent: re-delivered events find nothing to do; a 409 on create is read and
  compared). Only a policy the job owns (:func:`netpol.owned_by`) is ever patched: anything else
  under its name is a conflict, reported as a ``NetworkPolicyConflict`` Event on the TrainJob and
  the ``mpigate_controller_conflicts_total`` metric, and left as it is.
- :meth:`Reconciler.on_trainjob_event` / :meth:`on_pod_event`: lifecycle records (with GPU-seconds)
  and placement evidence, each exactly once per transition or pod: what was recorded is kept in the
  TrainJob's annotations ``mpigate.io/lifecycle`` and ``mpigate.io/evidence`` and, for the life
  of the process, in memory (so a failed annotation patch or a stale cached object cannot cause a
  second record).
- :meth:`on_policy_event`: a managed NetworkPolicy was edited or deleted → reconcile its owner.

Records are written before the annotations that remember them: a crash in between may repeat a
record after a restart (the report deduplicates on the TrainJob uid and event), it never loses one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from mpigate.admission.kube import KubeError
from mpigate.audit import AuditError, evidence_record, lifecycle_record
from mpigate.config import Config
from mpigate.config.model import Team
from mpigate.policy.demand import gpu_resources

from .api import ControllerApi, configmap_path, netpol_path, runtime_path, trainjob_path
from .demand import JobGpus, job_gpus, runtime_ref
from .events import EventPoster
from .lifecycle import (
    CLOSING_EVENTS,
    LIFECYCLE_ANNOTATION,
    Recorded,
    format_history,
    format_time,
    parse_history,
    plan,
    pod_run,
)
from .metrics import ControllerMetrics
from .netpol import (
    JOBSET_NAME_LABEL,
    PROFILE_ANNOTATION,
    TRAINJOB_LABEL,
    build_network_policy,
    drift,
    owned_by,
    repair_patch,
)
from .recording import Recorder
from .reliances import Reliance, kueue_reliances, unknown_reliances
from .residency import placement

__all__ = ["EVIDENCE_ANNOTATION", "NoConfigError", "Reconciler"]

log = logging.getLogger(__name__)

EVIDENCE_ANNOTATION: Final = "mpigate.io/evidence"
# Annotations must stay far below the API server's 256 KiB limit for all of an object's annotations.
_MAX_EVIDENCE_ANNOTATION: Final = 64 * 1024
# Uids of deleted TrainJobs remembered, so that a re-delivered DELETED event records nothing.
_DELETED_MEMORY: Final = 10_000

Key = tuple[str, str]


class NoConfigError(Exception):
    """No config has been loaded (yet): nothing can be decided."""


@dataclass
class _TrackedPod:
    body: Mapping[str, Any]
    gone_at: dt.datetime | None = None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _key(obj: Mapping[str, Any]) -> Key:
    meta = _meta(obj)
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _annotation(obj: Mapping[str, Any], key: str) -> str | None:
    annotations = _meta(obj).get("annotations")
    value = annotations.get(key) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KubeError):
        return exc.kind
    if isinstance(exc, AuditError):
        return "audit"
    return type(exc).__name__


class Reconciler:
    """The controller's state and actions (one per leader; every method is a coroutine of one
    event loop, so plain dicts suffice; per-job locks order the work on one job)."""

    def __init__(
        self,
        *,
        config: Callable[[], Config | None],
        api: ControllerApi,
        recorder: Recorder,
        metrics: ControllerMetrics,
        events: EventPoster,
        namespace_label: str | None = "mpigate.io/team",
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._config = config
        self.api = api
        self.recorder = recorder
        self.metrics = metrics
        self.events = events
        self.namespace_label = namespace_label or None
        self.clock = clock
        self._jobs: dict[Key, Mapping[str, Any]] = {}
        self._pods: dict[Key, dict[str, _TrackedPod]] = {}
        self._history: dict[str, tuple[Recorded, ...]] = {}
        self._evidence: dict[str, frozenset[str]] = {}
        self._gpus: dict[str, JobGpus] = {}
        self._locks: dict[Key, asyncio.Lock] = {}
        self._policies_seen: set[Key] = set()
        # (TrainJob uid, conflicting object's uid) already reported with an Event.
        self._conflicts_reported: set[tuple[str, str]] = set()
        self._deleted: OrderedDict[str, None] = OrderedDict()
        # Deletions whose record could not be written yet (the object is gone; resync retries).
        self._pending_deletions: dict[str, Mapping[str, Any]] = {}
        # The last state of each reliance check, so that a warning is logged when it changes.
        self._reliances: dict[str, bool | None] = {}

    # ------------------------------------------------------------------ helpers

    def config(self) -> Config:
        config = self._config()
        if config is None:
            raise NoConfigError("no config loaded yet")
        return config

    def _lock(self, key: Key) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    @property
    def jobs(self) -> list[Mapping[str, Any]]:
        """The TrainJobs seen (latest version of each)."""
        return list(self._jobs.values())

    async def team_of(self, trainjob: Mapping[str, Any]) -> Team | None:
        """The team whose namespace holds the job, when the controller manages it: the namespace
        belongs to a team in the config and — like the webhooks' namespaceSelector — carries the
        namespace label (so the controller acts only on jobs that admission has seen)."""
        namespace = _key(trainjob)[0]
        team = self.config().team_for_namespace(namespace)
        if team is None or self.namespace_label is None:
            return team
        labels = await self.api.namespace_labels(namespace)
        if labels is None or self.namespace_label not in labels:
            log.debug(
                "namespace %s of team %s lacks label %s: not managed",
                namespace,
                team.name,
                self.namespace_label,
            )
            return None
        return team

    # ------------------------------------------------------------------ NetworkPolicy

    async def ensure_network_policy(self, trainjob: Mapping[str, Any], *, cause: str = "") -> str:
        """Create or repair the job's NetworkPolicy. Returns ``created``, ``repaired``,
        ``unchanged``, ``conflict`` (an object the job does not own holds the name: reported, left
        alone) or ``skipped``; raises :class:`KubeError` (retry) when the API fails."""
        started = time.monotonic()
        key = _key(trainjob)
        try:
            result = await self._ensure_network_policy(trainjob, key, cause)
        except (KubeError, NoConfigError) as exc:
            self.metrics.reconciles.labels("networkpolicy", "error").inc()
            self.metrics.errors.labels("networkpolicy", _reason(exc)).inc()
            raise
        finally:
            self.metrics.duration.labels("networkpolicy").observe(time.monotonic() - started)
        self.metrics.reconciles.labels("networkpolicy", result).inc()
        return result

    async def _ensure_network_policy(self, trainjob: Mapping[str, Any], key: Key, cause: str) -> str:
        uid = _meta(trainjob).get("uid")
        if _meta(trainjob).get("deletionTimestamp") or not uid or uid in self._deleted:
            return "skipped"
        team = await self.team_of(trainjob)
        if team is None:
            return "skipped"
        config = self.config()
        desired = build_network_policy(config, trainjob, team)
        if desired is None:
            return "skipped"
        namespace = key[0]
        name = desired["metadata"]["name"]
        path = netpol_path(namespace, name)
        async with self._lock(key):
            actual = await self.api.get(path)
            if actual is None and key in self._policies_seen and not await self._lives(trainjob):
                return "skipped"  # deleted with its job (garbage collection), not by someone
            if actual is None:
                try:
                    await self.api.create(netpol_path(namespace), desired)
                except KubeError as exc:
                    if exc.status != 409:
                        await self._failed(trainjob, name, exc)
                        raise
                    actual = await self.api.get(path)  # created meanwhile: compare with it
                    if actual is None:
                        raise
                else:
                    recreated = key in self._policies_seen
                    self._policies_seen.add(key)
                    await self._announce_created(trainjob, desired, recreated, cause)
                    return "created"
            if not owned_by(actual, trainjob):
                await self._conflict(trainjob, name, actual)
                return "conflict"
            self._policies_seen.add(key)
            found = drift(desired, actual)
            if not found:
                return "unchanged"
            try:
                await self.api.merge_patch(path, repair_patch(desired, actual))
            except KubeError as exc:
                await self._failed(trainjob, name, exc)
                raise
            log.warning("NetworkPolicy %s/%s had drifted (%s); restored", namespace, name, found)
            await self.events.post(
                trainjob,
                "Warning",
                "NetworkPolicyRepaired",
                f"NetworkPolicy {name} had been changed ({found}); restored it.",
            )
            return "repaired"

    async def _lives(self, trainjob: Mapping[str, Any]) -> bool:
        """Whether the TrainJob (this very one: same uid) still exists and is not being deleted."""
        current = await self.api.get(trainjob_path(*_key(trainjob)))
        if current is None or _meta(current).get("uid") != _meta(trainjob).get("uid"):
            return False
        return not _meta(current).get("deletionTimestamp")

    async def _announce_created(
        self, trainjob: Mapping[str, Any], desired: Mapping[str, Any], recreated: bool, cause: str
    ) -> None:
        name = desired["metadata"]["name"]
        profile = desired["metadata"]["annotations"][PROFILE_ANNOTATION]
        why = desired["metadata"]["annotations"].get("mpigate.io/network-profile-reason", "")
        if recreated:
            log.warning("NetworkPolicy %s/%s had been deleted; recreated", _key(trainjob)[0], name)
            await self.events.post(
                trainjob,
                "Warning",
                "NetworkPolicyRepaired",
                f"NetworkPolicy {name} had been deleted; recreated it.",
            )
        else:
            log.info("created NetworkPolicy %s/%s (%s)%s", _key(trainjob)[0], name, profile, cause)
            await self.events.post(
                trainjob,
                "Normal",
                "NetworkPolicyCreated",
                f"Created NetworkPolicy {name}: profile {profile} ({why}).",
            )
        if profile == "pinned-ports":
            missing = self._missing_pinned_env(trainjob, profile)
            if missing:
                await self.events.post(
                    trainjob,
                    "Warning",
                    "PinnedPortsEnvMissing",
                    f"NetworkPolicy {name} opens only the pinned OpenMPI ports, but spec.trainer.env lacks "
                    f"{', '.join(missing)}: OpenMPI will use other ports and its traffic will be dropped.",
                )

    def _missing_pinned_env(self, trainjob: Mapping[str, Any], profile_name: str) -> list[str]:
        profile = self.config().network_profiles.get(profile_name)
        if profile is None:
            return []
        trainer = (trainjob.get("spec") or {}).get("trainer") or {}
        env = trainer.get("env") if isinstance(trainer, Mapping) else None
        names = {e.get("name") for e in env if isinstance(e, Mapping)} if isinstance(env, list) else set()
        return [name for name, _ in profile.openmpi_env if name not in names]

    async def _conflict(self, trainjob: Mapping[str, Any], name: str, actual: Mapping[str, Any]) -> None:
        """An object the job does not own holds the job's policy name: count it every time it is
        seen (an alert can watch the rate), say so once per job and object, and change nothing."""
        self.metrics.conflicts.labels("networkpolicy").inc()
        seen = (str(_meta(trainjob).get("uid") or ""), str(_meta(actual).get("uid") or ""))
        if seen in self._conflicts_reported:
            return
        self._conflicts_reported.add(seen)
        namespace = _key(trainjob)[0]
        refs = _meta(actual).get("ownerReferences")
        owner = next(
            (
                f"{r.get('kind')} {r.get('name')}"
                for r in (refs if isinstance(refs, list) else [])
                if isinstance(r, Mapping) and r.get("controller")
            ),
            "no controlling owner",
        )
        log.warning(
            "NetworkPolicy %s/%s is not TrainJob %s's (%s): left unchanged",
            namespace,
            name,
            _key(trainjob)[1],
            owner,
        )
        await self.events.post(
            trainjob,
            "Warning",
            "NetworkPolicyConflict",
            f"NetworkPolicy {name} exists but does not belong to this TrainJob ({owner}; no mpigate "
            "ownership label with this job's uid). mpigate left it unchanged, so the job's pods get no "
            "per-job policy from mpigate (the namespace's default deny still applies): delete or rename "
            f"that NetworkPolicy, or ask the platform team.",
        )

    async def _failed(self, trainjob: Mapping[str, Any], name: str, exc: KubeError) -> None:
        await self.events.post(
            trainjob,
            "Warning",
            "NetworkPolicyFailed",
            f"Could not create or repair NetworkPolicy {name}: {exc}",
        )

    async def on_policy_event(self, event_type: str | None, policy: Mapping[str, Any]) -> str | None:
        """A managed NetworkPolicy changed or disappeared: put it back if its TrainJob lives."""
        namespace, _ = _key(policy)
        labels = _meta(policy).get("labels") or {}
        job = labels.get(TRAINJOB_LABEL) if isinstance(labels, Mapping) else None
        if not isinstance(job, str):
            return None
        trainjob = self._jobs.get((namespace, job))
        if trainjob is None:
            return None  # the job is gone (garbage collection deletes its policy) or not seen yet
        if event_type == "DELETED":
            self._policies_seen.add((namespace, job))  # a create now restores it (if the job lives)
        return await self.ensure_network_policy(trainjob, cause=f" after {event_type or 'listing'}")

    # ------------------------------------------------------------------ lifecycle and evidence

    async def on_trainjob_event(self, event_type: str | None, trainjob: Mapping[str, Any]) -> None:
        """Every TrainJob watch event (``None``: listed at startup)."""
        key = _key(trainjob)
        uid = str(_meta(trainjob).get("uid") or "")
        if event_type == "DELETED":
            if uid and uid in self._deleted:
                return
            known = self._jobs.get(key)
            if known is not None and _meta(known).get("uid") == uid:
                del self._jobs[key]  # no more policy repairs for it
            try:
                await self.reconcile_job(trainjob, deleted=True)
            except (KubeError, AuditError, NoConfigError):
                self._pending_deletions[uid] = trainjob
                raise
            self._pending_deletions.pop(uid, None)
            self._forget(key, uid)
            return
        if uid in self._deleted:
            return  # a late event about a job already gone
        known = self._jobs.get(key)
        if known is not None and _meta(known).get("uid") != uid:
            self._forget(key, str(_meta(known).get("uid") or ""))  # same name, new job
        self._jobs[key] = trainjob
        await self.reconcile_job(trainjob)

    async def on_pod_event(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """Every watch event of a pod with JobSet's label: track it, then reconcile its job."""
        meta = _meta(pod)
        labels = meta.get("labels") or {}
        job = labels.get(JOBSET_NAME_LABEL) if isinstance(labels, Mapping) else None
        uid = meta.get("uid")
        if not isinstance(job, str) or not isinstance(uid, str):
            return
        key = (str(meta.get("namespace") or ""), job)
        trainjob = self._jobs.get(key)
        if trainjob is None and event_type == "DELETED":
            # not (or no longer) a job we know: forget the pod (its TrainJob may be gone)
            self._pods.get(key, {}).pop(uid, None)
            if not self._pods.get(key):
                self._pods.pop(key, None)
            return
        gone = self.clock() if event_type == "DELETED" else None
        self._pods.setdefault(key, {})[uid] = _TrackedPod(pod, gone)
        if trainjob is not None:
            await self.reconcile_job(trainjob)

    def _forget(self, key: Key, uid: str) -> None:
        self._jobs.pop(key, None)
        self._pods.pop(key, None)
        self._locks.pop(key, None)
        self._policies_seen.discard(key)
        for memo in (self._history, self._evidence, self._gpus):
            memo.pop(uid, None)
        self._conflicts_reported = {c for c in self._conflicts_reported if c[0] != uid}
        if uid:
            self._deleted[uid] = None
            while len(self._deleted) > _DELETED_MEMORY:
                self._deleted.popitem(last=False)

    async def reconcile_job(self, trainjob: Mapping[str, Any], *, deleted: bool = False) -> None:
        """Record the job's new lifecycle transitions and pod placements; remember them."""
        started = time.monotonic()
        try:
            await self._reconcile_job(trainjob, deleted)
        except (KubeError, AuditError, NoConfigError) as exc:
            self.metrics.reconciles.labels("lifecycle", "error").inc()
            self.metrics.errors.labels("lifecycle", _reason(exc)).inc()
            log.error("TrainJob %s/%s: %s (will retry)", *_key(trainjob), exc)
            raise
        finally:
            self.metrics.duration.labels("lifecycle").observe(time.monotonic() - started)

    async def _reconcile_job(self, trainjob: Mapping[str, Any], deleted: bool) -> None:
        uid = _meta(trainjob).get("uid")
        if not isinstance(uid, str) or not uid:
            return
        team = await self.team_of(trainjob)
        if team is None:
            return
        key = _key(trainjob)
        async with self._lock(key):
            if uid in self._deleted:
                return
            wrote = await self._lifecycle(trainjob, uid, team, deleted)
            if not deleted:
                wrote += await self._placements(trainjob, uid, team)
                await self._remember(trainjob, uid, key)
            self.metrics.reconciles.labels("lifecycle", "recorded" if wrote else "unchanged").inc()

    def _history_of(self, trainjob: Mapping[str, Any], uid: str) -> tuple[Recorded, ...]:
        stored = parse_history(_annotation(trainjob, LIFECYCLE_ANNOTATION))
        known = self._history.get(uid, ())
        return known if len(known) >= len(stored) else stored  # histories only grow

    async def _gpus_of(self, config: Config, trainjob: Mapping[str, Any], uid: str) -> JobGpus:
        found = self._gpus.get(uid)
        if found is not None:
            return found
        kind, name = runtime_ref(trainjob)
        namespace = _key(trainjob)[0]
        runtime: Mapping[str, Any] | None = None
        if name and config.runtime(kind, name, namespace) is None:
            approval = config.org.runtime_approval(name, kind)
            if approval is not None and approval.external:
                runtime = await self.api.get(runtime_path(kind, name, namespace))
        gpus = job_gpus(config, trainjob, runtime)
        self._gpus[uid] = gpus
        return gpus

    async def _lifecycle(self, trainjob: Mapping[str, Any], uid: str, team: Team, deleted: bool) -> int:
        config = self.config()
        history = self._history_of(trainjob, uid)
        gpus = await self._gpus_of(config, trainjob, uid)
        known = gpu_resources(config)
        key = _key(trainjob)
        tracked = self._pods.get(key, {})
        now = self.clock()
        runs = [
            pod_run(p.body, gpus.of_pod(p.body, known), gone_at=p.gone_at or (now if deleted else None))
            for p in tracked.values()
        ]
        transitions = plan(trainjob, runs, history, now, gpus=gpus.total, deleted=deleted)
        for t in transitions:
            entry = lifecycle_record(
                t.event,
                namespace=key[0],
                name=key[1],
                team=team.name,
                uid=uid,
                gpus=t.gpus,
                gpu_seconds=t.gpu_seconds,
                started=format_time(t.started) if t.started else None,
                finished=format_time(t.finished) if t.finished else None,
                reason=t.reason,
                revision=config.revision,
                at=format_time(t.at),
                labels=_chargeback_labels(config, team, trainjob),
            )
            await self.recorder.append(entry)
            history = (*history, Recorded(t.event, t.at))
            self._history[uid] = history
            self.metrics.lifecycle_records.labels(t.event).inc()
            if t.gpu_seconds:
                self.metrics.gpu_seconds.labels(team.name).inc(t.gpu_seconds)
            log.info(
                "TrainJob %s/%s %s at %s (GPU-seconds %s)",
                key[0],
                key[1],
                t.event,
                format_time(t.at),
                t.gpu_seconds,
            )
            if t.event in CLOSING_EVENTS:
                # pods that are gone were paid for with this segment
                for pod_uid in [u for u, p in tracked.items() if p.gone_at is not None]:
                    tracked.pop(pod_uid, None)
        return len(transitions)

    async def _placements(self, trainjob: Mapping[str, Any], uid: str, team: Team) -> int:
        config = self.config()
        stored = _annotation(trainjob, EVIDENCE_ANNOTATION)
        recorded = self._evidence.get(uid, frozenset()) | frozenset(filter(None, (stored or "").split(",")))
        key = _key(trainjob)
        labels = _meta(trainjob).get("labels") or {}
        wrote = 0
        for tracked in list(self._pods.get(key, {}).values()):
            meta, spec = _meta(tracked.body), tracked.body.get("spec") or {}
            pod, node = str(meta.get("name") or ""), spec.get("nodeName")
            if not pod or not isinstance(node, str) or not node or pod in recorded:
                continue
            node_labels = await self.api.node_labels(node) or {}
            found = placement(
                config, team, labels if isinstance(labels, Mapping) else {}, pod, node, node_labels
            )
            details = {**found.details(), "podUid": meta.get("uid")}
            entry = evidence_record(
                "placement",
                namespace=key[0],
                name=key[1],
                team=team.name,
                pod=pod,
                node=node,
                region=found.region,
                zone=found.zone,
                flavor=found.flavor,
                details=details,
            )
            await self.recorder.append(entry)
            recorded |= {pod}
            self._evidence[uid] = recorded
            wrote += 1
            self.metrics.evidence_records.labels(str(found.compliant).lower()).inc()
            if not found.compliant:
                self.metrics.residency_mismatches.labels(team.name, found.region or "none").inc()
                log.warning("TrainJob %s/%s: %s", key[0], key[1], found.message())
                await self.events.post(trainjob, "Warning", "ResidencyMismatch", found.message())
        return wrote

    async def _remember(self, trainjob: Mapping[str, Any], uid: str, key: Key) -> None:
        """Write what memory holds into the annotations when they lag behind it."""
        annotations: dict[str, str] = {}
        history = self._history.get(uid)
        if history is not None:
            text = format_history(history)
            if _annotation(trainjob, LIFECYCLE_ANNOTATION) != text:
                annotations[LIFECYCLE_ANNOTATION] = text
        evidence = self._evidence.get(uid)
        if evidence is not None:
            text = ",".join(sorted(evidence))
            if _annotation(trainjob, EVIDENCE_ANNOTATION) != text and len(text) <= _MAX_EVIDENCE_ANNOTATION:
                annotations[EVIDENCE_ANNOTATION] = text
        if not annotations:
            return
        try:
            updated = await self.api.merge_patch(
                trainjob_path(*key), {"metadata": {"annotations": annotations}}
            )
        except KubeError as exc:
            if exc.status == 404:
                return  # deleted meanwhile; the DELETED event follows
            raise
        if _meta(updated).get("uid") == uid:
            self._jobs[key] = updated

    # ------------------------------------------------------------------ reliances

    async def check_kueue(self, where: str) -> list[Reliance]:
        """Read Kueue's Configuration (``namespace/name`` of its ConfigMap) and report what of it the
        gate relies on (controller/reliances.py): the gauge every time, a log line when a check
        changes (a warning unless it holds)."""
        namespace, _, name = where.partition("/")
        try:
            configmap = await self.api.get(configmap_path(namespace, name))
        except KubeError as exc:
            found = unknown_reliances(f"reading ConfigMap {where} failed ({exc.kind})")
        else:
            found = kueue_reliances(configmap, where)
        for reliance in found:
            self.metrics.reliance.labels(reliance.check).set(reliance.value)
            if reliance.check in self._reliances and self._reliances[reliance.check] is reliance.holds:
                continue
            self._reliances[reliance.check] = reliance.holds
            if reliance.holds:
                log.info("reliance %s holds: %s", reliance.check, reliance.message)
            else:
                log.warning("reliance %s: %s", reliance.check, reliance.message)
        return found

    # ------------------------------------------------------------------ periodic

    async def resync(self) -> tuple[int, int]:
        """Reconcile every known job (policies that drifted unnoticed, config changes, records
        whose writing failed). Returns (jobs, failures); failures are logged and counted."""
        failures = 0
        for gone in list(self._pending_deletions.values()):
            try:
                await self.on_trainjob_event("DELETED", gone)
            except (KubeError, AuditError, NoConfigError) as exc:
                failures += 1
                log.warning("recording the deletion of TrainJob %s/%s failed again: %s", *_key(gone), exc)
        jobs = list(self._jobs.values())
        for trainjob in jobs:
            try:
                await self.ensure_network_policy(trainjob, cause=" on resync")
                await self.reconcile_job(self._jobs.get(_key(trainjob), trainjob))
            except (KubeError, AuditError, NoConfigError) as exc:
                failures += 1
                log.warning("resync of TrainJob %s/%s failed: %s", *_key(trainjob), exc)
        return len(jobs), failures


def _chargeback_labels(config: Config, team: Team, trainjob: Mapping[str, Any]) -> dict[str, str]:
    """The job's labels that reports group GPU-hours by: the labels the org and the team require
    (the cost center, typically) and the data classification."""
    meta = trainjob.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    if not isinstance(labels, dict):
        return {}
    wanted = {*config.org.lifecycle.required_labels, *team.required_labels, "mpigate.io/data-classification"}
    return {k: v for k in sorted(wanted) if isinstance(v := labels.get(k), str)}
