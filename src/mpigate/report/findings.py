"""What the merged inputs say about completeness and about each record kind's source, once every
input is read: the ``completeness`` section of the report, and the facts control status rests on
(:class:`~.assess.EvidenceFacts`): sources missing, findings per record kind, and the attention
reasons that concern every control."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpigate.audit.reader import ChainReport
from mpigate.audit.status import trail_status

from .assess import EvidenceFacts
from .completeness import expected_chains, uncovered
from .k8saudit import CATEGORIES, K8sAuditStats

if TYPE_CHECKING:
    from .aggregate import ReportBuilder

__all__ = ["completeness_section", "duration_text", "evidence_facts"]

_K8S_KINDS = tuple(CATEGORIES)


def duration_text(seconds: float) -> str:
    """A duration as people read it: 0.8 s, 42 s, 5.5 min, 3.2 h, 12.5 days."""
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _bounds(builder: ReportBuilder) -> tuple[str | None, str | None]:
    opts = builder.options
    firsts = [s.first for s in builder.spans.values() if s.first]
    lasts = [s.last for s in builder.spans.values() if s.last]
    start = opts.since or builder.first_time or (min(firsts) if firsts else None)
    ends = [t for t in (builder.last_time, builder.api_last) if t is not None]
    end = opts.until or (max(ends) if ends else None) or (max(lasts) if lasts else None)
    return start, end


def completeness_section(
    builder: ReportBuilder, chain_reports: Sequence[ChainReport], k8s: Sequence[K8sAuditStats]
) -> dict[str, Any]:
    """Coverage of the period by the chains and by the API-server logs, gaps longer than the
    heartbeat, the expected-chain inventory and the reconciliation of the two."""
    opts = builder.options
    heartbeat = opts.heartbeat
    start, end = _bounds(builder)
    chains = []
    for report in chain_reports:
        span = builder.spans.get(report.chain)
        if span is None:
            continue
        period, covered, gaps = uncovered([span], start, end, heartbeat)
        chains.append(
            {
                "chain": report.chain,
                "sources": sorted(builder.chain_sources.get(report.chain, ())),
                "from": span.first,
                "to": span.last,
                "coveredSeconds": round(covered, 3),
                "coverage": round(covered / period, 4) if period else None,
                "gaps": gaps[:20],
                "gapCount": len(gaps),
                "longestSilenceSeconds": round(span.longest[0], 3),
            }
        )
    period, covered, gaps = uncovered(builder.spans.values(), start, end, heartbeat)
    logs = []
    api_spans = [s.span for s in k8s if s.span.first]
    for stats in k8s:
        first = stats.to_dict()["firstEvent"]
        last = stats.to_dict()["lastEvent"]
        outside = bool(first) and (
            (end is not None and first >= end) or (start is not None and last is not None and last < start)
        )
        logs.append({"file": stats.file, "from": first, "to": last, "outsidePeriod": outside})
    api: dict[str, Any] = {"given": bool(k8s), "logs": logs}
    if api_spans:
        a_period, a_covered, a_gaps = uncovered(api_spans, start, end, heartbeat)
        api.update(
            periodSeconds=round(a_period, 3),
            coveredSeconds=round(a_covered, 3),
            coverage=round(a_covered / a_period, 4) if a_period else None,
            gaps=a_gaps[:20],
            gapCount=len(a_gaps),
        )
    names, counts = expected_chains(opts.expect_chains)
    given = {r.chain for r in chain_reports}
    by_source: dict[str, int] = {}
    for chain in given:
        for source in builder.chain_sources.get(chain, ()):
            by_source[source] = by_source.get(source, 0) + 1
    log_spans = [
        (s.to_dict()["firstEvent"], s.to_dict()["lastEvent"]) for s in k8s if s.span.first and s.span.last
    ]
    reconciliation = builder.reconciliation.result(sorted(given), log_spans, start, end)
    return {
        "heartbeatSeconds": heartbeat,
        "periodSeconds": round(period, 3),
        "from": start,
        "to": end,
        "coveredSeconds": round(covered, 3),
        "coverage": round(covered / period, 4) if period else None,
        "gaps": gaps[:50],
        "gapCount": len(gaps),
        "chains": chains,
        "apiServer": api,
        "expectedChains": {
            "names": sorted(names),
            "missing": sorted(names - given),
            "bySource": [
                {"source": source, "expected": n, "found": by_source.get(source, 0)}
                for source, n in sorted(counts.items())
            ],
            "found": dict(sorted(by_source.items())),
        },
        "reconciliation": reconciliation,
    }


def _gap_texts(gaps: Sequence[Mapping[str, Any]], what: str, heartbeat: float) -> list[str]:
    if not gaps:
        return []
    total = sum(float(g["seconds"]) for g in gaps)
    first = gaps[0]
    return [
        f"{what} {len(gaps)} gap(s) longer than the heartbeat ({duration_text(heartbeat)}), "
        f"{duration_text(total)} in all (first {first['from']} – {first['to']}; "
        "see Integrity and completeness)"
    ]


def evidence_facts(
    builder: ReportBuilder,
    chain_reports: Sequence[ChainReport],
    k8s: Sequence[K8sAuditStats],
    completeness: Mapping[str, Any],
    revisions: Sequence[Mapping[str, Any]],
) -> EvidenceFacts:
    """The facts control status rests on (see :mod:`.assess`)."""
    opts = builder.options
    outside = builder.outside
    heartbeat = opts.heartbeat
    general: list[str] = []
    broken = [c.chain for c in chain_reports if not c.ok]
    if broken:
        general.append(
            f"audit chain(s) {', '.join(broken)} failed verification: "
            "the evidence may be incomplete or altered"
        )
    if not builder.spans:
        general.append("no audit record was read")
    general.extend(_gap_texts(completeness["gaps"], "the chains leave", heartbeat))
    expected = completeness["expectedChains"]
    if expected["missing"]:
        general.append(f"expected chain(s) not among the inputs: {', '.join(expected['missing'])}")
    for row in expected["bySource"]:
        if row["found"] < row["expected"]:
            general.append(
                f"expected at least {row['expected']} chain(s) written by {row['source']}, "
                f"found {row['found']}"
            )
    recon = completeness["reconciliation"]
    if recon["mismatchCount"]:
        first = recon["mismatches"][0]
        general.append(
            f"the API server's log and the chains disagree in {recon['mismatchCount']} range(s) of records; "
            f"first: chain {first['chain']} seq {first['seqFrom']}–{first['seqTo']} ({first['stage']}): "
            f"{first['records']} record(s), {first['annotatedEvents']} annotated event(s)"
        )
    # a chain whose newest records no signature and no witness vouches for (mpigate.audit.status);
    # without a key nothing is authenticated: that is a missing source, below
    for status in trail_status(chain_reports).chains:
        report = next(r for r in chain_reports if r.chain == status.chain)
        if status.state == "unverifiable" and report.signatures != "unchecked":
            general.append(f"chain {status.chain}: {status.text()}")
    # sources
    sources = {s for chain in builder.chain_sources.values() for s in chain}
    missing: dict[str, str] = {}
    if "webhook" not in sources:
        for kind in ("validate", "mutate", "images"):
            missing[kind] = "no webhook chain (admission records) among the inputs"
    if "controller" not in sources:
        for kind in ("lifecycle", "evidence"):
            missing[kind] = "no controller chain (lifecycle and placement records) among the inputs"
    elif builder.residency.records == 0 and builder.admitted_creates:
        missing["evidence"] = (
            f"no placement record in the period although {builder.admitted_creates} TrainJob(s) were "
            "admitted (is the controller recording placements?)"
        )
    unchecked = [c.chain for c in chain_reports if c.signatures == "unchecked"]
    if unchecked:
        # without a key no record is authenticated: whatever rests on the chain itself is untested
        missing["checkpoint"] = missing["chain"] = (
            f"checkpoint signatures of chain(s) {', '.join(unchecked)} not checked "
            "(pass --key or --public-key)"
        )
    images = builder.images
    if not images.images and images.without_images:
        missing["images"] = (
            f"the records of {images.without_images} admitted request(s) list no images "
            "(written by a webhook before image lists were recorded)"
        )
    readable = [s for s in k8s if s.unreadable is None or s.events]
    if not k8s:
        reason = "no API-server audit log was given (--k8s-audit)"
    elif not readable:
        reason = "no API-server audit log could be read: " + "; ".join(
            f"{s.file}: {s.unreadable}" for s in k8s
        )
    elif not any(outside.in_period_total(kind) for kind in _K8S_KINDS) and not builder.api_server.writes:
        spans = ", ".join(f"{log['from']} – {log['to']}" for log in completeness["apiServer"]["logs"])
        reason = f"the API-server log(s) hold no event in the period (they span {spans})"
    else:
        reason = ""
    if reason:
        for kind in _K8S_KINDS:
            missing[kind] = reason
    elif outside.judged("k8s-workload") == 0 and outside.skipped_for("k8s-workload", "no requestObject"):
        missing["k8s-workload"] = (
            "the audit policy logs pods and workloads at Metadata level (no requestObject): Pod Security "
            "could not be judged"
        )
    # findings per record kind
    findings: dict[str, list[str]] = {}
    out, _, _ = builder.residency.counts()
    if out:
        findings.setdefault("evidence", []).append(f"{out} pod placement(s) outside the team's region")
    if builder.api_server.unjudged:
        findings.setdefault("k8s-activity", []).append(
            f"{builder.api_server.unjudged} API-server write(s) admitted without an mpigate decision"
        )
    for kind in _K8S_KINDS:
        n = outside.findings(kind)
        if n:
            example = outside.first_reason(kind)
            findings.setdefault(kind, []).append(
                f"{n} finding(s) among the API server's events: {CATEGORIES[kind].lower()}"
                + (f" (e.g. {example})" if example else "")
            )
    k8s_general: list[str] = []
    if k8s and not reason:
        api = completeness["apiServer"]
        k8s_general = _gap_texts(api.get("gaps", []), "the API-server log(s) leave", heartbeat)
        outside_logs = [log["file"] for log in api["logs"] if log["outsidePeriod"]]
        if outside_logs:
            names = ", ".join(Path(f).name for f in outside_logs)
            k8s_general.append(f"{len(outside_logs)} API-server log(s) lie outside the period: {names}")
    failed = [c.chain for c in chain_reports if c.signatures in ("failed", "unsigned", "missing")]
    if failed:
        findings.setdefault("checkpoint", []).append(
            f"chain(s) {', '.join(failed)} have no checkpoint that verified (signatures failed or missing)"
        )
    counts = {
        "mutate": builder.decisions.mutations,
        "lifecycle": builder.chargeback.records,
        "evidence": builder.residency.records,
        "checkpoint": builder.checkpoints,
        "chain": builder.records_in_period,
        "config": len(revisions),
        "images": len(images.images),
        "k8s-activity": builder.api_server.writes,
    }
    for kind in _K8S_KINDS:
        if kind != "k8s-activity":
            counts[kind] = outside.judged(kind)
    return EvidenceFacts(
        validate_by_kind=builder.decisions.validate_by_kind,
        effects=builder.decisions.effects,
        advisory=builder.decisions.advisory,
        expired=builder.decisions.expired_waivers,
        counts=counts,
        missing=missing,
        findings=findings,
        general=general,
        revisions=revisions,
        not_applicable=opts.not_applicable,
        k8s_general=k8s_general,
    )
