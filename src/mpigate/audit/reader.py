"""Streaming reading and verification of audit chains.

:class:`ChainReader` walks one chain's segments line by line (constant memory), yields every
record as an :class:`AuditEntry` and checks, as it goes, everything the writer guarantees: each
record's hash, the ``prev`` links, consecutive ``seq`` numbers, segment boundaries (every segment
but the last ends with a ``rotate`` checkpoint naming the next one) and the checkpoint signatures.
Its :class:`ChainReport` names the file and line of the first occurrence of each problem.

:func:`read_chains` merges many chains by time (a heap over the per-chain streams) for exports and
reports, and collects the per-chain reports.
"""

from __future__ import annotations

import fcntl
import hashlib
import heapq
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import orjson

from ._canonical import GENESIS_PREV, RECORD_VERSION, record_hash
from .layout import LOCK_FILE, chain_dirs, list_segments, segment_seq, torn_files
from .signing import KeyRing, signed_bytes
from .status import ChainStatus, chain_status

__all__ = [
    "PROBLEM_KINDS",
    "AuditEntry",
    "ChainReader",
    "ChainReport",
    "ChainsReading",
    "CheckpointInfo",
    "IntegrityProblem",
    "read_chains",
    "verify_chain",
]

Severity = Literal["error", "warning"]
# verified: at least one checkpoint verified with a key and none failed; unchecked: no key given;
# unsigned: the writer had no key; failed: a signature did not verify; missing: no checkpoint.
Signatures = Literal["verified", "unchecked", "unsigned", "failed", "missing"]

# What each problem kind means (docs/audit.md shows an example of each).
PROBLEM_KINDS: Mapping[str, str] = {
    "edited": "a record's content no longer matches its hash",
    "malformed": "a line is not a valid audit record",
    "deleted-records": "sequence numbers are missing inside a segment",
    "reordered": "records or segments are out of order",
    "broken-link": "a record's prev is not the hash of the record before it",
    "truncated": "a segment was cut short (incomplete last line, or lost its rotate checkpoint)",
    "deleted-segment": "a whole segment file is missing",
    "forged": "a checkpoint signature does not verify (records rewritten without the key)",
    "chain-mismatch": "a record claims another chain",
    "no-valid-checkpoint": "no checkpoint verifies although the chain is signed (checkpoints removed or the "
    "chain rewritten without the key)",
    "unsigned-tail": "records after the last checkpoint are not covered by a signature",
    "unchecked-signatures": "no key was given, so signatures were not checked",
    "unsigned-checkpoints": "the writer had no signing key (an error when verifying with a key)",
    "in-progress": "the newest line is still being written by a live writer",
    "witnessed-missing": "the API server's audit log witnessed a record the chain no longer holds",
    "witness-mismatch": "the chain's record differs from the one the API server's audit log witnessed",
    "missing-chain": "the API server's audit log names a chain whose directory is missing",
    "unreadable": "a segment file cannot be read (permissions, I/O error)",
}

_HASH_WINDOW = 256  # recent seq → hash kept for checking links across small reorders
_MAX_GAPS = 1000


@dataclass(frozen=True, slots=True)
class IntegrityProblem:
    """One finding. ``line`` is 1-based; ``None`` when the problem is about a whole file."""

    kind: str
    file: str
    line: int | None
    message: str
    severity: Severity = "error"

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "file": self.file,
            "line": self.line,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    seq: int
    time: str
    file: str
    line: int
    reason: str
    verified: bool | None  # None: no key to check it

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": self.time,
            "file": self.file,
            "line": self.line,
            "reason": self.reason,
            "verified": self.verified,
        }


class AuditEntry(NamedTuple):
    """One record as read: where it is, and whether it passed its own checks (``intact``).

    A named tuple rather than a frozen dataclass: verify creates a million of these per run and
    tuple construction is several times cheaper."""

    chain: str
    seq: int
    time: str
    stage: str
    file: str
    line: int
    record: Mapping[str, Any]
    raw: bytes
    intact: bool = True

    @property
    def hash(self) -> str:
        return str(self.record.get("hash", ""))


