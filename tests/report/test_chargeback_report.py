"""The report's chargeback (issue 20): each (job uid, segment, event) counted once, GPU-hours split
at days and at the period's bounds by when they were used, and what is not exact flagged instead of
summed silently. Records as the controller writes them (tests/controller/test_timelines.py drives
it through the timelines; test_timeline_records_* feed those very records in)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mpigate.audit import AuditEntry, evidence_record, lifecycle_record
from mpigate.report import ReportBuilder, ReportOptions, render

JOB = {"namespace": "nlp-team", "name": "llm", "team": "nlp-team", "gpus": 16}


def closing(
    event: str,
    seconds: float | None,
    *,
    uid: str = "u1",
    segment: int | None = 1,
    usage: tuple[str, list[list[int]]] | None = None,
    **details: Any,
) -> dict[str, Any]:
    extra: dict[str, Any] = dict(details)
    started = extra.pop("started", None)
    if segment is not None:
        extra["segment"] = segment
    if usage is not None:
        extra["usage"] = {"from": usage[0], "steps": usage[1]}
    return lifecycle_record(
        event,
        uid=uid,
        gpu_seconds=seconds,
        started=started,
        labels={"mpigate.io/cost-center": "cc-4711"},
        details=extra,
        **JOB,  # type: ignore[arg-type]
    )


def entries(*items: tuple[str, Mapping[str, Any]], chain: str = "c") -> list[AuditEntry]:
    return [
        AuditEntry(chain, i, time, "lifecycle", "f", i, record, b"") for i, (time, record) in enumerate(items)
    ]


def report(*inputs: Iterable[AuditEntry], **options: Any) -> dict[str, Any]:
    """One builder per input (as parallel workers aggregate chains), merged."""
    builders = []
    for items in inputs:
        builder = ReportBuilder(ReportOptions(**options))
        for item in items:
            builder.add_entry(item)
        builders.append(builder)
    first = builders[0]
    for other in builders[1:]:
        first.merge(other)
    return first.finish()["chargeback"]


TWO_HOURS = ("2026-11-22T11:00:00Z", [[0, 16], [7200, 0]])  # 16 GPUs 11:00 → 13:00


def test_a_repeated_record_counts_once_in_either_order_and_chain() -> None:
    """Timeline 14: the restarted controller writes the succeeded record again (another chain)."""
    done = closing("succeeded", 115200.0, usage=TWO_HOURS, basis="observed", started="2026-11-22T11:00:00Z")
    first = entries(("2026-11-22T13:00:05.000Z", done), chain="controller-a")
    again = entries(("2026-11-22T13:04:00.000Z", done), chain="controller-b")
    for inputs in ((first, again), (again, first), ([*first, *again],)):
        cb = report(*inputs)
        assert cb["gpuHours"] == 32.0
        assert cb["duplicates"] == {"records": 1, "differing": 0}
        assert cb["lifecycleEvents"] == {"succeeded": 1}
        assert cb["byTeamAndCostCenter"][0]["jobs"] == 1
    # a repeat that disagrees is said so (the earliest written copy counts)
    other = closing("succeeded", 100.0, usage=("2026-11-22T11:00:00Z", [[0, 1], [100, 0]]))
    cb = report(first, entries(("2026-11-22T13:04:00.000Z", other), chain="controller-b"))
    assert cb["gpuHours"] == 32.0 and cb["duplicates"] == {"records": 1, "differing": 1}


def test_a_period_boundary_splits_a_segment_by_when_it_ran() -> None:
    """Timeline 17: the job runs 11:00–13:00; a period ending at 12:00 gets the first hour, one
    starting at 12:00 the second — although the record was written at 13:00:05."""
    done = entries(("2026-11-22T13:00:05.000Z", closing("succeeded", 115200.0, usage=TWO_HOURS)))
    before = report(done, since="2026-11-22T00:00:00Z", until="2026-11-22T12:00:00Z")
    after = report(done, since="2026-11-22T12:00:00Z", until="2026-11-23T00:00:00Z")
    assert (before["gpuHours"], after["gpuHours"]) == (16.0, 16.0)
    assert (before["outsidePeriodGpuHours"], after["outsidePeriodGpuHours"]) == (16.0, 16.0)
    assert before["lifecycleEvents"] == {}  # written after the period, counted by its share
    assert before["byTeamAndCostCenter"] == [
        {"team": "nlp-team", "costCenter": "cc-4711", "gpuSeconds": 57600.0, "gpuHours": 16.0, "jobs": 0}
    ]
    assert after["byTeamAndCostCenter"][0]["jobs"] == 1
    assert report(done)["gpuHours"] == 32.0


def test_a_segment_across_midnight_is_split_by_day() -> None:
    """Timeline 16: 23:00 → 01:30 with 8 then 16 GPUs."""
    usage = ("2026-11-22T23:00:00Z", [[0, 8], [1800, 16], [9000, 0]])
    seconds = 8 * 1800 + 16 * 7200
    cb = report(entries(("2026-11-23T01:31:00.000Z", closing("succeeded", float(seconds), usage=usage))))
    assert cb["byDay"] == [
        {"date": "2026-11-22", "gpuHours": round((8 * 1800 + 16 * 1800) / 3600, 3)},
        {"date": "2026-11-23", "gpuHours": round(16 * 5400 / 3600, 3)},
    ]
    assert cb["gpuHours"] == round(seconds / 3600, 3) and cb["outsidePeriodGpuHours"] == 0.0
    day = report(
        entries(("2026-11-23T01:31:00.000Z", closing("succeeded", float(seconds), usage=usage))),
        since="2026-11-23",
        until="2026-11-24",
    )
    assert day["gpuHours"] == 24.0 and [d["date"] for d in day["byDay"]] == ["2026-11-23"]


def test_records_with_byday_only_and_older_records() -> None:
    by_day = closing("succeeded", 7200.0, uid="u2", byDay={"2026-11-21": 3600.0, "2026-11-22": 3600.0})
    legacy = lifecycle_record("succeeded", uid="u3", gpu_seconds=1800.0, **JOB)  # type: ignore[arg-type]
    cb = report(
        entries(("2026-11-22T01:00:00.000Z", by_day), ("2026-11-22T02:00:00.000Z", legacy)),
        since="2026-11-22",
        until="2026-11-23",
    )
    assert cb["byDay"] == [{"date": "2026-11-22", "gpuHours": 1.5}]
    # usage that is not well formed (a span of centuries, GPUs not whole) is not trusted: the
    # record is filed under the day it was written, never split across thousands of days
    for steps in ([[0, 8], [10**11, 0]], [[0, 1.5], [60, 0]], [[60, 8], [0, 0]], [[0, 8]]):
        bad = closing("succeeded", 3600.0, uid="u4", usage=("2026-11-22T10:00:00Z", steps))
        cb = report(entries(("2026-11-22T11:00:00.000Z", bad)))
        assert cb["byDay"] == [{"date": "2026-11-22", "gpuHours": 1.0}], steps


def test_what_is_not_exact_is_flagged_not_summed_silently() -> None:
    t = "2026-11-22T12:00:00.000Z"
    items = [
        # 0 GPU-seconds for a segment that ran: suspicious (what a restart used to write)
        closing("succeeded", 0.0, uid="zero", started="2026-11-22T10:00:00Z"),
        # no GPU-seconds at all
        closing("failed", None, uid="none"),
        # deleted while no controller watched: charged until last seen, with its range
        closing(
            "deleted",
            3600.0,
            uid="gone",
            usage=("2026-11-22T10:00:00Z", [[0, 8], [450, 0]]),
            basis="partial",
            vanished=True,
            gpuSecondsMin=3600.0,
            gpuSecondsMax=14400.0,
            notes=["deleted while the controller was not watching (last seen 10:07:30, found gone 11:00:00)"],
        ),
        closing(
            "succeeded",
            8 * 600.0,
            uid="spec",
            usage=("2026-11-22T10:00:00Z", [[0, 8], [600, 0]]),
            gpuSpecMismatch=[{"pod": "p", "charged": 8, "spec": 4}],
        ),
        # started, never closed in these inputs
        lifecycle_record("started", uid="open", details={"segment": 2}, **JOB),  # type: ignore[arg-type]
        # a deletion after success closes nothing: not suspicious
        closing("deleted", 0.0, uid="spec"),
    ]
    cb = report(entries(*((t, r) for r in items)))
    assert cb["flags"] == {
        "unknown": 1,
        "zeroButRan": 1,
        "partial": 1,
        "inferred": 0,
        "vanished": 1,
        "gpuSpecMismatch": 1,
        "open": 1,
    }
    assert cb["flaggedSegments"] == 5
    flagged = {x["uid"]: x for x in cb["flagged"]}
    assert flagged["gone"]["gpuHours"] == 1.0
    assert (flagged["gone"]["gpuHoursMin"], flagged["gone"]["gpuHoursMax"]) == (1.0, 4.0)
    assert flagged["zero"]["note"] == "0 GPU-seconds for a segment that ran"
    assert flagged["none"]["gpuHours"] is None and flagged["open"]["segment"] == 2
    assert cb["range"] == {
        "gpuHoursMin": round(1 + 8 * 600 / 3600, 3),
        "gpuHoursMax": round(4 + 8 * 600 / 3600, 3),
    }
    assert cb["lifecycleWithoutGpuSeconds"] == 1


def test_every_format_shows_the_split_and_the_flags(tmp_path: Any) -> None:
    builder = ReportBuilder(
        ReportOptions(since="2026-11-22", until="2026-11-23", generated="2026-11-23T00:00:00.000Z")
    )
    for item in entries(
        ("2026-11-22T13:00:05.000Z", closing("succeeded", 115200.0, usage=TWO_HOURS)),
        ("2026-11-22T13:00:06.000Z", closing("failed", 0.0, uid="zero", started="2026-11-22T10:00:00Z")),
    ):
        builder.add_entry(item)
    document = builder.finish()
    markdown = render(document, "md")
    assert "| 2026-11-22 | 32.0 |" in markdown or "| 2026-11-22 | 32 |" in markdown
    assert "Flagged segments: 1 zeroButRan." in markdown
    html = render(document, "html")
    assert "1 segment(s) flagged" in html and "0 GPU-seconds for a segment that ran" in html
    csv = render(document, "csv")
    assert "gpu_hours_by_day" in csv and "flagged_segment" in csv and "zeroButRan" in csv


def test_an_unknown_placement_is_unverified_never_a_violation() -> None:
    """Timeline 20: the pod's node is gone and its nodeSelector names no region — the controller
    says it does not know (``compliant: null``); the config's regions must not turn that into a
    violation."""
    record = evidence_record(
        "placement",
        namespace="nlp-team",
        name="llm",
        team="nlp-team",
        pod="p",
        node="gpu-eu-9",
        region=None,
        details={"compliant": None, "expectedRegions": ["eu"], "basis": "unknown"},
    )
    builder = ReportBuilder(ReportOptions(team_regions={"nlp-team": ("eu",)}))
    builder.add_entry(AuditEntry("c", 1, "2026-11-22T10:00:00.000Z", "evidence", "f", 1, record, b""))
    residency = builder.finish()["residency"]
    assert (residency["placements"], residency["outside"], residency["unverified"]) == (1, 0, 1)
    assert residency["outsideExamples"] == []
