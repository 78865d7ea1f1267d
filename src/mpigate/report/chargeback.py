"""GPU-hours per team, cost center and day (chargeback / showback) from the controller's
``lifecycle`` records.

The controller's contract (docs/controller.md): ``suspended``, ``succeeded``, ``failed`` and
``deleted`` close a run segment and carry its GPU-seconds; other events carry none. So GPU-seconds
add up with no state per job, whatever chain a job's records are in, and every segment is charged
to the day it closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._util import add_counts, number, text
from .options import NO_TEAM

__all__ = ["COST_CENTER_LABEL", "NO_COST_CENTER", "Chargeback"]

COST_CENTER_LABEL = "mpigate.io/cost-center"
NO_COST_CENTER = "(none recorded)"

# Lifecycle events that close a run segment (and carry its GPU-seconds), and those that end a job.
_CLOSING_EVENTS = frozenset({"suspended", "succeeded", "failed", "deleted", "finished"})
_ENDING_EVENTS = frozenset({"succeeded", "failed", "deleted", "finished"})


def _cost_center(obj: Mapping[str, Any], lifecycle: Mapping[str, Any]) -> str:
    labels = obj.get("labels")
    value = labels.get(COST_CENTER_LABEL) if isinstance(labels, Mapping) else None
    if not value:
        value = lifecycle.get("costCenter")
    return value if isinstance(value, str) and value else NO_COST_CENTER


class Chargeback:
    """GPU-seconds of the run segments that closed in the period; mergeable."""

    def __init__(self) -> None:
        self.lifecycle_events: dict[str, int] = {}
        self.gpu: dict[tuple[str, str], list[float]] = {}  # (team, cost center) -> [seconds, jobs ended]
        self.gpu_by_day: dict[str, float] = {}
        self.lifecycle_without_seconds = 0

    @property
    def records(self) -> int:
        """Lifecycle records in the period."""
        return sum(self.lifecycle_events.values())

    def add(self, record: Mapping[str, Any], time: str) -> None:
        """One lifecycle record of the period."""
        lifecycle = record.get("lifecycle")
        if type(lifecycle) is not dict:
            lifecycle = {}
        event = lifecycle.get("event")
        if type(event) is not str:
            event = text(event)
        self.lifecycle_events[event] = self.lifecycle_events.get(event, 0) + 1
        seconds = lifecycle.get("gpuSeconds")
        if type(seconds) is not float:
            seconds = number(seconds)
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

    def merge(self, other: Chargeback) -> None:
        for key, (seconds, jobs) in other.gpu.items():
            totals = self.gpu.setdefault(key, [0.0, 0.0])
            totals[0] += seconds
            totals[1] += jobs
        add_counts(self.gpu_by_day, other.gpu_by_day)
        self.lifecycle_without_seconds += other.lifecycle_without_seconds
        add_counts(self.lifecycle_events, other.lifecycle_events)

    def section(self, days: list[str]) -> dict[str, Any]:
        """The report's ``chargeback`` section."""
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
