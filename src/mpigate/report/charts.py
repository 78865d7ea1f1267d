"""SVG charts for the HTML report, computed from the report document.

Charts are geometry (frozen dataclasses of bars, grid lines and labels) that the Jinja2 template
draws as inline ``<svg>``: no JavaScript, no fonts or images to fetch, text escaped by the
template. Colours are the :data:`PALETTE` entries, chosen for contrast on white (WCAG 2.1: 4.5:1
for text, 3:1 for graphics — tests/report/test_html.py checks them) and told apart by more than
hue: stacked segments keep their order and every bar has a ``<title>`` and the tables beside the
charts carry the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = [
    "PALETTE",
    "Bar",
    "Chart",
    "Label",
    "Line",
    "axis_maximum",
    "contrast_ratio",
    "nice_ceiling",
    "report_charts",
]

PALETTE: Mapping[str, str] = MappingProxyType(
    {
        "text": "#1b1f24",
        "muted": "#57606a",
        "background": "#ffffff",
        "grid": "#8c959f",
        "allowed": "#1a7f37",
        "allowed-with-warnings": "#9a6700",
        "denied": "#cf222e",
        "bar": "#0969da",
        "attention": "#9a6700",
        "met": "#1a7f37",
        "not evaluated": "#6639ba",
        "no occasion": "#57606a",
        "not applicable": "#57606a",
    }
)


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    series: str  # CSS class suffix: allowed, denied, bar, ...
    title: str  # tooltip and accessible name


@dataclass(frozen=True, slots=True)
class Line:
    x1: float
    y1: float
    x2: float
    y2: float


@dataclass(frozen=True, slots=True)
class Label:
    x: float
    y: float
    text: str
    anchor: str = "start"  # start | middle | end
    css: str = "tick"


@dataclass(frozen=True, slots=True)
class Chart:
    id: str
    title: str
    description: str
    width: int
    height: int
    bars: tuple[Bar, ...]
    grid: tuple[Line, ...]
    labels: tuple[Label, ...]
    legend: tuple[tuple[str, str], ...]  # (series, text)
    empty: bool = False


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 × 10^k at or above ``value`` (axis maximum)."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value - 1e-9:
            return float(step * magnitude)
    return float(10 * magnitude)  # pragma: no cover - the loop always returns


def axis_maximum(value: float, *, integer: bool = True) -> float:
    """Top of a four-step axis: four times a nice step (1, 2, 2.5, 5 × 10^k), whole steps for
    counts, so that every tick is a round number."""
    step = nice_ceiling(value / 4) if value > 0 else 1.0
    if integer:
        step = max(1.0, math.ceil(step))
        if step not in (1.0, 2.0, 3.0) and step < 10:
            step = 5.0 if step <= 5 else 10.0
    return float(step * 4)


def _fmt(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.1f}"


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def stacked_columns(
    chart_id: str,
    title: str,
    description: str,
    categories: Sequence[str],
    series: Sequence[tuple[str, str]],
    values: Sequence[Mapping[str, float]],
    *,
    width: int = 760,
    height: int = 260,
) -> Chart:
    """Vertical bars, one per category, segments stacked in ``series`` order."""
    left, right, top, bottom = 48.0, 8.0, 10.0, 46.0
    plot_w, plot_h = width - left - right, height - top - bottom
    totals = [sum(v.get(s, 0) for s, _ in series) for v in values]
    top_value = axis_maximum(max(totals, default=0))
    grid: list[Line] = []
    labels: list[Label] = []
    for i in range(5):
        tick = top_value * i / 4
        y = top + plot_h - plot_h * i / 4
        grid.append(Line(left, y, left + plot_w, y))
        labels.append(Label(left - 6, y + 4, _fmt(tick), "end"))
    bars: list[Bar] = []
    n = max(len(categories), 1)
    slot = plot_w / n
    bar_w = max(min(slot * 0.7, 48.0), 1.0)
    every = max(1, math.ceil(n / 12))  # at most ~12 category labels
    for i, (category, row) in enumerate(zip(categories, values, strict=True)):
        x = left + slot * i + (slot - bar_w) / 2
        y = top + plot_h
        for key, name in series:
            amount = row.get(key, 0)
            if amount <= 0:
                continue
            h = plot_h * amount / top_value
            y -= h
            bars.append(Bar(x, y, bar_w, h, key, f"{category}: {_fmt(amount)} {name}"))
        if i % every == 0:
            labels.append(
                Label(
                    x + bar_w / 2,
                    top + plot_h + 16,
                    category[5:] if len(category) == 10 else category,
                    "middle",
                )
            )
    return Chart(
        chart_id,
        title,
        description,
        width,
        height,
        tuple(bars),
        tuple(grid),
        tuple(labels),
        tuple(series),
        empty=not any(totals),
    )


def horizontal_bars(
    chart_id: str,
    title: str,
    description: str,
    items: Sequence[tuple[str, float]],
    unit: str,
    *,
    width: int = 760,
    row_height: int = 24,
    label_width: int = 190,
    integer: bool = True,
) -> Chart:
    """One horizontal bar per item (already sorted), value written at its end."""
    top, bottom, right = 8.0, 24.0, 70.0
    height = int(top + bottom + row_height * max(len(items), 1))
    plot_w = width - label_width - right
    top_value = axis_maximum(max((v for _, v in items), default=0), integer=integer)
    grid: list[Line] = []
    labels: list[Label] = []
    plot_bottom = top + row_height * max(len(items), 1)
    for i in range(5):
        x = label_width + plot_w * i / 4
        grid.append(Line(x, top, x, plot_bottom))
        labels.append(Label(x, plot_bottom + 16, _fmt(top_value * i / 4), "middle"))
    bars: list[Bar] = []
    for i, (name, value) in enumerate(items):
        y = top + row_height * i + 4
        w = plot_w * value / top_value if value > 0 else 0.0
        bars.append(Bar(label_width, y, max(w, 0.0), row_height - 8, "bar", f"{name}: {_fmt(value)} {unit}"))
        labels.append(Label(label_width - 6, y + row_height / 2, _truncate(name, 28), "end", "name"))
        labels.append(Label(label_width + w + 4, y + row_height / 2, _fmt(value), "start", "value"))
    return Chart(
        chart_id,
        title,
        description,
        width,
        height,
        tuple(bars),
        tuple(grid),
        tuple(labels),
        (),
        empty=not any(v > 0 for _, v in items),
    )


def report_charts(report: Mapping[str, Any], top: int = 12) -> dict[str, Chart]:
    """The three charts of the HTML report: decisions per day, denials by rule, GPU-hours by team."""
    days = report["decisions"]["byDay"]
    outcomes = (
        ("allowed", "allowed"),
        ("allowed-with-warnings", "allowed with warnings"),
        ("denied", "denied"),
    )
    decisions = stacked_columns(
        "chart-decisions",
        "Admission decisions per day",
        "Stacked columns: allowed, allowed with warnings and denied decisions for each day (UTC).",
        [d["date"] for d in days],
        outcomes,
        [{k: float(d.get(k, 0)) for k, _ in outcomes} for d in days],
    )
    reasons = report["denials"]["topReasons"][:top]
    denials = horizontal_bars(
        "chart-denials",
        "Denials by rule",
        f"Violations that denied a request, by rule (top {top}).",
        [(r["rule"], float(r["violations"])) for r in reasons],
        "denials",
    )
    teams = report["chargeback"]["byTeam"][:top]
    gpu = horizontal_bars(
        "chart-gpu",
        "GPU-hours by team",
        f"GPU-hours consumed per team in the period (top {top}).",
        [(t["team"], float(t["gpuHours"])) for t in teams],
        "GPU-hours",
        integer=False,
    )
    return {"decisions": decisions, "denials": denials, "gpu": gpu}


def _luminance(color: str) -> float:
    channels = [int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast_ratio(foreground: str, background: str) -> float:
    """WCAG 2.1 contrast ratio of two ``#rrggbb`` colours."""
    a, b = sorted((_luminance(foreground), _luminance(background)), reverse=True)
    return (a + 0.05) / (b + 0.05)
