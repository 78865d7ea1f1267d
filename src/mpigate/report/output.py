"""The report document in four formats: HTML (one self-contained file), Markdown (for tickets),
JSON (``schema/report.schema.json``) and CSV (one tidy table, columns :data:`CSV_COLUMNS`).

Everything in the document that came from a record (messages, user and object names) is
untrusted: HTML autoescapes it, Markdown escapes table syntax and inline HTML, CSV defuses cells
that a spreadsheet would take for a formula.
"""

from __future__ import annotations

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
from mpigate._csv import SafeCsvWriter

from .assess import STATUSES
from .charts import PALETTE, report_charts
from .findings import duration_text

__all__ = [
    "CSV_COLUMNS",
    "FORMATS",
    "PAPERS",
    "csv_rows",
    "render",
    "render_csv",
    "render_html",
    "render_json",
    "render_markdown",
    "report_schema",
]

FORMATS = ("html", "md", "json", "csv")
PAPERS = ("A4", "letter")

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
    "ref",
    "request_uid",
    "unit",
)

_HTML_ROWS = 200  # rows of a sample table in HTML (the JSON keeps them all)
_HTML_EXAMPLES = 8  # examples per API-server event category in HTML
_HTML_RECENT = 50  # most recent requests and attempts shown in HTML


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


def _md_rows(out: list[str], headers: list[str], rows: list[list[Any]], max_rows: int, what: str) -> None:
    out.extend(_md_table(headers, rows[:max_rows]))
    if len(rows) > max_rows:
        out.append(f"| … {len(rows) - max_rows} more {what} (the HTML, JSON and CSV have them all) |")
    out.append("")


def _status_md(status: str) -> str:
    return {"met": "✔ met", "attention": "▲ attention", "not evaluated": "? not evaluated"}.get(
        status, status
    )


