"""Exports of audit records: JSONL (the lines as written), CSV (stable columns) and OpenReports.

All three consume an iterator of :class:`~mpigate.audit.reader.AuditEntry` (normally
:func:`~mpigate.audit.reader.read_chains`, merged by time). JSONL and CSV stream in constant
memory; OpenReports keeps one small summary per object (a Report describes an object's current
state: its latest ``validate`` decision in the window).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

import yaml

from mpigate._csv import SafeCsvWriter
from mpigate.catalogue import all_rules

from ._canonical import parse_time
from .reader import AuditEntry

__all__ = [
    "CSV_COLUMNS",
    "OPENREPORTS_API_VERSION",
    "csv_row",
    "export_csv",
    "export_jsonl",
    "export_openreports",
    "filter_team",
    "openreports",
]

OPENREPORTS_API_VERSION = "openreports.io/v1alpha1"

# Stable, documented in docs/audit.md. New columns are only ever appended.
CSV_COLUMNS = (
    "time",
    "chain",
    "seq",
    "stage",
    "source",
    "team",
    "namespace",
    "kind",
    "name",
    "operation",
    "dry_run",
    "user",
    "decision",
    "rules",
    "denied_by",
    "controls",
    "exceptions",
    "gpus",
    "pods",
    "region",
    "event",
    "gpu_seconds",
    "node",
    "message",
    "revision",
    "hash",
)


def filter_team(entries: Iterable[AuditEntry], team: str | None) -> Iterator[AuditEntry]:
    """Entries of one team (records without a team, such as checkpoints, are left out)."""
    for entry in entries:
        if team is None or entry.record.get("team") == team:
            yield entry


def export_jsonl(entries: Iterable[AuditEntry], out: IO[bytes]) -> int:
    """Write each record exactly as stored (so its hash can still be checked). Returns the count."""
    count = 0
    for entry in entries:
        out.write(entry.raw + b"\n")
        count += 1
    return count


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _violations(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = record.get("violations")
    return [v for v in items if isinstance(v, Mapping)] if isinstance(items, list) else []


def _denies(violation: Mapping[str, Any]) -> bool:
    return violation.get("mode") == "enforce" and not violation.get("waivedBy")


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def csv_row(entry: AuditEntry) -> list[Any]:
    """One CSV row (see :data:`CSV_COLUMNS`); lists are ``;``-separated and sorted. The values are
    raw: :class:`mpigate._csv.SafeCsvWriter` turns them into safe cells."""
    record = entry.record
    request = _mapping(record.get("request"))
    obj = _mapping(record.get("object"))
    demand = _mapping(record.get("demand"))
    lifecycle = _mapping(record.get("lifecycle"))
    evidence = _mapping(record.get("evidence"))
    checkpoint = _mapping(record.get("checkpoint"))
    violations = _violations(record)
    rules = sorted({str(v.get("id")) for v in violations})
    denied = sorted({str(v.get("id")) for v in violations if _denies(v)})
    controls = sorted({str(c) for v in violations for c in (v.get("controls") or [])})
    exceptions = record.get("exceptions") if isinstance(record.get("exceptions"), list) else []
    exception_names = sorted({str(_mapping(e).get("name")) for e in exceptions or []})
    event = lifecycle.get("event") or evidence.get("kind") or checkpoint.get("reason") or ""
    values = {
        "time": entry.time,
        "chain": entry.chain,
        "seq": entry.seq,
        "stage": entry.stage,
        "source": record.get("source"),
        "team": record.get("team"),
        "namespace": obj.get("namespace"),
        "kind": obj.get("kind"),
        "name": obj.get("name"),
        "operation": request.get("operation"),
        "dry_run": request.get("dryRun"),
        "user": _mapping(request.get("user")).get("username"),
        "decision": record.get("decision"),
        "rules": ";".join(rules),
        "denied_by": ";".join(denied),
        "controls": ";".join(controls),
        "exceptions": ";".join(exception_names),
        "gpus": demand.get("gpus") if demand else lifecycle.get("gpus"),
        "pods": demand.get("pods"),
        "region": demand.get("region") or evidence.get("region"),
        "event": event,
        "gpu_seconds": lifecycle.get("gpuSeconds"),
        "node": evidence.get("node"),
        "message": record.get("message"),
        "revision": record.get("revision"),
        "hash": entry.hash,
    }
    return [values[c] for c in CSV_COLUMNS]


def export_csv(entries: Iterable[AuditEntry], out: IO[str]) -> int:
    """CSV with a header row of :data:`CSV_COLUMNS` (``\\n`` line ends, RFC 4180 quoting), every
    cell defused against spreadsheet formulas (names and messages are the tenants' text)."""
    writer = SafeCsvWriter(out)
    writer.writerow(CSV_COLUMNS)
    count = 0
    for entry in entries:
        writer.writerow(csv_row(entry))
        count += 1
    return count


# ---------------------------------------------------------------------- OpenReports

_RESULT_SEVERITY = {"fail": "high", "warn": "low", "skip": "info", "pass": "info"}
_NAME_CHARS = re.compile(r"[^a-z0-9.-]+")


def _report_name(kind: str, name: str) -> str:
    base = _NAME_CHARS.sub("-", f"mpigate-{kind}-{name}".lower()).strip("-.")
    if len(base) <= 253:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    return f"{base[:242]}-{digest}"


def _timestamp(time: str) -> dict[str, int]:
    try:
        moment = parse_time(time)
    except ValueError:
        return {"seconds": 0, "nanos": 0}
    return {"seconds": int(moment.timestamp()), "nanos": moment.microsecond * 1000}


def _results(entry: AuditEntry) -> list[dict[str, Any]]:
    record = entry.record
    rules = all_rules()
    request = _mapping(record.get("request"))
    obj = _mapping(record.get("object"))
    subject = {k: obj.get(k) for k in ("apiVersion", "kind", "namespace", "name") if obj.get(k)}
    common = {
        "recordHash": entry.hash,
        "chain": entry.chain,
        "seq": str(entry.seq),
        "decision": _text(record.get("decision")),
        "operation": _text(request.get("operation")),
        "user": _text(_mapping(request.get("user")).get("username")),
        "revision": _text(record.get("revision")),
    }
    results: list[dict[str, Any]] = []
    for violation in _violations(record):
        rule_id = str(violation.get("id"))
        info = rules.get(rule_id)
        mode = str(violation.get("mode"))
        if violation.get("waivedBy"):
            result = "skip"
        elif mode == "warn":
            result = "warn"
        else:
            result = "fail"  # enforce (denied) and audit (recorded, not enforced)
        properties = {
            **common,
            "controls": ",".join(str(c) for c in violation.get("controls") or []),
            "mode": mode,
            "path": _text(violation.get("path")),
        }
        if violation.get("waivedBy"):
            properties["waivedBy"] = str(violation["waivedBy"])
        results.append(
            {
                "source": "mpigate",
                "policy": f"mpigate-{info.family}" if info else "mpigate",
                "rule": rule_id,
                "category": info.title if info else "",
                "severity": _RESULT_SEVERITY[result] if mode != "audit" else "medium",
                "result": result,
                "scored": result != "warn",
                "message": _text(violation.get("message")),
                "timestamp": _timestamp(entry.time),
                "resources": [subject] if subject else [],
                "properties": properties,
            }
        )
    if not results:
        results.append(
            {
                "source": "mpigate",
                "policy": "mpigate",
                "rule": "admission",
                "result": "pass",
                "scored": True,
                "message": f"{record.get('decision', 'allowed')}: no rule was violated",
                "timestamp": _timestamp(entry.time),
                "resources": [subject] if subject else [],
                "properties": {**common, "controls": ""},
            }
        )
    return results


def openreports(entries: Iterable[AuditEntry]) -> list[dict[str, Any]]:
    """One OpenReports ``Report`` per namespaced object (``ClusterReport`` for cluster-scoped
    runtimes) from the object's latest ``validate`` record; results carry the rule ID, the mode,
    control IDs and the record hash in ``properties``."""
    latest: dict[tuple[str, str, str], AuditEntry] = {}
    for entry in entries:
        if entry.stage != "validate":
            continue
        obj = _mapping(entry.record.get("object"))
        key = (_text(obj.get("namespace")), _text(obj.get("kind")), _text(obj.get("name")))
        current = latest.get(key)
        if current is None or (entry.time, entry.seq) >= (current.time, current.seq):
            latest[key] = entry
    reports: list[dict[str, Any]] = []
    for (namespace, kind, name), entry in sorted(latest.items()):
        obj = _mapping(entry.record.get("object"))
        results = _results(entry)
        summary = {
            k: sum(1 for r in results if r["result"] == k) for k in ("pass", "fail", "warn", "error", "skip")
        }
        metadata: dict[str, Any] = {
            "name": _report_name(kind, name),
            "labels": {"app.kubernetes.io/managed-by": "mpigate"},
            "annotations": {"mpigate.io/audit-hash": entry.hash, "mpigate.io/audit-chain": entry.chain},
        }
        if namespace:
            metadata["namespace"] = namespace
        team = entry.record.get("team")
        if isinstance(team, str) and team:
            metadata["labels"]["mpigate.io/team"] = team
        reports.append(
            {
                "apiVersion": OPENREPORTS_API_VERSION,
                "kind": "Report" if namespace else "ClusterReport",
                "metadata": metadata,
                "source": "mpigate",
                "scope": {k: obj.get(k) for k in ("apiVersion", "kind", "namespace", "name") if obj.get(k)},
                "summary": summary,
                "results": results,
            }
        )
    return reports


def export_openreports(entries: Iterable[AuditEntry], out: IO[str]) -> int:
    """Write the reports as a YAML stream (``kubectl apply -f`` ready). Returns the count."""
    reports = openreports(entries)
    if reports:
        yaml.safe_dump_all(reports, out, sort_keys=False, allow_unicode=True, width=120, explicit_start=True)
    return len(reports)
