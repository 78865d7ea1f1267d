"""Streaming aggregation of audit records and API-server events into a compliance report.

:class:`ReportBuilder` takes records one at a time (``add_entry`` for mpigate audit records,
``add_api_event`` for Kubernetes audit events), routes each to the part of the report it feeds —
:class:`~.decisions.Decisions`, :class:`~.activity.Activity`,
:class:`~.apiserver.ApiServerEvents`, :class:`~.residency.Residency`,
:class:`~.chargeback.Chargeback` — and keeps only counters and bounded samples: its memory
depends on the number of teams, rules, days, regions and actors, never on the number of records.
``finish`` turns the state into the report document (see ``schema/report.schema.json`` and
docs/compliance.md).

The hot path is ``add_entry``: a report over a million records calls it a million times, so it
uses local variables and plain dicts, and builds nothing per record that it does not keep.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mpigate.audit.reader import AuditEntry, ChainReport
from mpigate.audit.status import trail_status
from mpigate.catalogue import all_rules

from ._util import add_counts, now, period_days
from .activity import Activity
from .apiserver import ApiServerEvents
from .assess import STATUS_RULES, EvidenceFacts, assess_control
from .chargeback import COST_CENTER_LABEL, Chargeback
from .controls import RECORD_KINDS, all_frameworks
from .decisions import Decisions
from .k8saudit import ApiEvent, K8sAuditStats
from .options import NO_TEAM, OUTCOMES, REPORT_API_VERSION, ReportOptions
from .residency import Residency

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
        self.chargeback = Chargeback()

    # ------------------------------------------------------------------ mpigate records

    def add_entry(self, entry: AuditEntry) -> None:
        """One audit record (any stage); records outside the period are only counted as read."""
        self.records_read += 1
        time = entry.time
        record = entry.record
        stage = entry.stage
        since, until = self._since, self._until
        if (since is not None and time < since) or (until is not None and time >= until):
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
        by_chain[entry.chain] = by_chain.get(entry.chain, 0) + 1
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
            self._validate(record, time, team)
        elif stage == "mutate":
            self.decisions.add_mutate(record)
        elif stage == "lifecycle":
            self.chargeback.add(record, time)
        elif stage == "evidence":
            self.residency.add(record, time, team)

    def _validate(self, record: Any, time: str, team: str) -> None:
        outcome, kind, namespace, name, operation, user, demand = self.decisions.add_validate(
            record, time, team
        )
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
        )

    # ------------------------------------------------------------------ API-server events

    def add_api_event(self, event: ApiEvent) -> None:
        """One API-server audit event (a trainer write or an RBAC denial)."""
        opts = self.options
        time = event.time
        if (opts.since is not None and time < opts.since) or (opts.until is not None and time >= opts.until):
            return
        if opts.team is not None and self.ns_teams.get(event.namespace or "") != opts.team:
            return
        self.api_server.add(event, self.activity)

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
        self.chargeback.merge(later.chargeback)

    # ------------------------------------------------------------------ result

    def allowed_regions(self, team: str) -> frozenset[str] | None:
        """Where a team's pods may run (see :meth:`Residency.allowed_regions`)."""
        return self.residency.allowed_regions(team)

    def finish(
        self, chains: Iterable[ChainReport] = (), k8s_files: Iterable[K8sAuditStats] = ()
    ) -> dict[str, Any]:
        """The report document (plain JSON values, see schema/report.schema.json)."""
        chain_reports = list(chains)
        k8s = list(k8s_files)
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
        facts = EvidenceFacts(
            validate_by_kind=decisions.validate_by_kind,
            effects=decisions.effects,
            advisory=decisions.advisory,
            expired=decisions.expired_waivers,
            counts={
                "mutate": decisions.mutations,
                "lifecycle": self.chargeback.records,
                "evidence": self.residency.records,
                "checkpoint": self.checkpoints,
                "k8s-activity": api.writes,
                "k8s-rbac-denied": api.rbac_total,
            },
            broken=[c.chain for c in broken],
            unverified_signatures=[c.chain for c in chain_reports if c.signatures != "verified"],
            outside=self.residency.counts()[0],
            unjudged=api.unjudged,
            k8s_given=k8s_given,
        )
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
            s: sum(1 for f in controls for c in f["controls"] if c["status"] == s)
            for s in ("met", "attention", "no evidence")
        }
        return {
            "apiVersion": REPORT_API_VERSION,
            "kind": "ComplianceReport",
            "generated": opts.generated or now(),
            "period": {
                "from": opts.since,
                "to": opts.until,
                "firstRecord": self.first_time,
                "lastRecord": self.last_time,
                "days": len(days),
            },
            "filters": {"team": opts.team, "frameworks": list(opts.frameworks)},
            "configRevision": opts.config_revision,
            "inputs": {
                "chains": [
                    {**c.to_dict(), "recordsInPeriod": self.by_chain.get(c.chain, 0)} for c in chain_reports
                ],
                "k8sAudit": [s.to_dict() for s in k8s],
            },
            "integrity": integrity,
            "totals": {
                "recordsRead": self.records_read,
                "recordsInPeriod": self.records_in_period,
                "byStage": dict(sorted(self.by_stage.items())),
                "decisions": {o: decisions_section["byOutcome"].get(o, 0) for o in OUTCOMES},
                "dryRun": decisions.dry_run,
                "teams": sorted(self.teams),
                "apiServerEvents": api.in_period,
            },
            "decisions": decisions_section,
            "rules": decisions.rules_section(rules),
            "denials": decisions.denials_section(rules),
            "activity": self.activity.section(api.activity_section(k8s_given)),
            "rbacDenials": api.rbac_section(),
            "exceptions": decisions.exceptions_section(),
            "residency": self.residency.section(opts.max_events),
            "security": decisions.security_section(rules),
            "chargeback": self.chargeback.section(days),
            "controls": controls,
            "controlSummary": summary_status,
            "statusRules": dict(STATUS_RULES),
            "recordKinds": dict(RECORD_KINDS),
            "limits": {
                "maxExamples": opts.max_examples,
                "maxEvents": opts.max_events,
                "maxKeys": opts.max_keys,
                "actorsOverflowed": self.activity.actors.overflowed,
            },
        }
