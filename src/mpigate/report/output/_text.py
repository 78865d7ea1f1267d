"""Text shared by the report's formats: the period, coverage and GPU figures, numbers and
record references as tables show them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from mpigate.report.findings import duration_text


def period_text(report: Mapping[str, Any]) -> str:
    period = report["period"]
    start = period["from"] or period["firstRecord"] or "–"
    end = period["to"] or period["lastRecord"] or "–"
    return f"{start} – {end}"


def period_length(report: Mapping[str, Any]) -> str:
    """The period's length as people read it: "30 days" for whole days, else "0.8 s", "5.5 h"."""
    seconds = float(report["period"].get("seconds") or 0.0)
    if seconds >= 86400 and seconds % 86400 == 0:
        days = int(seconds // 86400)
        return f"{days} day{'s' if days != 1 else ''}"
    return duration_text(seconds)


def coverage_text(report: Mapping[str, Any]) -> str:
    coverage = report["completeness"].get("coverage")
    return "–" if coverage is None else f"{coverage * 100:.1f} %"


def gpu_text(report: Mapping[str, Any]) -> str:
    """GPU-hours, or "no data" when no lifecycle record was read (0.0 would claim a measurement)."""
    chargeback = report["chargeback"]
    return _num(chargeback["gpuHours"], 1) if chargeback["lifecycleEvents"] else "no data"


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) or digits:
        return f"{float(value):,.{digits}f}"
    return f"{value:,}"


def _basename(value: Any) -> str:
    return PurePath(str(value)).name if value else ""


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(value)).strip("-")


def short_ref(ref: Any) -> str:
    """``chain:seq:hash`` with the hash cut to 16 hex digits for tables (unique enough to find
    the record; the JSON and CSV carry it whole); other references as they are."""
    text = "" if ref is None else str(ref)
    head, sep, digest = text.rpartition(":")
    if sep and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
        return f"{head}:{digest[:16]}…"
    return text


def rules_by_mode(modes: list[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """A control's rules grouped by how they operated under the revisions in force
    (``enforce``, ``warn``, ``not run (…)``, ``unknown``), so that a table cell stays short."""
    groups: dict[str, list[str]] = {}
    for entry in modes:
        states = sorted({str(v) for v in entry["byRevision"].values() if v}) or ["mode not recorded"]
        groups.setdefault(" / ".join(states), []).append(str(entry["rule"]))
    order = sorted(groups, key=lambda state: (state != "enforce", state))
    return [(state, groups[state]) for state in order]
