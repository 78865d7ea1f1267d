"""The report as JSON, and the JSON Schema it follows (``report/schema/report.schema.json``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any


@cache
def report_schema() -> Mapping[str, Any]:
    """The JSON Schema (draft 2020-12) of the report document."""
    text = resources.files("mpigate.report").joinpath("schema", "report.schema.json").read_text("utf-8")
    schema: Mapping[str, Any] = json.loads(text)
    return schema


def render_json(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"
