"""The API server's audit log as a witness of the chains.

Every decision the webhook answers carries the audit annotation ``record`` =
``<chain>:<seq>:<hash>`` — the position of its durable record — and the API server writes it into
its own audit log (as ``<webhook name>/record``), which lives outside the audit volume. Because
each record's hash covers the previous one, the newest witnessed position of a chain vouches for
every record up to it. So, per chain, only the newest witnessed position matters:

- its seq is beyond the chain's end → the newest records were removed (``witnessed-missing``);
- the chain's record at that seq has another hash → the chain was rewritten (``witness-mismatch``);
- it matches → every record up to it is authenticated, key or no key;
- a chain id the witness names has no directory → the chain was deleted (``missing-chain``).

Memory is one position per chain, whatever the size of the log. Reading the log is
:class:`mpigate.report.k8saudit.K8sAuditReader`'s job (it fills a :class:`Witness`);
:func:`apply_witness` puts the verdicts into the chains' reports, which
:mod:`mpigate.audit.status` then turns into verified / unverifiable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from .layout import list_segments, segment_seq
from .reader import ChainReport, IntegrityProblem, parse_json_object

__all__ = [
    "POSITION_ANNOTATION",
    "Position",
    "Sighting",
    "Witness",
    "apply_witness",
    "parse_position",
    "record_at",
]

# The annotation key the webhook sets (admission.review.ANNOTATION_RECORD); the API server
# prefixes it with the webhook's name.
POSITION_ANNOTATION = "record"
_POSITION = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]{0,127}):([1-9][0-9]{0,18}):([0-9a-f]{64})$")


class Position(NamedTuple):
    """A record's place in its chain, as ``<chain>:<seq>:<hash>``."""

    chain: str
    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.chain}:{self.seq}:{self.hash}"


def parse_position(value: str) -> Position | None:
    """The position an annotation value names, or None when it is not one."""
    match = _POSITION.match(value)
    return Position(match[1], int(match[2]), match[3]) if match else None


@dataclass(frozen=True, slots=True)
class Sighting:
    """Where the witness saw a position: the API server's request time and the log's file:line."""

    position: Position
    time: str
    file: str
    line: int

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(slots=True)
class Witness:
    """The newest position seen per chain, how far the log runs, and what did not parse."""

    newest: dict[str, Sighting] = field(default_factory=dict)
    conflicts: dict[str, Sighting] = field(default_factory=dict)  # same seq seen with another hash
    positions: int = 0
    malformed: int = 0
    first_malformed: str | None = None
    end: str | None = None  # the time of the log's newest event

    def add(self, value: str, time: str, file: str, line: int) -> Position | None:
        """Note a ``record`` annotation value seen in the log; returns its position."""
        position = parse_position(value)
        if position is None:
            self.malformed += 1
            if self.first_malformed is None:
                self.first_malformed = f"{file}:{line}: {value[:200]!r}"
            return None
        self.positions += 1
        self._keep(Sighting(position, time, file, line))
        return position

    def _keep(self, sighting: Sighting) -> None:
        chain = sighting.position.chain
        newest = self.newest.get(chain)
        if newest is None or sighting.position.seq > newest.position.seq:
            self.newest[chain] = sighting
        elif sighting.position.seq == newest.position.seq and sighting.position.hash != newest.position.hash:
            self.conflicts.setdefault(chain, sighting)

    def saw(self, time: str) -> None:
        """The log holds an event at ``time`` (so it runs at least that far)."""
        if self.end is None or time > self.end:
            self.end = time

    def merge(self, other: Witness) -> None:
        """Add what another log file witnessed."""
        for sighting in other.newest.values():
            self._keep(sighting)
        for chain, sighting in other.conflicts.items():
            self.conflicts.setdefault(chain, sighting)
        self.positions += other.positions
        self.malformed += other.malformed
        self.first_malformed = self.first_malformed or other.first_malformed
        if other.end is not None:
            self.saw(other.end)


class _Found(NamedTuple):
    hash: str
    time: str
    file: str
    line: int


