"""Rebuild chain directories from what an OTLP sink received, so that ``mpigate audit verify``
proves the shipped copy complete and unaltered.

Input is the OpenTelemetry Collector's ``file`` exporter output (OTLP/JSON: one
``ExportLogsServiceRequest`` per line); every log record's body is an audit record's JSON line
exactly as stored (:mod:`mpigate.audit.otlp`), so the rebuilt segments hash as the originals did.
Shipping is at least once: a record received twice (same chain, seq and hash) is kept once; the
same seq with another hash is a conflict, reported and never silently chosen.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .layout import segment_name, segment_seq, valid_chain_id
from .reader import parse_json_object

__all__ = ["RestoreResult", "otlp_bodies", "restore_chains"]


@dataclass
class RestoreResult:
    """Records written per chain, duplicates dropped, and problems (file:line: message)."""

    chains: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)


def _records(value: Any, key: str) -> list[Any]:
    items = value.get(key) if isinstance(value, Mapping) else None
    return items if isinstance(items, list) else []


def otlp_bodies(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, body) of every OTLP log record in an OTLP/JSON file; raises ValueError for a
    line that is not JSON."""
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not OTLP/JSON ({exc})") from None
            for resource_logs in _records(request, "resourceLogs"):
                for scope_logs in _records(resource_logs, "scopeLogs"):
                    for log_record in _records(scope_logs, "logRecords"):
                        body = log_record.get("body") if isinstance(log_record, Mapping) else None
                        text = body.get("stringValue") if isinstance(body, Mapping) else None
                        if isinstance(text, str):
                            yield number, text


def restore_chains(files: Iterable[Path], out: Path) -> RestoreResult:
    """Write the chains found in ``files`` under ``out`` (which must not hold chains yet), one
    directory per chain, split into segments where the rotate checkpoints say."""
    result = RestoreResult()
    chains: dict[str, dict[int, tuple[str, str]]] = {}
    for path in files:
        for number, body in otlp_bodies(path):
            record = parse_json_object(body.encode("utf-8"))
            chain = record.get("chain") if record else None
            seq = record.get("seq") if record else None
            digest = record.get("hash") if record else None
            if not (isinstance(chain, str) and valid_chain_id(chain)) or not isinstance(seq, int):
                result.problems.append(f"{path}:{number}: a log record that is not an audit record")
                continue
            held = chains.setdefault(chain, {})
            if seq in held:
                if held[seq][0] == digest:
                    result.duplicates += 1
                else:
                    result.problems.append(
                        f"{path}:{number}: chain {chain} seq {seq} received twice with different hashes"
                    )
                continue
            held[seq] = (str(digest), body)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; restore into a new directory")
    for chain, held in sorted(chains.items()):
        directory = out / chain
        directory.mkdir(parents=True, exist_ok=True)
        seqs = sorted(held)
        segment = segment_name(seqs[0])
        handle = (directory / segment).open("w", encoding="utf-8")
        try:
            for seq in seqs:
                body = held[seq][1]
                handle.write(body + "\n")
                record = parse_json_object(body.encode("utf-8")) or {}
                checkpoint = record.get("checkpoint") if record.get("stage") == "checkpoint" else None
                nxt = checkpoint.get("next") if isinstance(checkpoint, Mapping) else None
                if isinstance(nxt, str) and nxt != segment and seq != seqs[-1]:
                    handle.close()
                    # a segment file name only (a hostile sink copy cannot write elsewhere)
                    segment = nxt if segment_seq(nxt) is not None else segment_name(seq + 1)
                    handle = (directory / segment).open("w", encoding="utf-8")
        finally:
            handle.close()
        result.chains[chain] = len(seqs)
    return result
