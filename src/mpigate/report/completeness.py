"""Whether the inputs cover the period: per chain and per API-server log, the time they cover,
the gaps longer than the heartbeat (the longest time a writer may stay silent), the chains that
were expected but not given, and the reconciliation of the API server's log with the chains on
their shared key — the chain position ``<chain>:<seq>:<hash>`` that the webhooks put into the
request's ``auditAnnotations`` (``<webhook name>/record``). The witness
(:mod:`mpigate.audit.witness`) checks each chain against the newest position the log names
(records cut off the end, deleted chains); the reconciliation compares every record with the
log, so that a range of records the log does not show, or events without their records, show too.

Reconciliation streams on both sides: records and claims are added into buckets of 64
consecutive sequence numbers per chain and stage, each bucket holding a count and a sum of the
records' hashes. At the end, a bucket whose records lie within the API-server log's time span
must match its claims exactly; a difference names the chain and sequence range to look at
(``mpigate audit export`` lists the records).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mpigate.audit.witness import Position

__all__ = ["BUCKET", "Reconciliation", "Span", "expected_chains", "to_epoch", "uncovered"]

BUCKET = 64
_MASK = (1 << 64) - 1
_MAX_GAPS = 100
_EDGE = 60.0  # seconds: records this close to the edge of a log or the period are not compared


def to_epoch(time: str) -> float:
    """Seconds since the epoch of an RFC 3339 UTC time as records write it."""
    return dt.datetime.fromisoformat(time.replace("Z", "+00:00")).timestamp()


def _time(epoch: float) -> str:
    from mpigate.audit._canonical import format_time

    return format_time(dt.datetime.fromtimestamp(epoch, dt.UTC))


class Span:
    """The time one input covers: first and last time, and its silent stretches longer than the
    heartbeat (bounded: the first ``_MAX_GAPS`` are kept, all are counted). Times are fed in
    order of reading; a time earlier than the latest seen does not open a gap."""

    __slots__ = ("_last_epoch", "first", "gap_count", "gap_seconds", "gaps", "heartbeat", "last", "longest")

    def __init__(self, heartbeat: float | None) -> None:
        self.heartbeat = heartbeat
        self.first: str | None = None
        self.last: str | None = None
        self._last_epoch = 0.0
        self.gaps: list[tuple[str, str]] = []
        self.gap_count = 0
        self.gap_seconds = 0.0
        self.longest: tuple[float, str, str] = (0.0, "", "")

    def add(self, time: str) -> None:
        last = self.last
        if last is None:
            self.first = self.last = time
            self._last_epoch = to_epoch(time)
            return
        if time <= last:
            if self.first is not None and time < self.first:
                self.first = time
            return
        # Records of one minute cannot be a gap worth a parse (heartbeats are minutes or more).
        if time[:16] == last[:16]:
            self.last = time
            return
        epoch = to_epoch(time)
        gap = epoch - self._last_epoch
        if gap > self.longest[0]:
            self.longest = (gap, last, time)
        if self.heartbeat is not None and gap > self.heartbeat:
            self.gap_count += 1
            self.gap_seconds += gap
            if len(self.gaps) < _MAX_GAPS:
                self.gaps.append((last, time))
        self.last = time
        self._last_epoch = epoch

    def intervals(self, start: str | None, end: str | None) -> list[tuple[float, float]]:
        """The covered stretches, clipped to [start, end)."""
        if self.first is None or self.last is None:
            return []
        pieces: list[tuple[float, float]] = []
        cursor = to_epoch(self.first)
        for gap_start, gap_end in self.gaps:
            pieces.append((cursor, to_epoch(gap_start)))
            cursor = to_epoch(gap_end)
        pieces.append((cursor, to_epoch(self.last)))
        lo = to_epoch(start) if start else None
        hi = to_epoch(end) if end else None
        out = []
        for a, b in pieces:
            a = max(a, lo) if lo is not None else a
            b = min(b, hi) if hi is not None else b
            if b >= a:
                out.append((a, b))
        return out


def uncovered(
    spans: Iterable[Span], start: str | None, end: str | None, heartbeat: float | None
) -> tuple[float, float, list[dict[str, Any]]]:
    """(period seconds, covered seconds, gaps) of the union of ``spans`` over [start, end): a
    stretch no input covers counts as a gap when it is longer than the heartbeat (every stretch
    without one)."""
    pieces = sorted(p for span in spans for p in span.intervals(start, end))
    lo = to_epoch(start) if start else (pieces[0][0] if pieces else 0.0)
    hi = to_epoch(end) if end else (max(b for _, b in pieces) if pieces else 0.0)
    period = max(0.0, hi - lo)
    merged: list[list[float]] = []
    for a, b in pieces:
        if merged and a <= merged[-1][1] + (heartbeat or 0.0):
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    gaps: list[dict[str, Any]] = []
    covered = 0.0
    cursor = lo
    for a, b in merged:
        if a - cursor > (heartbeat or 0.0):
            gaps.append({"from": _time(cursor), "to": _time(a), "seconds": round(a - cursor, 3)})
        elif a > cursor:
            covered += a - cursor  # a silence shorter than the heartbeat is coverage
        covered += b - a
        cursor = max(cursor, b)
    if hi - cursor > (heartbeat or 0.0):
        gaps.append({"from": _time(cursor), "to": _time(hi), "seconds": round(hi - cursor, 3)})
    elif hi > cursor:
        covered += hi - cursor
    return period, min(covered, period), gaps


@dataclass(slots=True)
class _Bucket:
    count: int = 0
    total: int = 0
    first: str = ""
    last: str = ""

    def add(self, value: int, time: str) -> None:
        self.count += 1
        self.total = (self.total + value) & _MASK
        if not self.first or time < self.first:
            self.first = time
        if time > self.last:
            self.last = time

    def merge(self, other: _Bucket) -> None:
        self.count += other.count
        self.total = (self.total + other.total) & _MASK
        if other.first and (not self.first or other.first < self.first):
            self.first = other.first
        self.last = max(self.last, other.last)


def _value(digest: str) -> int | None:
    try:
        return int(digest[:16], 16)
    except ValueError:
        return None


class Reconciliation:
    """Both sides of the reconciliation, in buckets: records (from chains) and claims (from the
    API server's ``…/record`` annotations). Memory: one bucket (about 100 bytes) per 64
    admission records — 1.5 MiB for a million."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str, int], _Bucket] = {}  # (stage, chain, seq // BUCKET)
        self.claims: dict[tuple[str, str, int], _Bucket] = {}
        self.unannotated = 0  # events with an mpigate decision but no chain position

    def add_record(self, stage: str, chain: str, seq: int, digest: str, time: str) -> None:
        value = _value(digest)
        if value is None:
            return
        key = (stage, chain, seq // BUCKET)
        bucket = self.records.get(key)
        if bucket is None:
            bucket = self.records[key] = _Bucket()
        bucket.add(value, time)

    def add_claim(self, webhook: str, position: Position, time: str) -> None:
        """A chain position the webhook ``webhook`` annotated (an annotation that is no position is
        the witness's to count: :class:`mpigate.audit.witness.Witness`)."""
        value = _value(position.hash)
        if value is None:
            return
        stage = "mutate" if webhook.startswith("mutate") else "validate"
        key = (stage, position.chain, position.seq // BUCKET)
        bucket = self.claims.get(key)
        if bucket is None:
            bucket = self.claims[key] = _Bucket()
        bucket.add(value, time)

    def merge(self, other: Reconciliation) -> None:
        for mine, theirs in ((self.records, other.records), (self.claims, other.claims)):
            for key, bucket in theirs.items():
                known = mine.get(key)
                if known is None:
                    mine[key] = _Bucket(bucket.count, bucket.total, bucket.first, bucket.last)
                else:
                    known.merge(bucket)
        self.unannotated += other.unannotated

    def result(
        self,
        chains: Sequence[str],
        log_spans: Sequence[tuple[str, str]],
        start: str | None,
        end: str | None,
    ) -> dict[str, Any]:
        """Compare the buckets of the records that lie within an API-server log's time span and
        the period, a minute away from their edges (a request received just before an edge can be
        recorded just after it)."""
        windows = []
        for a, b in log_spans:
            # records come after their events: a record up to a minute after the log's last
            # event is still one of its requests; one within a minute of its first event, or of
            # the period's edges, may belong to an event the log or period does not hold
            lo = max(to_epoch(a), to_epoch(start) if start else to_epoch(a)) + _EDGE
            hi = min(to_epoch(b) + _EDGE, to_epoch(end) - _EDGE if end else to_epoch(b) + _EDGE)
            if hi > lo:
                windows.append((_time(lo), _time(hi)))
        claimed_stages = {stage for stage, _, _ in self.claims}
        given = set(chains)

        def covered(bucket: _Bucket) -> bool:
            return any(a <= bucket.first and bucket.last <= b for a, b in windows)

        mismatches: list[dict[str, Any]] = []
        matched = compared = skipped = 0
        keys = {k for k in self.records if k[0] in claimed_stages} | {k for k in self.claims if k[1] in given}
        for key in sorted(keys):
            stage, chain, index = key
            records = self.records.get(key, _Bucket())
            claims = self.claims.get(key, _Bucket())
            if records.count and not covered(records):
                skipped += records.count
                continue
            compared += records.count
            if (records.count, records.total) == (claims.count, claims.total):
                matched += records.count
                continue
            lo = index * BUCKET
            mismatches.append(
                {
                    "stage": stage,
                    "chain": chain,
                    "seqFrom": max(lo, 1),
                    "seqTo": lo + BUCKET - 1,
                    "records": records.count,
                    "annotatedEvents": claims.count,
                    "from": records.first or claims.first,
                    "to": records.last or claims.last,
                }
            )
        return {
            "possible": bool(self.claims),
            "stages": sorted(claimed_stages),
            "recordsCompared": compared,
            "recordsMatched": matched,
            "recordsOutsideLogSpan": skipped,
            "mismatches": mismatches[:_MAX_GAPS],
            "mismatchCount": len(mismatches),
            "eventsWithoutChainPosition": self.unannotated,
        }


def expected_chains(specs: Sequence[str]) -> tuple[frozenset[str], Mapping[str, int]]:
    """``--expect-chains`` values: chain ids, or ``SOURCE=N`` (at least N chains written by that
    source, e.g. ``webhook=3``)."""
    names: set[str] = set()
    counts: dict[str, int] = {}
    for spec in specs:
        for item in spec.split(","):
            item = item.strip()
            if not item:
                continue
            source, eq, number = item.partition("=")
            if eq:
                if not number.strip().isdigit() or not source.strip():
                    raise ValueError(f"{item!r}: expected a chain id or SOURCE=N (e.g. webhook=3)")
                counts[source.strip()] = int(number)
            else:
                names.add(item)
    return frozenset(names), counts
