"""What verification can say about a chain, and about a set of chains, as one status.

A hash chain proves the order and content of what it holds; it cannot prove that nothing was cut
off its end. Signed checkpoints authenticate every record up to them (through the links), and a
chain that ends with its verified ``shutdown`` checkpoint was closed cleanly. Whatever comes after
the newest authenticated record — the unsigned tail, or the records that a cut removed together
with the shutdown checkpoint — can only be accounted for by a *witness*: the API server's audit log,
whose ``<webhook>/record`` annotations name the chain position of each decision
(:mod:`mpigate.audit.witness`).

So each chain gets one of four states:

``verified``
    no errors, every record authenticated (by a signature or the witness), and the end accounted
    for: sealed by the shutdown checkpoint, or the witness's log reaches past the chain's end.
``pending``
    no errors, the records up to the newest verified checkpoint authenticated, and the chain is
    held by a running writer: its tail is signed at its next checkpoint (``checkpointEvery`` /
    ``checkpointInterval``).
``unverifiable``
    no errors, but records after a point in time cannot be authenticated — "unverifiable since
    <time>, N records" (no key given, no checkpoint after them, or no shutdown checkpoint at the
    end while no writer holds the chain).
``broken``
    a verification error (edited, deleted, forged, …).

``mpigate audit verify`` exits 0 only when every chain is verified or pending; the compliance
report shows the same status (:class:`TrailStatus`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .reader import ChainReport

__all__ = ["ChainState", "ChainStatus", "TrailStatus", "chain_status", "trail_status"]

ChainState = Literal["verified", "pending", "unverifiable", "broken"]
_STATES: tuple[ChainState, ...] = ("verified", "pending", "unverifiable", "broken")


@dataclass(frozen=True, slots=True)
class ChainStatus:
    """One chain's status. ``through_seq``/``through_time``: the newest authenticated record;
    ``since``/``unverifiable_records``: when the unverifiable part begins (the time of the newest
    authenticated record, else of the first record) and how many records it holds."""

    chain: str
    state: ChainState
    reason: str
    through_seq: int | None = None
    through_time: str | None = None
    since: str | None = None
    unverifiable_records: int = 0

    @property
    def ok(self) -> bool:
        """Whether ``verify`` may exit 0 for this chain."""
        return self.state in ("verified", "pending")

    def text(self) -> str:
        """One line for people: ``unverifiable since <time>, N records (why)`` and the like."""
        if self.state == "unverifiable":
            count = self.unverifiable_records
            noun = "record" if count == 1 else "records"
            return f"unverifiable since {self.since or '-'}, {count} {noun} ({self.reason})"
        if self.state == "broken":
            return f"broken: {self.reason}"
        return f"{self.state} through seq {self.through_seq} ({self.through_time}): {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "state": self.state,
            "reason": self.reason,
            "throughSeq": self.through_seq,
            "throughTime": self.through_time,
            "unverifiableSince": self.since,
            "unverifiableRecords": self.unverifiable_records,
            "text": self.text(),
        }


def chain_status(report: ChainReport) -> ChainStatus:
    """The status of one verified chain (its reading must be complete)."""
    chain = report.chain
    errors = report.errors
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return ChainStatus(chain, "broken", f"{first.kind} at {first.location}: {first.message}{more}")
    if not report.records:
        return ChainStatus(chain, "unverifiable", "the chain holds no records")
    through_seq, through_time = report.covered_seq, report.covered_time
    witnessed = report.witnessed_seq
    if witnessed is not None and witnessed > through_seq:
        through_seq, through_time = witnessed, report.witnessed_time
    last_seq = report.last_seq or 0
    unverifiable = max(0, last_seq - through_seq)
    witnessed_to_end = (
        witnessed is not None
        and report.witness_end is not None
        and (report.last_time or "") <= report.witness_end
    )
    if unverifiable == 0 and (report.sealed or witnessed_to_end):
        how = (
            "sealed by its shutdown checkpoint"
            if report.sealed
            else f"witnessed by the API server's audit log, which runs to {report.witness_end}"
        )
        return ChainStatus(chain, "verified", how, through_seq, through_time)
    if report.live and report.signatures == "verified":
        return ChainStatus(
            chain,
            "pending",
            f"{unverifiable} newer record(s) wait for the running writer's next checkpoint",
            through_seq,
            through_time,
            through_time,
            unverifiable,
        )
    since = through_time if through_seq else report.first_time
    if report.signatures == "unchecked":
        reason = "signatures not checked: pass --key or --public-key"
    elif report.signatures == "unsigned":
        reason = "the writer had no signing key"
    elif unverifiable:
        reason = "no signed checkpoint after them"
    else:
        reason = (
            "the chain does not end with its shutdown checkpoint: newer records may have been cut, "
            "or its writer crashed or runs elsewhere"
        )
    if not report.witness_given:
        reason += "; the API server's audit log (--k8s-audit) can witness them"
    return ChainStatus(
        chain,
        "unverifiable",
        reason,
        through_seq or None,
        through_time if through_seq else None,
        since,
        last_seq if through_seq == 0 else unverifiable,
    )


@dataclass(frozen=True, slots=True)
class TrailStatus:
    """The status of every chain read together, and whether a witness accounted for the set of
    chains (without one, a deleted chain directory cannot be noticed)."""

    chains: tuple[ChainStatus, ...]
    witnessed: bool

    def count(self, state: ChainState) -> int:
        return sum(1 for c in self.chains if c.state == state)

    @property
    def state(self) -> ChainState:
        """The worst chain state (verified < pending < unverifiable < broken)."""
        return max((c.state for c in self.chains), key=_STATES.index, default="unverifiable")

    @property
    def ok(self) -> bool:
        """Every chain verified or pending (``verify`` exits 0)."""
        return bool(self.chains) and all(c.ok for c in self.chains)

    @property
    def chain_set_note(self) -> str | None:
        """What cannot be known without a witness, or None."""
        if self.witnessed:
            return None
        return (
            "the set of chains is not witnessed: a deleted chain directory goes unnoticed "
            "without the API server's audit log (--k8s-audit)"
        )

    def text(self) -> str:
        """``all verified`` or ``2 verified, 1 unverifiable`` (the chains' texts say since when)."""
        if self.chains and self.count("verified") == len(self.chains):
            return "all verified"
        return ", ".join(f"{self.count(s)} {s}" for s in _STATES if self.count(s)) or "no chains"

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "ok": self.ok,
            "text": self.text(),
            "counts": {s: self.count(s) for s in _STATES},
            "witnessed": self.witnessed,
            "chainSetNote": self.chain_set_note,
            "chains": [c.to_dict() for c in self.chains],
        }


def trail_status(reports: Iterable[ChainReport]) -> TrailStatus:
    """The status of every chain read; witnessed when an API-server audit log was applied to
    them (:func:`mpigate.audit.witness.apply_witness`)."""
    chains = list(reports)
    witnessed = bool(chains) and all(r.witness_given for r in chains)
    return TrailStatus(tuple(chain_status(r) for r in chains), witnessed)
