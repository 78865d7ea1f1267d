"""The aggregator keeps counters and bounded samples only, and accounts GPU-seconds per job once."""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

from mpigate.audit import AuditEntry
from mpigate.report import ReportBuilder, ReportOptions
from mpigate.report._bounded import OTHERS, KeyedSamples, LimitedCounter


def entry(seq: int, time: str, stage: str, **record: Any) -> AuditEntry:
    return AuditEntry("c", seq, time, stage, "f", seq, {"stage": stage, **record}, b"")


def validate(i: int, day: int = 1) -> AuditEntry:
    violations = [{"id": "MPG-Q001", "mode": "enforce", "message": f"m{i}"}] if i % 3 == 0 else []
    return entry(
        i,
        f"2026-11-{day:02d}T00:00:00.000Z",
        "validate",
        team=f"team-{i % 4}",
        decision="denied" if violations else "allowed",
        request={"operation": "CREATE", "user": {"username": f"user-{i}"}},  # a new user every time
        object={"kind": "TrainJob", "namespace": f"ns-{i}", "name": f"job-{i}"},  # and a new job
        violations=violations,
    )


def state_size(part: object, prefix: str = "") -> dict[str, int]:
    """Entries held by every container attribute of the builder and of the parts it is made of."""
    sizes = {}
    for name, value in vars(part).items():
        key = prefix + name
        if isinstance(value, dict | set | list | deque):
            sizes[key] = len(value)
        elif isinstance(value, LimitedCounter):
            sizes[key] = len(value.counts)
        elif isinstance(value, KeyedSamples):
            sizes[key] = sum(len(v) for v in value.samples.values())
        elif hasattr(value, "__dict__") and type(value).__module__.startswith("mpigate.report."):
            sizes.update(state_size(value, key + "."))
    return sizes


def test_state_does_not_grow_with_records() -> None:
    options = ReportOptions(max_keys=50, max_events=20, max_examples=3)
    small, large = ReportBuilder(options), ReportBuilder(options)
    for i in range(1_000):
        small.add_entry(validate(i))
    for i in range(20_000):
        large.add_entry(validate(i))
    assert state_size(small) == state_size(large)
    assert len(large.activity.actors.counts) == 51  # 50 users + "(others)"
    assert large.activity.actors.overflowed == 20_000 - 50
    report = large.finish()
    assert report["totals"]["decisions"]["denied"] == 6_667  # exact although the samples are not
    assert report["limits"]["actorsOverflowed"] == 20_000 - 50
    assert len(report["activity"]["recentEvents"]) == 20
    assert report["activity"]["recentEvents"][0]["name"] == "job-19999"
    assert any(a["actor"] == OTHERS for a in report["activity"]["actors"])


def test_gpu_seconds_add_up_per_run_segment() -> None:
    builder = ReportBuilder(ReportOptions(since="2026-11-10T00:00:00.000Z"))

    def life(seq: int, day: int, event: str, seconds: float | None, uid: str = "u1") -> AuditEntry:
        return entry(
            seq,
            f"2026-11-{day:02d}T12:00:00.000Z",
            "lifecycle",
            team="t",
            object={"namespace": "t", "name": uid, "labels": {"mpigate.io/cost-center": "cc-7"}},
            lifecycle={"event": event, "uid": uid, "gpuSeconds": seconds},
        )

    # u1 ran a segment before the period (suspended on the 9th: not counted), then ran again and
    # succeeded inside it; its deletion closes nothing. u2 was deleted while running.
    for item in (
        life(1, 8, "started", None),
        life(2, 9, "suspended", 3600),
        life(3, 10, "admitted", None),
        life(4, 11, "succeeded", 7200),
        life(5, 11, "deleted", 0.0),
        life(6, 12, "deleted", 1800, uid="u2"),
        life(7, 12, "failed", None, uid="u3"),  # a closing record without GPU-seconds
    ):
        builder.add_entry(item)
    report = builder.finish()
    assert report["chargeback"]["byTeamAndCostCenter"] == [
        {"team": "t", "costCenter": "cc-7", "gpuSeconds": 9000.0, "gpuHours": 2.5, "jobs": 2}
    ]
    assert report["chargeback"]["byDay"] == [
        {"date": "2026-11-10", "gpuHours": 0.0},
        {"date": "2026-11-11", "gpuHours": 2.0},
        {"date": "2026-11-12", "gpuHours": 0.5},
    ]
    assert report["chargeback"]["lifecycleWithoutGpuSeconds"] == 1
    assert report["chargeback"]["lifecycleEvents"] == {
        "admitted": 1,
        "deleted": 2,
        "failed": 1,
        "succeeded": 1,
    }


def test_limited_counter_and_samples() -> None:
    counter: LimitedCounter[str] = LimitedCounter(2, OTHERS)
    for key in ("a", "b", "a", "c", "d", "a"):
        counter.add(key)
    assert dict(counter.items()) == {"a": 3, "b": 1, OTHERS: 2}
    assert counter.overflowed == 2
    samples: KeyedSamples[str, int] = KeyedSamples(per_key=2, max_keys=1)
    for i in range(5):
        samples.add("x", i)
        samples.add("y", i)
    assert samples.get("x") == [3, 4]
    assert samples.get("y") == []
    assert sys.getsizeof(samples.samples) < 1024
