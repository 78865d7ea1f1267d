"""What each pod of a job ran, and what a run segment used (pure).

A pod holds its GPUs from its first container start to its last container finish, restarts
included (the pod keeps its GPUs while a container restarts). :class:`PodFacts` is what the
controller knows of one pod; it is built from the pod as the API shows it and from what was known
before (:func:`observe`), so that what the API forgets — the first run of a container restarted
twice, a pod deleted while the controller was down — is not lost: the controller keeps the facts in
the job's ``mpigate.io/pods`` annotation (:mod:`.jobstate`).

When a fact cannot be known, the facts say so and give its range: a pod first seen after two or
more restarts may have started as early as ``status.startTime``; a pod that disappeared while the
controller was not watching stopped somewhere between the controller's last observation and the
moment it noticed. What is charged then follows two rules (docs/controller.md, "Semantics"):

- what the API still shows about the job bounds the figure — the pod's ``status.startTime``, the
  transition that closed its segment (Kueue suspends, JobSet deletes the pods);
- where only the controller's own absence bounds it, the figure stops at the controller's last
  observation: a team is never charged for the time mpigate was not watching.

:func:`charge` turns the facts of a segment's pods into its GPU-seconds, the range they lie in, the
GPUs in use over time (:attr:`Charge.usage`, so that a report can split a segment at any
boundary) and per UTC day.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

__all__ = [
    "Charge",
    "PodFacts",
    "charge",
    "container_runs",
    "format_time",
    "observe",
    "parse_time",
    "split_by_day",
    "vanish",
]

#: How a pod's end is known.
Ended = Literal["finished", "deleted", "node-lost", "segment-closed", "last-seen"]
#: How a figure is known: every fact observed; a fact taken from the job's own later state (the
#: transition that closed the segment, the pod's start time); a fact bounded only by the
#: controller's last observation.
Basis = Literal["observed", "inferred", "partial"]
_BASIS_ORDER: Final = {"observed": 0, "inferred": 1, "partial": 2}
#: The kubelet's reason on a pod whose node stopped reporting (Kubernetes
#: pkg/controller/util/node SetPodTerminationReason: NodeUnreachablePodReason).
NODE_LOST_REASON: Final = "NodeLost"


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
class PodFacts:
    """What the controller knows of one pod of a job.

    ``start``/``end`` are what is charged; ``start_range``/``end_range`` (earliest, latest) are set
    when the fact is not known exactly. ``end`` is None while the pod runs (it is charged until the
    segment closes). ``spec_gpus`` is the pod spec's own GPU count when it differs from ``gpus`` (the
    job's resolved demand, which is what is charged)."""

    uid: str
    name: str
    role: str | None = None
    node: str | None = None
    gpus: int = 0
    spec_gpus: int | None = None
    start: dt.datetime | None = None
    start_range: tuple[dt.datetime, dt.datetime] | None = None
    end: dt.datetime | None = None
    end_range: tuple[dt.datetime, dt.datetime] | None = None
    ended: Ended | None = None
    gone: bool = False
    #: The pod's Ready=False transition (when the node lifecycle controller marked it not ready).
    not_ready_at: dt.datetime | None = None

    @property
    def earliest(self) -> dt.datetime | None:
        """The earliest the pod can have started (None: it never ran, as far as is known)."""
        return self.start_range[0] if self.start_range is not None else self.start

    @property
    def basis(self) -> Basis:
        if self.ended == "last-seen" or self.start is None:
            return "partial"
        if self.start_range is not None or self.ended == "segment-closed":
            return "inferred"
        return "observed"


def container_runs(pod: Mapping[str, Any]) -> tuple[list[dt.datetime], list[dt.datetime], bool, int]:
    """Starts and finishes of every run the pod's containers show (init containers included:
    the pod holds its GPUs while they run), whether one is running or restarting, and the most
    runs of one container that the API no longer shows (``restartCount`` beyond ``lastState``)."""
    status = pod.get("status")
    status = status if isinstance(status, Mapping) else {}
    starts: list[dt.datetime] = []
    ends: list[dt.datetime] = []
    active = False
    unseen = 0
    for key in ("initContainerStatuses", "containerStatuses"):
        statuses = status.get(key)
        for container in statuses if isinstance(statuses, list) else []:
            if not isinstance(container, Mapping):
                continue
            shown = 0
            for which in ("state", "lastState"):
                state = container.get(which)
                if not isinstance(state, Mapping):
                    continue
                running, terminated = state.get("running"), state.get("terminated")
                if isinstance(running, Mapping) and (t := parse_time(running.get("startedAt"))):
                    starts.append(t)
                    shown += 1
                    active = active or which == "state"
                if isinstance(terminated, Mapping):
                    if (t := parse_time(terminated.get("startedAt"))) is not None:
                        starts.append(t)
                        shown += 1
                    if (t := parse_time(terminated.get("finishedAt"))) is not None:
                        ends.append(t)
                if which == "state" and isinstance(state.get("waiting"), Mapping):
                    active = True  # not started yet, or restarting: the pod still holds its GPUs
            restarts = container.get("restartCount")
            if isinstance(restarts, int) and not isinstance(restarts, bool):
                # restartCount restarts mean restartCount + 1 runs; the API shows at most two
                unseen = max(unseen, restarts + 1 - shown) if shown else unseen
    return starts, ends, active, unseen


