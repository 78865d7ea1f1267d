"""Standing violations: what the controller's background audit found breaking the policy in force
(``evidence`` records of kind ``standing-violation``, events ``opened``, ``resolved`` and
``suspended``: docs/controller.md, "Background audit").

A violation opened before the period and still open at its end is standing at the end; one
resolved within the period is listed with when it was found and when it was resolved. Records of
every time up to the period's end count (a violation found last quarter may stand today), so the
aggregation sees them whatever the period; each (object uid, rule) keeps its events, which are put
in time order once every chain is merged (the controller's leaders each write a chain).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._util import text

__all__ = ["StandingViolations"]

_EVENTS = frozenset({"opened", "resolved", "suspended"})
# (time, event, details)
_Event = tuple[str, str, dict[str, Any]]


class StandingViolations:
    """Events per (object uid, rule), bounded by ``max_keys`` (then counted as overflowed)."""

    def __init__(self, since: str | None, max_keys: int, max_events: int) -> None:
        self.since = since
        self.max_keys = max_keys
        self.max_events = max_events
        self.events: dict[tuple[str, str], list[_Event]] = {}
        self.overflowed = 0

    def add(self, record: Mapping[str, Any], time: str) -> None:
        """One ``standing-violation`` record written before the period's end."""
        evidence = record.get("evidence")
        details = evidence.get("details") if type(evidence) is dict else None
        if type(details) is not dict:
            return
        event = details.get("event")
        rule, uid = details.get("rule"), details.get("uid")
        if event not in _EVENTS or type(rule) is not str or type(uid) is not str:
            return
        obj = record.get("object")
        obj = obj if type(obj) is dict else {}
        key = (uid, rule)
        events = self.events.get(key)
        if events is None:
            if len(self.events) >= self.max_keys:
                self.overflowed += 1
                return
            events = self.events[key] = []
        events.append(
            (
                time,
                str(event),
                {
                    "kind": text(obj.get("kind")) or None,
                    "namespace": text(obj.get("namespace")) or None,
                    "name": text(obj.get("name")) or None,
                    "team": text(record.get("team")) or None,
                    "rule": rule,
                    "mode": text(details.get("mode")) or None,
                    "action": text(details.get("action")) or None,
                    "message": text(details.get("message")) or None,
                    "expiredException": text(details.get("expiredException")) or None,
                },
            )
        )

    def merge(self, other: StandingViolations) -> None:
        for key, events in other.events.items():
            mine = self.events.get(key)
            if mine is None:
                if len(self.events) >= self.max_keys:
                    self.overflowed += 1
                    continue
                mine = self.events[key] = []
            mine.extend(events)
        self.overflowed += other.overflowed

    def section(self) -> dict[str, Any]:
        """The report's ``standingViolations`` section."""
        standing: list[dict[str, Any]] = []
        resolved: list[dict[str, Any]] = []
        opened_in_period = 0
        by_rule: dict[str, int] = {}
        for events in self.events.values():
            events.sort(key=lambda e: (e[0], e[1] != "opened"))
            opened_at: str | None = None
            suspended_at: str | None = None
            last: dict[str, Any] = {}
            for time, event, info in events:
                if event == "opened":
                    if opened_at is None:
                        opened_at, suspended_at = time, None
                        if self.since is None or time >= self.since:
                            opened_in_period += 1
                    last = info
                elif event == "suspended" and opened_at is not None:
                    suspended_at = suspended_at or time
                elif event == "resolved" and opened_at is not None:
                    if self.since is None or time >= self.since:
                        resolved.append(
                            {**last, "opened": opened_at, "resolved": time, "suspended": suspended_at}
                        )
                    opened_at = None
            if opened_at is not None:
                standing.append({**last, "opened": opened_at, "suspended": suspended_at})
                by_rule[last["rule"]] = by_rule.get(last["rule"], 0) + 1
        standing.sort(key=lambda s: (s["opened"], s["namespace"] or "", s["name"] or "", s["rule"]))
        resolved.sort(key=lambda s: (s["resolved"], s["namespace"] or "", s["name"] or "", s["rule"]))
        return {
            "atPeriodEnd": len(standing),
            "openedInPeriod": opened_in_period,
            "resolvedInPeriod": len(resolved),
            "byRule": dict(sorted(by_rule.items())),
            "standing": standing[: self.max_events],
            "resolved": resolved[-self.max_events :],
            "overflowed": self.overflowed,
        }
