"""The report as CSV: one tidy table (one fact per row), columns :data:`CSV_COLUMNS`."""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping
from typing import Any

from mpigate._csv import SafeCsvWriter

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


def _row(section: str, metric: str, value: Any, **columns: Any) -> dict[str, Any]:
    return {"section": section, "metric": metric, "value": value, **columns}


def csv_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The report as tidy rows (one fact per row, with its unit), in the HTML's section order."""
    yield from _completeness_rows(report)
    yield from _input_rows(report)
    yield from _control_rows(report)
    yield from _decision_rows(report)
    yield from _activity_rows(report)
    yield from _exception_rows(report)
    yield from _residency_rows(report)
    yield from _image_rows(report)
    yield from _chargeback_rows(report)
    yield from _sample_rows(report)
    yield from _digest_rows(report)


def _completeness_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Which chains and API-server logs were read, how much of the period they cover, and their gaps."""
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


def _input_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The API-server audit files read, and the config revisions in force."""
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


def _control_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Control status per framework, and the API-server events accounted for."""
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


def _decision_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Decisions by team, rule and outcome; denial reasons; security findings."""
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


def _activity_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Who did what: actors, requests nobody judged, recent requests, RBAC denials."""
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


def _exception_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Policy exceptions in force."""
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


def _residency_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Where pods ran against their data region."""
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


def _image_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The image inventory."""
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


def _chargeback_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """GPU-hours by team and day."""
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


def _sample_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The random sample of decisions for an auditor to trace."""
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


def _digest_rows(report: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Digests of every input segment and API-server audit file."""
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
