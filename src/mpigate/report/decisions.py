"""Admission decisions: validate records by day, team, outcome and rule (the cube), what each
rule's findings did (denied, warned, audited, waived), denial and security samples, the
exceptions used, and mutate records."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mpigate.catalogue import all_rules

from ._bounded import KeyedSamples
from ._util import add_counts, at, merge_recent, text, username
from .assess import EFFECTS
from .options import OUTCOMES, ReportOptions

__all__ = ["Decisions"]


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
        add_counts(self.waived, other.waived)


def _example(sample: tuple[Any, ...]) -> dict[str, Any]:
    time, team, kind, namespace, name, user, rule, effect, message, operation, ref, uid = sample
    return {
        "record": f"{ref[0]}:{ref[1]}:{ref[2]}",
        "requestUID": uid or None,
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


class Decisions:
    """Counters and bounded samples of validate and mutate records; mergeable."""

    def __init__(self, options: ReportOptions) -> None:
        self.options = options
        rules = all_rules()
        self._advisory = frozenset(r.id for r in rules.values() if r.advisory)
        self._security = frozenset(r.id for r in rules.values() if r.family == "security")
        self.cube: dict[tuple[str, str, str, str], int] = {}  # (day, team, outcome, rule or "")
        self.decision_counts: dict[tuple[str, str, str], int] = {}  # (day, team, outcome)
        self.validate_by_kind: dict[str, int] = {}
        self.dry_run = 0
        self.effects: dict[tuple[str, str], int] = {}  # (rule, effect) -> violations
        self.team_effects: dict[tuple[str, str, str], int] = {}  # (team, rule, effect), security only
        self.denial_examples: KeyedSamples[str, tuple[Any, ...]] = KeyedSamples(options.max_examples)
        self.security_examples: deque[tuple[Any, ...]] = deque(maxlen=options.max_events)
        self.expired_waivers: dict[str, int] = {}  # rule -> waivers by an expired exception
        self.exceptions: dict[str, _ExceptionUse] = {}
        self.mutations = 0
        self.mutations_patched = 0
        self.rule_digests: dict[str, set[str]] = {}  # custom rule -> expression digests judged with
        self.rule_controls: dict[str, tuple[str, ...]] = {}  # custom rule -> controls its records name

    @property
    def advisory(self) -> frozenset[str]:
        return self._advisory

    def add_mutate(self, record: Mapping[str, Any]) -> None:
        self.mutations += 1
        if record.get("patch"):
            self.mutations_patched += 1

    def add_validate(
        self, record: Mapping[str, Any], time: str, team: str, ref: tuple[str, int, str]
    ) -> tuple[str, str, str, str, str, str, Any]:
        """Count one validate record (``ref``: its chain, seq and hash); returns (outcome, kind,
        namespace, name, operation, user, demand) for the parts of the report that need them."""
        day = time[:10]
        outcome = record.get("decision")
        if type(outcome) is not str:
            outcome = text(outcome)
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
        dkey = (day, team, outcome)
        counts = self.decision_counts
        counts[dkey] = counts.get(dkey, 0) + 1
        cube = self.cube
        operation = request.get("operation") or ""
        user = username(request)
        violations = record.get("violations")
        if violations and type(violations) is list:
            effects = self.effects
            seen: set[str] = set()
            for violation in violations:
                if type(violation) is not dict:
                    continue
                rule = violation.get("id")
                if type(rule) is not str:
                    rule = text(rule)
                effect = self._effect(violation, rule)
                ekey = (rule, effect)
                effects[ekey] = effects.get(ekey, 0) + 1
                digest = violation.get("digest")
                if type(digest) is str:
                    self._note_custom(rule, digest, violation.get("controls"))
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
                        text(violation.get("message")),
                        operation,
                        ref,
                        request.get("uid"),
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
        return outcome, kind, namespace, name, operation, user, record.get("demand")

    @property
    def requests(self) -> int:
        """Validate records in the period: one per request judged."""
        return sum(self.decision_counts.values())

    @property
    def findings(self) -> int:
        """Violations (rule findings) in the period: a request can have several."""
        return sum(self.effects.values())

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
            name = text(item.get("name"))
            use = self.exceptions.get(name)
            if use is None:
                if len(self.exceptions) >= self.options.max_keys:
                    continue
                use = self.exceptions[name] = _ExceptionUse(first=time)
            if time >= use.last:
                # the latest record's terms win: an exception's expiry may be extended in Git
                rules = item.get("rules")
                use.approver = text(item.get("approver"))
                use.ticket = text(item.get("ticket"))
                use.expires = text(item.get("expires"))
                use.justification = text(item.get("justification"))
                use.rules = tuple(text(r) for r in rules) if type(rules) is list else ()
                use.last = time
            use.first = min(use.first, time)
            use.uses += 1
            if len(use.teams) < 64:
                use.teams.add(team)
            expires = text(item.get("expires"))
            expired = bool(expires) and day > expires
            if expired:
                use.after_expiry += 1
            for violation in violations if type(violations) is list else ():
                if type(violation) is dict and violation.get("waivedBy") == name:
                    rule = text(violation.get("id"))
                    use.waived[rule] = use.waived.get(rule, 0) + 1
                    if expired:
                        self.expired_waivers[rule] = self.expired_waivers.get(rule, 0) + 1

    def _note_custom(self, rule: str, digest: str, controls: Any) -> None:
        """A custom, library or ValidatingAdmissionPolicy rule: the expression digests it was
        judged with, and the controls its records name (the catalogue does not know it)."""
        digests = self.rule_digests.setdefault(rule, set())
        if len(digests) < 64:
            digests.add(digest)
        if rule not in self.rule_controls and type(controls) is list:
            self.rule_controls[rule] = tuple(text(c) for c in controls)

    def merge(self, other: Decisions) -> None:
        for rule, digests in other.rule_digests.items():
            self.rule_digests.setdefault(rule, set()).update(digests)
        for rule, controls in other.rule_controls.items():
            self.rule_controls.setdefault(rule, controls)
        add_counts(self.cube, other.cube)
        add_counts(self.decision_counts, other.decision_counts)
        add_counts(self.validate_by_kind, other.validate_by_kind)
        self.dry_run += other.dry_run
        add_counts(self.effects, other.effects)
        add_counts(self.team_effects, other.team_effects)
        self.denial_examples.merge(other.denial_examples, key=at(0))
        self.security_examples = merge_recent(self.security_examples, other.security_examples, 0)
        add_counts(self.expired_waivers, other.expired_waivers)
        for name, use in other.exceptions.items():
            mine = self.exceptions.get(name)
            if mine is None:
                if len(self.exceptions) < self.options.max_keys:
                    self.exceptions[name] = use
                continue
            mine.merge(use)
        self.mutations += other.mutations
        self.mutations_patched += other.mutations_patched

    # ------------------------------------------------------------------ sections

    def days_seen(self) -> set[str]:
        return {k[0] for k in self.cube}

    def decisions_section(self, days: list[str]) -> dict[str, Any]:
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

    def rules_section(self, rules: Mapping[str, Any]) -> list[dict[str, Any]]:
        per_rule: dict[str, dict[str, int]] = {}
        for (rule, effect), count in self.effects.items():
            per_rule.setdefault(rule, dict.fromkeys(EFFECTS, 0))[effect] = count
        out: list[dict[str, Any]] = []
        for rule, counts in per_rule.items():
            info = rules.get(rule)
            row: dict[str, Any] = {
                "rule": rule,
                "title": info.title if info else "(not in the rule catalogue)",
                "family": info.family if info else "",
                "controls": list(info.controls) if info else list(self.rule_controls.get(rule, ())),
                **counts,
                "total": sum(counts.values()),
            }
            if rule in self.rule_digests:
                row["title"] = row["title"] if info else "(custom, library or admission policy rule)"
                row["digests"] = sorted(self.rule_digests[rule])
            out.append(row)
        out.sort(key=lambda r: (-r["total"], r["rule"]))
        return out

    def denials_section(self, rules: Mapping[str, Any]) -> dict[str, Any]:
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

    def exceptions_section(self) -> list[dict[str, Any]]:
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

    def security_section(self, rules: Mapping[str, Any]) -> dict[str, Any]:
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
