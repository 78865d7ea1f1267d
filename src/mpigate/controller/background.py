"""The background audit (issue 25): what in the cluster violates the policy *today*.

Admission judges a job once. When the org tightens its policy — a quota cut, Pod Security raised,
a registry dropped, an exception expiring — the controller judges every TrainJob, MPIJob and
training runtime again with the admission engine (:func:`mpigate.policy.judge`, the webhook's and
``explain``'s), as a CREATE of the object as stored: on each new config revision, when an exception
expires, and every ``spec.backgroundAudit.interval`` (OrgPolicy).

- **In pages** (``limit``/``continue``, :meth:`.api.ControllerApi.pages`): a pass holds one page of
  objects and the bounded reports, so its memory does not grow with the number of jobs.
- **Quota as the webhook sees it:** a job still queued (suspended, not admitted by Kueue) is judged
  with its ClusterQueue's live quota and reservation, read once per ClusterQueue and pass; an
  admitted job's reservation is already in that figure, so it is judged on the config's quota only.
  MPG-Q007 (concurrent jobs) is a count of the team's jobs, not a property of one job: not judged.
  Nor is MPG-Q005 (a CREATE must reach validation suspended): Kueue lifts the suspension on
  admission, so a stored job's ``suspend`` says where Kueue is, not what was submitted.
- **Exceptions:** a violation an active PolicyException covers is waived, as at admission (the
  requester it names was checked when the job was admitted; the audit does not know who submitted
  it); one an *expired* exception covered is reported with that exception's name.
- **Standing violations** (job uid, rule) are kept in memory and in a ConfigMap (``--audit-state``),
  so that a restart neither repeats nor loses them. Each change is an audit record (``evidence`` of
  kind ``standing-violation``, ``event`` ``opened`` or ``resolved``), which ``mpigate report``
  turns into the standing violations at the period's end and when each was resolved; the gauge
  ``mpigate_controller_standing_violations{rule,team,action}`` counts them.
- **Actions** per rule (``spec.backgroundAudit.actions``): ``report`` (the default), ``event`` (a
  Warning Event on the job when the violation is found), ``suspend`` — a job still queued that would
  now be refused is kept from being admitted by deactivating its Kueue Workload
  (``spec.active: false``; Kueue: apis/kueue/v1beta2/workload_types.go ``WorkloadSpec.Active``),
  never deleted, and the deactivation is audited. An admitted job is never stopped: it is reported.
- **Reports** (:mod:`.policyreport`): one per namespace and one for the cluster's runtimes, bounded.
  Each pass lists mpigate's reports as stored and rewrites only those that differ from what the
  pass found — so a report someone else edited or deleted is put right at the next pass — and
  deletes those of namespaces with nothing left to report. A report is mpigate's when it carries
  the label ``app.kubernetes.io/managed-by: mpigate``; an object of the same name without it is
  never overwritten nor deleted (a warning, and ``mpigate_controller_report_writes_total`` with
  ``result="foreign"``).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import gzip
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

from mpigate.admission.kube import KubeError
from mpigate.admission.live import KueueReader, QueueUsage, is_active, queue_usage
from mpigate.audit import evidence_record
from mpigate.config import Config
from mpigate.config.model import BackgroundAudit, Team
from mpigate.policy import AdmissionInput, LiveContext, Violation, judge
from mpigate.policy.context import QUEUE_LABEL

from .api import ControllerApi, configmap_path
from .events import EventPoster
from .kinds import TRAINJOB, JobKind
from .metrics import ControllerMetrics
from .netpol import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from .policyreport import (
    CLUSTER_KIND,
    MANAGED_LABELS,
    NAMESPACED_KIND,
    REPORT_NAME,
    ReportBuilder,
    Result,
    digest,
    report_collection,
)
from .recording import Recorder

__all__ = ["DEFAULT_STATE_NAME", "AuditPass", "BackgroundAuditor", "Standing", "next_expiry"]

log = logging.getLogger(__name__)

DEFAULT_STATE_NAME: Final = "mpigate-controller-audit"
KUEUE_API: Final = "/apis/kueue.x-k8s.io/v1beta2"
TRAINER_API: Final = "/apis/trainer.kubeflow.org/v1alpha1"
# Kueue: pkg/controller/constants/constants.go JobUIDLabel (on a job's Workload)
JOB_UID_LABEL: Final = "kueue.x-k8s.io/job-uid"
_STATE_KEY: Final = "standing.json.gz"
# Rules judged from what only a submission has: the count of the team's jobs at that moment
# (MPG-Q007), and the suspension the CREATE carried, which Kueue lifts on admission (MPG-Q005).
_SUBMISSION_ONLY: Final = frozenset({"MPG-Q005", "MPG-Q007"})
_RUNTIMES: Final = (
    ("ClusterTrainingRuntime", f"{TRAINER_API}/clustertrainingruntimes"),
    ("TrainingRuntime", f"{TRAINER_API}/trainingruntimes"),
)

ObjectRef = tuple[str, str, str, str]  # kind, namespace ("" for cluster-scoped), name, uid


@dataclass(slots=True)
class Standing:
    """One standing violation of one object."""

    rule: str
    mode: str
    action: str
    team: str
    since: str
    path: str
    message: str
    fix: str = ""
    expired: str | None = None


@dataclass
class AuditPass:
    """What one pass did."""

    reason: str
    objects: int = 0
    standing: int = 0
    opened: int = 0
    resolved: int = 0
    suspended: int = 0
    reports_written: int = 0
    reports_deleted: int = 0
    seconds: float = 0.0


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = _meta(obj).get("labels")
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}


def _time(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str) -> int:
    return int(dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp())


def next_expiry(config: Config, now: dt.datetime) -> dt.datetime | None:
    """When the next PolicyException stops applying (the start of the day after its ``expires``:
    an exception applies through that day, UTC), or None."""
    today = now.astimezone(dt.UTC).date()
    ends = [
        dt.datetime.combine(e.expires + dt.timedelta(days=1), dt.time(), dt.UTC)
        for team in config.teams
        for e in config.exceptions_for(team)
        if e.expires >= today
    ]
    return min(ends, default=None)


class BackgroundAuditor:
    """Runs audit passes (one at a time) and keeps the standing violations."""

    def __init__(
        self,
        *,
        config: Callable[[], Config | None],
        api: ControllerApi,
        recorder: Recorder,
        metrics: ControllerMetrics,
        events: EventPoster,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        kinds: Iterable[JobKind] = (TRAINJOB,),
        namespace_label: str | None = "mpigate.io/team",
        state: tuple[str, str] | None = None,
        kueue_api: str = KUEUE_API,
    ) -> None:
        self._config = config
        self.api = api
        self.recorder = recorder
        self.metrics = metrics
        self.events = events
        self.clock = clock
        self.kinds = tuple(kinds)
        self.namespace_label = namespace_label or None
        self.state = state
        self.kueue_api = kueue_api
        self.standing: dict[ObjectRef, dict[str, Standing]] = {}
        self._loaded = False
        self._state_dirty = False
        # (api, namespace or None) -> (what the pass wanted, what the API server stored of it) at the
        # last write: a server that prunes or defaults a field is not rewritten at every pass
        self._written: dict[tuple[str, str | None], tuple[str, str]] = {}
        # (api, namespace or None) of reports named mpigate that mpigate does not own (warned once)
        self._foreign: set[tuple[str, str | None]] = set()
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ state

    async def load_state(self) -> None:
        """The standing violations the last leader knew (once per process)."""
        if self._loaded:
            return
        if self.state is not None:
            found = await self.api.get(configmap_path(*self.state))
            data = (found or {}).get("binaryData") if found is not None else None
            raw = data.get(_STATE_KEY) if isinstance(data, Mapping) else None
            if isinstance(raw, str):
                try:
                    items = json.loads(gzip.decompress(base64.b64decode(raw)))
                    for entry in items:
                        ref = tuple(entry["ref"])
                        self.standing[(ref[0], ref[1], ref[2], ref[3])] = {
                            s["rule"]: Standing(**s) for s in entry["standing"]
                        }
                except (ValueError, KeyError, TypeError, OSError) as exc:
                    log.warning("audit state %s/%s unreadable (%s): starting afresh", *self.state, exc)
        self._loaded = True

    async def save_state(self) -> None:
        if self.state is None or not self._state_dirty:
            return
        items = [
            {"ref": list(ref), "standing": [asdict(s) for s in rules.values()]}
            for ref, rules in sorted(self.standing.items())
        ]
        data = {_STATE_KEY: base64.b64encode(gzip.compress(json.dumps(items).encode(), mtime=0)).decode()}
        await self.api.write_configmap_data(*self.state, data)
        self._state_dirty = False

    # ------------------------------------------------------------------ a pass

    async def run_pass(self, reason: str) -> AuditPass | None:
        """Judge every object once; publish what changed. None when there is no config yet or the
        audit is off. A listing that fails ends the pass without resolving anything (raises)."""
        async with self._lock:
            started = time.monotonic()
            try:
                done = await self._pass(reason)
            except Exception:
                self.metrics.audit_passes.labels(reason, "error").inc()
                raise
            if done is not None:
                done.seconds = time.monotonic() - started
                self.metrics.audit_passes.labels(reason, "done").inc()
                self.metrics.audit_pass_seconds.set(done.seconds)
                self.metrics.audit_objects.set(done.objects)
                log.info(
                    "background audit (%s): %d objects, %d standing violations (%d new, %d resolved), "
                    "%d reports written, %d deleted, %.1f s",
                    reason,
                    done.objects,
                    done.standing,
                    done.opened,
                    done.resolved,
                    done.reports_written,
                    done.reports_deleted,
                    done.seconds,
                )
            return done

    async def _pass(self, reason: str) -> AuditPass | None:
        config = self._config()
        if config is None:
            return None
        settings = config.org.background_audit
        if not settings.enabled:
            return None
        await self.load_state()
        now = self.clock()
        done = AuditPass(reason)
        reports: dict[str | None, ReportBuilder] = {}
        usage: dict[str, QueueUsage | str] = {}
        seen: set[ObjectRef] = set()
        # A list that restarts from a fresh snapshot (an expired continue token) gives again the
        # objects judged already: each is judged once per pass (``seen``).
        for kind in self.kinds:
            async for page in self.api.pages(kind.collection()):
                for job in page.items:
                    await self._judge_job(config, settings, kind, job, now, reports, usage, seen, done)
                    await asyncio.sleep(0)  # the reconciler shares this event loop
        unlisted: set[str] = set()
        for runtime_kind, path in _RUNTIMES:
            try:
                async for page in self.api.pages(path):
                    for runtime in page.items:
                        await self._judge_runtime(
                            config, settings, runtime_kind, runtime, now, reports, seen, done
                        )
                        await asyncio.sleep(0)
            except KubeError as exc:
                if exc.status != 404:
                    raise
                log.warning("background audit: %ss are not served (%s)", runtime_kind, exc)
                unlisted.add(runtime_kind)
        for ref in [r for r in self.standing if r not in seen and r[0] not in unlisted]:
            await self._resolve_all(config, ref, now, done)
        await self._publish(config, settings, reports, done)
        self._gauges()
        done.standing = sum(len(v) for v in self.standing.values())
        await self.save_state()
        return done

    async def _managed(self, namespace: str) -> bool:
        if self.namespace_label is None:
            return True
        labels = await self.api.namespace_labels(namespace)
        return labels is not None and self.namespace_label in labels

    async def _judge_job(
        self,
        config: Config,
        settings: BackgroundAudit,
        kind: JobKind,
        job: Mapping[str, Any],
        now: dt.datetime,
        reports: dict[str | None, ReportBuilder],
        usage: dict[str, QueueUsage | str],
        seen: set[ObjectRef],
        done: AuditPass,
    ) -> None:
        meta = _meta(job)
        namespace, name, uid = str(meta.get("namespace") or ""), str(meta.get("name") or ""), meta.get("uid")
        team = config.team_for_namespace(namespace)
        if (
            team is None
            or not isinstance(uid, str)
            or not is_active(job)
            or not await self._managed(namespace)
        ):
            return  # not a team's, or finished: what it no longer does breaks nothing
        ref = (kind.kind, namespace, name, uid)
        if ref in seen:
            return  # listed again after a restarted list: judged already this pass
        queued = kind.suspended(job)
        live = await self._live(config, team, job, usage) if queued and kind is TRAINJOB else None
        request = AdmissionInput(operation="CREATE", kind=kind.kind, namespace=namespace, name=name, obj=job)
        decision = judge(config, request, live, now)
        seen.add(ref)
        done.objects += 1
        found = self._violations(config, team, decision.violations, namespace, name, _labels(job), now)
        refused = not decision.allowed
        await self._update(
            config, settings, ref, team.name, found, job, now, done, suspendable=queued and refused
        )
        builder = reports.setdefault(namespace, ReportBuilder(namespace, settings.max_results_per_report))
        builder.add(self._results(ref, kind.api_version, self.standing.get(ref, {})))

    async def _judge_runtime(
        self,
        config: Config,
        settings: BackgroundAudit,
        runtime_kind: str,
        runtime: Mapping[str, Any],
        now: dt.datetime,
        reports: dict[str | None, ReportBuilder],
        seen: set[ObjectRef],
        done: AuditPass,
    ) -> None:
        meta = _meta(runtime)
        namespace = str(meta.get("namespace") or "") if runtime_kind == "TrainingRuntime" else ""
        name, uid = str(meta.get("name") or ""), meta.get("uid")
        if not isinstance(uid, str):
            return
        team = config.team_for_namespace(namespace) if namespace else None
        if namespace and (team is None or not await self._managed(namespace)):
            return
        ref = (runtime_kind, namespace, name, uid)
        if ref in seen:
            return  # listed again after a restarted list: judged already this pass
        request = AdmissionInput(
            operation="CREATE", kind=runtime_kind, namespace=namespace or None, name=name, obj=runtime
        )
        decision = judge(config, request, None, now)
        seen.add(ref)
        done.objects += 1
        found = self._violations(config, team, decision.violations, namespace, name, _labels(runtime), now)
        await self._update(config, settings, ref, team.name if team else "", found, runtime, now, done)
        key = namespace or None
        builder = reports.setdefault(key, ReportBuilder(key, settings.max_results_per_report))
        builder.add(self._results(ref, "trainer.kubeflow.org/v1alpha1", self.standing.get(ref, {})))

    async def _live(
        self, config: Config, team: Team, job: Mapping[str, Any], usage: dict[str, QueueUsage | str]
    ) -> LiveContext:
        """The quota context the webhook gives a CREATE (admission/live.py ``KubeLiveSource``): the
        job's ClusterQueue as live in the cluster, read once per pass."""
        queue = _labels(job).get(QUEUE_LABEL) or (team.queues[0] if team.queues else team.name)
        namespace = str(_meta(job).get("namespace") or "")
        key = f"{namespace}/{queue}"
        found = usage.get(key)
        if found is None:
            found = usage[key] = await self._read_usage(config, team, namespace, queue)
        if isinstance(found, str):
            return LiveContext(unavailable_reason=found)
        return LiveContext(
            gpus_in_use=found.gpus_in_use(config, team.name),
            queue_usage=found.reserved,
            source=f"cluster (ClusterQueue {found.cluster_queue})",
        )

    async def _read_usage(self, config: Config, team: Team, namespace: str, queue: str) -> QueueUsage | str:
        """What the webhook reads for a CREATE (admission/live.py ``queue_usage``): the job's
        ClusterQueue and its cohort's, through a reader of this pass (no caching across passes)."""
        reader = KueueReader(self.api.client, api=self.kueue_api, queue_ttl=0.0, usage_ttl=0.0)
        try:
            return await queue_usage(reader, config, namespace, queue)
        except KubeError as exc:
            if exc.status == 404:
                return f"Kueue ClusterQueue for {namespace}/{queue} not found ({exc})"
            return f"Kueue ClusterQueue not read: {exc}"

    def _violations(
        self,
        config: Config,
        team: Team | None,
        violations: Iterable[Violation],
        namespace: str,
        name: str,
        labels: Mapping[str, str],
        now: dt.datetime,
    ) -> list[tuple[Violation, str | None]]:
        """The violations that stand (not waived, not submission-only), each with the name of an
        expired exception that covered it (None: none did)."""
        day = now.astimezone(dt.UTC).date()
        exceptions = config.exceptions_for(team.name) if team is not None else ()
        out: list[tuple[Violation, str | None]] = []
        for v in violations:
            if v.waived_by is not None or v.rule in _SUBMISSION_ONLY:
                continue
            covering = [
                e
                for e in exceptions
                if v.rule in e.rule_ids and e.matches(namespace, name, labels, requester_known=False)
            ]
            if any(e.active_on(day) for e in covering):
                continue  # waived: the requester was checked at admission
            expired = max(covering, key=lambda e: e.expires).name if covering else None
            out.append((v, expired))
        return out

    def _results(self, ref: ObjectRef, api_version: str, standing: Mapping[str, Standing]) -> list[Result]:
        kind, namespace, name, uid = ref
        subject = [("apiVersion", api_version), ("kind", kind)]
        if namespace:
            subject.append(("namespace", namespace))
        subject.extend([("name", name), ("uid", uid)])
        return [
            Result(
                rule=s.rule,
                mode=s.mode,
                path=s.path,
                message=s.message,
                fix=s.fix,
                action=s.action,
                since=_epoch(s.since),
                subject=tuple(subject),
                expired_exception=s.expired,
            )
            for s in standing.values()
        ]

    # ------------------------------------------------------------------ changes

    async def _update(
        self,
        config: Config,
        settings: BackgroundAudit,
        ref: ObjectRef,
        team: str,
        found: list[tuple[Violation, str | None]],
        obj: Mapping[str, Any],
        now: dt.datetime,
        done: AuditPass,
        *,
        suspendable: bool = False,
    ) -> None:
        old = self.standing.get(ref, {})
        new: dict[str, Standing] = {}
        opened: list[Standing] = []
        for v, expired in found:
            if v.rule in new:
                continue  # one standing violation per rule and object (the first path found)
            before = old.get(v.rule)
            standing = Standing(
                rule=v.rule,
                mode=v.mode,
                action=settings.action_for(v.rule),
                team=team,
                since=before.since if before is not None else _time(now),
                path=v.path,
                message=v.message,
                fix=v.fix,
                expired=expired,
            )
            new[v.rule] = standing
            if before is None:
                opened.append(standing)
            elif before != standing:
                self._state_dirty = True
        for rule, gone in old.items():
            if rule not in new:
                await self._record(config, ref, gone, "resolved", now, reason="no longer violated")
                done.resolved += 1
                self._state_dirty = True
        for standing in opened:
            await self._record(config, ref, standing, "opened", now)
            done.opened += 1
            self._state_dirty = True
        if new:
            self.standing[ref] = new
        else:
            self.standing.pop(ref, None)
        if opened:
            await self._act(ref, obj, opened, now, done, suspendable=suspendable)

    async def _resolve_all(self, config: Config, ref: ObjectRef, now: dt.datetime, done: AuditPass) -> None:
        """An object that is gone, finished or no longer a managed team's: its violations end."""
        for standing in self.standing.pop(ref, {}).values():
            await self._record(
                config, ref, standing, "resolved", now, reason="gone, finished or no longer managed"
            )
            done.resolved += 1
        self._state_dirty = True

    async def _record(
        self,
        config: Config,
        ref: ObjectRef,
        standing: Standing,
        event: str,
        now: dt.datetime,
        *,
        reason: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        kind, namespace, name, uid = ref
        details: dict[str, Any] = {
            "event": event,
            "rule": standing.rule,
            "mode": standing.mode,
            "action": standing.action,
            "path": standing.path,
            "message": standing.message,
            "uid": uid,
            "since": standing.since,
            "revision": config.revision,
            "at": _time(now),
        }
        if standing.expired:
            details["expiredException"] = standing.expired
        if reason:
            details["reason"] = reason
        if extra:
            details.update(extra)
        await self.recorder.append(
            evidence_record(
                "standing-violation",
                namespace=namespace,
                name=name,
                team=standing.team or None,
                details=details,
                job_kind=kind,
            )
        )

    async def _act(
        self,
        ref: ObjectRef,
        obj: Mapping[str, Any],
        opened: list[Standing],
        now: dt.datetime,
        done: AuditPass,
        *,
        suspendable: bool,
    ) -> None:
        """The actions of violations just found: an Event, or keeping a queued job from being
        admitted (its Workload deactivated)."""
        kind, namespace, name, uid = ref
        if not namespace:
            return  # a cluster-scoped runtime: reported only
        if any(s.action in ("event", "suspend") for s in opened):
            lines = "; ".join(f"[{s.rule}] {s.path}: {s.message}" for s in opened)
            await self.events.post(
                obj,
                "Warning",
                "PolicyViolation",
                f"The policy in force now refuses this {kind}: {lines}"[:1000],
                now=now,
            )
        suspend = [s for s in opened if s.action == "suspend" and s.mode == "enforce"]
        if not suspend:
            return
        if not suspendable:
            log.info(
                "%s %s/%s would be suspended but is admitted or allowed: reported only", kind, namespace, name
            )
            return
        deactivated = await self._deactivate(namespace, uid)
        if not deactivated:
            return
        done.suspended += 1
        self.metrics.audit_suspensions.inc()
        config = self._config()
        for standing in suspend:
            if config is not None:
                await self._record(config, ref, standing, "suspended", now, extra={"workloads": deactivated})
        await self.events.post(
            obj,
            "Warning",
            "PolicySuspended",
            f"mpigate deactivated Kueue Workload {', '.join(deactivated)} so that this {kind}, which the "
            f"policy in force now refuses ({', '.join(s.rule for s in suspend)}), is not admitted. It is not "
            "deleted: fix it (or ask for an exception) and set the Workload's spec.active back to true.",
            now=now,
        )

    async def _deactivate(self, namespace: str, uid: str) -> list[str]:
        """Deactivate the job's Kueue Workloads (``spec.active: false``); their names."""
        try:
            workloads = await self.api.list_items(
                f"{self.kueue_api}/namespaces/{namespace}/workloads", label_selector=f"{JOB_UID_LABEL}={uid}"
            )
        except KubeError as exc:
            log.warning("could not list the Workloads of job %s in %s: %s", uid, namespace, exc)
            return []
        names = []
        for workload in workloads:
            if _labels(workload).get(JOB_UID_LABEL) != uid:
                continue
            wl_name = str(_meta(workload).get("name") or "")
            try:
                await self.api.merge_patch(
                    f"{self.kueue_api}/namespaces/{namespace}/workloads/{wl_name}",
                    {"spec": {"active": False}},
                )
            except KubeError as exc:
                log.warning("could not deactivate Workload %s/%s: %s", namespace, wl_name, exc)
                continue
            names.append(wl_name)
        return names

    # ------------------------------------------------------------------ publishing

    def _gauges(self) -> None:
        counts: Counter[tuple[str, str, str]] = Counter()
        for rules in self.standing.values():
            for s in rules.values():
                counts[(s.rule, s.team, s.action)] += 1
        gauge = self.metrics.standing_violations
        gauge.clear()
        for (rule, team, action), n in counts.items():
            gauge.labels(rule, team, action).set(n)

    async def _publish(
        self,
        config: Config,
        settings: BackgroundAudit,
        reports: Mapping[str | None, ReportBuilder],
        done: AuditPass,
    ) -> None:
        """Make the stored reports say what this pass found (see the module docstring)."""
        for api in settings.report_apis:
            try:
                stored = await self._stored_reports(api, reports, config.revision)
            except KubeError as exc:
                if exc.status == 404:
                    log.warning("%s reports are not served (CRD not installed?): not published", api)
                    self.metrics.report_writes.labels(api, "unavailable").inc()
                else:
                    log.warning("listing %s reports failed: %s (none written this pass)", api, exc)
                    self.metrics.report_writes.labels(api, "error").inc()
                continue
            for namespace, builder in reports.items():
                body = builder.body(api, config.revision)
                key = (api, namespace)
                wanted = digest(_content(body, body))
                found = stored.pop(namespace, None)
                if found is not None and (
                    found.content == wanted or self._written.get(key) == (wanted, found.content)
                ):
                    continue  # as this pass would write it, or as the API server kept our last write
                written = await self._write(api, namespace, body, found)
                if written is None:
                    continue
                self._written[key] = (wanted, digest(_content(written, body)))
                self._foreign.discard(key)
                done.reports_written += 1
                self.metrics.report_writes.labels(api, "written").inc()
                omitted = sum(builder.results()[1].values())
                if omitted:
                    log.info(
                        "report %s in %s: %d results omitted (cap %d)",
                        api,
                        namespace,
                        omitted,
                        builder.max_results,
                    )
            for namespace in stored:  # mpigate's, where nothing was judged this pass
                try:
                    await self.api.delete(f"{report_collection(api, namespace)}/{REPORT_NAME}")
                except KubeError as exc:
                    log.warning("deleting report %s in %s failed: %s", api, namespace or "(cluster)", exc)
                    continue
                self._written.pop((api, namespace), None)
                done.reports_deleted += 1
        self.metrics.report_results_omitted.set(sum(sum(b.results()[1].values()) for b in reports.values()))

    async def _stored_reports(
        self, api: str, reports: Mapping[str | None, ReportBuilder], revision: str
    ) -> dict[str | None, _Stored]:
        """mpigate's reports of ``api`` as stored now, by namespace (None: the cluster's): each
        with its resourceVersion and what it says where this pass writes (listed page by page;
        the label selector narrows the list on a real API server, the labels are checked here)."""
        selector = ",".join(f"{k}={v}" for k, v in MANAGED_LABELS.items())
        out: dict[str | None, _Stored] = {}
        for cluster, collection in (
            (True, report_collection(api, None)),
            (False, f"/apis/{api}/{NAMESPACED_KIND[api][1]}"),
        ):
            listed: dict[str | None, _Stored] = {}
            async for page in self.api.pages(collection, label_selector=selector):
                if page.restarted:
                    listed.clear()  # what the abandoned snapshot said
                for report in page.items:
                    meta = _meta(report)
                    where = None if cluster else str(meta.get("namespace") or "")
                    if meta.get("name") != REPORT_NAME or where == "" or not _owned(report):
                        continue
                    builder = reports.get(where)
                    content = digest(_content(report, builder.body(api, revision))) if builder else ""
                    version = meta.get("resourceVersion")
                    listed[where] = _Stored(version if isinstance(version, str) else "", content)
            out.update(listed)
        return out

    async def _write(
        self, api: str, namespace: str | None, body: Mapping[str, Any], found: _Stored | None
    ) -> dict[str, Any] | None:
        """Merge-patch mpigate's stored report (on the resourceVersion listed: a change made since
        is not overwritten, the next pass compares again) or create it; the object the API server
        stored, or None when it was not written (logged and counted)."""
        collection = report_collection(api, namespace)
        where = namespace or "(cluster)"
        try:
            if found is not None:
                patch: dict[str, Any] = dict(body)
                if found.resource_version:
                    patch["metadata"] = {**body["metadata"], "resourceVersion": found.resource_version}
                return await self.api.merge_patch(f"{collection}/{REPORT_NAME}", patch)
            meta = dict(body["metadata"])
            meta["annotations"] = {k: v for k, v in meta["annotations"].items() if v is not None}
            try:
                return await self.api.create(collection, {**body, "metadata": meta})
            except KubeError as exc:
                if exc.status != 409:
                    raise
            existing = await self.api.get(f"{collection}/{REPORT_NAME}")
            if existing is None:
                raise KubeError(f"report {REPORT_NAME} in {where} conflicted and is gone", status=409)
            if _owned(existing):  # created since the listing: mpigate's
                return await self.api.merge_patch(f"{collection}/{REPORT_NAME}", body)
        except KubeError as exc:
            log.warning("writing report %s in %s failed: %s", api, where, exc)
            self.metrics.report_writes.labels(api, "error").inc()
            return None
        if (api, namespace) not in self._foreign:
            self._foreign.add((api, namespace))
            log.warning(
                "%s %s %r in %s exists and is not mpigate's (no label %s=%s): left as it is, and the "
                "results of %s are not published there; rename or remove that object",
                api,
                NAMESPACED_KIND[api][0] if namespace else CLUSTER_KIND[api][0],
                REPORT_NAME,
                where,
                MANAGED_BY_LABEL,
                MANAGED_BY_VALUE,
                where,
            )
        self.metrics.report_writes.labels(api, "foreign").inc()
        return None


@dataclass(frozen=True, slots=True)
class _Stored:
    """One of mpigate's reports as listed: its resourceVersion and a digest of what it says."""

    resource_version: str
    content: str


def _owned(report: Mapping[str, Any]) -> bool:
    """Whether the report is mpigate's: it carries mpigate's managed-by label."""
    return _labels(report).get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE


def _content(obj: Any, patch: Any) -> Any:
    """What of ``obj`` the JSON merge patch ``patch`` would set or remove (RFC 7386): ``obj``
    restricted to the keys of ``patch``, nested mappings alike, absent and null values left out.
    Equal for the stored object and for the patch itself exactly when the patch changes nothing."""
    if not isinstance(patch, Mapping) or not isinstance(obj, Mapping):
        return obj
    return {
        k: obj[k] if v is None else _content(obj[k], v)
        for k, v in patch.items()
        if k in obj and obj[k] is not None
    }


def interval_wait(config: Config | None, now: dt.datetime) -> tuple[float, str]:
    """How long until the next pass, and why: the interval, or an exception's expiry if sooner."""
    if config is None:
        return 60.0, "interval"
    settings = config.org.background_audit
    wait, reason = float(settings.interval_seconds), "interval"
    expiry = next_expiry(config, now)
    if expiry is not None:
        until = (expiry - now).total_seconds()
        if until < wait:
            wait, reason = max(until, 0.0) + 1.0, "exception-expired"
    return wait, reason
