"""A tampered chain is never skipped silently: the report says so at the top, with file:line."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mpigate.report import render

Report = dict[str, Any]


@pytest.fixture(scope="module")
def tampered(trail: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of the scenario with big-job's denial edited into an allowance (line 7 of webhook-0)."""
    copy = tmp_path_factory.mktemp("tampered") / "audit"
    shutil.copytree(trail / "audit", copy)
    segment = copy / "webhook-0" / "00000000000000000001.jsonl"
    lines = segment.read_bytes().split(b"\n")
    assert b'"name":"big-job"' in lines[6] and b'"decision":"denied"' in lines[6]
    lines[6] = lines[6].replace(b'"decision":"denied"', b'"decision":"allowed"')
    segment.write_bytes(b"\n".join(lines))
    return copy, segment


@pytest.fixture(scope="module")
def broken(make_report: Callable[..., Report], tampered: tuple[Path, Path]) -> Report:
    return make_report(audit=tampered[0])


def test_integrity_verdict_names_the_first_problem(broken: Report, tampered: tuple[Path, Path]) -> None:
    _, segment = tampered
    integrity = broken["integrity"]
    assert integrity["ok"] is False
    assert integrity["broken"] == 1
    assert integrity["firstProblem"] == {
        "chain": "webhook-0",
        "kind": "edited",
        "severity": "error",
        "file": str(segment),
        "line": 7,
        "message": "seq 7: the content does not match its hash (edited)",
    }
    assert integrity["recordsNotIntact"] == 1
    chains = {c["chain"]: c["ok"] for c in broken["inputs"]["chains"]}
    assert chains == {"controller-0": True, "webhook-0": False, "webhook-1": True}


def test_every_control_needs_attention(broken: Report) -> None:
    statuses = {c["status"] for f in broken["controls"] for c in f["controls"]}
    assert statuses == {"attention"}
    reason = "audit chain(s) webhook-0 failed verification: the evidence may be incomplete or altered"
    assert all(reason in c["reasons"] for f in broken["controls"] for c in f["controls"])


def test_counts_are_of_the_records_as_found(broken: Report) -> None:
    # the edited record is counted as it now reads (and flagged above), not dropped
    assert broken["totals"]["decisions"] == {"allowed": 7, "allowed-with-warnings": 1, "denied": 2}


def test_html_opens_with_a_banner(broken: Report, tampered: tuple[Path, Path]) -> None:
    html = render(broken, "html")
    banner_at = html.index('id="integrity-banner"')
    assert banner_at < html.index("<header>")
    banner = html[banner_at : html.index("</div></div>", banner_at)]
    assert "Audit trail integrity check failed." in banner
    assert f"<code>{tampered[1]}:7</code>" in banner
    assert "(edited, chain webhook-0)" in banner


def test_markdown_opens_with_the_failure(broken: Report, tampered: tuple[Path, Path]) -> None:
    text = render(broken, "md")
    lines = text.splitlines()
    assert lines[2].startswith("> **Audit trail integrity check FAILED**: 1 of 3 chain(s) did not verify.")
    assert f"`{tampered[1]}:7`" in lines[2]


def test_csv_marks_the_broken_chain(broken: Report, tampered: tuple[Path, Path]) -> None:
    rows = [line for line in render(broken, "csv").splitlines() if line.startswith("integrity,")]
    webhook0 = [r for r in rows if ",webhook-0,records," in r]
    assert "broken" in webhook0[0]
    assert f"{tampered[1]}:7 edited" in webhook0[0]


def test_a_cut_chain_is_reported(make_report: Callable[..., Report], trail: Path, tmp_path: Path) -> None:
    copy = tmp_path / "audit"
    shutil.copytree(trail / "audit", copy)
    segment = copy / "webhook-0" / "00000000000000000001.jsonl"
    data = segment.read_bytes()
    segment.write_bytes(data[: len(data) - 40])  # the shutdown checkpoint loses its end
    report = make_report(audit=copy)
    problem = report["integrity"]["firstProblem"]
    assert (problem["kind"], problem["line"]) == ("truncated", 10)
    assert report["totals"]["decisions"] == {"allowed": 6, "allowed-with-warnings": 1, "denied": 3}
