"""GPU-hours per team, cost center, day and period (chargeback / showback) from the controller's
``lifecycle`` records, de-duplicated, split by segment time, and flagged where not exact.

The controller's contract (docs/controller.md, "Lifecycle records"): ``suspended``, ``succeeded``,
``failed`` and ``deleted`` close a run segment and carry its GPU-seconds; records carry the job's
uid and the segment's number, so:

- **each (uid, segment, event) counts once**: a controller that died between a record and the
  annotation that remembers it writes the record again after its restart (another chain, often);
  the earliest written copy counts, and the report says how many repeats it dropped (and how many
  of them disagreed in their figure). Older records without a segment are keyed on (uid, event,
  ``at``);
- **GPU-seconds are split by when they were used, not when the record was written**: a record's
  ``usage`` steps (GPUs in use over time) split a segment exactly at midnight (UTC days) and at the
  period's bounds; a record with only ``byDay`` splits by day; an older record with neither is
  filed under the day it was written, as before. A segment that closed after the period but ran
  in it counts its share, so records written up to the end of the inputs are read;
- **what is not exact is flagged, not summed silently**: closing records without GPU-seconds
  (unknown), with 0 GPU-seconds for a segment that ran (suspicious), closed from facts the
  controller did not all observe (``basis`` inferred or partial, with their range; a job deleted
  while no controller watched is ``vanished``), with pods whose spec asks other GPUs than charged,
  and segments that started but have no closing record in the inputs (open: not charged yet).

State is one small entry per closed segment and per started one (the de-duplication needs them),
independent of everything else in the records.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ._util import add_counts, number, text
from .options import NO_TEAM

__all__ = ["COST_CENTER_LABEL", "FLAGS", "NO_COST_CENTER", "Chargeback"]

COST_CENTER_LABEL = "mpigate.io/cost-center"
NO_COST_CENTER = "(none recorded)"

# Lifecycle events that close a run segment (and carry its GPU-seconds), and those that end a job.
_CLOSING_EVENTS = frozenset({"suspended", "succeeded", "failed", "deleted", "finished"})
_ENDING_EVENTS = frozenset({"succeeded", "failed", "deleted", "finished"})
#: Why a segment is flagged, in the order the report lists them.
FLAGS: Final = ("unknown", "zeroButRan", "partial", "inferred", "vanished", "gpuSpecMismatch", "open")
_MAX_STEPS: Final = 100_000
_DAY: Final = 86_400.0
#: The longest segment a record's usage may span (longer is not well formed: it would split into
#: more days than any report shows).
_MAX_SPAN: Final = 3_660 * _DAY


def _cost_center(obj: Mapping[str, Any], lifecycle: Mapping[str, Any]) -> str:
    labels = obj.get("labels")
    value = labels.get(COST_CENTER_LABEL) if isinstance(labels, Mapping) else None
    if not value:
        value = lifecycle.get("costCenter")
    return value if isinstance(value, str) and value else NO_COST_CENTER


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)).timestamp()


def _day(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).date().isoformat()


def _steps(usage: Any) -> list[tuple[float, float, int]] | None:
    """A record's ``usage`` as (from, to, GPUs) intervals, or None when it has none or it is not
    well formed (offsets not increasing or beyond ten years, GPUs not whole numbers ≥ 0, not ending
    at 0)."""
    if not isinstance(usage, Mapping):
        return None
    origin, steps = _epoch(usage.get("from")), usage.get("steps")
    if origin is None or not isinstance(steps, list) or not 2 <= len(steps) <= _MAX_STEPS:
        return None
    out: list[tuple[float, float, int]] = []
    previous: tuple[float, int] | None = None
    for step in steps:
        if not isinstance(step, list) or len(step) != 2:
            return None
        offset, gpus = number(step[0]), step[1]
        if offset is None or type(gpus) is not int or gpus < 0 or not 0 <= offset <= _MAX_SPAN:
            return None
        if previous is not None:
            if offset < previous[0]:
                return None
            if previous[1] and offset > previous[0]:
                out.append((origin + previous[0], origin + offset, previous[1]))
        previous = (offset, gpus)
    return out if previous is not None and previous[1] == 0 else None


def _split(
    intervals: list[tuple[float, float, int]], since: float | None, until: float | None
) -> dict[str, float]:
    """GPU-seconds of ``intervals`` within the period, per UTC day."""
    by_day: dict[str, float] = {}
    for start, end, gpus in intervals:
        lo = max(start, since) if since is not None else start
        hi = min(end, until) if until is not None else end
        while lo < hi:
            midnight = (lo // _DAY + 1) * _DAY
            stop = min(midnight, hi)
            day = _day(lo)
            by_day[day] = by_day.get(day, 0.0) + gpus * (stop - lo)
            lo = stop
    return by_day


@dataclass(slots=True)
class _Closed:
    """One closed segment's contribution (the earliest written copy of its record)."""

    order: tuple[str, str, int]  # (record time, chain, seq): which copy counts
    team: str
    cost_center: str
    event: str
    ended: bool  # the job ended with it (for "jobs ended")
    in_period: bool  # the record itself is in the period (counted among lifecycle events)
    seconds: float | None  # the record's gpuSeconds
    by_day: dict[str, float]  # its share in the period, per day
    low: float | None
    high: float | None
    flags: tuple[str, ...]
    where: tuple[str, str, str, int | None]  # namespace, name, uid, segment
    note: str | None

    @property
    def share(self) -> float:
        return sum(self.by_day.values())


