"""Lifecycle transitions and GPU-seconds (pure), from the fixtures' TrainJob states and pods.
(Whole timelines through the real reconciler, restarts and outages included: test_timelines.py.)"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from tests.controller.conftest import fixture

from mpigate.controller.lifecycle import (
    Recorded,
    Transition,
    format_history,
    parse_history,
    plan,
)
from mpigate.controller.usage import Charge, PodFacts, charge, observe

STATES: dict[str, Any] = fixture("trainjob-states.yaml")
PODS: dict[str, Any] = fixture("pods.yaml")


def at(hhmmss: str) -> dt.datetime:
    return dt.datetime.fromisoformat(f"2026-11-22T{hhmmss}+00:00")


def run(name: str, gpus: int = 8, gone_at: dt.datetime | None = None) -> PodFacts:
    return observe(PODS[name], gpus=gpus, spec_gpus=gpus, role=None, gone_at=gone_at)


def gpu_seconds(pods: list[PodFacts], since: dt.datetime | None, until: dt.datetime) -> float:
    return charge(pods, since, until).gpu_seconds


def closing(t: Transition) -> tuple[Any, ...]:
    return (t.event, t.at, t.segment, t.gpus, t.gpu_seconds, t.started, t.finished, t.reason)


def record(history: list[Recorded], transitions: list[Transition]) -> list[Recorded]:
    return [*history, *(Recorded(t.event, t.at) for t in transitions)]


def test_pod_running_times_from_container_states() -> None:
    launcher = run("launcher-running")
    assert (launcher.start, launcher.end, launcher.node) == (at("10:02:00"), None, "gpu-eu-1")
    restarted = run("node-restarted")  # the first, failed run counts: it held the GPUs
    assert (restarted.start, restarted.end) == (at("10:01:00"), None)
    finished = run("node-finished")  # the last container to finish ends the pod
    assert (finished.start, finished.end) == (at("10:01:30"), at("10:31:30"))
    assert run("pending").start is None
    # a running pod that is deleted ran until its deletion
    assert run("launcher-running", gone_at=at("10:10:00")).end == at("10:10:00")


def test_gpu_seconds_clip_to_the_segment() -> None:
    pods = [run("launcher-running"), run("node-finished", gpus=4), run("pending")]
    # 8 × (10:20 − 10:02) + 4 × (10:31:30 − 10:01:30), capped at 10:20 for the finished pod
    assert gpu_seconds(pods, None, at("10:20:00")) == 8 * 1080 + 4 * 1110
    assert gpu_seconds(pods, at("10:10:00"), at("10:20:00")) == 8 * 600 + 4 * 600
    assert gpu_seconds(pods, None, at("12:00:00")) == 8 * 7080 + 4 * 1800


def test_a_kueue_job_through_preemption_to_success() -> None:
    history: list[Recorded] = []
    # queued: nothing yet
    assert plan(STATES["queued"], [], history, at("09:30:00"), gpus=16) == []
    # admitted at 10:00, no pod running yet
    step = plan(STATES["admitted"], [run("pending")], history, at("10:00:05"), gpus=16)
    assert step == [Transition("admitted", at("10:00:00"), 1, gpus=16)]
    history = record(history, step)
    # the same event delivered again: nothing new
    assert plan(STATES["admitted"], [run("pending")], history, at("10:00:06"), gpus=16) == []
    # pods run: started at the earliest container start
    pods = [run("launcher-running"), run("node-restarted"), run("pending")]
    step = plan(STATES["admitted"], pods, history, at("10:05:00"), gpus=16)
    assert step == [Transition("started", at("10:01:00"), 1, gpus=16, started=at("10:01:00"))]
    history = record(history, step)
    # preempted at 10:20: the segment's GPU-seconds, the reason from the condition
    step = plan(STATES["preempted"], pods, history, at("10:20:03"), gpus=16)
    assert [closing(t) for t in step] == [
        (
            "suspended",
            at("10:20:00"),
            1,
            16,
            8 * 1080 + 8 * 1140,
            at("10:01:00"),
            at("10:20:00"),
            "Suspended: Preempted by urgent-run",
        )
    ]
    history = record(history, step)
    assert plan(STATES["preempted"], pods, history, at("10:25:00"), gpus=16) == []
    # admitted again at 11:00; the old pods are gone, new ones run 11:01 → 11:59
    step = plan(STATES["readmitted"], [], history, at("11:00:02"), gpus=16)
    assert step == [Transition("admitted", at("11:00:00"), 2, gpus=16)]
    history = record(history, step)
    second = [
        PodFacts(
            "u2", "n2", "node", "gpu-eu-2", 8, start=at("11:01:00"), end=at("11:59:00"), ended="finished"
        ),
        PodFacts(
            "u3", "l2", "launcher", "gpu-eu-1", 8, start=at("11:01:00"), end=at("11:59:00"), ended="finished"
        ),
    ]
    old = [run("launcher-running", gone_at=at("10:20:30")), run("node-restarted", gone_at=at("10:20:30"))]
    step = plan(STATES["succeeded"], old + second, history, at("12:00:01"), gpus=16)
    assert [t.event for t in step] == ["started", "succeeded"]
    assert step[0].at == at("11:01:00")
    # only this segment's pods: the preempted ones were paid with the suspension
    assert step[1].gpu_seconds == 2 * 8 * 3480
    assert (step[1].started, step[1].finished, step[1].reason) == (
        at("11:01:00"),
        at("12:00:00"),
        "JobsCompleted: jobset completed",
    )
    history = record(history, step)
    events = [r.event for r in history]
    assert events == ["admitted", "started", "suspended", "admitted", "started", "succeeded"]
    assert plan(STATES["succeeded"], second, history, at("12:05:00"), gpus=16) == []
    # deleted later: one record, nothing left to pay
    step = plan(STATES["succeeded"], second, history, at("13:00:00"), gpus=16, deleted=True)
    assert step == [Transition("deleted", at("13:00:00"), 2, gpus=16, charge=Charge(0.0, 0.0, 0.0))]
    history = record(history, step)
    assert plan(STATES["succeeded"], second, history, at("13:00:01"), gpus=16, deleted=True) == []


def test_missed_events_are_reconstructed_in_order() -> None:
    """The controller was down while the job ran and failed: admitted, started, failed at once."""
    step = plan(STATES["failed"], [run("node-finished")], [], at("11:00:00"), gpus=8)
    assert [(t.event, t.at) for t in step] == [
        ("admitted", at("09:00:00")),  # never suspended: admitted when created
        ("started", at("10:01:30")),
        ("failed", at("10:40:00")),
    ]
    assert step[-1].gpu_seconds == 8 * 1800
    assert step[-1].reason == "DeadlineExceeded"


def test_job_outside_kueue_is_admitted_at_creation() -> None:
    step = plan(STATES["unqueued"], [], [], at("09:31:00"), gpus=0)
    assert step == [Transition("admitted", at("09:30:00"), 1, gpus=0)]


def test_deleted_while_running_pays_until_the_deletion() -> None:
    history = [Recorded("admitted", at("10:00:00")), Recorded("started", at("10:02:00"))]
    pods = [run("launcher-running", gone_at=at("10:10:00"))]
    step = plan(STATES["admitted"], pods, history, at("10:10:00"), gpus=8, deleted=True)
    assert [(t.event, t.gpu_seconds, t.started) for t in step] == [("deleted", 8 * 480, at("10:02:00"))]


def test_deleted_while_queued_records_the_deletion_only() -> None:
    step = plan(STATES["queued"], [], [], at("09:40:00"), gpus=16, deleted=True)
    assert [closing(t) for t in step] == [("deleted", at("09:40:00"), 0, 16, 0.0, None, at("09:40:00"), None)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("admitted@2026-11-22T10:00:00Z,started@2026-11-22T10:01:00Z", ["admitted", "started"]),
        ("admitted@2026-11-22T10:00:00Z, bogus@2026-11-22T10:00:00Z,started@not-a-time", ["admitted"]),
        ("", []),
        (None, []),
    ],
)
def test_history_annotation_round_trip(text: Any, expected: list[str]) -> None:
    history = parse_history(text)
    assert [r.event for r in history] == expected
    assert parse_history(format_history(history)) == history
