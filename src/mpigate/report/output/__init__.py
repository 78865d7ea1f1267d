"""The report document in four formats: HTML (one self-contained file), Markdown (for tickets),
JSON (``schema/report.schema.json``) and CSV (one tidy table, columns :data:`CSV_COLUMNS`).

Everything in the document that came from a record (messages, user and object names) is
untrusted: HTML autoescapes it, Markdown escapes table syntax and inline HTML, CSV defuses cells
that a spreadsheet would take for a formula.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._text import period_length, short_ref
from .html import PAPERS, render_html
from .jsondoc import render_json, report_schema
from .markdown import render_markdown
from .tabular import CSV_COLUMNS, csv_rows, render_csv

__all__ = [
    "CSV_COLUMNS",
    "FORMATS",
    "PAPERS",
    "csv_rows",
    "period_length",
    "render",
    "render_csv",
    "render_html",
    "render_json",
    "render_markdown",
    "report_schema",
    "short_ref",
]

FORMATS = ("html", "md", "json", "csv")


def render(report: Mapping[str, Any], fmt: str, *, paper: str = "A4") -> str:
    """The report in ``fmt`` (one of :data:`FORMATS`); ``paper`` applies to HTML's print layout."""
    if fmt == "html":
        return render_html(report, paper=paper)
    if fmt == "md":
        return render_markdown(report)
    if fmt == "json":
        return render_json(report)
    if fmt == "csv":
        return render_csv(report)
    raise ValueError(f"unknown report format {fmt!r} (known: {', '.join(FORMATS)})")
