"""Lifecycle records, GPU-seconds and placement evidence of each job, exact through restarts,
leader changes and outages (the reconciler calls it under the job's lock; docs/controller.md).

What a segment's close needs is kept durably, not only in memory:

- on the job, after every record: the transitions recorded (``mpigate.io/lifecycle``), the facts
  of the open segment's pods (``mpigate.io/pods``), the pods whose placement is recorded
  (``mpigate.io/evidence``), sealed with the audit key (:mod:`.jobstate`);
- in the ledger ConfigMap, every job with an open segment (:mod:`.ledger`), for jobs that are
  deleted while the controller is down.

On the first look at a job in a process, the controller lists the job's pods itself (so a job
listed before its pods is not closed without them), takes what it knew from the annotations (or
the ledger) and marks pods it knew that are gone now as *missing* (their end is unknown); it reads
the namespace's scheduling Events for pods that ran and went while it was away, so that their
placement is still recorded. Before a segment is closed the pods are listed again.

Records are written before what remembers them. A crash in between repeats the record after the
restart with the same (job uid, segment, event): the report counts it once (docs/compliance.md).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from mpigate.admission.kube import KubeError
from mpigate.audit import evidence_record, lifecycle_record
from mpigate.config import Config
from mpigate.config.model import Team
from mpigate.policy.demand import gpu_resources

from .api import ControllerApi, configmap_path, event_path, pod_path, runtime_path
from .demand import JobGpus, job_gpus, mpijob_gpus, pod_gpus, runtime_ref
from .events import EventPoster
from .jobstate import (
    EVIDENCE_ANNOTATION,
    PODS_ANNOTATION,
    SEAL_ANNOTATION,
    Sealer,
    decode_evidence,
    decode_pods,
    encode_evidence,
    encode_pods,
    seal_payload,
)
from .kinds import MPIJOB, TRAINJOB, JobKind
from .ledger import LedgerEntry, decode, encode
from .lifecycle import (
    CLOSING_EVENTS,
    LIFECYCLE_ANNOTATION,
    Recorded,
    Transition,
    format_history,
    parse_history,
    plan,
    segment_since,
)
from .metrics import ControllerMetrics
from .recording import Recorder
from .residency import placement
from .slim import is_slim, slim_event
from .usage import Charge, PodFacts, format_time, observe, parse_time, vanish

__all__ = ["Accountant", "JobState", "Key"]

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (kind, namespace, name)

# Annotations must stay far below the API server's 256 KiB limit for all of an object's annotations.
_MAX_ANNOTATION: Final = 64 * 1024
_OPEN: Final = frozenset({"admitted", "started"})
_TERMINAL: Final = frozenset({"succeeded", "failed", "deleted"})
# How long a namespace's scheduling Events are reused while the jobs of a restart are looked at.
_EVENTS_TTL: Final = dt.timedelta(seconds=60)
_SCHEDULED: Final = re.compile(r"\bto (\S+)\s*$")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotation(obj: Mapping[str, Any], key: str) -> str | None:
    annotations = _meta(obj).get("annotations")
    value = annotations.get(key) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else None


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = _meta(obj).get("labels")
    return labels if isinstance(labels, Mapping) else {}


@dataclass
class _Unplaced:
    """A pod whose placement is not recorded yet."""

    uid: str
    node: str
    node_selector: Mapping[str, Any] | None
    source: str  # pod | scheduling-event


@dataclass
class JobState:
    """What the controller knows of one job (one uid) in this process."""

    kind: JobKind
    key: Key
    uid: str
    history: tuple[Recorded, ...] = ()
    pods: dict[str, PodFacts] = field(default_factory=dict)
    evidence: frozenset[str] = frozenset()
    #: Pods known from durable state that no look in this process has confirmed yet.
    inherited: set[str] = field(default_factory=set)
    #: Inherited pods found gone at the first listing (their end is unknown).
    missing: set[str] = field(default_factory=set)
    #: When the durable state was last confirmed (annotation or ledger), for missing pods.
    inherited_seen: dt.datetime | None = None
    listed: bool = False
    seen_at: dt.datetime | None = None
    first_seen: dt.datetime | None = None
    unplaced: dict[str, _Unplaced] = field(default_factory=dict)
    team: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    gpus: JobGpus | None = None
    tamper_reported: bool = False
    #: The job as the last annotation patch returned it (the reconciler keeps the newest object).
    updated: Mapping[str, Any] | None = None

    @property
    def open(self) -> bool:
        return bool(self.history) and self.history[-1].event in _OPEN

    @property
    def last_seen(self) -> dt.datetime | None:
        times = [t for t in (self.seen_at, self.inherited_seen) if t is not None]
        return max(times) if times else None


class Accountant:
    """Lifecycle records, GPU-seconds, placement evidence and the ledger (one per leader)."""

    def __init__(
        self,
        *,
        config: Callable[[], Config],
        api: ControllerApi,
        recorder: Recorder,
        metrics: ControllerMetrics,
        events: EventPoster,
        clock: Callable[[], dt.datetime],
        sealer: Sealer | None = None,
        ledger: tuple[str, str] | None = None,
    ) -> None:
        self._config = config
        self.api = api
        self.recorder = recorder
        self.metrics = metrics
        self.events = events
        self.clock = clock
        self.sealer = sealer
        self.ledger = ledger
        self.states: dict[str, JobState] = {}
        # Pod events of jobs not seen yet: key -> pod uid -> (pod, deleted at).
        self.orphans: dict[Key, dict[str, tuple[Mapping[str, Any], dt.datetime | None]]] = {}
        # When pods of a job not seen yet were first kept (resync drops those of jobs that don't exist).
        self.orphaned_at: dict[Key, dt.datetime] = {}
        # Jobs the ledger named when this process started and no look has adopted yet.
        self.from_ledger: dict[str, LedgerEntry] = {}
        self.ledger_dirty = False
        self._scheduled: dict[str, tuple[dt.datetime, list[dict[str, Any]]]] = {}
        self.started_at = clock()

    # ------------------------------------------------------------------ durable state

    def _verified(self, job: Mapping[str, Any], uid: str) -> bool:
        """Whether the job's state annotations are the controller's own (their seal matches)."""
        annotations = _meta(job).get("annotations")
        annotations = annotations if isinstance(annotations, Mapping) else {}
        if self.sealer is None:
            return True
        present = any(
            isinstance(annotations.get(k), str)
            for k in (LIFECYCLE_ANNOTATION, PODS_ANNOTATION, EVIDENCE_ANNOTATION)
        )
        seal = annotations.get(SEAL_ANNOTATION)
        if not present and seal is None:
            return True  # nothing recorded yet
        return isinstance(seal, str) and seal == self.sealer(seal_payload(uid, annotations))

    async def state_for(self, kind: JobKind, job: Mapping[str, Any], uid: str, key: Key) -> JobState:
        """The job's state: from memory, else from its annotations (when sealed by the controller)
        or the ledger, whichever knows more."""
        now = self.clock()
        state = self.states.get(uid)
        if state is not None:
            # histories only grow: a longer one on the job was written by another process
            stored = parse_history(_annotation(job, LIFECYCLE_ANNOTATION))
            if len(stored) > len(state.history) and self._verified(job, uid):
                state.history = stored
            return state
        state = JobState(kind=kind, key=key, uid=uid, first_seen=now)
        sources: list[
            tuple[tuple[Recorded, ...], dict[str, PodFacts], frozenset[str], dt.datetime | None]
        ] = []
        if self._verified(job, uid):
            pods, seen = decode_pods(_annotation(job, PODS_ANNOTATION))
            sources.append(
                (
                    parse_history(_annotation(job, LIFECYCLE_ANNOTATION)),
                    pods,
                    decode_evidence(_annotation(job, EVIDENCE_ANNOTATION)),
                    seen,
                )
            )
        else:
            await self._tampered(job, state)
        entry = self.from_ledger.pop(uid, None)
        if entry is not None:
            pods, _ = decode_pods(entry.pods)
            sources.append((parse_history(entry.history), pods, decode_evidence(entry.evidence), entry.seen))
        if sources:
            history = max((s[0] for s in sources), key=len)
            pods = {}
            for source in sources[::-1]:
                pods.update(source[1])  # the annotation (first) wins over the ledger
            state.history = history
            state.pods = pods
            state.evidence = frozenset().union(*(s[2] for s in sources))
            times = [s[3] for s in sources if s[3] is not None]
            state.inherited_seen = max(times) if times else None
            state.inherited = {uid for uid, p in pods.items() if not p.gone}
        self.states[uid] = state
        self.orphaned_at.pop(key, None)
        for pod, gone_at in self.orphans.pop(key, {}).values():
            await self.pod_event(state, pod, gone_at, job=job)
        return state

    async def _tampered(self, job: Mapping[str, Any], state: JobState) -> None:
        self.metrics.state_tampered.labels(state.kind.kind).inc()
        log.warning(
            "%s %s/%s: mpigate.io state annotations were changed by someone other than the controller; "
            "ignored",
            state.kind.kind,
            state.key[1],
            state.key[2],
        )
        if not state.tamper_reported:
            state.tamper_reported = True
            await self.events.post(
                job,
                "Warning",
                "StateTampered",
                "The mpigate.io/lifecycle, mpigate.io/pods or mpigate.io/evidence annotations were changed "
                "by someone other than mpigate's controller. It ignored them and keeps its own record; "
                "leave these annotations to it.",
            )

    def forget(self, uid: str) -> None:
        self.states.pop(uid, None)
        self.from_ledger.pop(uid, None)
        self.ledger_dirty = True

    # ------------------------------------------------------------------ pods

    async def _gpus_of(self, state: JobState, job: Mapping[str, Any]) -> JobGpus:
        if state.gpus is not None:
            return state.gpus
        if is_slim(job):
            # the spec is not kept between events: read the job (once; its GPUs are remembered)
            full = await self.api.get(state.kind.path(state.key[1], state.key[2]))
            if full is None or _meta(full).get("uid") != state.uid:
                return JobGpus(None, {})  # gone: nothing to remember
            job = full
        config = self._config()
        if state.kind is MPIJOB:
            state.gpus = mpijob_gpus(config, job)
            return state.gpus
        runtime: Mapping[str, Any] | None = None
        if state.kind is TRAINJOB:
            kind, name = runtime_ref(job)
            namespace = state.key[1]
            if name and config.runtime(kind, name, namespace) is None:
                approval = config.org.runtime_approval(name, kind)
                if approval is not None and approval.external:
                    runtime = await self.api.get(runtime_path(kind, name, namespace))
        state.gpus = job_gpus(config, job, runtime)
        return state.gpus

    def _role(self, state: JobState, pod: Mapping[str, Any]) -> str | None:
        role = _labels(pod).get(state.kind.role_label)
        return role if isinstance(role, str) else None

    async def pod_event(
        self,
        state: JobState,
        pod: Mapping[str, Any],
        gone_at: dt.datetime | None,
        *,
        job: Mapping[str, Any] | None = None,
    ) -> None:
        """What a pod of the job shows now (``gone_at``: it was deleted)."""
        meta = _meta(pod)
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            return
        known = state.pods.get(uid)
        state.inherited.discard(uid)
        state.missing.discard(uid)
        if known is not None and known.gone and gone_at is None:
            return  # a late event about a pod already gone
        gpus_of = state.gpus
        if gpus_of is None and job is not None:
            gpus_of = await self._gpus_of(state, job)
        known_resources = gpu_resources(self._config())
        spec_gpus = pod_gpus(pod, known_resources)
        role = self._role(state, pod)
        gpus = gpus_of.per_pod.get(role, spec_gpus) if gpus_of is not None and role is not None else spec_gpus
        facts = observe(pod, gpus=gpus, spec_gpus=spec_gpus, role=role, known=known, gone_at=gone_at)
        since = segment_since(state.history)
        if facts.start is not None and since is not None and facts.start < since and known is None:
            return  # a pod of a segment already closed (and paid)
        deleting = gone_at is not None or bool(meta.get("deletionTimestamp"))
        if (
            deleting
            and facts.start is not None
            and facts.ended in (None, "deleted")
            and facts.node is not None
            and facts.not_ready_at is not None
            and await self._node_lost(facts.node)
        ):
            # deleted while its containers still read as running, and its node is gone or not
            # ready: the kubelet never reported the end; the node failed when the pod turned not ready
            facts = observe(
                pod, gpus=gpus, spec_gpus=spec_gpus, role=role, known=known, gone_at=gone_at, node_lost=True
            )
        if facts.start is None and known is None and gone_at is not None:
            return  # never ran, gone: nothing to charge
        state.pods[uid] = facts
        name = facts.name
        node = facts.node
        if node and name and name not in state.evidence and name not in state.unplaced:
            spec = pod.get("spec")
            selector = spec.get("nodeSelector") if isinstance(spec, Mapping) else None
            state.unplaced[name] = _Unplaced(
                uid, node, selector if isinstance(selector, Mapping) else None, "pod"
            )

    async def _node_lost(self, node: str) -> bool:
        try:
            return await self.api.node_lost(node)
        except KubeError:
            return False

    async def list_pods(self, state: JobState, job: Mapping[str, Any], now: dt.datetime) -> None:
        """Read the job's pods from the API; pods known before that are gone are *missing* the first
        time (the controller was away when they went), deleted now afterwards."""
        kind, namespace, name = state.kind, state.key[1], state.key[2]
        selector = ",".join(f"{k}={v}" for k, v in kind.pod_selector(name).items())
        items = await self.api.list_items(pod_path(namespace), label_selector=selector)
        present: set[str] = set()
        for pod in items:
            if not kind.selects(_labels(pod), name) or _meta(pod).get("namespace", namespace) != namespace:
                continue
            uid = _meta(pod).get("uid")
            if isinstance(uid, str):
                present.add(uid)
                await self.pod_event(state, pod, None, job=job)
        for uid, facts in list(state.pods.items()):
            if uid in present or facts.gone:
                continue
            if uid in state.inherited:
                state.missing.add(uid)
            elif facts.end is None and facts.start is not None:
                # it went between two looks of this process: its DELETED event is on its way
                state.pods[uid] = replace(facts, gone=True, end=max(now, facts.start), ended="deleted")
            else:
                state.pods[uid] = replace(facts, gone=True)
        state.inherited.clear()
        if not state.listed:
            state.listed = True
            await self._scheduled_while_away(state, job, present, now)

    async def _scheduled_while_away(
        self, state: JobState, job: Mapping[str, Any], present: set[str], now: dt.datetime
    ) -> None:
        """Pods of the job that ran and went while no controller watched: the scheduler's
        ``Scheduled`` Events (kept an hour by default) still say where they ran."""
        created = parse_time(_meta(job).get("creationTimestamp"))
        if created is None or created >= self.started_at:
            return  # created while this process watched: it saw every pod
        namespace, name = state.key[1], state.key[2]
        events = await self._scheduled_events(namespace, now)
        gpus = state.gpus
        roles = sorted(gpus.per_pod) if gpus is not None and gpus.per_pod else ["launcher", "worker"]
        pattern = re.compile(rf"^{re.escape(name)}-({'|'.join(re.escape(r) for r in roles)})-")
        known_names = {p.name for p in state.pods.values()} | state.evidence | set(state.unplaced)
        for event in events:
            involved = event.get("involvedObject")
            if not isinstance(involved, Mapping) or involved.get("kind") != "Pod":
                continue
            pod, uid = involved.get("name"), involved.get("uid")
            match = pattern.match(pod) if isinstance(pod, str) else None
            if match is None or not isinstance(pod, str) or not isinstance(uid, str):
                continue
            if uid in present or uid in state.pods or pod in known_names:
                continue
            when = parse_time(event.get("eventTime")) or parse_time(event.get("lastTimestamp"))
            when = when or parse_time(event.get("firstTimestamp"))
            message = event.get("message")
            node = _SCHEDULED.search(message) if isinstance(message, str) else None
            if when is None or when < created or node is None:
                continue
            role = match.group(1)
            per_pod = gpus.per_pod.get(role, 0) if gpus is not None else 0
            state.unplaced[pod] = _Unplaced(uid, node.group(1), None, "scheduling-event")
            # it ran between its scheduling and now, for how long is not known
            state.pods[uid] = PodFacts(
                uid=uid,
                name=pod,
                role=role,
                node=node.group(1),
                gpus=per_pod,
                start_range=(when, when),
                end_range=(when, max(now, when)),
                ended="last-seen",
                gone=True,
            )

    async def _scheduled_events(self, namespace: str, now: dt.datetime) -> list[dict[str, Any]]:
        cached = self._scheduled.get(namespace)
        if cached is not None and now - cached[0] < _EVENTS_TTL:
            return cached[1]
        try:
            items = await self.api.list_items(
                event_path(namespace), field_selector="involvedObject.kind=Pod,reason=Scheduled"
            )
        except KubeError as exc:
            log.warning("could not read the scheduling Events of %s: %s", namespace, exc)
            items = []
        items = [slim_event(e) for e in items if e.get("reason") == "Scheduled"]
        # only the namespaces looked at within the TTL are kept (a restart reads many at once)
        self._scheduled = {ns: c for ns, c in self._scheduled.items() if now - c[0] < _EVENTS_TTL}
        self._scheduled[namespace] = (now, items)
        return items

    # ------------------------------------------------------------------ lifecycle

    def _plan(
        self, state: JobState, job: Mapping[str, Any], now: dt.datetime, *, deleted: bool, vanished: bool
    ) -> list[Transition]:
        deleted_at = parse_time(_meta(job).get("deletionTimestamp")) if deleted and not vanished else None
        if deleted_at is not None and deleted_at > now:
            deleted_at = now
        missing = set(state.missing)
        if vanished:
            missing |= {uid for uid, p in state.pods.items() if not p.gone and p.end is None}
        return plan(
            job,
            list(state.pods.values()),
            state.history,
            now,
            kind=state.kind,
            gpus=state.gpus.total if state.gpus is not None else None,
            deleted=deleted,
            deleted_at=deleted_at,
            vanished=vanished,
            missing=missing,
            last_seen=state.last_seen,
        )

    async def reconcile(
        self,
        state: JobState,
        job: Mapping[str, Any],
        team: str,
        labels: Mapping[str, str],
        *,
        deleted: bool = False,
        vanished: bool = False,
    ) -> int:
        """Record the job's new transitions and placements; remember them. Returns records written."""
        now = self.clock()
        state.team = team
        state.labels = dict(labels)
        if not vanished:
            await self._gpus_of(state, job)
        listed = False
        if not state.listed and not vanished:
            await self.list_pods(state, job, now)
            listed = True
        transitions = self._plan(state, job, now, deleted=deleted, vanished=vanished)
        if not listed and not vanished and any(t.event in CLOSING_EVENTS for t in transitions):
            await self.list_pods(state, job, now)  # the pods' last state before the segment is paid
            transitions = self._plan(state, job, now, deleted=deleted, vanished=vanished)
        wrote = 0
        for t in transitions:
            await self._record(state, t)
            wrote += 1
        if state.open and state.missing:
            # the job runs on: pods that went unseen are charged until the controller last saw them
            for uid in list(state.missing):
                state.pods[uid] = vanish(
                    state.pods[uid], last_seen=state.last_seen, noticed=now, closed_at=None
                )
            state.missing.clear()
        wrote += await self._placements(state, job)
        state.seen_at = now
        self.ledger_dirty = True
        if not deleted:
            state.updated = await self.remember(state, job, now)
        return wrote

    async def _record(self, state: JobState, t: Transition) -> None:
        config = self._config()
        kind, namespace, name = state.key
        details: dict[str, Any] = {"segment": t.segment}
        if t.charge is not None:
            details.update(_charge_details(t, t.charge))
        elif t.note:
            details["notes"] = [t.note]
        entry = lifecycle_record(
            t.event,
            namespace=namespace,
            name=name,
            team=state.team,
            uid=state.uid,
            kind=kind,
            gpus=t.gpus,
            gpu_seconds=t.gpu_seconds,
            started=format_time(t.started) if t.started else None,
            finished=format_time(t.finished) if t.finished else None,
            reason=t.reason,
            revision=config.revision,
            at=format_time(t.at),
            labels=state.labels,
            details=details,
        )
        await self.recorder.append(entry)
        state.history = (*state.history, Recorded(t.event, t.at))
        self.metrics.lifecycle_records.labels(t.event).inc()
        if t.charge is not None:
            if t.charge.gpu_seconds and state.team:
                self.metrics.gpu_seconds.labels(state.team).inc(t.charge.gpu_seconds)
            basis = details.get("basis", "observed")
            if basis != "observed":
                self.metrics.segments_not_observed.labels(basis).inc()
        log.info(
            "%s %s/%s %s (segment %d) at %s (GPU-seconds %s)",
            kind,
            namespace,
            name,
            t.event,
            t.segment,
            format_time(t.at),
            t.gpu_seconds,
        )
        if t.event in CLOSING_EVENTS:
            # the segment is paid: its pods are done with (pods of a later segment stay)
            state.pods = {
                uid: p
                for uid, p in state.pods.items()
                if t.event == "suspended" and (first := p.earliest) is not None and first >= t.at
            }
            state.missing &= set(state.pods)
            state.unplaced = {
                pod: where
                for pod, where in state.unplaced.items()
                if t.event == "suspended" or where.uid in state.pods
            }

    async def _placements(self, state: JobState, job: Mapping[str, Any]) -> int:
        if not state.unplaced or state.team is None:
            return 0
        config = self._config()
        team = config.teams.get(state.team)
        if team is None:
            return 0
        kind, namespace, name = state.key
        wrote = 0
        for pod, where in list(state.unplaced.items()):
            node_labels = await self.api.node_labels(where.node)
            found = placement(
                config, team, _labels(job), pod, where.node, node_labels, node_selector=where.node_selector
            )
            details = {**found.details(), "podUid": where.uid}
            if where.source != "pod":
                details["source"] = where.source
            entry = evidence_record(
                "placement",
                namespace=namespace,
                name=name,
                team=team.name,
                pod=pod,
                node=where.node,
                region=found.region,
                zone=found.zone,
                flavor=found.flavor,
                details=details,
                job_kind=kind,
            )
            await self.recorder.append(entry)
            state.evidence = state.evidence | {pod}
            del state.unplaced[pod]
            wrote += 1
            verdict = found.compliant
            self.metrics.evidence_records.labels("unknown" if verdict is None else str(verdict).lower()).inc()
            if verdict is False:
                self.metrics.residency_mismatches.labels(team.name, found.region or "none").inc()
                log.warning("%s %s/%s: %s", kind, namespace, name, found.message())
                await self.events.post(job, "Warning", "ResidencyMismatch", found.message())
            elif verdict is None:
                log.warning("%s %s/%s: %s", kind, namespace, name, found.message())
        return wrote

    async def remember(
        self, state: JobState, job: Mapping[str, Any], now: dt.datetime
    ) -> Mapping[str, Any] | None:
        """Write what memory holds into the job's annotations when they lag behind it (sealed);
        returns the job as updated, or None when nothing was written."""
        finished = bool(state.history) and state.history[-1].event in _TERMINAL
        current = {
            k: _annotation(job, k) for k in (LIFECYCLE_ANNOTATION, PODS_ANNOTATION, EVIDENCE_ANNOTATION)
        }
        pods = current[PODS_ANNOTATION]
        if decode_pods(pods)[0] != (state.pods if not finished else {}):
            pods = encode_pods(state.pods.values(), now) if state.pods and not finished else None
        values: dict[str, str | None] = {
            LIFECYCLE_ANNOTATION: format_history(state.history) if state.history else None,
            PODS_ANNOTATION: pods,
            EVIDENCE_ANNOTATION: encode_evidence(state.evidence) if state.evidence else None,
        }
        for k, v in values.items():
            if v is not None and len(v) > _MAX_ANNOTATION:
                values[k] = None  # memory (and the ledger) still hold it
        patch: dict[str, Any] = dict(values)
        if self.sealer is not None:
            patch[SEAL_ANNOTATION] = self.sealer(seal_payload(state.uid, values))
        if values == current and (
            self.sealer is None or _annotation(job, SEAL_ANNOTATION) == patch[SEAL_ANNOTATION]
        ):
            return None
        _, namespace, name = state.key
        try:
            updated = await self.api.merge_patch(
                state.kind.path(namespace, name), {"metadata": {"annotations": patch}}
            )
        except KubeError as exc:
            if exc.status == 404:
                return None  # deleted meanwhile; the DELETED event follows
            raise
        return updated if _meta(updated).get("uid") == state.uid else None

    # ------------------------------------------------------------------ the ledger

    def ledger_entries(self) -> list[LedgerEntry]:
        """Every job with an open segment: those watched now (confirmed when the ledger is written)
        and those the ledger named that no look has adopted yet (confirmed when they were)."""
        entries = list(self.from_ledger.values())
        for state in self.states.values():
            if not state.open or state.team is None:
                continue
            entries.append(
                LedgerEntry(
                    kind=state.key[0],
                    namespace=state.key[1],
                    name=state.key[2],
                    uid=state.uid,
                    team=state.team,
                    labels=state.labels,
                    gpus=state.gpus.total if state.gpus is not None else None,
                    history=format_history(state.history),
                    pods=encode_pods(state.pods.values(), state.seen_at),
                    evidence=encode_evidence(state.evidence),
                )
            )
        return entries

    async def load_ledger(self) -> None:
        if self.ledger is None:
            return
        namespace, name = self.ledger
        found, seen = decode(await self.api.get(configmap_path(namespace, name)))
        self.from_ledger = {uid: e for uid, e in found.items() if uid not in self.states}
        log.info("ledger %s/%s: %d open jobs, last confirmed %s", namespace, name, len(found), seen)

    async def save_ledger(self) -> bool:
        """Write the ledger (every open job, confirmed now). Returns whether it was written."""
        if self.ledger is None:
            return False
        entries = self.ledger_entries()
        if not entries and not self.ledger_dirty:
            return False
        namespace, name = self.ledger
        now = self.clock()
        data, dropped = encode(entries, now)
        if dropped:
            self.metrics.ledger_writes.labels("truncated").inc()
            log.warning("ledger %s/%s too large: the pods of %d jobs were left out", namespace, name, dropped)
        try:
            await self.api.write_configmap_data(namespace, name, data)
        except KubeError:
            self.metrics.ledger_writes.labels("error").inc()
            raise
        self.metrics.ledger_writes.labels("written").inc()
        self.ledger_dirty = False
        return True

    def state_from_ledger(self, entry: LedgerEntry, kind: JobKind) -> tuple[JobState, dict[str, Any]]:
        """A job the ledger names and the API no longer has: its state and a stand-in object."""
        pods, _ = decode_pods(entry.pods)
        state = JobState(
            kind=kind,
            key=(entry.kind, entry.namespace, entry.name),
            uid=entry.uid,
            history=parse_history(entry.history),
            pods=pods,
            evidence=decode_evidence(entry.evidence),
            inherited_seen=entry.seen,
            listed=True,
            team=entry.team,
            labels=dict(entry.labels),
            gpus=JobGpus(entry.gpus, {}),
        )
        job = {
            "apiVersion": kind.api_version,
            "kind": kind.kind,
            "metadata": {"name": entry.name, "namespace": entry.namespace, "uid": entry.uid},
        }
        return state, job


