"""Small helpers shared by the report's aggregators: tolerant reading of record values, merging
of counters and samples, and the calendar days of a period."""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "add_counts",
    "at",
    "merge_recent",
    "most_recent",
    "now",
    "number",
    "period_days",
    "text",
    "username",
]


def text(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def add_counts(target: dict[Any, Any], source: Mapping[Any, Any]) -> None:
    for key, value in source.items():
        target[key] = target.get(key, 0) + value


def at(index: int) -> Callable[[tuple[Any, ...]], Any]:
    return lambda item: item[index]


def merge_recent(
    mine: deque[tuple[Any, ...]], other: deque[tuple[Any, ...]], at: int
) -> deque[tuple[Any, ...]]:
    """The most recent ``maxlen`` samples of both (by the time at index ``at``), oldest first."""
    merged = sorted([*mine, *other], key=lambda item: item[at])
    return deque(merged, maxlen=mine.maxlen)


def most_recent(events: list[tuple[Any, ...]], limit: int) -> list[tuple[Any, ...]]:
    """The ``limit`` latest events (time at index 1), latest first; of equal times, the one added
    last comes first."""
    order = sorted(range(len(events)), key=lambda i: (events[i][1], i), reverse=True)
    return [events[i] for i in order[:limit]]


def username(request: Any) -> str:
    user = request.get("user") if isinstance(request, Mapping) else None
    name = user.get("username") if isinstance(user, Mapping) else None
    return name if isinstance(name, str) and name else "(unknown)"


def period_days(
    since: str | None, until: str | None, first: str | None, last: str | None, seen: set[str]
) -> list[str]:
    """Every calendar day (UTC) of the period: from --from (or the first record) to --to (or the
    last record), capped at ten years; ``seen`` (days that hold data) when neither end is known."""
    start = since[:10] if since else first[:10] if first else None
    if until:
        end_moment = dt.datetime.fromisoformat(until.replace("Z", "+00:00")) - dt.timedelta(milliseconds=1)
        end: str | None = end_moment.date().isoformat()
    else:
        end = last[:10] if last else None
    if start is None or end is None:
        return sorted(seen)
    day = dt.date.fromisoformat(start)
    stop = dt.date.fromisoformat(end)
    out: list[str] = []
    while day <= stop and len(out) < 3660:
        out.append(day.isoformat())
        day += dt.timedelta(days=1)
    return out


def now() -> str:
    from mpigate.audit._canonical import format_time

    return format_time(dt.datetime.now(dt.UTC))
