"""The report as Markdown for tickets: table syntax and inline HTML in record text escaped."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mpigate import __version__
from mpigate.report.assess import STATUSES
from mpigate.report.findings import duration_text

from ._text import _basename, _num, coverage_text, gpu_text, period_length, period_text, rules_by_mode

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
    _md_overview(out, report, max_rows)
    _md_integrity(out, report, max_rows)
    _md_revisions(out, report, max_rows)
    _md_controls(out, report, max_rows)
    _md_decisions(out, report, max_rows)
    _md_denials(out, report, max_rows)
    _md_security(out, report, max_rows)
    _md_activity(out, report, max_rows)
    _md_refusals(out, report, max_rows)
    _md_exceptions(out, report, max_rows)
    _md_residency(out, report, max_rows)
    _md_standing(out, report, max_rows)
    _md_images(out, report, max_rows)
    _md_chargeback(out, report, max_rows)
    _md_sample(out, report, max_rows)
    _md_method(out, report, max_rows)
    return "\n".join(out) + "\n"


def _md_overview(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """The title, the integrity banner and the summary."""
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


def _md_integrity(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """The inputs: chains and API-server logs, their coverage and gaps."""
    comp = report["completeness"]
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


def _md_revisions(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """The config revisions in force."""
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


def _md_controls(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """Control status per framework, and the API-server events outside mpigate's judgement."""
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


def _md_decisions(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """Decisions by outcome."""
    totals = report["totals"]
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


def _md_denials(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """Denials by rule and their top reasons."""
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


def _md_security(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """Privileged and unsafe attempts."""
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


def _md_activity(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """Who created, changed and deleted which jobs."""
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


def _md_refusals(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """The authorizer's refusals."""
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


def _md_exceptions(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """Exceptions used."""
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


def _md_residency(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """Data residency."""
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
    # standing violations


def _md_standing(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """Standing violations (the controller's background audit)."""
    out.append("### Standing violations")
    out.append("")
    sv = report["standingViolations"]
    out.append(
        f"{_num(sv['atPeriodEnd'])} standing at the period's end, {_num(sv['openedInPeriod'])} found and "
        f"{_num(sv['resolvedInPeriod'])} resolved in the period."
    )
    out.append("")
    rows = [
        [
            s["opened"],
            s["team"] or "–",
            f"{s['namespace'] or ''}/{s['name']}",
            s["rule"],
            s["action"] or "–",
            s["expiredException"] or "–",
            s["message"] or "",
        ]
        for s in sv["standing"]
    ]
    if rows:
        _md_rows(
            out,
            ["Since", "Team", "Object", "Rule", "Action", "Expired exception", "Message"],
            rows,
            max_rows,
            "standing",
        )
    rows = [
        [s["opened"], s["resolved"], s["team"] or "–", f"{s['namespace'] or ''}/{s['name']}", s["rule"]]
        for s in sv["resolved"]
    ]
    if rows:
        _md_rows(out, ["Found", "Resolved", "Team", "Object", "Rule"], rows, max_rows, "resolved")
    # images


def _md_images(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """The image inventory."""
    out.append("### Image inventory (PCI DSS 6.3.2)")
    out.append("")
    inv = report["imageInventory"]
    rows = [
        [x["image"], x["tag"] or "–", x["digest"] or "–", x["requests"], ", ".join(x["teams"])]
        for x in inv["images"]
    ]
    _md_rows(out, ["Image", "Tag", "Digest", "Requests", "Teams"], rows, max_rows, "images")
    # chargeback


def _md_chargeback(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """GPU-hours."""
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


def _md_sample(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """The sample of requests."""
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


def _md_method(out: list[str], report: Mapping[str, Any], max_rows: int) -> None:
    """Method and limits, input digests, and the footer."""
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