@dataclass(slots=True)
class ChainReport:
    """Integrity of one chain, complete once its reader is exhausted."""

    chain: str
    directory: str
    records: int = 0
    segments: int = 0
    bytes: int = 0
    first_time: str | None = None
    last_time: str | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    last_checkpoint: CheckpointInfo | None = None
    checkpoints: int = 0
    recoveries: int = 0
    signatures: Signatures = "unchecked"
    unsigned_records: int = 0
    unsigned_bytes: int = 0
    torn_fragments: list[str] = field(default_factory=list)
    problems: list[IntegrityProblem] = field(default_factory=list)
    complete: bool = False
    # What the signatures cover: checkpoints that verified with a key, the newest of them (it
    # authenticates every record up to it through the hash links), and whether the chain ends
    # with a verified shutdown checkpoint (a cleanly closed chain).
    keys_given: bool = False
    verified_checkpoints: int = 0
    covered_seq: int = 0
    covered_time: str | None = None
    sealed: bool = False
    genesis_alg: str | None = None
    genesis_key_id: str | None = None
    live: bool = False  # a writer held the chain's lock when the reading ended
    # Retention deleted the segments through this seq, as a retention record in the chain says.
    pruned_through: int | None = None
    # Set by mpigate.audit.witness.apply_witness: the newest record the API server's audit log
    # witnessed (and that matched), and where that log ends.
    witness_given: bool = False
    witnessed_seq: int | None = None
    witnessed_time: str | None = None
    witness_end: str | None = None
    # Custom, library and ValidatingAdmissionPolicy rules the chain's decisions name, with the
    # expression digest each violation carries and how many violations carry it: which CEL judged.
    rule_digests: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def errors(self) -> list[IntegrityProblem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[IntegrityProblem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        """No errors (warnings allowed)."""
        return not self.errors

    def first(self, kind: str) -> IntegrityProblem | None:
        """The first problem of ``kind``, if any."""
        return next((p for p in self.problems if p.kind == kind), None)

    def status(self) -> ChainStatus:
        """What can be said about the chain as a whole: verified, pending (a running writer's tail),
        unverifiable since a time, or broken (see :func:`mpigate.audit.status.chain_status`)."""
        return chain_status(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "directory": self.directory,
            "ok": self.ok,
            "records": self.records,
            "segments": self.segments,
            "bytes": self.bytes,
            "firstSeq": self.first_seq,
            "lastSeq": self.last_seq,
            "prunedThroughSeq": self.pruned_through,
            "from": self.first_time,
            "to": self.last_time,
            "checkpoints": self.checkpoints,
            "lastCheckpoint": self.last_checkpoint.to_dict() if self.last_checkpoint else None,
            "signatures": self.signatures,
            "verifiedCheckpoints": self.verified_checkpoints,
            "sealed": self.sealed,
            "live": self.live,
            "witnessedSeq": self.witnessed_seq,
            "status": self.status().to_dict(),
            "unsignedTail": {"records": self.unsigned_records, "bytes": self.unsigned_bytes},
            "recoveries": self.recoveries,
            "tornFragments": list(self.torn_fragments),
            "problems": [p.to_dict() for p in self.problems],
            "ruleDigests": {rule: dict(sorted(d.items())) for rule, d in sorted(self.rule_digests.items())},
        }


@dataclass(slots=True)
class _Gap:
    lo: int
    hi: int
    file: str
    line: int
    found: int  # the seq found where lo was expected
    reordered_by: tuple[int, str, int] | None = None  # (seq, file, line) of a late record


class ChainReader:
    """Iterate one chain's records in order while verifying it. ``report`` is final after the
    iteration ends. Memory does not grow with the chain's length."""

    def __init__(
        self, chain_dir: str | Path, keys: KeyRing | None = None, *, max_problems: int = 100
    ) -> None:
        self.directory = Path(chain_dir)
        self.keys = keys if keys is not None and not keys.empty else None
        self.max_problems = max_problems
        self.report = ChainReport(
            chain=self.directory.name, directory=str(self.directory), keys_given=self.keys is not None
        )
        self._recent: dict[int, str] = {}
        self._gaps: list[_Gap] = []
        self._last_seq = 0
        self._last_time: str | None = None
        self._sig_failed = False
        self._unsigned_start: tuple[str, int] | None = None
        self._saw_unsigned_checkpoint = False
        self._genesis_at: tuple[str, int] | None = None
        # The chain on disk starts after seq 1 (path, first seq, its prev): fine only if a
        # retention record of this chain says that segments through seq - 1 were deleted.
        self._pruned: tuple[Path, int, Any] | None = None
        self._pruned_accounted = False

    # ------------------------------------------------------------------ problems

    def _problem(
        self, kind: str, file: Path | str, line: int | None, message: str, severity: Severity = "error"
    ) -> None:
        if len(self.report.problems) < self.max_problems:
            self.report.problems.append(IntegrityProblem(kind, str(file), line, message, severity))

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[AuditEntry]:
        report = self.report
        segments = list_segments(self.directory)
        report.segments = len(segments)
        report.torn_fragments = [p.name for p in torn_files(self.directory)]
        previous: tuple[Path, int, dict[str, Any] | None, bool] | None = None  # path, lines, last, cut short
        for index, path in enumerate(segments):
            first_in_segment = True
            lines = 0
            last: dict[str, Any] | None = None
            cut_short = False
            try:
                size = path.stat().st_size
            except OSError:
                size = 0
            report.bytes += size
            file = str(path)
            try:
                fh = path.open("rb")
            except OSError as exc:
                self._problem("unreadable", path, None, f"cannot read the segment: {exc.strerror or exc}")
                previous = (path, 0, None, True)
                continue
            with fh:
                for lineno, raw in enumerate(fh, start=1):
                    lines = lineno
                    complete = raw.endswith(b"\n")
                    body = raw[:-1] if complete else raw
                    record = parse_json_object(body)
                    if record is None:
                        if not complete and index == len(segments) - 1 and writer_is_live(self.directory):
                            self._problem(
                                "in-progress",
                                path,
                                lineno,
                                f"the last line ({len(raw)} bytes) is being written by the live writer",
                                "warning",
                            )
                        elif not complete:
                            cut_short = True
                            self._problem(
                                "truncated",
                                path,
                                lineno,
                                f"incomplete last line ({len(raw)} bytes): the segment was cut, "
                                "or its writer "
                                "crashed and has not restarted (restarting it moves the fragment aside)",
                            )
                        else:
                            self._problem("malformed", path, lineno, "not a JSON audit record")
                        continue
                    if first_in_segment:
                        self._check_boundary(index, path, record, previous)
                        first_in_segment = False
                    entry = self._check_record(file, lineno, body, record, len(raw))
                    last = record
                    yield entry
            previous = (path, lines, last, cut_short)
        self._finish(previous)

    def _check_boundary(
        self,
        index: int,
        path: Path,
        record: Mapping[str, Any],
        previous: tuple[Path, int, dict[str, Any] | None, bool] | None,
    ) -> None:
        seq = _int(record.get("seq"))
        named = segment_seq(path)
        if named is not None and seq is not None and named != seq:
            self._problem(
                "reordered",
                path,
                1,
                f"segment is named for seq {named} but starts with seq {seq} (renamed or moved)",
            )
        if index == 0 or previous is None:
            if seq != 1 or record.get("prev") != GENESIS_PREV:
                # judged in _finish: retention (audit/shipping.py) records what it deletes
                self._pruned = (path, seq or 0, record.get("prev"))
                self._last_seq = (seq or 1) - 1
            return
        prev_path, prev_lines, prev_last, prev_cut = previous
        if prev_last is None:
            return
        checkpoint = prev_last.get("checkpoint") if prev_last.get("stage") == "checkpoint" else None
        nxt = checkpoint.get("next") if isinstance(checkpoint, Mapping) else None
        if isinstance(nxt, str) and nxt != path.name:
            if not (self.directory / nxt).exists():
                self._problem(
                    "deleted-segment",
                    prev_path,
                    prev_lines,
                    f"the rotate checkpoint names the next segment {nxt}, which is missing "
                    f"(the chain resumes in {path.name} at seq {seq})",
                )
                self._skip_to(seq)
        elif nxt is None and not prev_cut:
            self._problem(
                "truncated",
                prev_path,
                prev_lines + 1,
                f"the segment ends at seq {prev_last.get('seq')} without its rotate checkpoint: "
                f"records after line {prev_lines} were cut (next segment {path.name} starts at seq {seq})",
            )
            self._skip_to(seq)
        elif prev_cut:
            self._skip_to(seq)

    def _note_digests(self, violations: Any) -> None:
        if type(violations) is not list:
            return
        digests = self.report.rule_digests
        for violation in violations:
            if type(violation) is dict:
                digest = violation.get("digest")
                if type(digest) is str:
                    per = digests.setdefault(str(violation.get("id")), {})
                    per[digest] = per.get(digest, 0) + 1

    def _skip_to(self, seq: int | None) -> None:
        # A boundary problem is already reported: resynchronise instead of reporting a gap again.
        if seq is not None:
            self._last_seq = max(self._last_seq, seq - 1)

    def _check_record(
        self, file: str, lineno: int, body: bytes, record: dict[str, Any], size: int
    ) -> AuditEntry:
        # The hot path of verify: plain local lookups, no helper calls for the common case.
        report = self.report
        intact = True
        get = record.get
        seq = get("seq")
        stored = get("hash")
        stage = get("stage", "")
        time = get("time", "")
        if type(stage) is not str:
            stage = str(stage)
        if type(time) is not str:
            time = str(time)
        if type(seq) is not int or type(stored) is not str or get("v") != RECORD_VERSION:
            report.sealed = False
            self._problem("malformed", file, lineno, "missing or invalid v/seq/hash")
            seq = seq if type(seq) is int else 0
            return AuditEntry(report.chain, seq, time, stage, file, lineno, record, body, False)
        if get("chain") != report.chain:
            intact = False
            self._problem(
                "chain-mismatch",
                file,
                lineno,
                f"record claims chain {get('chain')!r}, directory is {report.chain!r}",
            )
        if not _hash_ok(body, record, stored):
            intact = False
            self._problem("edited", file, lineno, f"seq {seq}: the content does not match its hash (edited)")

        last_seq = self._last_seq
        recent = self._recent
        if seq == last_seq + 1:
            known = GENESIS_PREV if seq == 1 else recent.get(seq - 1)
            if known is not None and get("prev") != known:
                intact = False
                self._problem(
                    "broken-link",
                    file,
                    lineno,
                    f"seq {seq}: prev is not the hash of seq {seq - 1} (record replaced)",
                )
            self._last_seq = seq
        elif seq > last_seq:
            intact = False
            if len(self._gaps) < _MAX_GAPS:
                self._gaps.append(_Gap(last_seq + 1, seq - 1, file, lineno, seq))
            self._last_seq = seq
        else:
            intact = False
            gap = next((g for g in self._gaps if g.lo <= seq <= g.hi), None)
            if gap is not None:
                if gap.reordered_by is None:
                    gap.reordered_by = (seq, file, lineno)
            else:
                self._problem(
                    "reordered", file, lineno, f"seq {seq} appears after seq {last_seq} (duplicate or moved)"
                )
        recent[seq] = stored
        recent.pop(seq - _HASH_WINDOW, None)

        report.records += 1
        if report.first_seq is None:
            report.first_seq = seq
            report.first_time = time
        if report.last_seq is None or seq > report.last_seq:
            report.last_seq = seq
        report.last_time = time
        if stage == "checkpoint":
            self._check_checkpoint(Path(file), lineno, record, seq, time)
        else:
            report.sealed = False
            if stage == "genesis":
                self._note_genesis(file, lineno, record)
            elif stage == "recovered":
                report.recoveries += 1
            elif stage == "retention" and self._pruned is not None:
                self._note_retention(record)
            elif stage == "validate" and get("violations"):
                self._note_digests(get("violations"))
            if self._unsigned_start is None:
                self._unsigned_start = (file, lineno)
            report.unsigned_records += 1
            report.unsigned_bytes += size
        return AuditEntry(report.chain, seq, time, stage, file, lineno, record, body, intact)

    def _check_checkpoint(
        self, path: Path, lineno: int, record: Mapping[str, Any], seq: int, time: str
    ) -> None:
        report = self.report
        report.checkpoints += 1
        report.sealed = False
        checkpoint = record.get("checkpoint")
        if not isinstance(checkpoint, Mapping):
            self._problem("malformed", path, lineno, "checkpoint record without a checkpoint object")
            return
        if checkpoint.get("head") != record.get("prev") or checkpoint.get("headSeq") != seq - 1:
            self._problem(
                "broken-link", path, lineno, f"checkpoint seq {seq} does not certify the record before it"
            )
        alg = str(checkpoint.get("alg", ""))
        verified: bool | None = None
        if alg == "none" or "sig" not in checkpoint:
            if self.keys is not None and not self._saw_unsigned_checkpoint:
                # Verifying with a key means the chain must be signed: an unsigned checkpoint is
                # what a rewrite without the key can produce (a development writer's too).
                self._problem(
                    "unsigned-checkpoints",
                    path,
                    lineno,
                    f"checkpoint seq {seq} carries no signature although a key was given: records "
                    "before it are not authenticated (the writer had no key, or the chain was rewritten)",
                )
            self._saw_unsigned_checkpoint = True
        elif self.keys is not None:
            why = self.keys.verify(
                alg, str(checkpoint.get("keyId", "")), signed_bytes(record), str(checkpoint["sig"])
            )
            verified = why is None
            if why is not None:
                self._sig_failed = True
                since = report.last_checkpoint
                after = (
                    f"after the checkpoint at {since.file}:{since.line}"
                    if since and since.verified
                    else "before it"
                )
                self._problem(
                    "forged",
                    path,
                    lineno,
                    f"checkpoint seq {seq}: {why} — records {after} may have been rewritten without the key",
                )
        reason = str(checkpoint.get("reason", ""))
        report.last_checkpoint = CheckpointInfo(seq, time, str(path), lineno, reason, verified)
        if verified:
            report.verified_checkpoints += 1
            report.covered_seq = seq
            report.covered_time = time
            report.sealed = reason == "shutdown"
        if verified is not False:
            self._unsigned_start = None
            report.unsigned_records = 0
            report.unsigned_bytes = 0

    def _note_genesis(self, file: str, lineno: int, record: Mapping[str, Any]) -> None:
        genesis = record.get("genesis")
        if isinstance(genesis, Mapping):
            self.report.genesis_alg = str(genesis.get("alg", ""))
            self.report.genesis_key_id = str(genesis.get("keyId", ""))
            self._genesis_at = (file, lineno)

    def _check_signed_at_all(self) -> None:
        """A signed chain needs at least one checkpoint that verifies: dropping every checkpoint
        and recomputing the links (which needs no key) must not pass as intact."""
        report = self.report
        if not report.records or report.verified_checkpoints or self._sig_failed:
            return
        if self.keys is not None and self._saw_unsigned_checkpoint:
            return  # reported at the first unsigned checkpoint
        promised = report.genesis_alg not in (None, "", "none")
        if self.keys is None and not (promised and report.checkpoints == 0):
            return  # nothing to check without a key, unless the genesis contradicts the chain
        where = self._genesis_at or (str(self.directory), None)
        named = (
            f"the genesis record names {report.genesis_alg} key {report.genesis_key_id or '?'}, but "
            if promised
            else ""
        )
        what = (
            "the chain carries no checkpoint"
            if report.checkpoints == 0
            else "no checkpoint verifies with the given keys"
        )
        self._problem(
            "no-valid-checkpoint",
            where[0],
            where[1],
            f"{named}{what}: nothing in it is authenticated (checkpoints removed and the links "
            "recomputed, or the chain rewritten without the key)",
        )

    def _note_retention(self, record: Mapping[str, Any]) -> None:
        assert self._pruned is not None
        retention = record.get("retention")
        _, seq, prev = self._pruned
        if (
            isinstance(retention, Mapping)
            and retention.get("chain") == self.report.chain
            and retention.get("lastSeq") == seq - 1
            and retention.get("lastHash") == prev
        ):
            self._pruned_accounted = True
            self.report.pruned_through = seq - 1

    def _finish(self, previous: tuple[Path, int, dict[str, Any] | None, bool] | None) -> None:
        report = self.report
        if self._pruned is not None and not self._pruned_accounted:
            path, seq, _ = self._pruned
            self._problem(
                "deleted-segment",
                path,
                1,
                f"the chain starts at seq {seq}, not with its genesis record: "
                "earlier segments are missing (and no retention record says they were deleted)",
            )
        for gap in self._gaps:
            if gap.reordered_by is not None:
                seq, file, line = gap.reordered_by
                self._problem(
                    "reordered",
                    gap.file,
                    gap.line,
                    f"seq {gap.found} comes before seq {seq} ({file}:{line}): records are out of order",
                )
            else:
                count = gap.hi - gap.lo + 1
                span = f"seq {gap.lo}" if count == 1 else f"seq {gap.lo}..{gap.hi}"
                self._problem(
                    "deleted-records",
                    gap.file,
                    gap.line,
                    f"{count} record(s) missing before this line ({span})",
                )
        if previous is not None:
            path, lines, last, _ = previous
            checkpoint = last.get("checkpoint") if last and last.get("stage") == "checkpoint" else None
            nxt = checkpoint.get("next") if isinstance(checkpoint, Mapping) else None
            if isinstance(nxt, str) and not (self.directory / nxt).exists():
                self._problem(
                    "deleted-segment",
                    path,
                    lines,
                    f"the rotate checkpoint names the next segment {nxt}, which is missing "
                    "(the newest records are gone)",
                )
        if self._unsigned_start is not None and report.unsigned_records:
            file, line = self._unsigned_start
            self._problem(
                "unsigned-tail",
                file,
                line,
                f"{report.unsigned_records} record(s) ({report.unsigned_bytes} bytes) after the last "
                "checkpoint are not covered by a signature (normal for a running writer; after a clean "
                "shutdown it means the "
                "end of the chain was cut)",
                "warning",
            )
        self._check_signed_at_all()
        if self._sig_failed:
            report.signatures = "failed"
        elif self._saw_unsigned_checkpoint:
            report.signatures = "unsigned"
            if self.keys is None:
                self._problem(
                    "unsigned-checkpoints",
                    str(self.directory),
                    None,
                    "checkpoints carry no signature (the writer had no key): "
                    "a rewritten chain cannot be detected",
                    "warning",
                )
        elif report.checkpoints == 0 or (self.keys is not None and not report.verified_checkpoints):
            report.signatures = "missing"
        elif self.keys is None:
            report.signatures = "unchecked"
            if report.checkpoints:
                self._problem(
                    "unchecked-signatures",
                    str(self.directory),
                    None,
                    "no --key/--public-key given: checkpoint signatures were not checked",
                    "warning",
                )
        else:
            report.signatures = "verified"
        report.live = writer_is_live(self.directory)
        order = {name: i for i, name in enumerate(p.name for p in list_segments(self.directory))}
        report.problems.sort(key=lambda p: (order.get(Path(p.file).name, -1), p.line or 0))
        report.complete = True


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_json_object(body: bytes) -> dict[str, Any] | None:
    """A JSON object, or None. orjson parses several times faster than the standard library,
    which matters at a million records; anything it refuses gets a second chance with json."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
    return value if isinstance(value, dict) else None


def _hash_ok(body: bytes, record: Mapping[str, Any], stored: str) -> bool:
    # Fast path: a line the writer wrote is the canonical encoding, so dropping the hash member
    # from the bytes gives exactly what was hashed. Anything else takes the canonical re-encoding.
    member = b',"hash":"' + stored.encode("ascii", "replace") + b'"'
    at = body.find(member)
    if at >= 0 and body.find(member, at + 1) < 0:
        view = memoryview(body)
        digest = hashlib.sha256(view[:at])
        digest.update(view[at + len(member) :])
        if digest.hexdigest() == stored:
            return True
    return record_hash(record) == stored


def writer_is_live(chain_dir: Path) -> bool:
    """Whether a writer holds the chain's lock right now (probed without blocking it: a shared
    lock attempt that is released at once)."""
    try:
        fd = os.open(chain_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def verify_chain(chain_dir: str | Path, keys: KeyRing | None = None) -> ChainReport:
    """Read a whole chain and return its report."""
    reader = ChainReader(chain_dir, keys)
    for _ in reader:
        pass
    return reader.report


class ChainsReading:
    """Records of many chains merged by time; ``reports`` (one per chain) are complete once the
    iteration ended. Iterate once."""

    def __init__(self, readers: list[ChainReader], since: str | None, until: str | None) -> None:
        self.readers = readers
        self.since = since
        self.until = until

    @property
    def reports(self) -> list[ChainReport]:
        return [r.report for r in self.readers]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)

    def __iter__(self) -> Iterator[AuditEntry]:
        streams = [iter(r) for r in self.readers]
        merged = heapq.merge(*streams, key=lambda e: (e.time, e.chain, e.seq))
        for entry in merged:
            if self.since is not None and entry.time < self.since:
                continue
            if self.until is not None and entry.time >= self.until:
                continue
            yield entry


def read_chains(
    paths: Iterable[str | Path],
    keys: KeyRing | None = None,
    *,
    since: str | None = None,
    until: str | None = None,
) -> ChainsReading:
    """Every chain under ``paths`` (audit dirs or chain dirs), merged by time and verified while
    read. ``since``/``until`` are RFC 3339 UTC times as written in records (``until`` exclusive);
    filtering does not skip verification."""
    readers = [ChainReader(d, keys) for d in chain_dirs(paths)]
    return ChainsReading(readers, since, until)