def _ready_false_at(pod: Mapping[str, Any]) -> dt.datetime | None:
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "False":
            return parse_time(c.get("lastTransitionTime"))
    return None


def observe(
    pod: Mapping[str, Any],
    *,
    gpus: int,
    spec_gpus: int,
    role: str | None,
    known: PodFacts | None = None,
    gone_at: dt.datetime | None = None,
    node_lost: bool = False,
) -> PodFacts:
    """The facts of ``pod`` as the API shows it now, merged with what was ``known`` before.

    ``gone_at``: the pod was deleted (its DELETED event's time). ``node_lost``: its node is gone or
    not ready (Kubernetes' node lifecycle controller marked the pod not ready), so containers that
    still read as running stopped when the pod turned not ready."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    status = pod.get("status")
    status = status if isinstance(status, Mapping) else {}
    starts, ends, active, unseen = container_runs(pod)
    start = min(starts) if starts else None
    start_range = None
    if known is not None and known.start is not None:
        # remembered from an earlier look: the first run, whatever the API shows now
        start = known.start if start is None else min(start, known.start)
        start_range = known.start_range
    elif start is not None and unseen > 0:
        # first seen after runs the API no longer shows: it ran from its pod's start at the earliest
        earliest = parse_time(status.get("startTime"))
        if earliest is not None and earliest < start:
            start_range = (earliest, start)
            start = earliest
    node = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else None
    end: dt.datetime | None = None
    ended: Ended | None = None
    not_ready = _ready_false_at(pod)
    if start is not None and not active and ends:
        end, ended = max(max(ends), start), "finished"
    lost = node_lost or status.get("reason") == NODE_LOST_REASON
    if start is not None and end is None and lost and not_ready is not None and not_ready >= start:
        # the kubelet never reported the end: the node failed when the pod turned not ready
        end, ended = not_ready, "node-lost"
    if start is not None and end is None and gone_at is not None:
        deletion = parse_time(meta.get("deletionTimestamp"))
        end, ended = max(min(deletion or gone_at, gone_at), start), "deleted"
    return PodFacts(
        uid=str(meta.get("uid") or ""),
        name=str(meta.get("name") or ""),
        role=role,
        node=node or (known.node if known is not None else None),
        gpus=gpus,
        spec_gpus=spec_gpus if spec_gpus != gpus else None,
        start=start,
        start_range=start_range,
        end=end,
        ended=ended,
        gone=gone_at is not None,
        not_ready_at=not_ready,
    )


def vanish(
    facts: PodFacts, *, last_seen: dt.datetime | None, noticed: dt.datetime, closed_at: dt.datetime | None
) -> PodFacts:
    """``facts`` of a pod found gone without the controller seeing it go, its end unknown.

    When the segment had closed by then (``closed_at``: the job's own transition), the pod ran until
    that transition at the latest and is charged until it; otherwise it is charged until the
    controller's ``last_seen`` observation (it stopped somewhere before ``noticed``)."""
    if facts.gone or facts.end is not None or facts.start is None:
        return replace(facts, gone=True)
    early = max(facts.start, last_seen) if last_seen is not None else facts.start
    if closed_at is not None and closed_at >= early:
        return replace(facts, gone=True, end=closed_at, end_range=(early, closed_at), ended="segment-closed")
    late = max(noticed, early)
    return replace(facts, gone=True, end=early, end_range=(early, late), ended="last-seen")


@dataclass(frozen=True, slots=True)
class Charge:
    """What one run segment used: GPU-seconds charged, their range when a fact was not observed,
    GPUs in use over time (``usage``: (from, GPUs) steps, the last one 0 GPUs) and per UTC day."""

    gpu_seconds: float
    minimum: float
    maximum: float
    usage: tuple[tuple[dt.datetime, int], ...] = ()
    by_day: Mapping[str, float] = field(default_factory=dict)
    pods: int = 0
    basis: Basis = "observed"
    notes: tuple[str, ...] = ()
    spec_mismatches: tuple[tuple[str, int, int], ...] = ()


def _overlap(start: dt.datetime, end: dt.datetime, since: dt.datetime | None, until: dt.datetime) -> float:
    lo = max(start, since) if since is not None else start
    hi = min(end, until)
    return max(0.0, (hi - lo).total_seconds())


def _describe(p: PodFacts) -> str | None:
    if p.start is None and p.start_range is not None:
        return (
            f"pod {p.name}: scheduled at {format_time(p.start_range[0])} and gone while the controller was "
            "not watching; its run time is not known (not charged)"
        )
    if p.start_range is not None:
        return (
            f"pod {p.name}: restarted more often than the API still shows; charged from its pod start "
            f"{format_time(p.start_range[0])} (its earliest run seen started {format_time(p.start_range[1])})"
        )
    if p.ended == "segment-closed" and p.end_range is not None:
        return (
            f"pod {p.name}: gone while the controller was not watching; charged until the segment closed "
            f"at {format_time(p.end_range[1])} (last seen running {format_time(p.end_range[0])})"
        )
    if p.ended == "last-seen" and p.end_range is not None:
        return (
            f"pod {p.name}: gone while the controller was not watching; charged until it was last seen "
            f"running at {format_time(p.end_range[0])} (it stopped by {format_time(p.end_range[1])})"
        )
    if p.ended == "node-lost" and p.end is not None:
        return f"pod {p.name}: its node was lost; charged until it turned not ready at {format_time(p.end)}"
    return None


def charge(pods: Iterable[PodFacts], since: dt.datetime | None, until: dt.datetime) -> Charge:
    """GPU-seconds of ``pods`` within ``[since, until]`` (a pod still running runs until ``until``)."""
    total = low = high = 0.0
    steps: dict[dt.datetime, int] = {}
    by_day: dict[str, float] = {}
    basis: Basis = "observed"
    notes: list[str] = []
    mismatches: list[tuple[str, int, int]] = []
    charged = 0
    for p in sorted(pods, key=lambda p: (p.earliest or until, p.name)):
        if p.start is None:
            if p.start_range is not None and p.end_range is not None:
                # ran unseen (known from its scheduling only): not charged, within the range
                unseen = _overlap(p.start_range[0], p.end_range[1], since, until)
                if unseen > 0:
                    high += p.gpus * unseen
                    basis = "partial"
                    notes.append(_describe(p) or "")
            continue
        end = p.end if p.end is not None else until
        seconds = _overlap(p.start, end, since, until)
        if seconds <= 0 and not (p.end_range and _overlap(p.start, p.end_range[1], since, until) > 0):
            continue
        charged += 1
        start_lo, start_hi = p.start_range if p.start_range is not None else (p.start, p.start)
        end_lo, end_hi = p.end_range if p.end_range is not None else (end, end)
        total += p.gpus * seconds
        low += p.gpus * _overlap(start_hi, end_lo, since, until)
        high += p.gpus * _overlap(start_lo, end_hi, since, until)
        if p.spec_gpus is not None:
            mismatches.append((p.name, p.gpus, p.spec_gpus))
        if _BASIS_ORDER[p.basis] > _BASIS_ORDER[basis]:
            basis = p.basis
        if (note := _describe(p)) is not None:
            notes.append(note)
        if p.gpus and seconds > 0:
            lo = max(p.start, since) if since is not None else p.start
            hi = min(end, until)
            steps[lo] = steps.get(lo, 0) + p.gpus
            steps[hi] = steps.get(hi, 0) - p.gpus
            for day, part in split_by_day(lo, hi):
                by_day[day] = by_day.get(day, 0.0) + p.gpus * part
    usage: list[tuple[dt.datetime, int]] = []
    running = 0
    for at in sorted(steps):
        if steps[at] == 0:
            continue
        running += steps[at]
        usage.append((at, running))
    return Charge(
        gpu_seconds=round(total, 3),
        minimum=round(low, 3),
        maximum=round(high, 3),
        usage=tuple(usage),
        by_day={d: round(s, 3) for d, s in sorted(by_day.items())},
        pods=charged,
        basis=basis,
        notes=tuple(notes),
        spec_mismatches=tuple(mismatches),
    )


def split_by_day(start: dt.datetime, end: dt.datetime) -> list[tuple[str, float]]:
    """``[start, end]`` cut at UTC midnights: (day, seconds) for each day it touches."""
    out: list[tuple[str, float]] = []
    at = start.astimezone(dt.UTC)
    end = end.astimezone(dt.UTC)
    while at < end:
        midnight = dt.datetime.combine(at.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
        stop = min(midnight, end)
        out.append((at.date().isoformat(), (stop - at).total_seconds()))
        at = stop
    return out
