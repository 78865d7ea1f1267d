"""A TrainJob's lifecycle transitions and GPU-seconds, as pure functions of what the API shows.

The controller derives, on every event, which transitions the job has gone through that are
not yet in its ``mpigate.io/lifecycle`` annotation (``admitted@<ts>,started@<ts>,...``) and
writes one audit record per new transition. Re-delivered events find the annotation updated and
produce nothing.

- ``admitted``: the job is not suspended (Kueue admitted it and set ``spec.suspend: false``; a job
  outside Kueue is admitted at creation). Time: the ``Suspended=False`` condition's transition,
  else the creation time.
- ``started``: a pod of the job has a running (or finished) container. Time: the earliest
  container start.
- ``suspended``: the job is suspended again after admission (Kueue preempted or evicted it).
- ``succeeded`` / ``failed``: the ``Complete`` / ``Failed`` condition is ``True``.
- ``deleted``: the TrainJob is gone.

``suspended``, ``succeeded``, ``failed`` and ``deleted`` close a *run segment* and carry its
GPU-seconds: Σ over the job's pods of GPUs per pod × the part of the pod's running time (first
container start to last container finish) that lies in the segment.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "CLOSING_EVENTS",
    "EVENTS",
    "LIFECYCLE_ANNOTATION",
    "PodRun",
    "Recorded",
    "Transition",
    "format_history",
    "format_time",
    "gpu_seconds",
    "parse_history",
    "parse_time",
    "plan",
    "pod_run",
]

LIFECYCLE_ANNOTATION: Final = "mpigate.io/lifecycle"
REPLICATED_JOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"

Event = Literal["admitted", "started", "suspended", "succeeded", "failed", "deleted"]
EVENTS: Final[tuple[Event, ...]] = ("admitted", "started", "suspended", "succeeded", "failed", "deleted")
# Events that end a run segment and carry its GPU-seconds.
CLOSING_EVENTS: Final = frozenset({"suspended", "succeeded", "failed", "deleted"})
_OPEN: Final = frozenset({"admitted", "started"})
_TERMINAL: Final = frozenset({"succeeded", "failed", "deleted"})


def parse_time(value: Any) -> dt.datetime | None:
    """An RFC 3339 timestamp as the API server writes it (``2026-11-22T10:15:03Z``), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def format_time(value: dt.datetime) -> str:
    """UTC, whole seconds, ``Z`` — the API server's own format."""
    return value.astimezone(dt.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


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


@dataclass(frozen=True, slots=True)
class PodRun:
    """When a pod of the job ran, and with how many GPUs."""

    name: str
    uid: str
    replicated_job: str | None
    node: str | None
    start: dt.datetime | None
    end: dt.datetime | None
    gpus: int = 0

    def seconds_within(self, since: dt.datetime | None, until: dt.datetime) -> float:
        """Running seconds inside ``[since, until]`` (a still running pod runs until ``until``)."""
        if self.start is None:
            return 0.0
        start = max(self.start, since) if since is not None else self.start
        end = min(self.end, until) if self.end is not None else until
        return max(0.0, (end - start).total_seconds())


def _container_times(statuses: Any) -> tuple[list[dt.datetime], list[dt.datetime], bool]:
    starts: list[dt.datetime] = []
    ends: list[dt.datetime] = []
    active = False
    for status in statuses if isinstance(statuses, list) else []:
        if not isinstance(status, Mapping):
            continue
        for key in ("state", "lastState"):
            state = status.get(key)
            if not isinstance(state, Mapping):
                continue
            running, terminated = state.get("running"), state.get("terminated")
            if isinstance(running, Mapping):
                if (t := parse_time(running.get("startedAt"))) is not None:
                    starts.append(t)
                active = active or key == "state"
            if isinstance(terminated, Mapping):
                if (t := parse_time(terminated.get("startedAt"))) is not None:
                    starts.append(t)
                if (t := parse_time(terminated.get("finishedAt"))) is not None:
                    ends.append(t)
            if key == "state" and isinstance(state.get("waiting"), Mapping):
                active = True  # restarting: the pod still holds its GPUs
    return starts, ends, active


def pod_run(pod: Mapping[str, Any], gpus: int = 0, *, gone_at: dt.datetime | None = None) -> PodRun:
    """The running time of ``pod``: first container start → last container finish.

    A pod whose containers are not all terminated is still running, unless it is gone
    (``gone_at``: deleted; then it ran until its deletion, or until ``gone_at``)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    starts, ends, active = _container_times(status.get("containerStatuses"))
    start = min(starts) if starts else None
    end: dt.datetime | None = None
    phase = status.get("phase")
    if start is not None and not active and ends and phase in ("Succeeded", "Failed", "Running", None):
        end = max(ends)
    if start is not None and end is None and gone_at is not None:
        end = parse_time(meta.get("deletionTimestamp")) or gone_at
        end = max(end, start)
    return PodRun(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        replicated_job=labels.get(REPLICATED_JOB_LABEL) if isinstance(labels, Mapping) else None,
        node=spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else None,
        start=start,
        end=end,
        gpus=gpus,
    )


def gpu_seconds(pods: Iterable[PodRun], since: dt.datetime | None, until: dt.datetime) -> float:
    """Σ GPUs × running seconds of ``pods`` within ``[since, until]``."""
    return round(sum(p.gpus * p.seconds_within(since, until) for p in pods), 3)


@dataclass(frozen=True, slots=True)
class Transition:
    """A lifecycle transition to record."""

    event: Event
    at: dt.datetime
    gpus: int | None = None
    gpu_seconds: float | None = None
    started: dt.datetime | None = None
    finished: dt.datetime | None = None
    reason: str | None = None


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions")
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
    trainjob: Mapping[str, Any],
    pods: Sequence[PodRun],
    history: Sequence[Recorded],
    now: dt.datetime,
    *,
    gpus: int | None = None,
    deleted: bool = False,
) -> list[Transition]:
    """The transitions ``trainjob`` has gone through that ``history`` does not hold yet, in order.

    ``pods`` are all pods of the job the controller knows of (including deleted ones it saw);
    ``gpus`` is the job's total GPU demand (recorded with every transition); ``deleted``: the
    TrainJob is gone.
    """
    events = [r.event for r in history]
    last = events[-1] if events else None
    if last in _TERMINAL and not (deleted and last != "deleted"):
        return []
    out: list[Transition] = []
    # The current segment starts after the last suspension: pods of earlier segments were paid.
    since = next((r.at for r in reversed(history) if r.event == "suspended"), None)
    admitted_at = next((r.at for r in reversed(history) if r.event == "admitted"), None)
    started_at = next((r.at for r in reversed(history) if r.event == "started"), None)
    if last in _TERMINAL:
        # Finished earlier and deleted now: the deletion closes nothing.
        return [Transition("deleted", now, gpus=gpus, gpu_seconds=0.0)]

    meta = trainjob.get("metadata") or {}
    spec = trainjob.get("spec") or {}
    complete, failed = _condition(trainjob, "Complete"), _condition(trainjob, "Failed")
    suspended_cond = _condition(trainjob, "Suspended")
    terminal: tuple[Event, Mapping[str, Any]] | None = None
    if _true(complete):
        terminal = ("succeeded", complete)  # type: ignore[assignment]
    elif _true(failed):
        terminal = ("failed", failed)  # type: ignore[assignment]
    suspended = spec.get("suspend") is True and terminal is None and not deleted
    segment_pods = [p for p in pods if p.start is not None and (since is None or p.start >= since)]
    first_start = min((p.start for p in segment_pods if p.start is not None), default=None)

    def admit() -> None:
        nonlocal last, admitted_at
        # Trainer turns Suspended to False (reason Resumed) when Kueue admits the job; a job that
        # was never suspended was admitted when it was created.
        at: dt.datetime | None = None
        if suspended_cond is not None and suspended_cond.get("status") == "False":
            at = parse_time(suspended_cond.get("lastTransitionTime"))
        elif suspended_cond is None and since is None:
            at = parse_time(meta.get("creationTimestamp"))
        if at is None or (since is not None and at < since):
            at = now
        if first_start is not None:
            at = min(at, first_start)
        out.append(Transition("admitted", at, gpus=gpus))
        last, admitted_at = "admitted", at

    def start() -> None:
        nonlocal last, started_at
        assert first_start is not None
        out.append(Transition("started", first_start, gpus=gpus, started=first_start))
        last, started_at = "started", first_start

    def close(event: Event, at: dt.datetime, reason: str | None) -> None:
        opened = last in _OPEN
        used = gpu_seconds(segment_pods, since, at) if opened else 0.0
        out.append(
            Transition(
                event,
                at,
                gpus=gpus,
                gpu_seconds=used,
                started=started_at if opened else None,
                finished=at,
                reason=reason,
            )
        )

    if terminal is not None or deleted:
        ran = first_start is not None
        if ran and last not in _OPEN:
            admit()
        if ran and last == "admitted":
            start()
        if terminal is not None:
            event, condition = terminal
            at = parse_time(condition.get("lastTransitionTime")) or now
            close(event, at, _reason(condition))
            last = event
        if deleted:
            close("deleted", now, None)
        return out
    if suspended:
        if last in _OPEN:
            if last == "admitted" and first_start is not None:
                start()
            when: dt.datetime | None = None
            if suspended_cond is not None and _true(suspended_cond):
                when = parse_time(suspended_cond.get("lastTransitionTime"))
            if when is None or (admitted_at is not None and when < admitted_at):
                when = now
            close("suspended", when, _reason(suspended_cond) if _true(suspended_cond) else None)
        return out
    if last not in _OPEN:
        admit()
    if last == "admitted" and first_start is not None:
        start()
    return out
