"""The four formats: JSON against its schema, CSV columns, Markdown and HTML escaping, charts."""

from __future__ import annotations

import copy
import csv
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mpigate.report import CSV_COLUMNS, render, report_schema
from mpigate.report.charts import PALETTE, axis_maximum, contrast_ratio, nice_ceiling, report_charts

from .scenario import SCRIPT_MESSAGE

Report = dict[str, Any]


@pytest.fixture(scope="module")
def full(make_report: Callable[..., Report], k8s_log: Path) -> Report:
    return make_report(k8s=[k8s_log])


def validator() -> jsonschema.Draft202012Validator:
    schema = report_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_json_documents_match_the_schema(
    report: Report, full: Report, make_report: Callable[..., Report]
) -> None:
    empty = make_report(since="2027-01-01", until="2027-01-02")
    filtered = make_report(team="nlp-team", frameworks=("gdpr",))
    for document in (report, full, empty, filtered):
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator().iter_errors(document)]
        assert errors == []


def test_the_schema_rejects_drift(report: Report) -> None:
    broken = copy.deepcopy(report)
    broken["controls"][0]["controls"][0]["status"] = "compliant"
    del broken["chargeback"]["gpuHours"]
    broken["surprise"] = 1
    messages = sorted(e.message for e in validator().iter_errors(broken))
    assert any("'compliant' is not one of" in m for m in messages)
    assert any("'gpuHours' is a required property" in m for m in messages)
    assert any("'surprise' was unexpected" in m for m in messages)


def test_json_output_is_the_document(report: Report) -> None:
    import json

    assert json.loads(render(report, "json")) == report


def test_csv_has_the_documented_columns_and_parses(full: Report) -> None:
    text = render(full, "csv")
    rows = list(csv.reader(io.StringIO(text)))
    documented = (
        "section date framework control team cost_center rule outcome region actor actor_kind verb kind"
    )
    assert (
        tuple(rows[0])
        == CSV_COLUMNS
        == (
            *documented.split(),
            "namespace",
            "name",
            "metric",
            "value",
            "detail",
            "ref",
            "request_uid",
            "unit",
        )
    )
    assert all(len(r) == len(CSV_COLUMNS) for r in rows)
    records = [dict(zip(CSV_COLUMNS, r, strict=True)) for r in rows[1:]]
    sections = [r["section"] for r in records]
    # the HTML's sections, in its order
    order = [
        "integrity",
        "completeness",
        "k8s_audit",
        "revisions",
        "controls",
        "api_events",
        "decisions",
        "rules",
        "denials",
        "security",
        "activity",
        "rbac",
        "exceptions",
        "residency",
        "images",
        "chargeback",
        "sample",
        "inputs",
    ]
    assert sorted(set(sections), key=order.index) == [s for s in order if s in sections]
    assert sections == sorted(sections, key=order.index)  # grouped in that order
    assert set(order) - set(sections) == {"sample"}  # no sample was asked for
    gpu = {(r["team"], r["cost_center"]): r["value"] for r in records if r["metric"] == "gpu_hours"}
    assert gpu == {("cv-team", "(none recorded)"): "3.0", ("nlp-team", "cc-nlp"): "2.0"}
    decisions = sum(int(r["value"]) for r in records if r["section"] == "decisions" and not r["rule"])
    assert decisions == 4  # decisions that hit no rule (the two waivers hit one)
    assert {r["unit"] for r in records if r["section"] == "decisions"} == {"requests"}
    assert {r["unit"] for r in records if r["section"] == "rules"} == {"findings"}
    controls = [r for r in records if r["section"] == "controls"]
    assert len(controls) == 33
    art44 = next(r for r in controls if r["control"] == "GDPR-Art44")
    # 10 requests and 3 placements: the population, in its units
    assert (art44["framework"], art44["outcome"], art44["value"]) == ("gdpr", "attention", "13")
    assert art44["rule"] == "validate=10 requests;evidence=3 placements"
    assert any(
        r["section"] == "activity" and r["metric"] == "unjudged_writes" and r["value"] == "1" for r in records
    )
    # every sampled or listed request names its record
    listed = [r for r in records if r["section"] == "activity" and r["metric"] == "request"]
    assert listed and all(r["ref"] for r in listed)
    mpigate = [r for r in listed if r["detail"] == "source=mpigate"]
    assert all(r["ref"].count(":") == 2 and len(r["ref"].rsplit(":", 1)[1]) == 64 for r in mpigate)
    digests = [r for r in records if r["section"] == "inputs"]
    assert len(digests) == 6 and all(len(r["detail"]) == 64 for r in digests)  # 5 segments, 1 log


def test_csv_cells_cannot_become_formulas(report: Report) -> None:
    evil = copy.deepcopy(report)
    evil["denials"]["topReasons"][0]["examples"][0]["message"] = '=HYPERLINK("http://x","click")'
    evil["activity"]["actors"][0]["actor"] = "@SUM(A1)"
    rows = list(csv.DictReader(io.StringIO(render(evil, "csv"))))
    assert rows[next(i for i, r in enumerate(rows) if r["section"] == "denials")]["detail"] == (
        '\'=HYPERLINK("http://x","click")'
    )
    assert any(r["actor"] == "'@SUM(A1)" for r in rows)


