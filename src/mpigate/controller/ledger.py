"""The ledger: what the controller knows of every job with an open run segment, kept outside the
jobs (pure encoding; the reconciler reads and writes it).

A job's own annotations die with the job. When a job is deleted while the controller is down (or
its deletion is missed), the ledger — a ConfigMap in the controller's namespace, which tenants
cannot write — still names it, its team and cost-center labels, its transitions and its pods'
facts, and when the controller last confirmed all of that (``seen``). The next leader closes such a
job from it (a ``deleted`` record marked ``vanished``, charged until ``seen``).

The document is JSON, gzip-compressed into the ConfigMap's ``binaryData`` (a ConfigMap holds at
most 1 MiB). When it would not fit, the pods of the largest entries are left out (those jobs would
be closed without their pods' run time, and the record says so) and the write is counted.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import gzip
import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from .usage import format_time, parse_time

__all__ = ["DEFAULT_LEDGER_NAME", "LEDGER_KEY", "MAX_LEDGER_BYTES", "LedgerEntry", "decode", "encode"]

DEFAULT_LEDGER_NAME: Final = "mpigate-controller-ledger"
LEDGER_KEY: Final = "ledger.json.gz"
# A ConfigMap's data is limited to 1 MiB; base64 grows by 4/3 and the object has metadata.
MAX_LEDGER_BYTES: Final = 700 * 1024
_VERSION: Final = 1
# Decompressed size accepted when reading (a ConfigMap someone edited by hand must not exhaust memory).
_MAX_JSON_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One job with an open segment: identity, what records need, and its durable state."""

    kind: str
    namespace: str
    name: str
    uid: str
    team: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: int | None = None
    history: str = ""
    pods: str = ""
    evidence: str = ""
    #: When the controller last confirmed this entry (None: when the ledger is written).
    seen: dt.datetime | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "ns": self.namespace, "name": self.name, "team": self.team}
        if self.seen is not None:
            out["seen"] = format_time(self.seen)
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.gpus is not None:
            out["gpus"] = self.gpus
        for key in ("history", "pods", "evidence"):
            if value := getattr(self, key):
                out[key] = value
        return out


def encode(entries: Iterable[LedgerEntry], seen: dt.datetime) -> tuple[dict[str, str], int]:
    """The ConfigMap's ``binaryData`` and how many entries lost their pods to fit."""
    jobs = {e.uid: e for e in entries}
    dropped = 0
    while True:
        doc = {
            "version": _VERSION,
            "seen": format_time(seen),
            "jobs": {uid: e.to_json() for uid, e in sorted(jobs.items())},
        }
        packed = gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), mtime=0)
        if len(packed) <= MAX_LEDGER_BYTES:
            return {LEDGER_KEY: base64.b64encode(packed).decode("ascii")}, dropped
        with_pods = [e for e in jobs.values() if e.pods]
        if not with_pods:
            raise ValueError(f"the ledger holds {len(jobs)} open jobs, more than a ConfigMap can")
        largest = max(with_pods, key=lambda e: len(e.pods))
        jobs[largest.uid] = replace(largest, pods="")
        dropped += 1


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def decode(configmap: Mapping[str, Any] | None) -> tuple[dict[str, LedgerEntry], dt.datetime | None]:
    """The entries (each with when it was last confirmed) and when the ledger was written; an
    unreadable ledger reads as empty."""
    binary = configmap.get("binaryData") if isinstance(configmap, Mapping) else None
    raw = binary.get(LEDGER_KEY) if isinstance(binary, Mapping) else None
    if not isinstance(raw, str):
        return {}, None
    try:
        inflater = zlib.decompressobj(wbits=31)
        text = inflater.decompress(base64.b64decode(raw, validate=True), _MAX_JSON_BYTES)
        doc = json.loads(text)
    except (binascii.Error, zlib.error, ValueError):
        return {}, None
    if not isinstance(doc, dict) or doc.get("version") != _VERSION or not isinstance(doc.get("jobs"), dict):
        return {}, None
    written = parse_time(doc.get("seen"))
    out: dict[str, LedgerEntry] = {}
    for uid, item in doc["jobs"].items():
        if not isinstance(uid, str) or not uid or not isinstance(item, dict):
            continue
        kind, namespace, name, team = (_text(item.get(k)) for k in ("kind", "ns", "name", "team"))
        if not (kind and namespace and name and team):
            continue
        labels = item.get("labels")
        gpus = item.get("gpus")
        out[uid] = LedgerEntry(
            kind=kind,
            namespace=namespace,
            name=name,
            uid=uid,
            team=team,
            labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
            gpus=gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else None,
            history=_text(item.get("history")),
            pods=_text(item.get("pods")),
            evidence=_text(item.get("evidence")),
            seen=parse_time(item.get("seen")) or written,
        )
    return out, written
