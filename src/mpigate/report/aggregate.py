"""Streaming aggregation of audit records and API-server events into a compliance report.

:class:`ReportBuilder` takes records one at a time (``add_entry`` for mpigate audit records,
``add_api_event`` for Kubernetes audit events), routes each to the part of the report it feeds —
:class:`~.decisions.Decisions`, :class:`~.activity.Activity`,
:class:`~.apiserver.ApiServerEvents`, :class:`~.residency.Residency`,
:class:`~.chargeback.Chargeback` — and keeps only counters and bounded samples: its memory
depends on the number of teams, rules, days, regions and actors, not on the number of records
(except the chargeback's one small entry per run segment, which de-duplication needs).
``finish`` turns the state into the report document (see ``schema/report.schema.json`` and
docs/compliance.md).

The hot path is ``add_entry``: a report over a million records calls it a million times, so it
uses local variables and plain dicts, and builds nothing per record that it does not keep.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from mpigate.audit._canonical import canonical_bytes
from mpigate.audit.reader import AuditEntry, ChainReport
from mpigate.audit.status import trail_status
from mpigate.catalogue import all_rules

from ._util import add_counts, now, period_days
from .activity import Activity
from .apiserver import ApiServerEvents
from .assess import STATUS_RULES, STATUSES, assess_control
from .chargeback import COST_CENTER_LABEL, Chargeback
from .completeness import Reconciliation, Span
from .controls import RECORD_KINDS, all_frameworks
from .decisions import Decisions
from .findings import completeness_section, evidence_facts
from .inventory import ImageInventory
from .k8saudit import CATEGORIES, ApiEvent, K8sAuditStats
from .options import NO_TEAM, OUTCOMES, REPORT_API_VERSION, ReportOptions
from .outside import OutsideEvents, PssTimeline
from .residency import Residency
from .revisions import Revisions
from .sampling import Sampler
from .standing import StandingViolations

__all__ = ["COST_CENTER_LABEL", "OUTCOMES", "REPORT_API_VERSION", "ReportBuilder", "ReportOptions"]


class ReportBuilder:
    """Aggregates one or more inputs. Feed records with :meth:`add_entry` (one chain's records in
    chain order) and :meth:`add_api_event`, combine builders of other inputs with :meth:`merge`,
    then call :meth:`finish` once.

    Nothing depends on the order of records *across* inputs, so inputs can be aggregated in
    parallel and merged: residency is judged at the end (against every region known for a team),
    samples keep the most recent by time, and GPU-seconds are per run segment, so they add up.
    """

    def __init__(self, options: ReportOptions | None = None) -> None:
        self.options = opts = options or ReportOptions()
        self._since, self._until, self._team = opts.since, opts.until, opts.team
        self._reconcile = opts.reconcile
        # totals
        self.records_read = 0
        self.records_in_period = 0
        self.records_not_intact = 0
        self.by_stage: dict[str, int] = {}
        self.by_chain: dict[str, int] = {}
        self.first_time: str | None = None
        self.last_time: str | None = None
        self.teams: set[str] = set()
        self.checkpoints = 0
        self.ns_teams: dict[str, str] = dict(opts.namespace_teams)
        # the parts of the report
        self.decisions = Decisions(opts)
        self.activity = Activity(opts.max_keys, opts.max_events)
        self.api_server = ApiServerEvents(opts.max_keys, opts.max_examples)
        self.residency = Residency(opts.team_regions, opts.max_examples, opts.max_keys)
        self.standing = StandingViolations(opts.since, opts.max_keys, opts.max_events)
        self.chargeback = Chargeback(opts.since, opts.until, opts.max_events)
        self.revisions = Revisions(opts.since, opts.max_keys)
        self.images = ImageInventory(opts.max_keys)
        self.sampler = Sampler(opts.sample, opts.seed)
        self.reconciliation = Reconciliation()
        policy = opts.config_policy
        pss = policy.get("podSecurity") if isinstance(policy, Mapping) else None
        default = (
            (str(pss.get("level")), str(pss.get("version") or "latest"), opts.config_revision or "")
            if isinstance(pss, Mapping)
            else None
        )
        self.outside = OutsideEvents(
            self.ns_teams, PssTimeline(opts.pss_timeline, default), opts.max_keys, opts.max_examples
        )
        # completeness: every record's time per chain, who wrote each chain
        self.spans: dict[str, Span] = {}
        self.chain_sources: dict[str, set[str]] = {}
        self.admitted_creates = 0  # TrainJobs admitted on CREATE (placements are expected)
        self.api_last: str | None = None  # the newest API-server event in the period
        self._chain = ""
        self._span: Span | None = None

    # ------------------------------------------------------------------ mpigate records

    def add_entry(self, entry: AuditEntry) -> None:
        """One audit record (any stage); records outside the period are only counted as read
        (and tell the config in force when the period began)."""
        self.records_read += 1
        time = entry.time
        record = entry.record
        stage = entry.stage
        chain = entry.chain
        span = self._span
        if span is None or chain != self._chain:
            span = self.spans.get(chain)
            if span is None:
                span = self.spans[chain] = Span(self.options.heartbeat)
                self.chain_sources[chain] = set()
            self._chain, self._span = chain, span
        span.add(time)
        if stage == "genesis" or span.first == span.last:
            source = record.get("source")
            if type(source) is str and source:
                self.chain_sources[chain].add(source)
        since, until = self._since, self._until
        in_period = (since is None or time >= since) and (until is None or time < until)
        if stage == "evidence":
            evidence = record.get("evidence")
            kind = evidence.get("kind") if type(evidence) is dict else None
            if kind == "config":
                self.revisions.add_config(record, time, chain, in_period)
            elif (
                kind == "standing-violation"
                and (until is None or time < until)
                and (self._team is None or record.get("team") == self._team)
            ):
                # found before the period, it may still stand at its end
                self.standing.add(record, time)
        if not in_period:
            if stage == "lifecycle" and (self._team is None or record.get("team") == self._team):
                # a segment closed before or after the period may have run in it (by its usage)
                self.chargeback.add(record, time, (chain, entry.seq))
            return
        if stage == "checkpoint":
            self.checkpoints += 1
        team = record.get("team")
        if self._team is not None and team != self._team and stage != "checkpoint":
            return
        self.records_in_period += 1
        if not entry.intact:
            self.records_not_intact += 1
        by_stage = self.by_stage
        by_stage[stage] = by_stage.get(stage, 0) + 1
        by_chain = self.by_chain
        by_chain[chain] = by_chain.get(chain, 0) + 1
        if self.first_time is None or time < self.first_time:
            self.first_time = time
        if self.last_time is None or time > self.last_time:
            self.last_time = time
        if type(team) is str and team:
            if team not in self.teams:
                self.teams.add(team)
        else:
            team = NO_TEAM
        if stage == "validate":
            self._validate(entry, record, time, team)
        elif stage == "mutate":
            self.decisions.add_mutate(record)
            if self._reconcile:
                self.reconciliation.add_record("mutate", chain, entry.seq, entry.hash, time)
        elif stage == "lifecycle":
            self.chargeback.add(record, time, (chain, entry.seq))
        elif stage == "evidence":
            self.residency.add(record, time, team, (chain, entry.seq, entry.hash))

    def _validate(self, entry: AuditEntry, record: Any, time: str, team: str) -> None:
        digest = entry.hash
        ref = (entry.chain, entry.seq, digest)
        outcome, kind, namespace, name, operation, user, demand = self.decisions.add_validate(
            record, time, team, ref
        )
        self.revisions.add_decision(record.get("revision"), time)
        if self._reconcile:
            self.reconciliation.add_record("validate", entry.chain, entry.seq, digest, time)
        ns_teams = self.ns_teams
        if (
            namespace
            and namespace not in ns_teams
            and team != NO_TEAM
            and len(ns_teams) < self.options.max_keys
        ):
            ns_teams[namespace] = team
        if outcome != "denied":
            region = demand.get("region") if type(demand) is dict else None
            if type(region) is str and region:
                self.residency.learn(team, region)
            if demand is not None:
                self.images.add(demand, time, team)
            if operation == "CREATE" and kind == "TrainJob":
                self.admitted_creates += 1
        request = record.get("request")
        uid = request.get("uid") if type(request) is dict else None
        activity = self.activity
        result = "denied" if outcome == "denied" else "admitted"
        user_kind = activity.actor_kind(user)
        activity.add(
            "mpigate",
            time,
            user,
            user_kind,
            "",
            operation.lower(),
            kind,
            namespace,
            name,
            result,
            outcome,
            None,
            ref,
            uid,
        )
        sampler = self.sampler
        if sampler.size:
            priority = sampler.offer(digest)
            if priority is not None:
                violations = record.get("violations")
                rules = sorted(
                    {str(v.get("id")) for v in violations if type(v) is dict}
                    if type(violations) is list
                    else set()
                )
                dry = request.get("dryRun") is True if type(request) is dict else False
                sampler.add(
                    priority,
                    (
                        time,
                        ref,
                        uid,
                        team,
                        kind,
                        namespace,
                        name,
                        user,
                        operation,
                        outcome,
                        rules,
                        record.get("revision"),
                        dry,
                    ),
                )

    # ------------------------------------------------------------------ API-server events

    def add_api_event(self, event: ApiEvent) -> None:
        """One API-server audit event the reader classified (:data:`~.k8saudit.CATEGORIES`)."""
        opts = self.options
        outside = self.outside
        if not opts.in_period(event.time):
            for category in event.categories:
                outside.skip(category, "outside the period")
            return
        if opts.team is not None and self.ns_teams.get(event.namespace or "") != opts.team:
            for category in event.categories:
                outside.skip(category, f"outside the namespaces of team {opts.team}")
            return
        if self.api_last is None or event.time > self.api_last:
            self.api_last = event.time
        categories = event.categories
        if "k8s-activity" in categories or "k8s-rbac-denied" in categories:
            self.api_server.add(event, self.activity)
        else:
            self.api_server.in_period += 1
        outside.add(event, self.activity.actor_kind(event.actor))
        if event.records:
            for webhook, position in event.records:
                self.reconciliation.add_claim(webhook, position, event.time)
        elif event.mpigate_decision is not None:
            self.reconciliation.unannotated += 1

    # ------------------------------------------------------------------ merging

    def merge(self, later: ReportBuilder) -> None:
        """Add another input's aggregate (associative: the order of merging changes nothing but
        the order of equal-time samples)."""
        self.records_read += later.records_read
        self.records_in_period += later.records_in_period
        self.records_not_intact += later.records_not_intact
        add_counts(self.by_stage, later.by_stage)
        add_counts(self.by_chain, later.by_chain)
        times = [t for t in (self.first_time, later.first_time) if t is not None]
        self.first_time = min(times) if times else None
        times = [t for t in (self.last_time, later.last_time) if t is not None]
        self.last_time = max(times) if times else None
        self.teams |= later.teams
        self.checkpoints += later.checkpoints
        for namespace, team in later.ns_teams.items():
            if namespace not in self.ns_teams and len(self.ns_teams) < self.options.max_keys:
                self.ns_teams[namespace] = team
        self.decisions.merge(later.decisions)
        self.activity.merge(later.activity)
        self.api_server.merge(later.api_server)
        self.residency.merge(later.residency)
        self.standing.merge(later.standing)
        self.chargeback.merge(later.chargeback)
        self.revisions.merge(later.revisions)
        self.images.merge(later.images)
        self.sampler.merge(later.sampler)
        self.reconciliation.merge(later.reconciliation)
        self.outside.merge(later.outside)
        self.admitted_creates += later.admitted_creates
        if later.api_last is not None and (self.api_last is None or later.api_last > self.api_last):
            self.api_last = later.api_last
        for chain, span in later.spans.items():
            if chain not in self.spans:  # a chain is one input: it is never split across builders
                self.spans[chain] = span
                self.chain_sources[chain] = set(later.chain_sources.get(chain, ()))

    # ------------------------------------------------------------------ result

    def allowed_regions(self, team: str) -> frozenset[str] | None:
        """Where a team's pods may run (see :meth:`Residency.allowed_regions`)."""
        return self.residency.allowed_regions(team)

    def finish(
        self,
        chains: Iterable[ChainReport] = (),
        k8s_files: Iterable[K8sAuditStats] = (),
        segment_digests: Mapping[str, list[dict[str, Any]]] | None = None,
    ) -> dict[str, Any]:
        """The report document (plain JSON values, see schema/report.schema.json).
        ``segment_digests``: chain -> [{path, sha256, bytes}] of its segment files."""
        chain_reports = list(chains)
        k8s = list(k8s_files)
        digests = segment_digests or {}
        opts = self.options
        rules = all_rules()
        decisions, api = self.decisions, self.api_server
        broken = [c for c in chain_reports if not c.ok]
        first_problem = None
        for chain in broken:
            problem = chain.errors[0]
            first_problem = {"chain": chain.chain, **problem.to_dict()}
            break
        integrity = {
            "ok": not broken,
            "chains": len(chain_reports),
            "broken": len(broken),
            "records": sum(c.records for c in chain_reports),
            "recordsNotIntact": self.records_not_intact,
            "signatures": {
                state: sum(1 for c in chain_reports if c.signatures == state)
                for state in ("verified", "unchecked", "unsigned", "failed", "missing")
            },
            "firstProblem": first_problem,
            # verified / pending / unverifiable since <time> / broken, per chain (mpigate.audit.status)
            "status": trail_status(chain_reports).to_dict(),
        }
        days = period_days(
            opts.since,
            opts.until,
            self.first_time,
            self.last_time,
            decisions.days_seen() | set(self.chargeback.gpu_by_day),
        )
        decisions_section = decisions.decisions_section(days)
        k8s_given = bool(k8s)
        fallback = (
            {opts.config_revision: dict(opts.config_policy)}
            if opts.config_revision and opts.config_policy
            else {}
        )
        revisions = self.revisions.in_force(fallback)
        completeness = completeness_section(self, chain_reports, k8s)
        facts = evidence_facts(self, chain_reports, k8s, completeness, revisions)
        frameworks = all_frameworks()
        controls: list[dict[str, Any]] = [
            {
                "framework": name,
                "title": frameworks[name].title,
                "controls": [assess_control(control, facts, rules) for control in frameworks[name].controls],
            }
            for name in opts.frameworks
        ]
        summary_status = {
            s: sum(1 for f in controls for c in f["controls"] if c["status"] == s) for s in STATUSES
        }
        inputs = {
            "chains": [
                {
                    **c.to_dict(),
                    "recordsInPeriod": self.by_chain.get(c.chain, 0),
                    "segmentDigests": digests.get(c.chain, []),
                }
                for c in chain_reports
            ],
            "k8sAudit": [s.to_dict() for s in k8s],
        }
        generated = opts.generated or now()
        report_id = hashlib.sha256(
            canonical_bytes(
                {
                    "generated": generated,
                    "filters": [opts.team, list(opts.frameworks), opts.since, opts.until],
                    "chains": [[c["chain"], c["segmentDigests"]] for c in inputs["chains"]],
                    "k8s": [f["sha256"] for f in inputs["k8sAudit"]],
                }
            )
        ).hexdigest()[:20]
        requests = decisions.requests
        return {
            "apiVersion": REPORT_API_VERSION,
            "kind": "ComplianceReport",
            "reportId": report_id,
            "generated": generated,
            "period": {
                "from": opts.since,
                "to": opts.until,
                "firstRecord": self.first_time,
                "lastRecord": self.last_time,
                "days": len(days),
                "seconds": completeness["periodSeconds"],
            },
            "filters": {"team": opts.team, "frameworks": list(opts.frameworks)},
            "configRevision": opts.config_revision,
            "revisions": revisions,
            "inputs": inputs,
            "integrity": integrity,
            "completeness": completeness,
            "totals": {
                "recordsRead": self.records_read,
                "recordsInPeriod": self.records_in_period,
                "byStage": dict(sorted(self.by_stage.items())),
                "decisions": {o: decisions_section["byOutcome"].get(o, 0) for o in OUTCOMES},
                "requests": requests,
                "findings": decisions.findings,
                "mutatedRequests": decisions.mutations,
                "dryRun": decisions.dry_run,
                "teams": sorted(self.teams),
                "apiServerEvents": api.in_period,
            },
            "decisions": decisions_section,
            "rules": decisions.rules_section(rules),
            "denials": decisions.denials_section(rules),
            "activity": self.activity.section(api.activity_section(k8s_given)),
            "rbacDenials": api.rbac_section(),
            "apiServerEvents": self._api_server_events(k8s),
            "exceptions": decisions.exceptions_section(),
            "residency": self.residency.section(opts.max_events),
            "standingViolations": self.standing.section(),
            "security": decisions.security_section(rules),
            "imageInventory": self.images.section(),
            "chargeback": self.chargeback.section(days),
            "sample": self._sample(),
            "controls": controls,
            "controlSummary": summary_status,
            "crossCuttingReasons": {"all": list(facts.general), "apiServerLog": list(facts.k8s_general)},
            "statusRules": dict(STATUS_RULES),
            "recordKinds": dict(RECORD_KINDS),
            "limits": {
                "maxExamples": opts.max_examples,
                "maxEvents": opts.max_events,
                "maxKeys": opts.max_keys,
                "actorsOverflowed": self.activity.actors.overflowed,
            },
        }

    def _api_server_events(self, k8s: list[K8sAuditStats]) -> dict[str, Any]:
        controls: dict[str, list[str]] = {}
        for framework in all_frameworks().values():
            for control in framework.controls:
                for kind in control.records:
                    if kind.startswith("k8s-"):
                        controls.setdefault(kind, []).append(control.full_id)
        section = self.outside.section(CATEGORIES, controls)
        read = sum(s.events for s in k8s)
        skipped: dict[str, int] = {}
        for stats in k8s:
            add_counts(skipped, stats.skipped)
        by_category: dict[tuple[str, str], int] = dict(self.outside.not_evaluated)
        used = sum(s.used for s in k8s)
        section["counts"] = {
            "read": read,
            "used": used,
            "notUsed": [
                {"reason": r, "events": n} for r, n in sorted(skipped.items(), key=lambda kv: -kv[1])
            ],
            "notEvaluated": [
                {"category": c or None, "reason": r, "events": n}
                for (c, r), n in sorted(by_category.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
            "malformed": sum(s.malformed for s in k8s),
        }
        return section

    def _sample(self) -> dict[str, Any]:
        sampler = self.sampler
        return {
            "size": sampler.size,
            "seed": sampler.seed if sampler.size else None,
            "population": sampler.population,
            "unit": "requests (validate records in the period)",
            "items": [
                {
                    "time": s[0],
                    "record": f"{s[1][0]}:{s[1][1]}:{s[1][2]}",
                    "requestUID": s[2] or None,
                    "team": s[3],
                    "kind": s[4],
                    "namespace": s[5] or None,
                    "name": s[6] or None,
                    "user": s[7],
                    "operation": s[8],
                    "decision": s[9],
                    "rules": s[10],
                    "revision": s[11] if isinstance(s[11], str) else None,
                    "dryRun": s[12],
                }
                for s in sampler.items()
            ],
        }