def _charge_details(t: Transition, used: Charge) -> dict[str, Any]:
    """The fields a closing record carries besides ``gpuSeconds`` (docs/controller.md)."""
    basis = "partial" if t.vanished else used.basis
    out: dict[str, Any] = {"basis": basis, "pods": used.pods, "byDay": dict(used.by_day)}
    if used.usage:
        origin = used.usage[0][0]
        out["usage"] = {
            "from": format_time(origin),
            "steps": [[round((at - origin).total_seconds()), gpus] for at, gpus in used.usage],
        }
    notes = [n for n in (t.note,) if n] + list(used.notes)
    if basis != "observed":
        out["gpuSecondsMin"] = used.minimum
        out["gpuSecondsMax"] = used.maximum
    if notes:
        out["notes"] = notes
    if t.vanished:
        out["vanished"] = True
    if used.spec_mismatches:
        out["gpuSpecMismatch"] = [{"pod": p, "charged": g, "spec": s} for p, g, s in used.spec_mismatches]
    return out


def chargeback_labels(config: Config, team: Team, job: Mapping[str, Any]) -> dict[str, str]:
    """The job's labels that reports group GPU-hours by: the labels the org and the team require
    (the cost center, typically) and the data classification."""
    labels = _labels(job)
    wanted = {*config.org.lifecycle.required_labels, *team.required_labels, "mpigate.io/data-classification"}
    return {k: v for k in sorted(wanted) if isinstance(v := labels.get(k), str)}
