"""The HTML report in a real browser: headless Chromium (Debian package ``chromium``) loads it from
a file over the DevTools protocol; no console error, no request but the file itself, every section
shown, printable."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mpigate.report import render

from .chromium import PageResult, find_chromium, inspect_page
from .conftest import require_tool
from .scenario import SCRIPT_MESSAGE

SECTIONS = [
    "summary", "integrity", "revisions", "controls", "api-events", "decisions", "denials", "security",
    "activity", "rbac", "exceptions", "residency", "standing", "images", "chargeback", "sample", "method",
]  # fmt: skip


@pytest.fixture(scope="module")
def chromium() -> str:
    found = find_chromium()
    require_tool(found, "chromium not found on PATH (Debian package chromium; `make test` installs it)")
    assert found is not None
    return found


def load(chromium: str, report: dict[str, Any], path: Path) -> PageResult:
    path.write_text(render(report, "html"), encoding="utf-8")
    return inspect_page(path, binary=chromium)


def test_report_loads_cleanly_offline(
    chromium: str, make_report: Callable[..., dict[str, Any]], k8s_log: Path, tmp_path: Path
) -> None:
    report = make_report(k8s=[k8s_log])
    page = load(chromium, report, tmp_path / "report.html")
    assert page.errors == []
    assert page.requests == [(tmp_path / "report.html").as_uri()]  # nothing but the file itself
    facts = page.facts
    assert facts["sections"] == SECTIONS
    assert facts["lang"] == "en"
    assert facts["scripts"] == 0
    assert facts["banner"] is None
    assert facts["svgTitles"] == ["Admission decisions per day", "Denials by rule", "GPU-hours by team"]
    assert facts["bars"] == 6 + 3 + 2
    assert facts["tablesWithoutHeaders"] == 0
    assert facts["colHeadersWithoutScope"] == 0
    text = facts["text"]
    for expected in (
        "Integrity and completeness of the inputs",
        "CC6.1 Logical access security",
        "164.312(b) Audit controls",
        "Art. 44 — Transfers to third countries",
        "10.2.1 Audit logs are enabled and active",
        "nlp-hostpath-scratch",
        "SEC-1234",
        "gpu-eu-7",
        "system:serviceaccount:nlp-team:pipeline serviceaccount via alice",
        SCRIPT_MESSAGE,  # shown as text, not run
    ):
        assert expected in text, expected
    assert page.screenshot.startswith(b"\x89PNG\r\n\x1a\n")
    assert page.pdf.startswith(b"%PDF-")
    # printable: A4 pages (the print CSS starts controls, decisions, activity and method on new pages)
    pages = len(re.findall(rb"/Type\s*/Page[^s]", page.pdf))
    assert pages >= 5
    boxes = set(re.findall(rb"/MediaBox\s*\[0 0 ([0-9.]+) ([0-9.]+)\]", page.pdf))
    assert {(round(float(w)), round(float(h))) for w, h in boxes} == {(595, 842)}  # A4 in points
    # every printed page carries the report id and its number
    [rule] = facts["pageRules"]
    assert f'"mpigate compliance report {report["reportId"]}"' in rule
    assert 'counter(page) " of " counter(pages)' in rule


def test_letter_paper(chromium: str, make_report: Callable[..., dict[str, Any]], tmp_path: Path) -> None:
    path = tmp_path / "letter.html"
    path.write_text(render(make_report(), "html", paper="letter"), encoding="utf-8")
    page = inspect_page(path, binary=chromium)
    boxes = set(re.findall(rb"/MediaBox\s*\[0 0 ([0-9.]+) ([0-9.]+)\]", page.pdf))
    assert {(round(float(w)), round(float(h))) for w, h in boxes} == {(612, 792)}  # US Letter


def test_broken_chain_banner_is_shown(
    chromium: str, make_report: Callable[..., dict[str, Any]], trail: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "audit"
    shutil.copytree(trail / "audit", copy)
    segment = copy / "controller-0" / "00000000000000000001.jsonl"
    segment.write_bytes(segment.read_bytes().replace(b'"region":"eu"', b'"region":"us"', 1))
    page = load(chromium, make_report(audit=copy), tmp_path / "broken.html")
    assert page.errors == []
    banner = " ".join((page.facts["banner"] or "").split())
    assert banner.startswith("Audit trail integrity check failed. 1 of 3 chain(s) did not verify.")
    assert f"{segment}:4 (edited, chain controller-0)" in banner


def test_no_browser_process_outlives_a_page(chromium: str, tmp_path: Path) -> None:
    """Chromium and every process it started are gone when its context ends, so its profile can be
    removed (terminating the browser alone left its children writing into the profile: "Directory
    not empty: 'Default'" now and then on a loaded machine)."""
    import asyncio

    from .chromium import _browser, group_members

    profile = tmp_path / "profile"
    profile.mkdir()
    groups: list[int] = []

    def browser_groups() -> list[int]:  # our children in a process group of their own
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    _state, ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
                except (OSError, ValueError):
                    continue
                if int(ppid) == os.getpid() and int(pgrp) != os.getpgid(0):
                    found.append(int(pgrp))
        return found

    async def open_and_close() -> None:
        async with _browser(chromium, profile):
            groups.extend(browser_groups())
            assert len(group_members(groups[0])) > 1  # the browser and the children it started

    asyncio.run(open_and_close())
    assert len(groups) == 1 and group_members(groups[0]) == []
    shutil.rmtree(profile)  # nothing writes into it any more