def render_markdown(report: Mapping[str, Any], *, max_rows: int = 50) -> str:
    """The report for a ticket or a review: the same sections as the HTML, tables cut at
    ``max_rows`` rows (saying how many more there are)."""
    out: list[str] = []
    integrity = report["integrity"]
    comp = report["completeness"]
    totals = report["totals"]
    d = totals["decisions"]
    status = report["controlSummary"]
    out.append(f"## mpigate compliance report {report['reportId']} — {_md(period_text(report))}")
    out.append("")
    if not integrity["ok"]:
        first = integrity["firstProblem"] or {}
        line = first.get("line")
        where = f"{first.get('file', '')}" + (f":{line}" if line is not None else "") if first else "?"
        out.append(
            f"> **Audit trail integrity check FAILED**: {integrity['broken']} of {integrity['chains']} "
            f"chain(s) did not verify. First problem: `{where}` ({_md(first.get('kind'))}, chain "
            f"{_md(first.get('chain'))}): {_md(first.get('message'))}"
        )
        out.append("")
    revisions = ", ".join(f"`{v['revision']}`" for v in report["revisions"]) or "none recorded"
    out.append(
        f"- **Report:** `{report['reportId']}`, generated {report['generated']} by mpigate {__version__}"
    )
    out.append(
        f"- **Period:** {_md(period_text(report))} ({period_length(report)}, UTC); "
        f"the inputs cover {coverage_text(report)} of it"
    )
    out.append(f"- **Frameworks:** {_md(', '.join(f['title'] for f in report['controls']))}")
    out.append(f"- **Team:** {_md(report['filters']['team'] or 'all teams')}")
    out.append(f"- **Config revisions in force:** {revisions}")
    out.append("- This report shows how the controls operated as recorded; it is not an audit opinion.")
    out.append("")
    out.append("### Summary")
    out.append("")
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
        f"- **Coverage:** {coverage_text(report)} of the period; {comp['gapCount']} gap(s) longer than "
        f"the heartbeat ({duration_text(float(comp['heartbeatSeconds']))})"
    )
    out.append(
        f"- **Requests judged:** {_num(totals['requests'])} ({_num(d['allowed'])} allowed, "
        f"{_num(d['allowed-with-warnings'])} with warnings, {_num(d['denied'])} denied); "
        f"{_num(totals['findings'])} rule finding(s)"
    )
    out.append("- **Controls:** " + ", ".join(f"{status[s]} {s}" for s in STATUSES))
    api_findings = report["apiServerEvents"]["findings"] if report["inputs"]["k8sAudit"] else None
    out.append(
        "- **API-server events outside mpigate's judgement:** "
        + (f"{_num(api_findings)} finding(s)" if api_findings is not None else "no API-server log given")
    )
    out.append(
        f"- **Residency:** {_num(report['residency']['placements'])} placements, "
        f"{_num(report['residency']['outside'])} outside the team's region"
    )
    out.append(f"- **GPU-hours:** {gpu_text(report)}")
    out.append(f"- **Exceptions used:** {len(report['exceptions'])}")
    out.append("")
    # integrity and completeness
    out.append("### Integrity and completeness of the inputs")
    out.append("")
    coverage = {c["chain"]: c for c in comp["chains"]}
    rows = []
    for c in report["inputs"]["chains"]:
        cov = coverage.get(c["chain"], {})
        first_error = next((p for p in c["problems"] if p["severity"] == "error"), None)
        rows.append(
            [
                c["chain"],
                ", ".join(cov.get("sources", [])),
                "intact" if c["ok"] else "BROKEN",
                c["records"],
                c["recordsInPeriod"],
                f"{c['from'] or '–'} – {c['to'] or '–'}",
                "–" if cov.get("coverage") is None else f"{cov['coverage'] * 100:.1f} %",
                cov.get("gapCount", 0),
                c["signatures"],
                f"{first_error['kind']}: {first_error['message']}" if first_error else "",
            ]
        )
    headers = ["Chain", "Writer", "Verdict", "Records", "In period", "Span", "Coverage", "Gaps", "Signatures"]
    _md_rows(out, [*headers, "First problem"], rows, max_rows, "chains")
    if comp["gaps"]:
        rows = [[g["from"], g["to"], duration_text(g["seconds"])] for g in comp["gaps"]]
        out.append(f"Gaps longer than the heartbeat in which no chain holds a record ({comp['gapCount']}):")
        out.append("")
        _md_rows(out, ["From", "To", "Length"], rows, max_rows, "gaps")
    exp = comp["expectedChains"]
    missing = ", ".join(exp["missing"]) or "none"
    sources = "; ".join(f"{x['source']}: {x['found']} of at least {x['expected']}" for x in exp["bySource"])
    out.append(f"Expected chains missing: {_md(missing)}" + (f"; {_md(sources)}" if sources else "") + ".")
    out.append("")
    if report["inputs"]["k8sAudit"]:
        api_cov = comp["apiServer"]
        rows = [
            [
                f["file"],
                f"{f['firstEvent'] or '–'} – {f['lastEvent'] or '–'}",
                "yes" if log["outsidePeriod"] else "no",
                f["events"],
                f["used"],
                f["malformed"],
                f["sha256"],
            ]
            for f, log in zip(report["inputs"]["k8sAudit"], api_cov["logs"], strict=True)
        ]
        _md_rows(
            out,
            ["API-server log", "Events span", "Outside the period", "Events", "Used", "Malformed", "SHA-256"],
            rows,
            max_rows,
            "logs",
        )
        rec = comp["reconciliation"]
        if rec["possible"]:
            out.append(
                f"Reconciliation with the chains: {_num(rec['recordsMatched'])} of "
                f"{_num(rec['recordsCompared'])} compared record(s) match; {rec['mismatchCount']} range(s) "
                "disagree (a chain the log names but that was not given is a missing-chain problem above)."
            )
            out.append("")
            rows = [
                [m["chain"], m["stage"], f"{m['seqFrom']}–{m['seqTo']}", m["records"], m["annotatedEvents"]]
                for m in rec["mismatches"]
            ]
            if rows:
                _md_rows(
                    out, ["Chain", "Stage", "Seq", "Records", "Annotated events"], rows, max_rows, "ranges"
                )
        else:
            out.append("Reconciliation with the chains: not possible (no event carries a chain position).")
            out.append("")
    # revisions
    out.append("### Config revisions in force")
    out.append("")
    rows = []
    for v in report["revisions"]:
        policy = v["policy"]
        if policy:
            pss = f"{policy['podSecurity']['level']}:{policy['podSecurity']['version']}"
            relaxed = ", ".join(f"{r}: {m}" for r, m in policy["modes"].items() if m != "enforce") or "none"
        else:
            pss, relaxed = "not recorded", "not recorded"
        loaded = "; ".join(f"{x['time']} {x['chain']}" for x in v["loaded"]) or "not recorded"
        rows.append([v["revision"], loaded, v["decisions"], pss, relaxed])
    _md_rows(
        out,
        ["Revision", "Loaded", "Requests", "Pod Security", "Rules not in enforce mode"],
        rows,
        max_rows,
        "revisions",
    )
    # controls
    for fw in report["controls"]:
        out.append(f"### {_md(fw['title'])}")
        out.append("")
        rows = []
        for c in fw["controls"]:
            tested = "; ".join(f"{p['count']:,} {p['unit']} ({k})" for k, p in c["population"].items())
            modes = "; ".join(f"{state}: {', '.join(rules)}" for state, rules in rules_by_mode(c["modes"]))
            why = [*c["reasons"], *(f"not evaluated: {x}" for x in c["notEvaluated"])]
            if c["notApplicable"]:
                why.insert(0, c["notApplicable"])
            rows.append([c["id"], c["title"], tested, modes or "–", _status_md(c["status"]), "; ".join(why)])
        _md_rows(
            out,
            ["Control", "Title", "Tested on", "Rules (mode)", "Status", "Why"],
            rows,
            max_rows,
            "controls",
        )
    out.append(
        "**How the status is decided.** "
        + " ".join(f"*{s}*: {_md(t)}" for s, t in report["statusRules"].items())
    )
    out.append("")
    # API-server events
    out.append("### API-server events outside mpigate's judgement")
    out.append("")
    ae = report["apiServerEvents"]
    if not report["inputs"]["k8sAudit"]:
        out.append(
            "No API-server audit log was given (`--k8s-audit`): "
            "the controls that rest on it are not evaluated."
        )
        out.append("")
    else:
        counts = ae["counts"]
        out.append(
            f"{_num(counts['read'])} event(s) read, {_num(counts['used'])} used, "
            f"{_num(counts['read'] - counts['used'])} deliberately not used, "
            f"{_num(counts['malformed'])} malformed."
        )
        out.append("")
        rows = [
            [
                c["title"],
                c["requests"],
                c["finding"],
                c["passed"] + c["recorded"],
                c["refused"],
                c["notEvaluated"],
                ", ".join(c["controls"]),
            ]
            for c in ae["categories"]
        ]
        _md_rows(
            out,
            ["Category", "Requests", "Findings", "Passed / recorded", "Refused", "Not evaluated", "Controls"],
            rows,
            max_rows,
            "categories",
        )
        rows = [
            [
                e["time"],
                c["category"],
                e["actor"] + (f" via {e['via']}" if e["via"] else ""),
                f"{e['verb']} {e['resource']} {e['namespace'] or ''}/{e['name'] or ''}",
                e["reason"],
                f"{_basename(e['source'])} {e['auditID'] or ''}".strip(),
            ]
            for c in ae["categories"]
            for e in c["examples"]
            if e["outcome"] == "finding"
        ]
        if rows:
            _md_rows(
                out, ["Time", "Category", "Identity", "Request", "Why", "Source"], rows, max_rows, "findings"
            )
        rows = [[x["reason"], "–", x["events"]] for x in counts["notUsed"]] + [
            [x["reason"], x["category"] or "–", x["events"]] for x in counts["notEvaluated"]
        ]
        _md_rows(out, ["Not used / not evaluated because", "Category", "Events"], rows, max_rows, "reasons")
    # decisions
    out.append("### Decisions")
    out.append("")
    out.append(
        f"{_num(totals['requests'])} request(s) judged ({_num(totals['mutatedRequests'])} also mutated, "
        f"counted once); {_num(totals['findings'])} rule finding(s); {_num(totals['dryRun'])} dry run(s)."
    )
    out.append("")
    rows = [
        [t["team"], t["allowed"], t["allowed-with-warnings"], t["denied"], t["total"]]
        for t in report["decisions"]["byTeam"]
    ]
    _md_rows(out, ["Team", "Allowed", "With warnings", "Denied", "Requests"], rows, max_rows, "teams")
    rows = [[x["rule"], x["denied"], x["warned"], x["audited"], x["waived"]] for x in report["rules"]]
    _md_rows(out, ["Rule (findings)", "Denied", "Warned", "Audited", "Waived"], rows, max_rows, "rules")
    # denials
    out.append("### Denials")
    out.append("")
    out.append(f"{_num(report['denials']['decisions'])} request(s) denied.")
    out.append("")
    rows = [
        [
            r["rule"],
            r["violations"],
            r["examples"][0]["message"] if r["examples"] else "",
            r["examples"][0]["record"] if r["examples"] else "",
        ]
        for r in report["denials"]["topReasons"]
    ]
    _md_rows(out, ["Rule", "Findings", "Latest example", "Record"], rows, max_rows, "rules")
    # security
    out.append("### Privileged and unsafe attempts")
    out.append("")
    rows = [
        [r["rule"], r["denied"], r["warned"], r["audited"], r["waived"]] for r in report["security"]["byRule"]
    ]
    _md_rows(out, ["Rule (findings)", "Denied", "Warned", "Audited", "Waived"], rows, max_rows, "rules")
    rows = [
        [
            e["time"],
            e["team"],
            f"{e['namespace'] or ''}/{e['name'] or ''}",
            e["user"],
            e["rule"],
            e["effect"],
            e["message"],
            e["record"],
        ]
        for e in report["security"]["recent"]
    ]
    if rows:
        _md_rows(
            out,
            ["Time", "Team", "Object", "User", "Rule", "Effect", "Message", "Record"],
            rows,
            max_rows,
            "attempts",
        )
    # activity
    out.append("### Who created, changed and deleted which jobs")
    out.append("")
    rows = [
        [
            a["actor"] + (f" via {a['via']}" if a["via"] else ""),
            a["actorKind"],
            a["source"],
            a["create"],
            a["update"],
            a["delete"],
            a["other"],
            a["refused"],
        ]
        for a in report["activity"]["actors"]
    ]
    _md_rows(
        out,
        ["Identity", "Kind", "Source", "Create", "Update", "Delete", "Other", "Refused"],
        rows,
        max_rows,
        "identities",
    )
    api = report["activity"]["apiServer"]
    if api["given"]:
        out.append(
            f"**{_num(api['unjudgedWrites'])} API-server write(s) of TrainJobs/runtimes carry no mpigate "
            "decision** although the webhooks judge the identity."
            if api["unjudgedWrites"]
            else "Every API-server write by an identity the webhooks judge carries an mpigate decision."
        )
        out.append("")
        rows = [
            [
                e["time"],
                e["actor"],
                e["verb"],
                f"{e['kind']} {e['namespace'] or ''}/{e['name'] or ''}",
                f"{_basename(e['source'])} {e['auditID'] or ''}".strip(),
            ]
            for e in api["unjudgedExamples"]
        ]
        if rows:
            _md_rows(out, ["Time", "Identity", "Verb", "Object", "Source"], rows, max_rows, "writes")
    rows = [
        [
            e["time"],
            e["source"],
            e["actor"],
            e["verb"],
            f"{e['kind']} {e['namespace'] or ''}/{e['name'] or ''}",
            e["result"],
            e["ref"] or "",
            e["requestUID"] or "",
        ]
        for e in report["activity"]["recentEvents"]
    ]
    _md_rows(
        out,
        ["Time", "Source", "Identity", "Verb", "Object", "Result", "Record", "Request UID"],
        rows,
        max_rows,
        "requests",
    )
    # refusals
    out.append("### Authorizer refusals")
    out.append("")
    if report["inputs"]["k8sAudit"]:
        out.append(
            f"{_num(report['rbacDenials']['total'])} request(s) refused by the API server's authorizer."
        )
        out.append("")
        rows = [
            [x["actor"], x["verb"], x["resource"], x["namespace"] or "–", x["count"]]
            for x in report["rbacDenials"]["byActor"]
        ]
        _md_rows(out, ["Identity", "Verb", "Resource", "Namespace", "Requests"], rows, max_rows, "rows")
    else:
        out.append("No API-server audit log was given: refusals are not known.")
        out.append("")
    # exceptions
    out.append("### Exceptions used")
    out.append("")
    rows = [
        [
            x["name"],
            x["approver"],
            x["ticket"],
            x["expires"],
            x["uses"],
            x["usesAfterExpiry"],
            ", ".join(f"{w['rule']} ({w['violations']})" for w in x["waived"]),
        ]
        for x in report["exceptions"]
    ]
    _md_rows(
        out,
        ["Exception", "Approver", "Ticket", "Expires", "Uses", "After expiry", "Rules waived"],
        rows,
        max_rows,
        "exceptions",
    )
    # residency
    out.append("### Data residency")
    out.append("")
    res = report["residency"]
    rows = [
        [x["region"], x["team"], ", ".join(x["allowedRegions"]) or "unknown", x["placements"], x["outside"]]
        for x in res["byRegionAndTeam"]
    ]
    _md_rows(out, ["Region", "Team", "Allowed", "Placements", "Outside"], rows, max_rows, "rows")
    rows = [
        [e["time"], e["team"], f"{e['namespace']}/{e['name']}", e["node"], e["region"], e["record"]]
        for e in res["outsideExamples"]
    ]
    if rows:
        _md_rows(out, ["Time", "Team", "Job", "Node", "Region", "Record"], rows, max_rows, "placements")
    # images
    out.append("### Image inventory (PCI DSS 6.3.2)")
    out.append("")
    inv = report["imageInventory"]
    rows = [
        [x["image"], x["tag"] or "–", x["digest"] or "–", x["requests"], ", ".join(x["teams"])]
        for x in inv["images"]
    ]
    _md_rows(out, ["Image", "Tag", "Digest", "Requests", "Teams"], rows, max_rows, "images")
    # chargeback
    out.append("### GPU-hours")
    out.append("")
    if not report["chargeback"]["lifecycleEvents"]:
        out.append("No data: no lifecycle record in the period.")
        out.append("")
    else:
        cb = report["chargeback"]
        line = (
            f"{_num(cb['gpuHours'], 1)} GPU-hours used in the period (GPUs × pod run time, split by when "
            "they were used; each job, segment and event once; GPUs per pod are the job's resolved demand, "
            "not the live pod spec)"
        )
        if cb["duplicates"]["records"]:
            line += f"; {_num(cb['duplicates']['records'])} repeated record(s) counted once"
        if cb["range"]["gpuHoursMin"] != cb["range"]["gpuHoursMax"]:
            line += (
                f"; with the segments not all observed, between {_num(cb['range']['gpuHoursMin'], 1)} and "
                f"{_num(cb['range']['gpuHoursMax'], 1)}"
            )
        out.append(line + ".")
        out.append("")
        rows = [[x["team"], x["costCenter"], x["jobs"], x["gpuHours"]] for x in cb["byTeamAndCostCenter"]]
        _md_rows(out, ["Team", "Cost center", "Jobs ended", "GPU-hours"], rows, max_rows, "rows")
        _md_rows(
            out,
            ["Day (UTC)", "GPU-hours"],
            [[x["date"], x["gpuHours"]] for x in cb["byDay"]],
            max_rows,
            "days",
        )
        if cb["flagged"]:
            out.append(
                "Flagged segments: " + ", ".join(f"{n} {name}" for name, n in cb["flags"].items() if n) + "."
            )
            out.append("")
            rows = [
                [
                    f"{x['namespace'] or ''}/{x['name'] or ''}",
                    x["team"],
                    x["segment"] if x["segment"] is not None else "–",
                    f"{x['event']} {x['time'][:19]}",
                    ", ".join(x["flags"]),
                    x["gpuHours"] if x["gpuHours"] is not None else "unknown",
                    f"{x['gpuHoursMin']}–{x['gpuHoursMax']}" if x["gpuHoursMin"] is not None else "–",
                    x["note"] or "",
                ]
                for x in cb["flagged"]
            ]
            _md_rows(
                out,
                ["Job", "Team", "Segment", "Closed by", "Flags", "GPU-hours", "Range", "Why"],
                rows,
                max_rows,
                "flagged segments",
            )
    # sample
    out.append("### Sample of requests")
    out.append("")
    sample = report["sample"]
    if sample["size"]:
        out.append(
            f"{len(sample['items'])} of {_num(sample['population'])} {sample['unit']}, "
            f"`--sample {sample['size']} --seed {sample['seed']}`."
        )
        out.append("")
        rows = [
            [
                e["record"],
                e["requestUID"] or "",
                e["time"],
                e["team"],
                f"{e['operation']} {e['kind']} {e['namespace'] or ''}/{e['name'] or ''}",
                e["decision"],
            ]
            for e in sample["items"]
        ]
        _md_rows(
            out,
            ["Record", "Request UID", "Time", "Team", "Request", "Decision"],
            rows,
            len(rows) or 1,
            "samples",
        )
    else:
        out.append("No sample was drawn (`--sample N --seed S`).")
        out.append("")
    # method
    out.append("### Method and limits")
    out.append("")
    rows = [
        [f"{c['chain']}/{_basename(sg['path'])}", sg["bytes"], sg["sha256"]]
        for c in report["inputs"]["chains"]
        for sg in c["segmentDigests"]
    ]
    rows += [[f["file"], f["bytes"], f["sha256"]] for f in report["inputs"]["k8sAudit"]]
    _md_rows(out, ["Input", "Bytes", "SHA-256"], rows, max_rows, "inputs")
    rows = [[c["fullId"], c["gaps"]] for fw in report["controls"] for c in fw["controls"]]
    _md_rows(out, ["Control", "Not covered by mpigate's evidence"], rows, max_rows, "controls")
    out.append(
        f"_Report {report['reportId']}, generated {report['generated']} by mpigate {__version__}. "
        "Counts are exact; every row names its record (`chain:seq:hash`, request UID) or API-server "
        "event (`file:line`, audit ID)._"
    )
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------- CSV


