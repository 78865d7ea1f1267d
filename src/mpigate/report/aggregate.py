"""Streaming aggregation of audit records and API-server events into a compliance report.

:class:`ReportBuilder` takes records one at a time (``add_entry`` for mpigate audit records,
``add_api_event`` for Kubernetes audit events) and keeps only counters and bounded samples:
its memory depends on the number of teams, rules, days, regions and actors, never on the number
of records. ``finish`` turns the state into the report document (see ``schema/report.schema.json``
and docs/compliance.md).

The hot path is ``add_entry``: a report over a million records calls it a million times, so it
uses local variables and plain dicts, and builds nothing per record that it does not keep.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mpigate.audit.reader import AuditEntry, ChainReport
from mpigate.catalogue import all_rules

from ._bounded import OTHERS, KeyedSamples, LimitedCounter
from .assess import EFFECTS, STATUS_RULES, EvidenceFacts, assess_control
from .controls import FRAMEWORK_FILES, RECORD_KINDS, all_frameworks
from .k8saudit import ApiEvent, K8sAuditStats, actor_kind, exempt_from_webhook, normalize_time

__all__ = ["COST_CENTER_LABEL", "OUTCOMES", "REPORT_API_VERSION", "ReportBuilder", "ReportOptions"]

REPORT_API_VERSION = "mpigate.io/v1alpha1"
OUTCOMES = ("allowed", "allowed-with-warnings", "denied")
COST_CENTER_LABEL = "mpigate.io/cost-center"
NO_TEAM = "(no team)"
NO_COST_CENTER = "(none recorded)"

_PLACEMENT_KINDS = frozenset({"placement", "residency"})
# Lifecycle events that close a run segment (and carry its GPU-seconds), and those that end a job.
_CLOSING_EVENTS = frozenset({"suspended", "succeeded", "failed", "deleted", "finished"})
_ENDING_EVENTS = frozenset({"succeeded", "failed", "deleted", "finished"})


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """What to report on.

    ``since``/``until`` are RFC 3339 UTC times as records write them (``until`` exclusive);
    ``namespace_teams`` and ``team_regions`` come from the config when one is given (otherwise
    the report learns them from the records); ``max_*`` bound the samples kept."""

    since: str | None = None
    until: str | None = None
    team: str | None = None
    frameworks: tuple[str, ...] = tuple(FRAMEWORK_FILES)
    namespace_teams: Mapping[str, str] = field(default_factory=dict)
    team_regions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    config_revision: str | None = None
    max_examples: int = 5
    max_events: int = 200
    max_keys: int = 10_000
    generated: str | None = None

    def __post_init__(self) -> None:
        # Plain dicts: options travel to worker processes, and read-only proxies do not pickle.
        object.__setattr__(self, "namespace_teams", dict(self.namespace_teams))
        object.__setattr__(self, "team_regions", {k: tuple(v) for k, v in self.team_regions.items()})
        # Bounds compare as strings with record times: bring any RFC 3339 time or date to that form.
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, normalize_time(value))


@dataclass(slots=True)
class _ExceptionUse:
    approver: str = ""
    ticket: str = ""
    expires: str = ""
    justification: str = ""
    rules: tuple[str, ...] = ()
    uses: int = 0
    after_expiry: int = 0
    first: str = ""
    last: str = ""
    teams: set[str] = field(default_factory=set)
    waived: dict[str, int] = field(default_factory=dict)

    def merge(self, other: _ExceptionUse) -> None:
        if other.last >= self.last:  # the latest terms win
            self.approver, self.ticket, self.expires = other.approver, other.ticket, other.expires
            self.justification, self.rules, self.last = other.justification, other.rules, other.last
        self.first = min(self.first, other.first)
        self.uses += other.uses
        self.after_expiry += other.after_expiry
        self.teams |= set(sorted(other.teams)[: max(0, 64 - len(self.teams))])
        _add_counts(self.waived, other.waived)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


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
        rules = all_rules()
        self._advisory = frozenset(r.id for r in rules.values() if r.advisory)
        self._security = frozenset(r.id for r in rules.values() if r.family == "security")
        k = opts.max_keys
        # totals
        self.records_read = 0
        self.records_in_period = 0
        self.records_not_intact = 0
        self.by_stage: dict[str, int] = {}
        self.by_chain: dict[str, int] = {}
        self.first_time: str | None = None
        self.last_time: str | None = None
        self.teams: set[str] = set()
        # decisions
        self.cube: dict[tuple[str, str, str, str], int] = {}  # (day, team, outcome, rule or "")
        self.decision_counts: dict[tuple[str, str, str], int] = {}  # (day, team, outcome)
        self.validate_by_kind: dict[str, int] = {}
        self.dry_run = 0
        self.effects: dict[tuple[str, str], int] = {}  # (rule, effect) -> violations
        self.team_effects: dict[tuple[str, str, str], int] = {}  # (team, rule, effect), security only
        self.denial_examples: KeyedSamples[str, tuple[Any, ...]] = KeyedSamples(opts.max_examples)
        self.security_examples: deque[tuple[Any, ...]] = deque(maxlen=opts.max_events)
        self.expired_waivers: dict[str, int] = {}  # rule -> waivers by an expired exception
        self.exceptions: dict[str, _ExceptionUse] = {}
        self.mutations = 0
        self.mutations_patched = 0
        # activity: (source, actor, actor kind, via, verb, kind, result) -> count
        self.actors: LimitedCounter[tuple[str, ...]] = LimitedCounter(k, ("", OTHERS, "", "", "", "", ""))
        self.events: deque[tuple[Any, ...]] = deque(maxlen=opts.max_events)  # time at index 1
        self.objects: LimitedCounter[tuple[str, str, str]] = LimitedCounter(k, ("", "", OTHERS))
        self._kinds: dict[str, str] = {}  # username -> actor kind (a cache)
        # API server
        self.k8s_in_period = 0
        self.k8s_writes = 0
        self.k8s_write_results: dict[tuple[str, str], int] = {}  # (verb, result) -> count
        self.unjudged = 0
        self.unjudged_examples: deque[tuple[Any, ...]] = deque(maxlen=opts.max_examples * 4)
        self.rbac: LimitedCounter[tuple[str, str, str, str]] = LimitedCounter(k, (OTHERS, "", "", ""))
        self.rbac_total = 0
        self.rbac_examples: deque[tuple[Any, ...]] = deque(maxlen=opts.max_examples * 4)
        self.ns_teams: dict[str, str] = dict(opts.namespace_teams)
        # lifecycle and chargeback
        self.lifecycle_events: dict[str, int] = {}
        self.gpu: dict[tuple[str, str], list[float]] = {}  # (team, cost center) -> [seconds, jobs ended]
        self.gpu_by_day: dict[str, float] = {}
        self.lifecycle_without_seconds = 0
        # residency: (region, team) -> [placements, judged by the controller, of those outside]
        self.placements: dict[tuple[str, str], list[int]] = {}
        self.placement_samples: KeyedSamples[tuple[str, str], tuple[Any, ...]] = KeyedSamples(
            opts.max_examples, max_keys=k
        )
        self.evidence_kinds: dict[str, int] = {}
        self.learned_regions: dict[str, set[str]] = {}  # team -> regions admission resolved to
        self.expected_regions: dict[str, set[str]] = {}  # team -> regions the controller expected
        # integrity evidence
        self.checkpoints = 0

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
            self.mutations += 1
            if record.get("patch"):
                self.mutations_patched += 1
        elif stage == "lifecycle":
            self._lifecycle(record, time)
        elif stage == "evidence":
            self._evidence(record, time, team)

    def _actor_kind(self, user: str) -> str:
        kind = self._kinds.get(user)
        if kind is None:
            kind = actor_kind(user)
            if len(self._kinds) < self.options.max_keys:
                self._kinds[user] = kind
        return kind

    def _validate(self, record: Mapping[str, Any], time: str, team: str) -> None:
        day = time[:10]
        outcome = record.get("decision")
        if type(outcome) is not str:
            outcome = _text(outcome)
        request = record.get("request")
        if type(request) is not dict:
            request = {}
        obj = record.get("object")
        if type(obj) is not dict:
            obj = {}
        kind = obj.get("kind") or ""
        namespace = obj.get("namespace") or ""
        name = obj.get("name") or ""
        by_kind = self.validate_by_kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
        if request.get("dryRun") is True:
            self.dry_run += 1
        ns_teams = self.ns_teams
        if (
            namespace
            and namespace not in ns_teams
            and team != NO_TEAM
            and len(ns_teams) < self.options.max_keys
        ):
            ns_teams[namespace] = team
        dkey = (day, team, outcome)
        counts = self.decision_counts
        counts[dkey] = counts.get(dkey, 0) + 1
        cube = self.cube
        operation = request.get("operation") or ""
        user = _user(request)
        violations = record.get("violations")
        if violations and type(violations) is list:
            effects = self.effects
            seen: set[str] = set()
            for violation in violations:
                if type(violation) is not dict:
                    continue
                rule = violation.get("id")
                if type(rule) is not str:
                    rule = _text(rule)
                effect = self._effect(violation, rule)
                ekey = (rule, effect)
                effects[ekey] = effects.get(ekey, 0) + 1
                if rule in seen:
                    continue
                seen.add(rule)
                key = (day, team, outcome, rule)
                cube[key] = cube.get(key, 0) + 1
                security = rule in self._security
                if effect == "denied" or security:
                    sample = (
                        time,
                        team,
                        kind,
                        namespace,
                        name,
                        user,
                        rule,
                        effect,
                        _text(violation.get("message")),
                        operation,
                    )
                    if effect == "denied":
                        self.denial_examples.add(rule, sample)
                    if security:
                        tkey = (team, rule, effect)
                        self.team_effects[tkey] = self.team_effects.get(tkey, 0) + 1
                        self.security_examples.append(sample)
        else:
            key = (day, team, outcome, "")
            cube[key] = cube.get(key, 0) + 1
        exceptions = record.get("exceptions")
        if exceptions:
            self._exceptions(exceptions, violations or (), time, team)
        if outcome != "denied":
            demand = record.get("demand")
            region = demand.get("region") if type(demand) is dict else None
            if type(region) is str and region:
                regions = self.learned_regions.get(team)
                if regions is None:
                    regions = self.learned_regions[team] = set()
                if region not in regions and len(regions) < 64:
                    regions.add(region)
        verb = operation.lower()
        result = "denied" if outcome == "denied" else "admitted"
        user_kind = self._actor_kind(user)
        self.actors.add(("mpigate", user, user_kind, "", verb, kind, result))
        self.objects.add((namespace, kind, name))
        self.events.append(
            ("mpigate", time, user, user_kind, "", verb, kind, namespace, name, result, outcome, None)
        )

    def _effect(self, violation: dict[str, Any], rule: str) -> str:
        if violation.get("waivedBy"):
            return "waived"
        mode = violation.get("mode")
        if mode == "enforce":
            return "warned" if rule in self._advisory else "denied"
        if mode == "warn":
            return "warned"
        return "audited"

    def _exceptions(self, exceptions: Any, violations: Any, time: str, team: str) -> None:
        day = time[:10]
        for item in exceptions if type(exceptions) is list else ():
            if type(item) is not dict:
                continue
            name = _text(item.get("name"))
            use = self.exceptions.get(name)
            if use is None:
                if len(self.exceptions) >= self.options.max_keys:
                    continue
                use = self.exceptions[name] = _ExceptionUse(first=time)
            if time >= use.last:
                # the latest record's terms win: an exception's expiry may be extended in Git
                rules = item.get("rules")
                use.approver = _text(item.get("approver"))
                use.ticket = _text(item.get("ticket"))
                use.expires = _text(item.get("expires"))
                use.justification = _text(item.get("justification"))
                use.rules = tuple(_text(r) for r in rules) if type(rules) is list else ()
                use.last = time
            use.first = min(use.first, time)
            use.uses += 1
            if len(use.teams) < 64:
                use.teams.add(team)
            expires = _text(item.get("expires"))
            expired = bool(expires) and day > expires
            if expired:
                use.after_expiry += 1
            for violation in violations if type(violations) is list else ():
                if type(violation) is dict and violation.get("waivedBy") == name:
                    rule = _text(violation.get("id"))
                    use.waived[rule] = use.waived.get(rule, 0) + 1
                    if expired:
                        self.expired_waivers[rule] = self.expired_waivers.get(rule, 0) + 1

    def _lifecycle(self, record: Mapping[str, Any], time: str) -> None:
        # The controller's contract (docs/controller.md): suspended, succeeded, failed and deleted
        # close a run segment and carry its GPU-seconds; other events carry none. So GPU-seconds
        # add up, with no state per job, and every segment is charged to the day it closed.
        lifecycle = record.get("lifecycle")
        if type(lifecycle) is not dict:
            lifecycle = {}
        event = lifecycle.get("event")
        if type(event) is not str:
            event = _text(event)
        self.lifecycle_events[event] = self.lifecycle_events.get(event, 0) + 1
        seconds = lifecycle.get("gpuSeconds")
        if type(seconds) is not float:
            seconds = _number(seconds)
        if seconds is None or seconds < 0:
            if event in _CLOSING_EVENTS:
                self.lifecycle_without_seconds += 1
            return
        ended = event in _ENDING_EVENTS and (event != "deleted" or seconds > 0)
        if seconds == 0 and not ended:
            return
        team = record.get("team")
        team_name = team if type(team) is str and team else NO_TEAM
        obj = record.get("object")
        key = (team_name, _cost_center(obj if type(obj) is dict else {}, lifecycle))
        totals = self.gpu.get(key)
        if totals is None:
            totals = self.gpu[key] = [0.0, 0.0]
        totals[0] += seconds
        if ended:  # a job ends once: succeeded, failed, or deleted while it ran
            totals[1] += 1
        day = time[:10]
        self.gpu_by_day[day] = self.gpu_by_day.get(day, 0.0) + seconds

    def _evidence(self, record: Mapping[str, Any], time: str, team: str) -> None:
        evidence = record.get("evidence")
        if type(evidence) is not dict:
            return
        kind = evidence.get("kind")
        if type(kind) is not str:
            kind = _text(kind)
        self.evidence_kinds[kind] = self.evidence_kinds.get(kind, 0) + 1
        if kind not in _PLACEMENT_KINDS:
            return
        region = evidence.get("region")
        if type(region) is not str or not region:
            region = _text(region) or "(unknown)"
        details = evidence.get("details")
        verdict = None
        if type(details) is dict and details:
            verdict = _explicit_verdict(region, details)
            expected = details.get("expectedRegions")
            if type(expected) is list and expected:
                regions = self.expected_regions.setdefault(team, set())
                if len(regions) < 64:
                    regions.update(_text(r) for r in expected)
        key = (region, team)
        counts = self.placements.get(key)
        if counts is None:
            counts = self.placements[key] = [0, 0, 0]
        counts[0] += 1
        if verdict is not None:
            counts[1] += 1
            if verdict:
                counts[2] += 1
        obj = record.get("object")
        if type(obj) is not dict:
            obj = {}
        # raw values: most placements are never shown, so text conversion waits for finish()
        self.placement_samples.add(
            key,
            (
                time,
                team,
                obj.get("namespace"),
                obj.get("name"),
                evidence.get("pod"),
                evidence.get("node"),
                region,
                verdict,
            ),
        )

    def allowed_regions(self, team: str) -> frozenset[str] | None:
        """Where a team's pods may run: the config's regions for it, else the regions the
        controller's placement records expected, else every region its admitted jobs were resolved
        to; None when none is known."""
        configured = self.options.team_regions.get(team)
        if configured:
            return frozenset(configured)
        for known in (self.expected_regions.get(team), self.learned_regions.get(team)):
            if known:
                return frozenset(known)
        return None

    # ------------------------------------------------------------------ API-server events

    def add_api_event(self, event: ApiEvent) -> None:
        """One API-server audit event (a trainer write or an RBAC denial)."""
        opts = self.options
        time = event.time
        if (opts.since is not None and time < opts.since) or (opts.until is not None and time >= opts.until):
            return
        if opts.team is not None and self.ns_teams.get(event.namespace or "") != opts.team:
            return
        self.k8s_in_period += 1
        actor = event.actor
        kind = self._actor_kind(actor)
        via = event.username if event.impersonated else ""
        namespace = event.namespace or ""
        name = event.name or ""
        if event.rbac_denied:
            self.rbac_total += 1
            self.rbac.add((actor, event.verb, event.resource, namespace))
            self.rbac_examples.append(
                (
                    time,
                    actor,
                    kind,
                    via,
                    event.verb,
                    event.resource,
                    namespace,
                    name,
                    event.authorization_reason,
                    f"{event.file}:{event.line}",
                )
            )
        if not event.is_trainer_write:
            return
        self.k8s_writes += 1
        decision = event.mpigate_decision
        if event.rbac_denied:
            result = "rbac-denied"
        elif decision == "denied" or (event.code == 403 and decision is not None):
            result = "denied"
        elif event.succeeded:
            result = "admitted"
        else:
            result = "failed"
        rkey = (event.verb, result)
        self.k8s_write_results[rkey] = self.k8s_write_results.get(rkey, 0) + 1
        obj_kind = event.kind
        self.actors.add(("k8s-audit", actor, kind, via, event.verb, obj_kind, result))
        self.objects.add((namespace, obj_kind, name))
        self.events.append(
            (
                "k8s-audit",
                time,
                actor,
                kind,
                via,
                event.verb,
                obj_kind,
                namespace,
                name,
                result,
                decision or "",
                event.code,
            )
        )
        if (
            event.succeeded
            and decision is None
            and event.verb != "deletecollection"
            and not exempt_from_webhook(actor, event.actor_groups)
        ):
            self.unjudged += 1
            self.unjudged_examples.append(
                (time, actor, kind, via, event.verb, obj_kind, namespace, name, f"{event.file}:{event.line}")
            )

    # ------------------------------------------------------------------ merging

    def merge(self, later: ReportBuilder) -> None:
        """Add another input's aggregate (associative: the order of merging changes nothing but
        the order of equal-time samples)."""
        opts = self.options
        for key, (seconds, jobs) in later.gpu.items():
            totals = self.gpu.setdefault(key, [0.0, 0.0])
            totals[0] += seconds
            totals[1] += jobs
        _add_counts(self.gpu_by_day, later.gpu_by_day)
        self.lifecycle_without_seconds += later.lifecycle_without_seconds
        _add_counts(self.lifecycle_events, later.lifecycle_events)
        # totals
        self.records_read += later.records_read
        self.records_in_period += later.records_in_period
        self.records_not_intact += later.records_not_intact
        _add_counts(self.by_stage, later.by_stage)
        _add_counts(self.by_chain, later.by_chain)
        times = [t for t in (self.first_time, later.first_time) if t is not None]
        self.first_time = min(times) if times else None
        times = [t for t in (self.last_time, later.last_time) if t is not None]
        self.last_time = max(times) if times else None
        self.teams |= later.teams
        # decisions
        _add_counts(self.cube, later.cube)
        _add_counts(self.decision_counts, later.decision_counts)
        _add_counts(self.validate_by_kind, later.validate_by_kind)
        self.dry_run += later.dry_run
        _add_counts(self.effects, later.effects)
        _add_counts(self.team_effects, later.team_effects)
        self.denial_examples.merge(later.denial_examples, key=_at(0))
        self.security_examples = _merge_recent(self.security_examples, later.security_examples, 0)
        _add_counts(self.expired_waivers, later.expired_waivers)
        for name, use in later.exceptions.items():
            mine = self.exceptions.get(name)
            if mine is None:
                if len(self.exceptions) < opts.max_keys:
                    self.exceptions[name] = use
                continue
            mine.merge(use)
        self.mutations += later.mutations
        self.mutations_patched += later.mutations_patched
        # activity
        self.actors.merge(later.actors)
        self.objects.merge(later.objects)
        self.events = _merge_recent(self.events, later.events, 1)
        # API server
        self.k8s_in_period += later.k8s_in_period
        self.k8s_writes += later.k8s_writes
        _add_counts(self.k8s_write_results, later.k8s_write_results)
        self.unjudged += later.unjudged
        self.unjudged_examples = _merge_recent(self.unjudged_examples, later.unjudged_examples, 0)
        self.rbac.merge(later.rbac)
        self.rbac_total += later.rbac_total
        self.rbac_examples = _merge_recent(self.rbac_examples, later.rbac_examples, 0)
        for namespace, team in later.ns_teams.items():
            if namespace not in self.ns_teams and len(self.ns_teams) < opts.max_keys:
                self.ns_teams[namespace] = team
        # residency
        for key, counts in later.placements.items():
            placed = self.placements.setdefault(key, [0, 0, 0])
            for i in range(3):
                placed[i] += counts[i]
        self.placement_samples.merge(later.placement_samples, key=_at(0))
        _add_counts(self.evidence_kinds, later.evidence_kinds)
        for team, regions in later.learned_regions.items():
            self.learned_regions.setdefault(team, set()).update(regions)
        for team, regions in later.expected_regions.items():
            self.expected_regions.setdefault(team, set()).update(regions)
        self.checkpoints += later.checkpoints

    # ------------------------------------------------------------------ result

    def finish(
        self, chains: Iterable[ChainReport] = (), k8s_files: Iterable[K8sAuditStats] = ()
    ) -> dict[str, Any]:
        """The report document (plain JSON values, see schema/report.schema.json)."""
        chain_reports = list(chains)
        k8s = list(k8s_files)
        opts = self.options
        rules = all_rules()
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
                for state in ("verified", "unchecked", "unsigned", "failed")
            },
            "firstProblem": first_problem,
        }
        days = _days(opts.since, opts.until, self.first_time, self.last_time, self.cube, self.gpu_by_day)
        decisions = self._decisions(days, rules)
        effects_by_rule = self._effects_by_rule(rules)
        k8s_given = bool(k8s)
        facts = EvidenceFacts(
            validate_by_kind=self.validate_by_kind,
            effects=self.effects,
            advisory=self._advisory,
            expired=self.expired_waivers,
            counts={
                "mutate": self.mutations,
                "lifecycle": sum(self.lifecycle_events.values()),
                "evidence": sum(v[0] for v in self.placements.values()),
                "checkpoint": self.checkpoints,
                "k8s-activity": self.k8s_writes,
                "k8s-rbac-denied": self.rbac_total,
            },
            broken=[c.chain for c in broken],
            unverified_signatures=[c.chain for c in chain_reports if c.signatures != "verified"],
            outside=self._residency_counts()[0],
            unjudged=self.unjudged,
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
            "generated": opts.generated or _now(),
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
                "decisions": {o: decisions["byOutcome"].get(o, 0) for o in OUTCOMES},
                "dryRun": self.dry_run,
                "teams": sorted(self.teams),
                "apiServerEvents": self.k8s_in_period,
            },
            "decisions": decisions,
            "rules": effects_by_rule,
            "denials": self._denials(rules),
            "activity": self._activity(k8s_given),
            "rbacDenials": self._rbac(),
            "exceptions": self._exception_list(),
            "residency": self._residency(),
            "security": self._security_section(rules),
            "chargeback": self._chargeback(days),
            "controls": controls,
            "controlSummary": summary_status,
            "statusRules": dict(STATUS_RULES),
            "recordKinds": dict(RECORD_KINDS),
            "limits": {
                "maxExamples": opts.max_examples,
                "maxEvents": opts.max_events,
                "maxKeys": opts.max_keys,
                "actorsOverflowed": self.actors.overflowed,
            },
        }

    def _decisions(self, days: list[str], rules: Mapping[str, Any]) -> dict[str, Any]:
        per_day: dict[str, dict[str, int]] = {d: dict.fromkeys(OUTCOMES, 0) for d in days}
        per_team: dict[str, dict[str, int]] = {}
        by_outcome: dict[str, int] = {}
        cube_rows = [
            {"date": day, "team": team, "outcome": outcome, "rule": rule or None, "decisions": count}
            for (day, team, outcome, rule), count in sorted(self.cube.items())
        ]
        for (day, team, outcome), count in sorted(self.decision_counts.items()):
            per_day.setdefault(day, dict.fromkeys(OUTCOMES, 0))
            per_day[day][outcome] = per_day[day].get(outcome, 0) + count
            row = per_team.setdefault(team, dict.fromkeys(OUTCOMES, 0))
            row[outcome] = row.get(outcome, 0) + count
            by_outcome[outcome] = by_outcome.get(outcome, 0) + count
        return {
            "byOutcome": by_outcome,
            "byDay": [{"date": d, **per_day[d], "total": sum(per_day[d].values())} for d in sorted(per_day)],
            "byTeam": [
                {"team": t, **per_team[t], "total": sum(per_team[t].values())} for t in sorted(per_team)
            ],
            "cube": cube_rows,
        }

    def _effects_by_rule(self, rules: Mapping[str, Any]) -> list[dict[str, Any]]:
        per_rule: dict[str, dict[str, int]] = {}
        for (rule, effect), count in self.effects.items():
            per_rule.setdefault(rule, dict.fromkeys(EFFECTS, 0))[effect] = count
        out: list[dict[str, Any]] = []
        for rule, counts in per_rule.items():
            info = rules.get(rule)
            out.append(
                {
                    "rule": rule,
                    "title": info.title if info else "(not in the rule catalogue)",
                    "family": info.family if info else "",
                    "controls": list(info.controls) if info else [],
                    **counts,
                    "total": sum(counts.values()),
                }
            )
        out.sort(key=lambda r: (-r["total"], r["rule"]))
        return out

    def _denials(self, rules: Mapping[str, Any]) -> dict[str, Any]:
        reasons: list[dict[str, Any]] = []
        for (rule, effect), count in self.effects.items():
            if effect != "denied":
                continue
            info = rules.get(rule)
            reasons.append(
                {
                    "rule": rule,
                    "title": info.title if info else "(not in the rule catalogue)",
                    "violations": count,
                    "examples": [_example(s) for s in reversed(self.denial_examples.get(rule))],
                }
            )
        reasons.sort(key=lambda r: (-r["violations"], r["rule"]))
        denied = sum(c for (_, _, outcome), c in self.decision_counts.items() if outcome == "denied")
        return {"decisions": denied, "topReasons": reasons}

    def _activity(self, k8s_given: bool) -> dict[str, Any]:
        per_actor: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        for (source, actor, kind, via, verb, obj_kind, result), count in self.actors.items():
            row = per_actor.setdefault(
                (source, actor, kind, via),
                {
                    "source": source,
                    "actor": actor,
                    "actorKind": kind,
                    "via": via or None,
                    "create": 0,
                    "update": 0,
                    "delete": 0,
                    "other": 0,
                    "refused": 0,
                    "total": 0,
                    "kinds": set(),
                },
            )
            bucket = (
                verb if verb in ("create", "update", "delete") else ("update" if verb == "patch" else "other")
            )
            row[bucket] += count
            row["total"] += count
            if result != "admitted":
                row["refused"] += count
            if obj_kind:
                row["kinds"].add(obj_kind)
        actors = []
        for row in per_actor.values():
            row["kinds"] = sorted(row["kinds"])
            actors.append(row)
        actors.sort(key=lambda r: (-r["total"], r["source"], r["actor"]))
        events = [
            {
                "source": e[0],
                "time": e[1],
                "actor": e[2],
                "actorKind": e[3],
                "via": e[4] or None,
                "verb": e[5],
                "kind": e[6],
                "namespace": e[7] or None,
                "name": e[8] or None,
                "result": e[9],
                "mpigateDecision": e[10] or None,
                "code": e[11],
            }
            for e in _most_recent(list(self.events), self.options.max_events)
        ]
        return {
            "actors": actors,
            "objects": len(self.objects) - (1 if self.objects.overflowed else 0),
            "objectsOverflowed": self.objects.overflowed > 0,
            "recentEvents": events,
            "apiServer": {
                "given": k8s_given,
                "writes": self.k8s_writes,
                "byVerb": [
                    {"verb": verb, "result": result, "count": count}
                    for (verb, result), count in sorted(self.k8s_write_results.items())
                ],
                "unjudgedWrites": self.unjudged,
                "unjudgedExamples": [
                    {
                        "time": e[0],
                        "actor": e[1],
                        "actorKind": e[2],
                        "via": e[3] or None,
                        "verb": e[4],
                        "kind": e[5],
                        "namespace": e[6] or None,
                        "name": e[7] or None,
                        "source": e[8],
                    }
                    for e in reversed(self.unjudged_examples)
                ],
            },
        }

    def _rbac(self) -> dict[str, Any]:
        rows: list[dict[str, Any]] = [
            {
                "actor": actor,
                "actorKind": actor_kind(actor) if actor != OTHERS else "",
                "verb": verb,
                "resource": resource,
                "namespace": namespace or None,
                "count": count,
            }
            for (actor, verb, resource, namespace), count in self.rbac.items()
        ]
        rows.sort(key=lambda r: (-r["count"], r["actor"], r["verb"], r["resource"]))
        return {
            "total": self.rbac_total,
            "byActor": rows,
            "examples": [
                {
                    "time": e[0],
                    "actor": e[1],
                    "actorKind": e[2],
                    "via": e[3] or None,
                    "verb": e[4],
                    "resource": e[5],
                    "namespace": e[6] or None,
                    "name": e[7] or None,
                    "reason": e[8],
                    "source": e[9],
                }
                for e in reversed(self.rbac_examples)
            ],
        }

    def _exception_list(self) -> list[dict[str, Any]]:
        out = []
        for name, use in sorted(self.exceptions.items()):
            out.append(
                {
                    "name": name,
                    "approver": use.approver,
                    "ticket": use.ticket,
                    "expires": use.expires,
                    "justification": use.justification,
                    "rules": list(use.rules),
                    "uses": use.uses,
                    "usesAfterExpiry": use.after_expiry,
                    "teams": sorted(use.teams),
                    "firstUsed": use.first,
                    "lastUsed": use.last,
                    "waived": [{"rule": r, "violations": c} for r, c in sorted(use.waived.items())],
                }
            )
        return out

    def _residency_counts(self) -> tuple[int, int, list[dict[str, Any]]]:
        """(outside, unverified, rows): placements the controller judged itself, plus the others
        judged against the team's allowed regions."""
        outside = unverified = 0
        rows: list[dict[str, Any]] = []
        for (region, team), (placed, judged, judged_outside) in sorted(self.placements.items()):
            allowed = self.allowed_regions(team)
            rest = placed - judged
            if allowed is None:
                unverified += rest
                out = judged_outside
            else:
                out = judged_outside + (rest if region not in allowed else 0)
            outside += out
            rows.append(
                {
                    "region": region,
                    "team": team,
                    "placements": placed,
                    "outside": out,
                    "allowedRegions": sorted(allowed or ()),
                }
            )
        return outside, unverified, rows

    def _residency(self) -> dict[str, Any]:
        outside, unverified, rows = self._residency_counts()
        by_region: dict[str, int] = {}
        for row in rows:
            by_region[row["region"]] = by_region.get(row["region"], 0) + row["placements"]
        examples = []
        for (region, team), samples in self.placement_samples.samples.items():
            allowed = self.allowed_regions(team)
            for sample in samples:
                verdict = sample[7]
                if verdict is True or (verdict is None and allowed is not None and region not in allowed):
                    examples.append(sample)
        examples.sort(key=lambda e: e[0], reverse=True)
        return {
            "placements": sum(r["placements"] for r in rows),
            "outside": outside,
            "unverified": unverified,
            "byRegion": [{"region": r, "placements": c} for r, c in sorted(by_region.items())],
            "byRegionAndTeam": rows,
            "outsideExamples": [
                {
                    "time": e[0],
                    "team": e[1],
                    "namespace": _text(e[2]) or None,
                    "name": _text(e[3]) or None,
                    "pod": _text(e[4]) or None,
                    "node": _text(e[5]) or None,
                    "region": e[6],
                    "allowedRegions": sorted(self.allowed_regions(e[1]) or ()),
                }
                for e in examples[: self.options.max_events]
            ],
            "evidenceKinds": dict(sorted(self.evidence_kinds.items())),
        }

    def _security_section(self, rules: Mapping[str, Any]) -> dict[str, Any]:
        by_rule: dict[str, dict[str, int]] = {}
        for (rule, effect), count in self.effects.items():
            if rule in self._security:
                by_rule.setdefault(rule, dict.fromkeys(EFFECTS, 0))[effect] = count
        rows: list[dict[str, Any]] = []
        for rule, counts in by_rule.items():
            info = rules.get(rule)
            rows.append(
                {"rule": rule, "title": info.title if info else "", **counts, "total": sum(counts.values())}
            )
        rows.sort(key=lambda r: (-r["total"], r["rule"]))
        by_team: dict[str, dict[str, int]] = {}
        for (team, _rule, effect), count in self.team_effects.items():
            row = by_team.setdefault(team, dict.fromkeys(EFFECTS, 0))
            row[effect] += count
        return {
            "attempts": sum(r["total"] for r in rows),
            "byRule": rows,
            "byTeam": [{"team": t, **c, "total": sum(c.values())} for t, c in sorted(by_team.items())],
            "byTeamAndRule": [
                {"team": team, "rule": rule, "effect": effect, "violations": count}
                for (team, rule, effect), count in sorted(self.team_effects.items())
            ],
            "recent": [_example(s) for s in reversed(self.security_examples)],
        }

    def _chargeback(self, days: list[str]) -> dict[str, Any]:
        rows = [
            {
                "team": team,
                "costCenter": cost_center,
                "gpuSeconds": round(v[0], 3),
                "gpuHours": round(v[0] / 3600, 3),
                "jobs": int(v[1]),
            }
            for (team, cost_center), v in sorted(self.gpu.items())
        ]
        per_team: dict[str, float] = {}
        for (team, _), v in self.gpu.items():
            per_team[team] = per_team.get(team, 0.0) + v[0]
        total = sum(per_team.values())
        return {
            "gpuHours": round(total / 3600, 3),
            "byTeam": [
                {"team": t, "gpuHours": round(s / 3600, 3), "share": round(s / total, 4) if total else 0.0}
                for t, s in sorted(per_team.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
            "byTeamAndCostCenter": rows,
            "byDay": [{"date": d, "gpuHours": round(self.gpu_by_day.get(d, 0.0) / 3600, 3)} for d in days],
            "lifecycleEvents": dict(sorted(self.lifecycle_events.items())),
            "lifecycleWithoutGpuSeconds": self.lifecycle_without_seconds,
        }


# ---------------------------------------------------------------------- helpers


def _add_counts(target: dict[Any, Any], source: Mapping[Any, Any]) -> None:
    for key, value in source.items():
        target[key] = target.get(key, 0) + value


def _at(index: int) -> Callable[[tuple[Any, ...]], Any]:
    return lambda item: item[index]


def _merge_recent(
    mine: deque[tuple[Any, ...]], other: deque[tuple[Any, ...]], at: int
) -> deque[tuple[Any, ...]]:
    """The most recent ``maxlen`` samples of both (by the time at index ``at``), oldest first."""
    merged = sorted([*mine, *other], key=lambda item: item[at])
    return deque(merged, maxlen=mine.maxlen)


def _explicit_verdict(region: str, details: Mapping[str, Any]) -> bool | None:
    """The controller's own judgement of a placement (``details.compliant``, else
    ``details.expectedRegions``): True when the pod is outside its allowed regions, False when
    inside, None when the record says nothing."""
    compliant = details.get("compliant")
    if type(compliant) is bool:
        return not compliant
    expected = details.get("expectedRegions")
    if isinstance(expected, list) and expected:
        return region not in {_text(r) for r in expected}
    return None


def _user(request: Any) -> str:
    user = request.get("user") if isinstance(request, Mapping) else None
    name = user.get("username") if isinstance(user, Mapping) else None
    return name if isinstance(name, str) and name else "(unknown)"


def _cost_center(obj: Mapping[str, Any], lifecycle: Mapping[str, Any]) -> str:
    labels = obj.get("labels")
    value = labels.get(COST_CENTER_LABEL) if isinstance(labels, Mapping) else None
    if not value:
        value = lifecycle.get("costCenter")
    return value if isinstance(value, str) and value else NO_COST_CENTER


def _example(sample: tuple[Any, ...]) -> dict[str, Any]:
    time, team, kind, namespace, name, user, rule, effect, message, operation = sample
    return {
        "time": time,
        "team": team,
        "kind": kind,
        "namespace": namespace or None,
        "name": name or None,
        "user": user,
        "operation": operation,
        "rule": rule,
        "effect": effect,
        "message": message,
    }


def _days(
    since: str | None,
    until: str | None,
    first: str | None,
    last: str | None,
    cube: Mapping[tuple[str, str, str, str], int],
    gpu_by_day: Mapping[str, float],
) -> list[str]:
    """Every calendar day (UTC) of the period: from --from (or the first record) to --to (or the
    last record), capped at ten years."""
    start = since[:10] if since else first[:10] if first else None
    if until:
        end_moment = dt.datetime.fromisoformat(until.replace("Z", "+00:00")) - dt.timedelta(milliseconds=1)
        end: str | None = end_moment.date().isoformat()
    else:
        end = last[:10] if last else None
    if start is None or end is None:
        return sorted({k[0] for k in cube} | set(gpu_by_day))
    day = dt.date.fromisoformat(start)
    stop = dt.date.fromisoformat(end)
    out: list[str] = []
    while day <= stop and len(out) < 3660:
        out.append(day.isoformat())
        day += dt.timedelta(days=1)
    return out


def _most_recent(events: list[tuple[Any, ...]], limit: int) -> list[tuple[Any, ...]]:
    """The ``limit`` latest events (time at index 1), latest first; of equal times, the one added
    last comes first."""
    order = sorted(range(len(events)), key=lambda i: (events[i][1], i), reverse=True)
    return [events[i] for i in order[:limit]]


def _now() -> str:
    from mpigate.audit._canonical import format_time

    return format_time(dt.datetime.now(dt.UTC))
