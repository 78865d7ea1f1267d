"""What the controller does for each job (TrainJob, and MPIJob where the MPI Operator runs),
independent of kopf (the handlers only call it).

- :meth:`Reconciler.ensure_network_policy`: create the job's NetworkPolicy, or repair it when it
  drifted (idempotent: re-delivered events find nothing to do; a 409 on create is read and
  compared). Only a policy the job owns (:func:`netpol.owned_by`) is ever patched: anything else
  under its name is a conflict, reported as a ``NetworkPolicyConflict`` Event on the job and the
  ``mpigate_controller_conflicts_total`` metric, and left as it is.
- :meth:`Reconciler.on_job_event` / :meth:`on_pod_event`: lifecycle records (with GPU-seconds) and
  placement evidence, each once per transition or pod (:mod:`.accounting`: what is needed to close
  a segment is kept in the job's sealed annotations and in the ledger, not only in memory).
- :meth:`on_policy_event`: a managed NetworkPolicy was edited or deleted → reconcile its owner.
- :meth:`start` / :meth:`resync`: jobs that disappeared unseen (deleted while the controller was
  down, or a deletion it missed) are closed from what is known, marked ``vanished``.

Records are written before what remembers them: a crash in between repeats a record after the
restart with the same job uid, segment and event — the report counts it once
(docs/compliance.md) — it never loses one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Final

from mpigate.admission.kube import KubeError
from mpigate.audit import AuditError
from mpigate.config import Config
from mpigate.config.model import NetworkProfile, Team
from mpigate.config.mpienv import IMPLEMENTATIONS

from .accounting import Accountant, JobState, Key, chargeback_labels
from .api import ControllerApi, configmap_path, netpol_path
from .events import EventPoster
from .jobstate import EVIDENCE_ANNOTATION, Sealer
from .kinds import TRAINJOB, JobKind
from .ledger import DEFAULT_LEDGER_NAME
from .metrics import ControllerMetrics
from .netpol import (
    PROFILE_ANNOTATION,
    build_network_policy,
    drift,
    owned_by,
    repair_patch,
)
from .recording import Recorder
from .reliances import Reliance, kueue_reliances, unknown_reliances
from .slim import SlimJob, slim_job, slim_pod

__all__ = ["DEFAULT_LEDGER_NAME", "EVIDENCE_ANNOTATION", "Key", "NoConfigError", "Reconciler"]

log = logging.getLogger(__name__)

# Uids of deleted jobs remembered, so that a re-delivered DELETED event records nothing.
_DELETED_MEMORY: Final = 10_000
_ERRORS: Final = (KubeError, AuditError)


class NoConfigError(Exception):
    """No config has been loaded (yet): nothing can be decided."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _key(kind: JobKind, obj: Mapping[str, Any]) -> Key:
    meta = _meta(obj)
    return kind.kind, str(meta.get("namespace") or ""), str(meta.get("name") or "")


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
        kinds: Iterable[JobKind] = (TRAINJOB,),
        sealer: Sealer | None = None,
        ledger: tuple[str, str] | None = None,
    ) -> None:
        self._config = config
        self.api = api
        self.recorder = recorder
        self.metrics = metrics
        self.events = events
        self.namespace_label = namespace_label or None
        self.clock = clock
        self.kinds: dict[str, JobKind] = {k.kind: k for k in kinds}
        # The jobs of team namespaces, slim (slim.py): what the controller reads between events.
        self._jobs: dict[Key, SlimJob] = {}
        self._locks: dict[Key, asyncio.Lock] = {}
        self._policies_seen: set[Key] = set()
        # (job uid, conflicting object's uid) already reported with an Event.
        self._conflicts_reported: set[tuple[str, str]] = set()
        self._deleted: OrderedDict[str, None] = OrderedDict()
        # Deletions whose record could not be written yet (the object is gone; resync retries).
        self._pending_deletions: dict[str, tuple[JobKind, Mapping[str, Any]]] = {}
        # The last state of each reliance check, so that a warning is logged when it changes.
        self._reliances: dict[str, bool | None] = {}
        self.accounts = Accountant(
            config=self.config,
            api=api,
            recorder=recorder,
            metrics=metrics,
            events=events,
            clock=clock,
            sealer=sealer,
            ledger=ledger,
        )

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
        """The jobs seen in team namespaces (latest version of each, slim)."""
        return list(self._jobs.values())

    async def _watched(self, job: Mapping[str, Any]) -> bool:
        """Whether the job is one the controller looks after (a managed team namespace). When that
        cannot be told now (no config yet, the namespace unreadable) it is kept: the reconcile that
        follows raises and is retried."""
        try:
            return await self.team_of(job) is not None
        except (KubeError, NoConfigError):
            return True

    async def team_of(self, job: Mapping[str, Any]) -> Team | None:
        """The team whose namespace holds the job, when the controller manages it: the namespace
        belongs to a team in the config and — like the webhooks' namespaceSelector — carries the
        namespace label (so the controller acts only on jobs that admission has seen)."""
        namespace = str(_meta(job).get("namespace") or "")
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

    async def ensure_network_policy(
        self, trainjob: Mapping[str, Any], *, cause: str = "", kind: JobKind = TRAINJOB
    ) -> str:
        """Create or repair the job's NetworkPolicy. Returns ``created``, ``repaired``,
        ``unchanged``, ``conflict`` (an object the job does not own holds the name: reported, left
        alone) or ``skipped``; raises :class:`KubeError` (retry) when the API fails."""
        started = time.monotonic()
        key = _key(kind, trainjob)
        try:
            result = await self._ensure_network_policy(trainjob, key, cause, kind)
        except (KubeError, NoConfigError) as exc:
            self.metrics.reconciles.labels("networkpolicy", "error").inc()
            self.metrics.errors.labels("networkpolicy", _reason(exc)).inc()
            raise
        finally:
            self.metrics.duration.labels("networkpolicy").observe(time.monotonic() - started)
        self.metrics.reconciles.labels("networkpolicy", result).inc()
        return result

    async def _ensure_network_policy(
        self, trainjob: Mapping[str, Any], key: Key, cause: str, kind: JobKind
    ) -> str:
        uid = _meta(trainjob).get("uid")
        if _meta(trainjob).get("deletionTimestamp") or not uid or uid in self._deleted:
            return "skipped"
        team = await self.team_of(trainjob)
        if team is None:
            return "skipped"
        config = self.config()
        desired = build_network_policy(config, trainjob, team, kind=kind)
        if desired is None:
            return "skipped"
        namespace = key[1]
        name = desired["metadata"]["name"]
        path = netpol_path(namespace, name)
        async with self._lock(key):
            actual = await self.api.get(path)
            if actual is None and key in self._policies_seen and not await self._lives(trainjob, kind):
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
                    await self._announce_created(trainjob, desired, recreated, cause, kind)
                    return "created"
            if not owned_by(actual, trainjob, kind):
                await self._conflict(trainjob, name, actual, kind)
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

    async def _lives(self, trainjob: Mapping[str, Any], kind: JobKind) -> bool:
        """Whether the job (this very one: same uid) still exists and is not being deleted."""
        _, namespace, name = _key(kind, trainjob)
        current = await self.api.get(kind.path(namespace, name))
        if current is None or _meta(current).get("uid") != _meta(trainjob).get("uid"):
            return False
        return not _meta(current).get("deletionTimestamp")

    async def _announce_created(
        self,
        trainjob: Mapping[str, Any],
        desired: Mapping[str, Any],
        recreated: bool,
        cause: str,
        kind: JobKind,
    ) -> None:
        namespace = _key(kind, trainjob)[1]
        name = desired["metadata"]["name"]
        profile = desired["metadata"]["annotations"][PROFILE_ANNOTATION]
        why = desired["metadata"]["annotations"].get("mpigate.io/network-profile-reason", "")
        if recreated:
            log.warning("NetworkPolicy %s/%s had been deleted; recreated", namespace, name)
            await self.events.post(
                trainjob,
                "Warning",
                "NetworkPolicyRepaired",
                f"NetworkPolicy {name} had been deleted; recreated it.",
            )
        else:
            log.info("created NetworkPolicy %s/%s (%s)%s", namespace, name, profile, cause)
            await self.events.post(
                trainjob,
                "Normal",
                "NetworkPolicyCreated",
                f"Created NetworkPolicy {name}: profile {profile} ({why}).",
            )
        if profile == "pinned-ports":
            missing = self._missing_pinned_env(trainjob, profile, kind)
            if missing:
                where = "spec.trainer.env" if kind is TRAINJOB else "the Launcher's first container's env"
                await self.events.post(
                    trainjob,
                    "Warning",
                    "PinnedPortsEnvMissing",
                    f"NetworkPolicy {name} opens only the pinned MPI ports, but {where} lacks "
                    f"{', '.join(missing)}: MPI will use other ports and its traffic will be dropped.",
                )

    def _missing_pinned_env(self, trainjob: Mapping[str, Any], profile_name: str, kind: JobKind) -> list[str]:
        profile = self.config().network_profiles.get(profile_name)
        if profile is None:
            return []
        env = _pinned_env_of(trainjob, kind)
        names = {e.get("name") for e in env if isinstance(e, Mapping)} if isinstance(env, list) else set()
        return missing_pinned_env(profile, names)

    async def _conflict(
        self, trainjob: Mapping[str, Any], name: str, actual: Mapping[str, Any], kind: JobKind
    ) -> None:
        """An object the job does not own holds the job's policy name: count it every time it is
        seen (an alert can watch the rate), say so once per job and object, and change nothing."""
        self.metrics.conflicts.labels("networkpolicy").inc()
        seen = (str(_meta(trainjob).get("uid") or ""), str(_meta(actual).get("uid") or ""))
        if seen in self._conflicts_reported:
            return
        self._conflicts_reported.add(seen)
        _, namespace, job_name = _key(kind, trainjob)
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
            "NetworkPolicy %s/%s is not %s %s's (%s): left unchanged",
            namespace,
            name,
            kind.kind,
            job_name,
            owner,
        )
        await self.events.post(
            trainjob,
            "Warning",
            "NetworkPolicyConflict",
            f"NetworkPolicy {name} exists but does not belong to this {kind.kind} ({owner}; no mpigate "
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
        """A managed NetworkPolicy changed or disappeared: put it back if its job lives."""
        namespace = str(_meta(policy).get("namespace") or "")
        labels = _meta(policy).get("labels") or {}
        for kind in self.kinds.values():
            job = labels.get(kind.job_label) if isinstance(labels, Mapping) else None
            if not isinstance(job, str):
                continue
            key = (kind.kind, namespace, job)
            known = self._jobs.get(key)
            if known is None:
                return None  # the job is gone (garbage collection deletes its policy) or not seen yet
            if event_type == "DELETED":
                self._policies_seen.add(key)  # a create now restores it (if the job lives)
            # the whole job (the kept one is slim): its labels now, and the env a profile needs
            current = await self.api.get(kind.path(namespace, job))
            if current is None or _meta(current).get("uid") != _meta(known).get("uid"):
                return None  # gone: its DELETED event follows
            return await self.ensure_network_policy(
                current, cause=f" after {event_type or 'listing'}", kind=kind
            )
        return None

    # ------------------------------------------------------------------ lifecycle and evidence

    async def on_trainjob_event(self, event_type: str | None, trainjob: Mapping[str, Any]) -> None:
        """Every TrainJob watch event (``None``: listed at startup)."""
        await self.on_job_event(TRAINJOB, event_type, trainjob)

    async def on_job_event(self, kind: JobKind, event_type: str | None, job: Mapping[str, Any]) -> None:
        """Every watch event of a job of ``kind`` (``None``: listed at startup)."""
        key = _key(kind, job)
        uid = str(_meta(job).get("uid") or "")
        if event_type == "DELETED":
            if uid and uid in self._deleted:
                return
            known = self._jobs.get(key)
            if known is not None and _meta(known).get("uid") == uid:
                del self._jobs[key]  # no more policy repairs for it
            try:
                await self.reconcile_job(job, deleted=True, kind=kind)
            except (*_ERRORS, NoConfigError):
                self._pending_deletions[uid] = (kind, job)
                raise
            self._pending_deletions.pop(uid, None)
            self._forget(key, uid)
            return
        if uid in self._deleted:
            return  # a late event about a job already gone
        known = self._jobs.get(key)
        if known is not None and _meta(known).get("uid") != uid:
            self._forget(key, str(_meta(known).get("uid") or ""))  # same name, new job
        if not await self._watched(job):
            self._jobs.pop(key, None)  # not (or no longer) a managed team namespace's
            return
        self._jobs[key] = slim_job(kind, job)
        await self.reconcile_job(job, kind=kind)

    async def on_pod_event(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """Every watch event of a pod of a job (by its job-name label): its facts, then its job."""
        meta = _meta(pod)
        labels = meta.get("labels")
        uid = meta.get("uid")
        if not isinstance(labels, Mapping) or not isinstance(uid, str):
            return
        for kind in self.kinds.values():
            name = kind.job_of_pod(labels)
            if name is None:
                continue
            key = (kind.kind, str(meta.get("namespace") or ""), name)
            gone = self.clock() if event_type == "DELETED" else None
            job = self._jobs.get(key)
            state = self.accounts.states.get(str(_meta(job).get("uid"))) if job is not None else None
            if job is None or state is None:
                # not (or not yet) a job we know: keep the pod (slim) until the job is seen — in a
                # team's namespace only (resync drops those whose job never shows up)
                if job is None and event_type == "DELETED" and key not in self.accounts.orphans:
                    return
                if job is None and not self._team_namespace(key[1]):
                    return
                self.accounts.orphans.setdefault(key, {})[uid] = (slim_pod(kind, pod), gone)
                self.accounts.orphaned_at.setdefault(key, self.clock())
                if job is not None:
                    await self.reconcile_job(job, kind=kind)
                return
            async with self._lock(key):
                await self.accounts.pod_event(state, pod, gone, job=job)
            await self.reconcile_job(job, kind=kind)
            return

    def _team_namespace(self, namespace: str) -> bool:
        config = self._config()
        return config is None or config.team_for_namespace(namespace) is not None

    def _forget(self, key: Key, uid: str) -> None:
        self._jobs.pop(key, None)
        self.accounts.orphans.pop(key, None)
        self.accounts.orphaned_at.pop(key, None)
        self._locks.pop(key, None)
        self._policies_seen.discard(key)
        self.accounts.forget(uid)
        self._conflicts_reported = {c for c in self._conflicts_reported if c[0] != uid}
        if uid:
            self._deleted[uid] = None
            while len(self._deleted) > _DELETED_MEMORY:
                self._deleted.popitem(last=False)

    async def reconcile_job(
        self,
        job: Mapping[str, Any],
        *,
        deleted: bool = False,
        kind: JobKind = TRAINJOB,
        vanished: bool = False,
    ) -> None:
        """Record the job's new lifecycle transitions and pod placements; remember them."""
        started = time.monotonic()
        try:
            await self._reconcile_job(job, deleted, kind, vanished)
        except (*_ERRORS, NoConfigError) as exc:
            self.metrics.reconciles.labels("lifecycle", "error").inc()
            self.metrics.errors.labels("lifecycle", _reason(exc)).inc()
            log.error("%s %s/%s: %s (will retry)", *_key(kind, job), exc)
            raise
        finally:
            self.metrics.duration.labels("lifecycle").observe(time.monotonic() - started)

    async def _reconcile_job(
        self, job: Mapping[str, Any], deleted: bool, kind: JobKind, vanished: bool
    ) -> None:
        uid = _meta(job).get("uid")
        if not isinstance(uid, str) or not uid:
            return
        team = await self.team_of(job)
        if team is None:
            return
        key = _key(kind, job)
        async with self._lock(key):
            if uid in self._deleted:
                return
            state = await self.accounts.state_for(kind, job, uid, key)
            if not deleted and not vanished:
                job = await self._confirmed(kind, key, job, state)
            labels = chargeback_labels(self.config(), team, job)
            wrote = await self.accounts.reconcile(
                state, job, team.name, labels, deleted=deleted, vanished=vanished
            )
            if state.updated is not None and key in self._jobs:
                self._jobs[key] = slim_job(kind, state.updated)
            state.updated = None
            self.metrics.reconciles.labels("lifecycle", "recorded" if wrote else "unchanged").inc()

    async def _confirmed(
        self, kind: JobKind, key: Key, job: Mapping[str, Any], state: JobState
    ) -> Mapping[str, Any]:
        """The job to plan with: as the API holds it now when the copy at hand contradicts what is
        known — it reads as suspended while a segment is open or its pods are known, or as admitted
        after a suspension. Watches lag behind reads and are not ordered with one another: a pod's
        event comes before its job's admission, a job's event from before its admission comes after
        the controller read or patched the admitted job. Planned on the copy, a running segment was
        closed as suspended and another one opened (an extra segment, its GPU-seconds repeated)."""
        suspended = kind.suspended(job)
        if not (suspended and (state.open or state.pods)) and not (
            not suspended and state.history and state.history[-1].event == "suspended"
        ):
            return job
        current = await self.api.get(kind.path(key[1], key[2]))
        if current is None or _meta(current).get("uid") != state.uid:
            return job  # gone (its DELETED event follows) or replaced
        if key in self._jobs:
            self._jobs[key] = slim_job(kind, current)
        return current

    # ------------------------------------------------------------------ jobs that went unseen

    async def start(self) -> None:
        """Before watching: read the ledger and close the jobs it names that are gone."""
        try:
            await self.accounts.load_ledger()
        except KubeError as exc:
            log.error(
                "could not read the ledger: %s (jobs deleted while the controller was down stay open)", exc
            )
            return
        await self.find_vanished()

    async def _present(self) -> dict[str, set[str]] | None:
        """The uids of every job of each kind the API has (paged), or None when listing failed."""
        present: dict[str, set[str]] = {}
        for kind in self.kinds.values():
            uids = present[kind.kind] = set()
            try:
                async for page in self.api.pages(kind.collection()):
                    if page.restarted:
                        uids.clear()  # the abandoned snapshot's
                    uids.update(str(_meta(i).get("uid")) for i in page.items)
            except KubeError as exc:
                log.warning(
                    "listing %ss failed (%s): deleted jobs are looked for again at the next resync",
                    kind.kind,
                    exc,
                )
                return None
        return present

    async def find_vanished(
        self, present: Mapping[str, set[str]] | None = None, began: dt.datetime | None = None
    ) -> int:
        """Close every job the controller knew with an open segment (from the ledger, or seen by this
        process) that the API no longer has: it was deleted unseen. Returns how many failed.

        ``present``: the uids of each kind listed since ``began`` (default: listed now)."""
        if present is None or began is None:
            began = self.clock()
            present = await self._present()
            if present is None:
                return 0
        failures = 0
        for uid, entry in list(self.accounts.from_ledger.items()):
            entry_kind = self.kinds.get(entry.kind)
            if entry_kind is None or uid in present.get(entry.kind, set()):
                continue
            key = (entry.kind, entry.namespace, entry.name)
            async with self._lock(key):
                if uid not in self.accounts.from_ledger:
                    continue  # adopted meanwhile
                state, stand_in = self.accounts.state_from_ledger(entry, entry_kind)
                del self.accounts.from_ledger[uid]
                self.accounts.states[uid] = state
                try:
                    await self.accounts.reconcile(
                        state, stand_in, entry.team, entry.labels, deleted=True, vanished=True
                    )
                except (*_ERRORS, NoConfigError) as exc:
                    failures += 1
                    self.accounts.from_ledger[uid] = entry
                    self.accounts.states.pop(uid, None)
                    log.warning(
                        "closing vanished %s %s/%s failed: %s", entry.kind, entry.namespace, entry.name, exc
                    )
                    continue
            self.metrics.vanished.labels(entry.kind).inc()
            self._forget(key, uid)
        for key, job in list(self._jobs.items()):
            kind = self.kinds[key[0]]
            uid = str(_meta(job).get("uid") or "")
            known = self.accounts.states.get(uid)
            if uid in present.get(kind.kind, set()) or known is None or not known.open:
                continue
            if known.first_seen is not None and known.first_seen >= began:
                continue  # seen after the listing began
            if await self.api.get(kind.path(key[1], key[2])) is not None:
                continue
            log.warning("%s %s/%s is gone and its deletion was not seen: closing it", *key)
            del self._jobs[key]
            try:
                await self.reconcile_job(job, deleted=True, kind=kind, vanished=True)
            except (*_ERRORS, NoConfigError):
                failures += 1
                self._jobs[key] = job
                continue
            self.metrics.vanished.labels(kind.kind).inc()
            self._forget(key, uid)
        if self.accounts.ledger is not None:
            try:
                await self.accounts.save_ledger()
            except KubeError as exc:
                log.warning("writing the ledger failed: %s", exc)
        return failures

    async def save_ledger(self) -> None:
        """Write the ledger (the runner calls it every few seconds and when it stops)."""
        await self.accounts.save_ledger()

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
            config = self._config()  # what the tree declares of Kueue (None: not loaded yet)
            found = kueue_reliances(configmap, where, config.kueue if config is not None else None)
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
        """Reconcile every job of a managed team namespace, listed from the API page by page
        (policies that drifted unnoticed, config changes, records whose writing failed), and close
        jobs that went unseen. Returns (jobs, failures); failures are logged and counted."""
        failures = 0
        for kind, gone in list(self._pending_deletions.values()):
            try:
                await self.on_job_event(kind, "DELETED", gone)
            except (*_ERRORS, NoConfigError) as exc:
                failures += 1
                log.warning("recording the deletion of %s %s/%s failed again: %s", *_key(kind, gone), exc)
        began = self.clock()
        present: dict[str, set[str]] = {}
        listed: set[Key] = set()
        jobs = 0
        for kind in self.kinds.values():
            uids = present[kind.kind] = set()
            try:
                async for page in self.api.pages(kind.collection()):
                    if page.restarted:
                        uids.clear()  # the abandoned snapshot's (its jobs were reconciled: idempotent)
                    for job in page.items:
                        uids.add(str(_meta(job).get("uid")))
                        listed.add(_key(kind, job))
                        managed, failed = await self._resync_job(kind, job)
                        jobs += managed
                        failures += failed
            except KubeError as exc:
                log.warning("resync: listing %ss failed (%s); again at the next resync", kind.kind, exc)
                return jobs, failures + 1
        for key, since in list(self.accounts.orphaned_at.items()):
            if key not in listed and since < began:  # pods of no job (a JobSet of no TrainJob)
                self.accounts.orphans.pop(key, None)
                del self.accounts.orphaned_at[key]
        failures += await self.find_vanished(present, began)
        return jobs, failures

    async def _resync_job(self, kind: JobKind, job: Mapping[str, Any]) -> tuple[int, int]:
        """One listed job: (1 if managed, 1 if its reconcile failed)."""
        key = _key(kind, job)
        uid = str(_meta(job).get("uid") or "")
        if not uid or uid in self._deleted or not await self._watched(job):
            return 0, 0
        try:
            await self.ensure_network_policy(job, cause=" on resync", kind=kind)
            known = self._jobs.get(key)
            if known is not None and _meta(known).get("uid") == uid:
                # the newest copy seen (a watch event may have overtaken the listing)
                await self.reconcile_job(known, kind=kind)
            else:
                await self.on_job_event(kind, None, job)
        except (*_ERRORS, NoConfigError) as exc:
            log.warning("resync of %s %s/%s failed: %s", *key, exc)
            return 1, 1
        return 1, 0


def missing_pinned_env(profile: NetworkProfile, names: Collection[object]) -> list[str]:
    """The pinned-port variables a job's env (``names``) lacks. The job's MPI implementation is
    its runtime's, which is not read here: the job is judged against the implementation whose
    variables it carries most of (the webhook injected one set), Open MPI's when it carries none."""
    wanted = [[n for n, _ in profile.pinned_env(impl)] for impl in IMPLEMENTATIONS]
    closest = max(wanted, key=lambda candidate: sum(n in names for n in candidate))
    return [n for n in closest if n not in names]


def _pinned_env_of(job: Mapping[str, Any], kind: JobKind) -> Any:
    """Where a job's pinned OpenMPI variables are written: a TrainJob's ``spec.trainer.env``, an
    MPIJob's Launcher first container (where mpirun reads them)."""
    spec = job.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    if kind is TRAINJOB:
        trainer = spec.get("trainer")
        return trainer.get("env") if isinstance(trainer, Mapping) else None
    replicas = spec.get("mpiReplicaSpecs")
    launcher = replicas.get("Launcher") if isinstance(replicas, Mapping) else None
    template = launcher.get("template") if isinstance(launcher, Mapping) else None
    pod_spec = template.get("spec") if isinstance(template, Mapping) else None
    containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
    first = containers[0] if isinstance(containers, list) and containers else None
    return first.get("env") if isinstance(first, Mapping) else None