class Chargeback:
    """GPU-seconds of the run segments used in the period; mergeable."""

    def __init__(self, since: str | None = None, until: str | None = None, max_events: int = 200) -> None:
        self.since, self.until = since, until
        self._since, self._until = _epoch(since), _epoch(until)
        self.max_events = max_events
        self.closed: dict[tuple[Any, ...], _Closed] = {}
        self.events: dict[tuple[Any, ...], tuple[str, str]] = {}  # non-closing: key -> (time, event)
        # segments that started before the period ended: (uid, segment) -> (time, team, namespace,
        # name), and every segment closed (whenever): those left open are flagged
        self.started: dict[tuple[str, int], tuple[str, str, str, str]] = {}
        self.closed_segments: set[tuple[str, int]] = set()
        self.duplicates = 0
        self.differing = 0

    # ------------------------------------------------------------------ reading

    @property
    def records(self) -> int:
        """Lifecycle records in the period (each (uid, segment, event) once)."""
        return sum(self.lifecycle_events.values())

    @property
    def lifecycle_events(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for closed in self.closed.values():
            if closed.in_period:
                counts[closed.event] = counts.get(closed.event, 0) + 1
        for time, event in self.events.values():
            if self._in_period(time):
                counts[event] = counts.get(event, 0) + 1
        return counts

    @property
    def gpu_by_day(self) -> dict[str, float]:
        days: dict[str, float] = {}
        for closed in self.closed.values():
            add_counts(days, closed.by_day)
        return days

    def _in_period(self, time: str) -> bool:
        return (self.since is None or time >= self.since) and (self.until is None or time < self.until)

    def add(self, record: Mapping[str, Any], time: str, ref: tuple[str, int] = ("", 0)) -> None:
        """One lifecycle record written at ``time`` (``ref``: its chain and position). Records
        written after the period are read too: a segment that closed later may have run in it; and
        those before it, for the segments they open and close."""
        lifecycle = record.get("lifecycle")
        if type(lifecycle) is not dict:
            lifecycle = {}
        event = lifecycle.get("event")
        if type(event) is not str:
            event = text(event)
        uid = text(lifecycle.get("uid"))
        segment = lifecycle.get("segment")
        segment = segment if type(segment) is int else None
        if uid and segment is not None:
            if event in _CLOSING_EVENTS:
                self.closed_segments.add((uid, segment))
            elif event == "started" and (self.until is None or time < self.until):
                obj = record.get("object")
                obj = obj if type(obj) is dict else {}
                team = record.get("team")
                info = (
                    time,
                    team if type(team) is str and team else NO_TEAM,
                    text(obj.get("namespace")),
                    text(obj.get("name")),
                )
                known = self.started.get((uid, segment))
                if known is None or time < known[0]:
                    self.started[(uid, segment)] = info
        if self.since is not None and time < self.since:
            return  # closed before the period began: nothing of it is in the period
        if uid and segment is not None:
            key: tuple[Any, ...] = (uid, segment, event)
        else:
            key = (uid or f"{ref[0]}:{ref[1]}", event, text(lifecycle.get("at")) or time)
        order = (time, ref[0], ref[1])
        team = record.get("team")
        team_name = team if type(team) is str and team else NO_TEAM
        obj = record.get("object")
        obj = obj if type(obj) is dict else {}
        if event not in _CLOSING_EVENTS:
            seen = self.events.get(key)
            if seen is not None:
                self.duplicates += 1
                if time >= seen[0]:
                    return
            self.events[key] = (time, event)
            return
        closed = self._closed(lifecycle, time, order, team_name, obj, event, uid, segment)
        if closed is None:
            return
        known_closed = self.closed.get(key)
        if known_closed is not None:
            self.duplicates += 1
            if known_closed.seconds != closed.seconds:
                self.differing += 1
            if known_closed.order <= closed.order:
                return
        self.closed[key] = closed

    def _closed(
        self,
        lifecycle: Mapping[str, Any],
        time: str,
        order: tuple[str, str, int],
        team: str,
        obj: Mapping[str, Any],
        event: str,
        uid: str,
        segment: int | None,
    ) -> _Closed | None:
        in_period = self._in_period(time)
        seconds = lifecycle.get("gpuSeconds")
        if type(seconds) is not float:
            seconds = number(seconds)
        flags: list[str] = []
        by_day: dict[str, float] = {}
        if seconds is None or seconds < 0:
            seconds = None
            flags.append("unknown")
        else:
            intervals = _steps(lifecycle.get("usage"))
            split = lifecycle.get("byDay")
            if intervals is not None:
                by_day = _split(intervals, self._since, self._until)
            elif type(split) is dict and split:
                # per day only: a day partly in the period counts whole
                for day, value in split.items():
                    part = number(value)
                    start = _epoch(f"{day}T00:00:00Z") if type(day) is str else None
                    if start is None or not part or part < 0:
                        continue
                    if (self._until is None or start < self._until) and (
                        self._since is None or start + _DAY > self._since
                    ):
                        by_day[day] = by_day.get(day, 0.0) + part
            elif in_period and seconds:
                by_day = {time[:10]: seconds}  # an older record: the day it was written
        if not in_period and not any(by_day.values()):
            return None  # neither written nor used in the period
        basis = lifecycle.get("basis")
        if basis in ("partial", "inferred"):
            flags.append(str(basis))
        if lifecycle.get("vanished") is True:
            flags.append("vanished")
        if lifecycle.get("gpuSpecMismatch"):
            flags.append("gpuSpecMismatch")
        started = lifecycle.get("started")
        pods = lifecycle.get("pods")
        ran = (type(started) is str and bool(started)) or (type(pods) is int and pods > 0)
        if seconds == 0 and ran:
            flags.append("zeroButRan")
        low, high = number(lifecycle.get("gpuSecondsMin")), number(lifecycle.get("gpuSecondsMax"))
        notes = lifecycle.get("notes")
        note = text(notes[0]) if type(notes) is list and notes else None
        if seconds is None:
            note = note or "the record carries no GPU-seconds"
        elif seconds == 0 and ran:
            note = note or "0 GPU-seconds for a segment that ran"
        return _Closed(
            order=order,
            team=team,
            cost_center=_cost_center(obj, lifecycle),
            event=event,
            ended=seconds is not None and event in _ENDING_EVENTS and (event != "deleted" or bool(seconds)),
            in_period=in_period,
            seconds=seconds,
            by_day=by_day,
            low=low if "partial" in flags or "inferred" in flags else None,
            high=high if "partial" in flags or "inferred" in flags else None,
            flags=tuple(flags),
            where=(text(obj.get("namespace")), text(obj.get("name")), uid, segment),
            note=note,
        )

    def merge(self, other: Chargeback) -> None:
        for key, closed in other.closed.items():
            known = self.closed.get(key)
            if known is not None:
                self.duplicates += 1
                if known.seconds != closed.seconds:
                    self.differing += 1
                if known.order <= closed.order:
                    continue
            self.closed[key] = closed
        for key, (time, event) in other.events.items():
            seen = self.events.get(key)
            if seen is not None:
                self.duplicates += 1
                if seen[0] <= time:
                    continue
            self.events[key] = (time, event)
        for segment, info in other.started.items():
            mine = self.started.get(segment)
            if mine is None or info[0] < mine[0]:
                self.started[segment] = info
        self.closed_segments |= other.closed_segments
        self.duplicates += other.duplicates
        self.differing += other.differing

    # ------------------------------------------------------------------ the section

    def section(self, days: list[str]) -> dict[str, Any]:
        """The report's ``chargeback`` section."""
        totals: dict[tuple[str, str], list[float]] = {}  # (team, cost center) -> [seconds, jobs]
        by_day: dict[str, float] = {}
        low = high = outside = 0.0
        counts = dict.fromkeys(FLAGS, 0)
        flagged: list[tuple[str, dict[str, Any]]] = []
        without_seconds = 0
        for closed in self.closed.values():
            namespace, name, uid, segment = closed.where
            share = closed.share
            if closed.seconds is None:
                without_seconds += closed.in_period
            elif share or closed.ended:
                row = totals.setdefault((closed.team, closed.cost_center), [0.0, 0.0])
                row[0] += share
                if closed.ended and closed.in_period:
                    row[1] += 1
                add_counts(by_day, closed.by_day)
                outside += max(0.0, closed.seconds - share) if closed.by_day else 0.0
                fraction = share / closed.seconds if closed.seconds else 0.0
                low += closed.low * fraction if closed.low is not None else share
                high += closed.high * fraction if closed.high is not None else share
            for flag in closed.flags:
                counts[flag] += 1
            if closed.flags:
                flagged.append(
                    (
                        closed.order[0],
                        {
                            "flags": list(closed.flags),
                            "team": closed.team,
                            "namespace": namespace or None,
                            "name": name or None,
                            "uid": uid or None,
                            "segment": segment,
                            "event": closed.event,
                            "time": closed.order[0],
                            "gpuHours": round(closed.seconds / 3600, 3)
                            if closed.seconds is not None
                            else None,
                            "gpuHoursMin": round(closed.low / 3600, 3) if closed.low is not None else None,
                            "gpuHoursMax": round(closed.high / 3600, 3) if closed.high is not None else None,
                            "note": closed.note,
                        },
                    )
                )
        for (uid, segment), (time, team, namespace, name) in self.started.items():
            if (uid, segment) in self.closed_segments:
                continue
            counts["open"] += 1
            flagged.append(
                (
                    time,
                    {
                        "flags": ["open"],
                        "team": team,
                        "namespace": namespace or None,
                        "name": name or None,
                        "uid": uid,
                        "segment": segment,
                        "event": "started",
                        "time": time,
                        "gpuHours": None,
                        "gpuHoursMin": None,
                        "gpuHoursMax": None,
                        "note": "started, and no record in the inputs closes it: not charged yet",
                    },
                )
            )
        flagged.sort(key=lambda item: item[0], reverse=True)
        per_team: dict[str, float] = {}
        for (team, _), v in totals.items():
            per_team[team] = per_team.get(team, 0.0) + v[0]
        total = sum(per_team.values())
        shown = sorted(set(days) | set(by_day))
        return {
            "gpuHours": round(total / 3600, 3),
            "range": {"gpuHoursMin": round(low / 3600, 3), "gpuHoursMax": round(high / 3600, 3)},
            "byTeam": [
                {"team": t, "gpuHours": round(s / 3600, 3), "share": round(s / total, 4) if total else 0.0}
                for t, s in sorted(per_team.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
            "byTeamAndCostCenter": [
                {
                    "team": team,
                    "costCenter": cost_center,
                    "gpuSeconds": round(v[0], 3),
                    "gpuHours": round(v[0] / 3600, 3),
                    "jobs": int(v[1]),
                }
                for (team, cost_center), v in sorted(totals.items())
            ],
            "byDay": [{"date": d, "gpuHours": round(by_day.get(d, 0.0) / 3600, 3)} for d in shown],
            "outsidePeriodGpuHours": round(outside / 3600, 3),
            "flags": counts,
            "flaggedSegments": len(flagged),
            "flagged": [item for _, item in flagged[: self.max_events]],
            "duplicates": {"records": self.duplicates, "differing": self.differing},
            "lifecycleEvents": dict(sorted(self.lifecycle_events.items())),
            "lifecycleWithoutGpuSeconds": without_seconds,
        }