def record_at(chain_dir: Path, seq: int) -> _Found | None:
    """The record with ``seq`` in a chain: its hash, time and file:line (one segment is read)."""
    candidates = [p for p in list_segments(chain_dir) if (segment_seq(p) or 0) <= seq]
    marker = b'"seq":%d,' % seq
    for path in reversed(candidates[-2:]):  # a renamed segment may hide it one further back
        try:
            with path.open("rb") as fh:
                for lineno, raw in enumerate(fh, start=1):
                    if marker not in raw:
                        continue
                    record = parse_json_object(raw.rstrip(b"\n"))
                    if record is not None and record.get("seq") == seq:
                        found_hash, found_time = str(record.get("hash", "")), str(record.get("time", ""))
                        return _Found(found_hash, found_time, str(path), lineno)
        except OSError:
            return None
    return None


def apply_witness(reports: Iterable[ChainReport], witness: Witness) -> list[ChainReport]:
    """Check each chain against what the witness saw, and add a report for every chain the
    witness names that was not read (deleted). The reports must be complete. A witness that saw no
    position at all vouches for nothing: the reports stay as they were (unwitnessed)."""
    out = list(reports)
    if not witness.positions:
        return out
    # A chain read from two directories (an archived copy and the live one): the witness speaks
    # about its end, so it is checked against the copy that reaches furthest.
    furthest: dict[str, ChainReport] = {}
    for report in out:
        report.witness_given = True
        report.witness_end = witness.end
        known = furthest.get(report.chain)
        if known is None or (report.last_seq or 0) > (known.last_seq or 0):
            furthest[report.chain] = report
    for chain, report in furthest.items():
        sighting = witness.newest.get(chain)
        if sighting is not None:
            _check(report, sighting, witness.conflicts.get(chain))
    read = set(furthest)
    for chain in sorted(set(witness.newest) - read):
        sighting = witness.newest[chain]
        missing = ChainReport(chain=chain, directory="", complete=True)
        missing.witness_given, missing.witness_end = True, witness.end
        missing.problems.append(
            IntegrityProblem(
                "missing-chain",
                sighting.file,
                sighting.line,
                f"the API server's audit log shows decisions of chain {chain} up to seq "
                f"{sighting.position.seq} ({sighting.time}), but no directory of that chain was read: "
                "it was deleted, or its directory was not given",
            )
        )
        out.append(missing)
    return out


def _check(report: ChainReport, sighting: Sighting, conflict: Sighting | None) -> None:
    position = sighting.position
    seen = f"the API server's audit log ({sighting.location}, {sighting.time}) witnessed seq {position.seq}"
    if conflict is not None:
        report.problems.append(
            IntegrityProblem(
                "witness-mismatch",
                conflict.file,
                conflict.line,
                f"{seen} with hash {position.hash[:16]}…, and here with hash "
                f"{conflict.position.hash[:16]}…: two different chains claim the id {report.chain}",
            )
        )
        return
    last = report.last_seq or 0
    if position.seq > last:
        report.problems.append(
            IntegrityProblem(
                "witnessed-missing",
                sighting.file,
                sighting.line,
                f"{seen} of chain {report.chain}, which ends at seq {last}: "
                f"{position.seq - last} or more of its newest records were removed",
            )
        )
        return
    found = record_at(Path(report.directory), position.seq)
    if found is None:
        report.problems.append(
            IntegrityProblem(
                "witnessed-missing",
                sighting.file,
                sighting.line,
                f"{seen} of chain {report.chain}, which the chain does not hold (records removed)",
            )
        )
    elif found.hash != position.hash:
        report.problems.append(
            IntegrityProblem(
                "witness-mismatch",
                found.file,
                found.line,
                f"seq {position.seq} has hash {found.hash[:16]}…, but {seen} with hash "
                f"{position.hash[:16]}…: the chain was rewritten up to here",
            )
        )
    else:
        report.witnessed_seq = position.seq
        report.witnessed_time = found.time
