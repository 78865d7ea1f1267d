"""The report document in four formats: HTML (one self-contained file), Markdown (for tickets),
JSON (``schema/report.schema.json``) and CSV (one tidy table, columns :data:`CSV_COLUMNS`).

Everything in the document that came from a record (messages, user and object names) is
untrusted: HTML autoescapes it, Markdown escapes table syntax and inline HTML, CSV defuses cells
that a spreadsheet would take for a formula.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from pathlib import PurePath
from typing import Any

import jinja2

from mpigate import __version__

from .charts import PALETTE, report_charts

__all__ = [
    "CSV_COLUMNS",
    "FORMATS",
    "csv_rows",
    "render",
    "render_csv",
    "render_html",
    "render_json",
    "render_markdown",
    "report_schema",
]

FORMATS = ("html", "md", "json", "csv")

# Stable, documented in docs/compliance.md. New columns are only ever appended.
CSV_COLUMNS = (
    "section",
    "date",
    "framework",
    "control",
    "team",
    "cost_center",
    "rule",
    "outcome",
    "region",
    "actor",
    "actor_kind",
    "verb",
    "kind",
    "namespace",
    "name",
    "metric",
    "value",
    "detail",
)

_HTML_ROWS = 200  # rows of a sample table in HTML (the JSON keeps them all)


def period_text(report: Mapping[str, Any]) -> str:
    period = report["period"]
    start = period["from"] or period["firstRecord"] or "–"
    end = period["to"] or period["lastRecord"] or "–"
    return f"{start} – {end}"


# ---------------------------------------------------------------------- HTML


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
    return env


def render_html(report: Mapping[str, Any]) -> str:
    """One self-contained HTML page: inline CSS and SVG, no script, nothing fetched."""
    template = _environment().get_template("report.html.j2")
    return template.render(
        r=report,
        charts=report_charts(report),
        palette=PALETTE,
        version=__version__,
        period_text=period_text(report),
        limits_rows=_HTML_ROWS,
    )


# ---------------------------------------------------------------------- JSON


@cache
def report_schema() -> Mapping[str, Any]:
    """The JSON Schema (draft 2020-12) of the report document."""
    text = resources.files(__package__).joinpath("schema", "report.schema.json").read_text("utf-8")
    schema: Mapping[str, Any] = json.loads(text)
    return schema


def render_json(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------- Markdown

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>|#])")


def _md(value: Any) -> str:
    """Text safe inside a Markdown table cell: no pipes, no HTML, no line breaks."""
    text = "–" if value is None or value == "" else str(value)
    text = " ".join(text.split())
    return _MD_SPECIAL.sub(r"\\\1", text)


def _md_table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines.extend(
        "| " + " | ".join(_md(c) if not isinstance(c, int | float) else _num(c) for c in row) + " |"
        for row in rows
    )
    return lines


def render_markdown(report: Mapping[str, Any], *, max_rows: int = 20) -> str:
    """A summary to paste into a ticket: integrity, control status, denials, exceptions,
    residency and GPU-hours (the HTML and JSON have everything)."""
    out: list[str] = []
    integrity = report["integrity"]
    totals = report["totals"]
    d = totals["decisions"]
    out.append(f"## mpigate compliance report — {_md(period_text(report))}")
    out.append("")
    if not integrity["ok"]:
        first = integrity["firstProblem"] or {}
        line = first.get("line")
        where = f"{first.get('file', '')}" + (f":{line}" if line is not None else "") if first else "?"
        out.append(
            f"> **Audit trail integrity check FAILED**: {integrity['broken']} of {integrity['chains']} "
            f"chain(s) did not verify. First problem: `{where}` ({_md(first.get('kind'))}): "
            f"{_md(first.get('message'))}"
        )
        out.append("")
    status = report["controlSummary"]
    out.append(f"- **Team:** {_md(report['filters']['team'] or 'all teams')}")
    trail = integrity["status"]
    out.append(
        f"- **Integrity:** {integrity['chains']} chain(s), "
        + (trail["text"] if integrity["ok"] else f"{integrity['broken']} BROKEN")
        + f"; signatures verified on {integrity['signatures']['verified']}"
    )
    out.extend(
        f"  - `{_md(c['chain'])}`: {_md(c['text'])}" for c in trail["chains"] if c["state"] == "unverifiable"
    )
    if trail["chainSetNote"]:
        out.append(f"  - {_md(trail['chainSetNote'])}")
    out.append(
        f"- **Decisions:** {_num(sum(d.values()))} ({_num(d['allowed'])} allowed, "
        f"{_num(d['allowed-with-warnings'])} with warnings, {_num(d['denied'])} denied)"
    )
    out.append(
        f"- **Controls:** {status['met']} met, {status['attention']} attention, "
        f"{status['no evidence']} no evidence"
    )
    out.append(
        f"- **Residency:** {_num(report['residency']['placements'])} placements, "
        f"{_num(report['residency']['outside'])} outside the team's region"
    )
    out.append(f"- **GPU-hours:** {_num(report['chargeback']['gpuHours'], 1)}")
    out.append("")
    for fw in report["controls"]:
        out.append(f"### {_md(fw['title'])}")
        out.append("")
        rows = [
            [c["id"], c["title"], c["evidenceTotal"], c["status"], "; ".join(c["reasons"])]
            for c in fw["controls"]
        ]
        out.extend(_md_table(["Control", "Title", "Evidence", "Status", "Why"], rows))
        out.append("")
    reasons = report["denials"]["topReasons"][:max_rows]
    if reasons:
        out.append("### Top denial reasons")
        out.append("")
        rows = [
            [r["rule"], r["violations"], r["examples"][0]["message"] if r["examples"] else ""]
            for r in reasons
        ]
        out.extend(_md_table(["Rule", "Denials", "Example"], rows))
        out.append("")
    if report["security"]["byRule"]:
        out.append("### Privileged and unsafe attempts")
        out.append("")
        rows = [
            [r["rule"], r["denied"], r["warned"], r["audited"], r["waived"]]
            for r in report["security"]["byRule"]
        ]
        out.extend(_md_table(["Rule", "Denied", "Warned", "Audited", "Waived"], rows[:max_rows]))
        out.append("")
    if report["exceptions"]:
        out.append("### Exceptions used")
        out.append("")
        rows = [
            [x["name"], x["approver"], x["ticket"], x["expires"], x["uses"], x["usesAfterExpiry"]]
            for x in report["exceptions"][:max_rows]
        ]
        out.extend(_md_table(["Exception", "Approver", "Ticket", "Expires", "Uses", "After expiry"], rows))
        out.append("")
    outside = report["residency"]["outsideExamples"][:max_rows]
    if outside:
        out.append("### Placements outside the team's region")
        out.append("")
        rows = [
            [e["time"], e["team"], f"{e['namespace']}/{e['name']}", e["node"], e["region"]] for e in outside
        ]
        out.extend(_md_table(["Time", "Team", "Job", "Node", "Region"], rows))
        out.append("")
    unjudged = report["activity"]["apiServer"]["unjudgedWrites"]
    if unjudged:
        out.append(
            f"**{_num(unjudged)} API-server write(s) of TrainJobs/runtimes carry no mpigate decision.**"
        )
        out.append("")
    if report["chargeback"]["byTeamAndCostCenter"]:
        out.append("### GPU-hours")
        out.append("")
        rows = [
            [x["team"], x["costCenter"], x["jobs"], x["gpuHours"]]
            for x in report["chargeback"]["byTeamAndCostCenter"]
        ]
        out.extend(_md_table(["Team", "Cost center", "Jobs", "GPU-hours"], rows[:max_rows]))
        out.append("")
    out.append(
        f"_Generated {report['generated']} by mpigate {__version__}; "
        "`mpigate report --format html` has the full report._"
    )
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------- CSV


def _row(section: str, metric: str, value: Any, **columns: Any) -> dict[str, Any]:
    return {"section": section, "metric": metric, "value": value, **columns}


def csv_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The report as tidy rows (one fact per row), in a fixed section order."""
    for chain in report["inputs"]["chains"]:
        first = next((p for p in chain["problems"] if p["severity"] == "error"), None)
        status = chain["status"]
        if first:
            detail = f"{first['file']}:{first['line']} {first['kind']}: {first['message']}"
        else:
            detail = status["text"] if status["state"] == "unverifiable" else ""
        outcome = "broken" if not chain["ok"] else status["state"]
        yield _row(
            "integrity", "records", chain["records"], name=chain["chain"], outcome=outcome, detail=detail
        )
        yield _row(
            "integrity", "records_in_period", chain["recordsInPeriod"], name=chain["chain"], outcome=outcome
        )
    for f in report["inputs"]["k8sAudit"]:
        first = f["firstMalformed"]
        detail = f"line {first['line']}: {first['reason']}" if first else (f["unreadable"] or "")
        yield _row("k8s_audit", "events_used", f["used"], name=f["file"])
        yield _row("k8s_audit", "malformed_lines", f["malformed"], name=f["file"], detail=detail)
    for row in report["decisions"]["cube"]:
        yield _row(
            "decisions",
            "decisions",
            row["decisions"],
            date=row["date"],
            team=row["team"],
            outcome=row["outcome"],
            rule=row["rule"] or "",
        )
    for rule in report["rules"]:
        for effect in ("denied", "warned", "audited", "waived"):
            if rule[effect]:
                yield _row(
                    "rules",
                    "violations",
                    rule[effect],
                    rule=rule["rule"],
                    outcome=effect,
                    detail=rule["title"],
                )
    for reason in report["denials"]["topReasons"]:
        example = reason["examples"][0]["message"] if reason["examples"] else ""
        yield _row("denials", "violations", reason["violations"], rule=reason["rule"], detail=example)
    for x in report["security"]["byTeamAndRule"]:
        yield _row(
            "security", "violations", x["violations"], team=x["team"], rule=x["rule"], outcome=x["effect"]
        )
    for actor in report["activity"]["actors"]:
        for verb in ("create", "update", "delete", "other"):
            if actor[verb]:
                yield _row(
                    "activity",
                    "requests",
                    actor[verb],
                    actor=actor["actor"],
                    actor_kind=actor["actorKind"],
                    verb=verb,
                    kind=";".join(actor["kinds"]),
                    detail=f"source={actor['source']}" + (f";via={actor['via']}" if actor["via"] else ""),
                )
        if actor["refused"]:
            yield _row(
                "activity",
                "refused",
                actor["refused"],
                actor=actor["actor"],
                actor_kind=actor["actorKind"],
                detail=f"source={actor['source']}",
            )
    api = report["activity"]["apiServer"]
    if api["given"]:
        yield _row("activity", "unjudged_writes", api["unjudgedWrites"])
    for x in report["rbacDenials"]["byActor"]:
        yield _row(
            "rbac",
            "denials",
            x["count"],
            actor=x["actor"],
            actor_kind=x["actorKind"],
            verb=x["verb"],
            kind=x["resource"],
            namespace=x["namespace"] or "",
        )
    for x in report["exceptions"]:
        terms = f"approver={x['approver']};ticket={x['ticket']};expires={x['expires']}"
        yield _row("exceptions", "uses", x["uses"], name=x["name"], team=";".join(x["teams"]), detail=terms)
        if x["usesAfterExpiry"]:
            yield _row("exceptions", "uses_after_expiry", x["usesAfterExpiry"], name=x["name"], detail=terms)
        for w in x["waived"]:
            yield _row("exceptions", "waived", w["violations"], name=x["name"], rule=w["rule"])
    for x in report["residency"]["byRegionAndTeam"]:
        allowed = ";".join(x["allowedRegions"])
        yield _row(
            "residency", "placements", x["placements"], region=x["region"], team=x["team"], detail=allowed
        )
        yield _row("residency", "outside", x["outside"], region=x["region"], team=x["team"], detail=allowed)
    for x in report["chargeback"]["byTeamAndCostCenter"]:
        yield _row("chargeback", "gpu_hours", x["gpuHours"], team=x["team"], cost_center=x["costCenter"])
        yield _row("chargeback", "jobs", x["jobs"], team=x["team"], cost_center=x["costCenter"])
    for fw in report["controls"]:
        for c in fw["controls"]:
            yield _row(
                "controls",
                "evidence",
                c["evidenceTotal"],
                framework=fw["framework"],
                control=c["fullId"],
                outcome=c["status"],
                detail="; ".join(c["reasons"]),
            )


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    # A cell a spreadsheet would evaluate (CSV injection): keep the text, stop the formula.
    return "'" + text if text.startswith(_FORMULA) else text


def render_csv(report: Mapping[str, Any]) -> str:
    """CSV with a header row of :data:`CSV_COLUMNS` (``\\n`` line ends, RFC 4180 quoting)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in csv_rows(report):
        writer.writerow([_cell(row.get(c)) for c in CSV_COLUMNS])
    return buffer.getvalue()


def render(report: Mapping[str, Any], fmt: str) -> str:
    """The report in ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "html":
        return render_html(report)
    if fmt == "md":
        return render_markdown(report)
    if fmt == "json":
        return render_json(report)
    if fmt == "csv":
        return render_csv(report)
    raise ValueError(f"unknown report format {fmt!r} (known: {', '.join(FORMATS)})")