def test_markdown_escapes_table_syntax_and_markup(report: Report) -> None:
    evil = copy.deepcopy(report)
    evil["denials"]["topReasons"][0]["examples"][0]["message"] = "a | b <img src=x onerror=alert(1)>\nnext"
    text = render(evil, "md")
    row = next(line for line in text.splitlines() if line.startswith("| MPG-Q001 | 2 | a"))
    assert row.startswith(r"| MPG-Q001 | 2 | a \| b \<img src=x onerror=alert(1)\> next | webhook-1:")
    assert "- **Requests judged:** 10 (6 allowed, 1 with warnings, 3 denied); 7 rule finding(s)" in text


def test_markdown_and_csv_carry_the_html_sections(full: Report) -> None:
    html = render(full, "html")
    headings = re.findall(r'<h2 id="h-[a-z-]+">([^<]+)</h2>', html)
    markdown = render(full, "md")
    md_headings = re.findall(r"^### (.+)$", markdown, flags=re.MULTILINE)
    for heading in headings:
        if heading == "Controls":  # one table per framework in Markdown
            assert all(f"### {f['title']}" in markdown for f in full["controls"])
            continue
        short = heading.split(" (")[0].replace("&#39;", "'")
        assert any(h.startswith(short) for h in md_headings), heading


def test_html_escapes_record_text(report: Report) -> None:
    html = render(report, "html")
    assert SCRIPT_MESSAGE in report["security"]["recent"][1]["message"]
    assert "<script" not in html.lower()
    assert "runAsNonRoot missing &lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html


def test_html_is_self_contained(report: Report) -> None:
    html = render(report, "html")
    assert html.startswith("<!DOCTYPE html>")
    assert "default-src 'none'" in html  # CSP: no script, nothing fetched
    # no reference to anything outside the file: no src attributes, links only to anchors
    assert re.findall(r"\ssrc=", html) == []
    assert {h for h in re.findall(r'href="([^"]*)"', html) if not h.startswith("#")} == set()
    assert "@import" not in html and "url(" not in html
    assert html.count("<svg") == 3
    assert "@media print" in html and "break-before: page" in html


def test_html_is_deterministic(report: Report) -> None:
    assert render(report, "html") == render(copy.deepcopy(report), "html")


def test_unknown_format_is_an_error(report: Report) -> None:
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        render(report, "pdf")


def test_axis_scales() -> None:
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 7, 12, 26, 999)] == [1, 0.5, 1, 10, 20, 50, 1000]
    assert [axis_maximum(v) for v in (0, 5, 9, 13, 101)] == [4, 8, 12, 20, 200]
    assert axis_maximum(0.3, integer=False) == 0.4


def test_decision_chart_geometry(report: Report) -> None:
    chart = report_charts(report)["decisions"]
    assert len(chart.bars) == 6  # day 1: allowed+denied; day 2: allowed+warned; day 3: allowed+denied
    # axis 0..8 over the 204 px plot: the 5 decisions of day 1 stack to 5/8 of it
    day1 = [b for b in chart.bars if b.title.startswith("2026-11-20")]
    assert sum(b.height for b in day1) == pytest.approx(204 * 5 / 8)
    assert [b.title for b in day1] == ["2026-11-20: 3 allowed", "2026-11-20: 2 denied"]
    assert [label.text for label in chart.labels if label.anchor == "middle"] == ["11-20", "11-21", "11-22"]


def test_bar_charts(report: Report) -> None:
    charts = report_charts(report)
    assert [b.title for b in charts["denials"].bars] == [
        "MPG-Q001: 2 denials",
        "MPG-IMG-002: 1 denials",
        "MPG-SEC-PRIVILEGED: 1 denials",
    ]
    gpu = charts["gpu"].bars
    assert [b.title for b in gpu] == ["cv-team: 3 GPU-hours", "nlp-team: 2 GPU-hours"]
    assert gpu[0].width / gpu[1].width == pytest.approx(1.5)


def test_empty_charts_say_so(make_report: Callable[..., Report]) -> None:
    report = make_report(since="2027-01-01", until="2027-01-02")
    html = render(report, "html")
    assert "Denials by rule: nothing to show in this period." in html
    assert html.count("<svg") == 0


def test_palette_contrast_meets_wcag() -> None:
    white = PALETTE["background"]
    for name in (
        "text",
        "muted",
        "allowed",
        "allowed-with-warnings",
        "denied",
        "met",
        "attention",
        "not evaluated",
        "no occasion",
        "not applicable",
    ):
        assert contrast_ratio(PALETTE[name], white) >= 4.5, name  # text in these colours
    assert contrast_ratio(PALETTE["bar"], white) >= 3.0  # graphics
    assert contrast_ratio("#000000", "#ffffff") == pytest.approx(21.0)