def _row(section: str, metric: str, value: Any, **columns: Any) -> dict[str, Any]:
    return {"section": section, "metric": metric, "value": value, **columns}


def csv_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The report as tidy rows (one fact per row, with its unit), in the HTML's section order."""
    comp = report["completeness"]
    coverage = {c["chain"]: c for c in comp["chains"]}
    for chain in report["inputs"]["chains"]:
        first = next((p for p in chain["problems"] if p["severity"] == "error"), None)
        status = chain["status"]
        if first:
            detail = f"{first['file']}:{first['line']} {first['kind']}: {first['message']}"
        else:
            detail = status["text"] if status["state"] == "unverifiable" else ""
        outcome = "broken" if not chain["ok"] else status["state"]
        name = chain["chain"]
        yield _row(
            "integrity",
            "records",
            chain["records"],
            name=name,
            outcome=outcome,
            detail=detail,
            unit="records",
        )
        yield _row(
            "integrity",
            "records_in_period",
            chain["recordsInPeriod"],
            name=name,
            outcome=outcome,
            unit="records",
        )
    for chain in report["inputs"]["chains"]:
        name = chain["chain"]
        cov = coverage.get(name)
        if cov is not None:
            yield _row(
                "completeness",
                "chain_coverage",
                cov["coverage"],
                name=name,
                unit="fraction of the period",
                actor=";".join(cov["sources"]),
                detail=f"{cov['from']}–{cov['to']}",
            )
            for gap in cov["gaps"]:
                yield _row(
                    "completeness",
                    "chain_gap",
                    gap["seconds"],
                    name=name,
                    unit="seconds",
                    detail=f"{gap['from']}–{gap['to']}",
                )
    yield _row(
        "completeness",
        "coverage",
        comp["coverage"],
        unit="fraction of the period",
        detail=f"heartbeat={comp['heartbeatSeconds']}s",
    )
    for gap in comp["gaps"]:
        yield _row("completeness", "gap", gap["seconds"], unit="seconds", detail=f"{gap['from']}–{gap['to']}")
    for name in comp["expectedChains"]["missing"]:
        yield _row("completeness", "expected_chain_missing", 1, name=name, unit="chains")
    for x in comp["expectedChains"]["bySource"]:
        yield _row(
            "completeness",
            "expected_chains",
            x["expected"],
            actor=x["source"],
            unit="chains",
            detail=f"found={x['found']}",
        )
    rec = comp["reconciliation"]
    if rec["possible"]:
        yield _row(
            "completeness",
            "reconciled_records",
            rec["recordsMatched"],
            unit="records",
            detail=f"compared={rec['recordsCompared']}",
        )
        for m in rec["mismatches"]:
            yield _row(
                "completeness",
                "unreconciled_range",
                m["records"],
                name=m["chain"],
                outcome=m["stage"],
                unit="records",
                detail=f"seq={m['seqFrom']}-{m['seqTo']};annotated_events={m['annotatedEvents']}",
            )
    for f in report["inputs"]["k8sAudit"]:
        first = f["firstMalformed"]
        detail = f"line {first['line']}: {first['reason']}" if first else (f["unreadable"] or "")
        yield _row(
            "k8s_audit",
            "events_read",
            f["events"],
            name=f["file"],
            unit="events",
            detail=f"{f['firstEvent']}–{f['lastEvent']}",
        )
        yield _row("k8s_audit", "events_used", f["used"], name=f["file"], unit="events")
        yield _row(
            "k8s_audit", "malformed_lines", f["malformed"], name=f["file"], detail=detail, unit="lines"
        )
        for x in f["notUsed"]:
            yield _row(
                "k8s_audit", "events_not_used", x["events"], name=f["file"], detail=x["reason"], unit="events"
            )
    for v in report["revisions"]:
        policy = v["policy"]
        if policy:
            relaxed = ",".join(f"{r}={m}" for r, m in policy["modes"].items() if m != "enforce")
            pss = policy["podSecurity"]
            detail = f"pss={pss['level']}:{pss['version']};not_enforce={relaxed}"
        else:
            detail = "policy not recorded"
        loaded = ";".join(f"{x['time']}@{x['chain']}" for x in v["loaded"])
        yield _row(
            "revisions",
            "requests",
            v["decisions"],
            name=v["revision"],
            detail=detail,
            unit="requests",
            date=loaded,
        )
    for fw in report["controls"]:
        for c in fw["controls"]:
            why = [*c["reasons"], *(f"not evaluated: {x}" for x in c["notEvaluated"])]
            if c["notApplicable"]:
                why.insert(0, f"not applicable: {c['notApplicable']}")
            tested = ";".join(f"{k}={p['count']} {p['unit']}" for k, p in c["population"].items())
            yield _row(
                "controls",
                "population",
                c["evidenceTotal"],
                framework=fw["framework"],
                control=c["fullId"],
                outcome=c["status"],
                detail="; ".join(why),
                unit="requests, records and events",
                rule=tested,
            )
    ae = report["apiServerEvents"]
    if report["inputs"]["k8sAudit"]:
        for c in ae["categories"]:
            for outcome in ("finding", "passed", "recorded", "refused", "notEvaluated"):
                yield _row(
                    "api_events",
                    "requests",
                    c[outcome],
                    kind=c["category"],
                    outcome=outcome,
                    unit="requests",
                    detail=";".join(c["controls"]),
                )
            for e in c["examples"]:
                yield _row(
                    "api_events",
                    "example",
                    1,
                    date=e["time"],
                    kind=c["category"],
                    outcome=e["outcome"],
                    actor=e["actor"],
                    actor_kind=e["actorKind"],
                    verb=e["verb"],
                    namespace=e["namespace"],
                    name=f"{e['resource']}/{e['name'] or ''}",
                    detail=e["reason"],
                    ref=e["source"],
                    request_uid=e["auditID"],
                    unit="requests",
                )
        for x in ae["counts"]["notEvaluated"]:
            yield _row(
                "api_events",
                "not_evaluated",
                x["events"],
                kind=x["category"] or "",
                detail=x["reason"],
                unit="events",
            )
    for row in report["decisions"]["cube"]:
        yield _row(
            "decisions",
            "decisions",
            row["decisions"],
            date=row["date"],
            team=row["team"],
            outcome=row["outcome"],
            rule=row["rule"] or "",
            unit="requests",
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
                    unit="findings",
                )
    for reason in report["denials"]["topReasons"]:
        example = reason["examples"][0] if reason["examples"] else None
        yield _row(
            "denials",
            "violations",
            reason["violations"],
            rule=reason["rule"],
            detail=example["message"] if example else "",
            ref=example["record"] if example else "",
            request_uid=example["requestUID"] if example else "",
            unit="findings",
        )
    for x in report["security"]["byTeamAndRule"]:
        yield _row(
            "security",
            "violations",
            x["violations"],
            team=x["team"],
            rule=x["rule"],
            outcome=x["effect"],
            unit="findings",
        )
    for e in report["security"]["recent"]:
        yield _row(
            "security",
            "attempt",
            1,
            date=e["time"],
            team=e["team"],
            rule=e["rule"],
            outcome=e["effect"],
            actor=e["user"],
            namespace=e["namespace"],
            name=e["name"],
            detail=e["message"],
            ref=e["record"],
            request_uid=e["requestUID"],
            unit="findings",
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
                    unit="requests",
                )
        if actor["refused"]:
            yield _row(
                "activity",
                "refused",
                actor["refused"],
                actor=actor["actor"],
                actor_kind=actor["actorKind"],
                detail=f"source={actor['source']}",
                unit="requests",
            )
    api = report["activity"]["apiServer"]
    if api["given"]:
        yield _row("activity", "unjudged_writes", api["unjudgedWrites"], unit="requests")
        for e in api["unjudgedExamples"]:
            yield _row(
                "activity",
                "unjudged_write",
                1,
                date=e["time"],
                actor=e["actor"],
                verb=e["verb"],
                kind=e["kind"],
                namespace=e["namespace"],
                name=e["name"],
                ref=e["source"],
                request_uid=e["auditID"],
                unit="requests",
            )
    for e in report["activity"]["recentEvents"]:
        yield _row(
            "activity",
            "request",
            1,
            date=e["time"],
            actor=e["actor"],
            actor_kind=e["actorKind"],
            verb=e["verb"],
            kind=e["kind"],
            namespace=e["namespace"],
            name=e["name"],
            outcome=e["result"],
            detail=f"source={e['source']}",
            ref=e["ref"],
            request_uid=e["requestUID"],
            unit="requests",
        )
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
            unit="requests",
        )
    for x in report["exceptions"]:
        terms = f"approver={x['approver']};ticket={x['ticket']};expires={x['expires']}"
        yield _row(
            "exceptions",
            "uses",
            x["uses"],
            name=x["name"],
            team=";".join(x["teams"]),
            detail=terms,
            unit="requests",
        )
        if x["usesAfterExpiry"]:
            yield _row(
                "exceptions",
                "uses_after_expiry",
                x["usesAfterExpiry"],
                name=x["name"],
                detail=terms,
                unit="requests",
            )
        for w in x["waived"]:
            yield _row(
                "exceptions", "waived", w["violations"], name=x["name"], rule=w["rule"], unit="findings"
            )
    for x in report["residency"]["byRegionAndTeam"]:
        allowed = ";".join(x["allowedRegions"])
        yield _row(
            "residency",
            "placements",
            x["placements"],
            region=x["region"],
            team=x["team"],
            detail=allowed,
            unit="placements",
        )
        yield _row(
            "residency",
            "outside",
            x["outside"],
            region=x["region"],
            team=x["team"],
            detail=allowed,
            unit="placements",
        )
    for e in report["residency"]["outsideExamples"]:
        yield _row(
            "residency",
            "outside_example",
            1,
            date=e["time"],
            region=e["region"],
            team=e["team"],
            namespace=e["namespace"],
            name=e["name"],
            detail=f"pod={e['pod']};node={e['node']}",
            ref=e["record"],
            unit="placements",
        )
    for x in report["imageInventory"]["images"]:
        yield _row(
            "images",
            "requests",
            x["requests"],
            name=x["image"],
            team=";".join(x["teams"]),
            detail=f"tag={x['tag'] or ''};digest={x['digest'] or ''}",
            unit="requests",
        )
    if report["chargeback"]["lifecycleEvents"]:
        for x in report["chargeback"]["byTeamAndCostCenter"]:
            yield _row(
                "chargeback",
                "gpu_hours",
                x["gpuHours"],
                team=x["team"],
                cost_center=x["costCenter"],
                unit="GPU-hours",
            )
            yield _row(
                "chargeback", "jobs", x["jobs"], team=x["team"], cost_center=x["costCenter"], unit="jobs"
            )
        for x in report["chargeback"]["byDay"]:
            yield _row("chargeback", "gpu_hours_by_day", x["gpuHours"], date=x["date"], unit="GPU-hours")
        for x in report["chargeback"]["flagged"]:
            yield _row(
                "chargeback",
                "flagged_segment",
                x["gpuHours"],
                date=x["time"],
                team=x["team"],
                namespace=x["namespace"],
                name=x["name"],
                outcome=";".join(x["flags"]),
                detail=(
                    f"segment={x['segment']};event={x['event']};min={x['gpuHoursMin']};max={x['gpuHoursMax']};"
                    f"{x['note'] or ''}"
                ),
                unit="GPU-hours",
            )
    else:
        yield _row(
            "chargeback",
            "gpu_hours",
            None,
            detail="no data: no lifecycle record in the period",
            unit="GPU-hours",
        )
    sample = report["sample"]
    for e in sample["items"]:
        yield _row(
            "sample",
            "sampled",
            1,
            date=e["time"],
            team=e["team"],
            kind=e["kind"],
            namespace=e["namespace"],
            name=e["name"],
            actor=e["user"],
            verb=e["operation"].lower(),
            outcome=e["decision"],
            rule=";".join(e["rules"]),
            detail=f"seed={sample['seed']};population={sample['population']}",
            ref=e["record"],
            request_uid=e["requestUID"],
            unit="requests",
        )
    for chain in report["inputs"]["chains"]:
        for segment in chain["segmentDigests"]:
            yield _row(
                "inputs",
                "bytes",
                segment["bytes"],
                name=segment["path"],
                detail=segment["sha256"],
                kind="chain-segment",
                unit="bytes",
            )
    for f in report["inputs"]["k8sAudit"]:
        yield _row(
            "inputs", "bytes", f["bytes"], name=f["file"], detail=f["sha256"], kind="k8s-audit", unit="bytes"
        )


def render_csv(report: Mapping[str, Any]) -> str:
    """CSV with a header row of :data:`CSV_COLUMNS` (``\\n`` line ends, RFC 4180 quoting)."""
    buffer = io.StringIO()
    writer = SafeCsvWriter(buffer)  # the project's one CSV writer: cells defused against formulas
    writer.writerow(CSV_COLUMNS)
    for row in csv_rows(report):
        writer.writerow(row.get(c) for c in CSV_COLUMNS)
    return buffer.getvalue()


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
