"""The report as one self-contained HTML page (Jinja2 templates under ``report/templates``)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import jinja2

from mpigate import __version__
from mpigate.report.assess import STATUSES
from mpigate.report.charts import PALETTE, report_charts
from mpigate.report.findings import duration_text

from ._text import (
    _basename,
    _num,
    _slug,
    coverage_text,
    gpu_text,
    period_length,
    period_text,
    rules_by_mode,
    short_ref,
)

PAPERS = ("A4", "letter")

_HTML_ROWS = 200  # rows of a sample table in HTML (the JSON keeps them all)
_HTML_EXAMPLES = 8  # examples per API-server event category in HTML
_HTML_RECENT = 50  # most recent requests and attempts shown in HTML


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("mpigate.report", "templates"),
        autoescape=True,  # every string from a record is untrusted
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
        lstrip_blocks=False,
        keep_trailing_newline=True,
    )
    env.filters["num"] = _num
    env.filters["basename"] = _basename
    env.filters["slug"] = _slug
    env.filters["duration"] = duration_text
    env.filters["rules_by_mode"] = rules_by_mode
    env.filters["short_ref"] = short_ref
    return env


def render_html(report: Mapping[str, Any], *, paper: str = "A4") -> str:
    """One self-contained HTML page: inline CSS and SVG, no script, nothing fetched. ``paper``
    (``A4`` or ``letter``) is the printed page size; every printed page carries the report id
    and its page number."""
    if paper not in PAPERS:
        raise ValueError(f"unknown paper size {paper!r} (known: {', '.join(PAPERS)})")
    template = _environment().get_template("report.html.j2")
    return template.render(
        r=report,
        charts=report_charts(report),
        palette=PALETTE,
        version=__version__,
        period_text=period_text(report),
        period_length=period_length(report),
        coverage_text=coverage_text(report),
        heartbeat_text=duration_text(float(report["completeness"]["heartbeatSeconds"])),
        gpu_text=gpu_text(report),
        statuses=STATUSES,
        paper=paper,
        limits_rows=_HTML_ROWS,
        example_rows=_HTML_EXAMPLES,
        recent_rows=_HTML_RECENT,
    )
