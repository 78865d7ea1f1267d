"""A job's lifecycle transitions and what each run segment used, as pure functions of what the API
shows and what the controller remembers.

The controller derives, on every event, which transitions the job has gone through that are
not yet in its history (the ``mpigate.io/lifecycle`` annotation, ``admitted@<ts>,started@<ts>,...``)
and writes one audit record per new transition. Re-delivered events find the history updated and
produce nothing.

- ``admitted``: the job is not suspended (Kueue admitted it and set ``suspend: false``; a job
  outside Kueue is admitted at creation). Time: the ``Suspended=False`` condition's transition,
  else the creation time. Each ``admitted`` opens a *run segment*, numbered from 1.
- ``started``: a pod of the job has a running (or finished) container — any pod, the initializers
  included: from admission on the job holds every GPU Kueue admitted, and GPU-seconds are counted
  per pod anyway. Time: the earliest container start of the segment.
- ``suspended``: the job is suspended again after admission (Kueue preempted or evicted it).
- ``succeeded`` / ``failed``: the success condition (``Complete`` for a TrainJob, ``Succeeded`` for an
  MPIJob) / ``Failed`` is ``True``.
- ``deleted``: the job is gone — seen going, or found gone (``vanished``: it disappeared while the
  controller was not watching).

``suspended``, ``succeeded``, ``failed`` and ``deleted`` close the open segment and carry what it
used (:func:`mpigate.controller.usage.charge`): Σ over the segment's pods of GPUs per pod × the
part of the pod's running time that lies in the segment.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from .kinds import REPLICATED_JOB_LABEL, TRAINJOB, JobKind
from .usage import Charge, PodFacts, charge, format_time, parse_time, vanish

__all__ = [
    "CLOSING_EVENTS",
    "EVENTS",
    "LIFECYCLE_ANNOTATION",
    "REPLICATED_JOB_LABEL",
    "Recorded",
    "Transition",
    "format_history",
    "format_time",
    "parse_history",
    "parse_time",
    "plan",
    "segment_since",
]

LIFECYCLE_ANNOTATION: Final = "mpigate.io/lifecycle"

Event = Literal["admitted", "started", "suspended", "succeeded", "failed", "deleted"]
EVENTS: Final[tuple[Event, ...]] = ("admitted", "started", "suspended", "succeeded", "failed", "deleted")
# Events that end a run segment and carry its GPU-seconds.
CLOSING_EVENTS: Final = frozenset({"suspended", "succeeded", "failed", "deleted"})
_OPEN: Final = frozenset({"admitted", "started"})
_TERMINAL: Final = frozenset({"succeeded", "failed", "deleted"})
_NOTHING: Final = Charge(0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Recorded:
    """A transition already recorded (an item of the ``mpigate.io/lifecycle`` annotation)."""

    event: str
    at: dt.datetime


def parse_history(annotation: Any) -> tuple[Recorded, ...]:
    """``admitted@2026-11-22T10:15:03Z,started@...`` → records; unreadable items are skipped."""
    if not isinstance(annotation, str):
        return ()
    out: list[Recorded] = []
    for item in annotation.split(","):
        event, _, stamp = item.strip().partition("@")
        at = parse_time(stamp)
        if event in EVENTS and at is not None:
            out.append(Recorded(event, at))
    return tuple(out)


def format_history(history: Iterable[Recorded]) -> str:
    return ",".join(f"{r.event}@{format_time(r.at)}" for r in history)


def segment_since(history: Sequence[Recorded]) -> dt.datetime | None:
    """Where the open (or next) segment's time begins: the last suspension (what ran before it was
    paid with that segment), or None."""
    return next((r.at for r in reversed(history) if r.event == "suspended"), None)


@dataclass(frozen=True, slots=True)
class Transition:
    """A lifecycle transition to record; closing ones carry what their segment used."""

    event: Event
    at: dt.datetime
    segment: int
    gpus: int | None = None
    charge: Charge | None = None
    started: dt.datetime | None = None
    finished: dt.datetime | None = None
    reason: str | None = None
    #: Closed from what the controller knew: the job disappeared while it was not watching.
    vanished: bool = False
    #: What the controller could not observe about this transition (recorded with it).
    note: str | None = None

    @property
    def gpu_seconds(self) -> float | None:
        return self.charge.gpu_seconds if self.charge is not None else None


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def _true(condition: Mapping[str, Any] | None) -> bool:
    return condition is not None and condition.get("status") == "True"


def _reason(condition: Mapping[str, Any] | None) -> str | None:
    if condition is None:
        return None
    parts = [str(condition[k]) for k in ("reason", "message") if condition.get(k)]
    return ": ".join(parts) or None


def plan(
    job: Mapping[str, Any],
    pods: Sequence[PodFacts],
    history: Sequence[Recorded],
    now: dt.datetime,
    *,
    kind: JobKind = TRAINJOB,
    gpus: int | None = None,
    deleted: bool = False,
    deleted_at: dt.datetime | None = None,
    vanished: bool = False,
    missing: Iterable[str] = (),
    last_seen: dt.datetime | None = None,
) -> list[Transition]:
    """The transitions ``job`` has gone through that ``history`` does not hold yet, in order.

    ``pods``: what the controller knows of the job's pods (deleted ones included); ``missing``:
    uids among them that are gone although the controller never saw them go (their end is unknown:
    charged until the segment's closing transition, see :func:`~.usage.vanish`); ``last_seen``: when
    the controller last observed the job. ``gpus``: the job's total demand (recorded with every
    transition). ``deleted``: the job is gone (at ``deleted_at``, else ``now``); ``vanished``: it
    disappeared while the controller was not watching (its pods are charged until ``last_seen``).
    """
    events = [r.event for r in history]
    last = events[-1] if events else None
    segment = events.count("admitted")
    if last in _TERMINAL and not (deleted and last != "deleted"):
        return []
    if last in _TERMINAL:
        # Finished earlier and deleted now: the deletion closes nothing.
        return [Transition("deleted", deleted_at or now, segment, gpus=gpus, charge=_NOTHING)]
    since = segment_since(history)
    admitted_at = next((r.at for r in reversed(history) if r.event == "admitted"), None)
    started_at = next((r.at for r in reversed(history) if r.event == "started"), None)
    out: list[Transition] = []

    meta = job.get("metadata") or {}
    complete, failed = _condition(job, kind.complete_condition), _condition(job, "Failed")
    suspended_cond = _condition(job, "Suspended")
    terminal: tuple[Event, Mapping[str, Any]] | None = None
    if _true(complete) and complete is not None:
        terminal = ("succeeded", complete)
    elif _true(failed) and failed is not None:
        terminal = ("failed", failed)
    suspended = kind.suspended(job) and terminal is None and not deleted
    missing_uids = frozenset(missing)
    segment_pods = [
        p for p in pods if (first := p.earliest) is not None and (since is None or first >= since)
    ]
    first_start = min((p.start for p in segment_pods if p.start is not None), default=None)
    # the earliest any pod of the segment can have run (a pod known only from its scheduling counts)
    first_run = min((p.earliest for p in segment_pods if p.earliest is not None), default=None)

    resumed = parse_time(suspended_cond.get("lastTransitionTime")) if suspended_cond is not None else None
    watched_until = max(t for t in (admitted_at, last_seen) if t is not None) if admitted_at else None
    if (
        last in _OPEN
        and suspended_cond is not None
        and suspended_cond.get("status") == "False"
        and resumed is not None
        and watched_until is not None
        and resumed > watched_until
    ):
        # Suspended=False changed after the controller last saw the job: it was suspended and
        # admitted again meanwhile. Close the segment that ended unseen, then go on from there.
        earlier = [p for p in segment_pods if p.earliest is not None and p.earliest < resumed]
        used = charge(
            [
                vanish(p, last_seen=last_seen, noticed=now, closed_at=None) if p.uid in missing_uids else p
                for p in earlier
            ],
            since,
            resumed,
        )
        seen = format_time(watched_until)
        closed = Transition(
            "suspended",
            resumed,
            segment,
            gpus=gpus,
            charge=used,
            started=started_at if last == "started" else None,
            finished=resumed,
            reason="suspended and admitted again while the controller was not watching",
            note=f"suspended between {seen} and {format_time(resumed)}; the time is not known",
        )
        rest = plan(
            job,
            pods,
            (*history, Recorded("suspended", resumed)),
            now,
            kind=kind,
            gpus=gpus,
            deleted=deleted,
            deleted_at=deleted_at,
            vanished=vanished,
            missing=missing_uids,
            last_seen=last_seen,
        )
        return [closed, *rest]

    def admit(note: str | None = None) -> None:
        nonlocal last, admitted_at, segment
        # Trainer and the MPI Operator turn Suspended to False (reason Resumed) when Kueue admits
        # the job; a job that was never suspended was admitted when it was created.
        at: dt.datetime | None = None
        if suspended_cond is not None and suspended_cond.get("status") == "False":
            at = parse_time(suspended_cond.get("lastTransitionTime"))
        elif suspended_cond is None and since is None:
            at = parse_time(meta.get("creationTimestamp"))
        if at is None or (since is not None and at < since):
            at = now
        if first_run is not None:
            at = min(at, first_run)
        segment += 1
        out.append(Transition("admitted", at, segment, gpus=gpus, note=note))
        last, admitted_at = "admitted", at

    def start() -> None:
        nonlocal last, started_at
        assert first_start is not None
        out.append(Transition("started", first_start, segment, gpus=gpus, started=first_start))
        last, started_at = "started", first_start

    def close(
        event: Event, at: dt.datetime, reason: str | None, *, by_condition: bool, note: str | None = None
    ) -> None:
        opened = last in _OPEN
        used = _NOTHING
        if opened:
            facts = [
                vanish(p, last_seen=last_seen, noticed=now, closed_at=at if by_condition else None)
                if p.uid in missing_uids
                else p
                for p in segment_pods
            ]
            used = charge(facts, since, at)
        out.append(
            Transition(
                event,
                at,
                segment,
                gpus=gpus,
                charge=used,
                started=(started_at if last == "started" else None) if opened else None,
                finished=at,
                reason=reason,
                vanished=vanished and event == "deleted",
                note=note,
            )
        )

    if terminal is not None or deleted:
        ran = first_run is not None
        if ran and last not in _OPEN:
            admit()
        if first_start is not None and last == "admitted":
            start()
        if terminal is not None:
            event, condition = terminal
            at = parse_time(condition.get("lastTransitionTime")) or now
            close(event, at, _reason(condition), by_condition=True)
            last = event
        if deleted:
            note = None
            if vanished:
                seen = f"last seen {format_time(last_seen)}" if last_seen is not None else "never seen"
                note = (
                    f"deleted while the controller was not watching ({seen}, found gone {format_time(now)})"
                )
            close("deleted", deleted_at or now, None, by_condition=False, note=note)
        return out
    if suspended:
        if last not in _OPEN and first_run is not None:
            # a whole segment ran while the controller was not watching; the suspension overwrote
            # the admission's time
            admit(note="admitted while the controller was not watching; the time is its first pod's")
        if last in _OPEN:
            if last == "admitted" and first_start is not None:
                start()
            when: dt.datetime | None = None
            if suspended_cond is not None and _true(suspended_cond):
                when = parse_time(suspended_cond.get("lastTransitionTime"))
            if when is None or (admitted_at is not None and when < admitted_at):
                when = now
            close(
                "suspended",
                when,
                _reason(suspended_cond) if _true(suspended_cond) else None,
                by_condition=True,
            )
        return out
    if last not in _OPEN:
        admit()
    if last == "admitted" and first_start is not None:
        start()
    return out
