"""The writer's public value types: its tuning (:class:`WriterOptions`) and what an append
returns (:class:`WrittenRecord`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["WriterOptions", "WrittenRecord"]


@dataclass(frozen=True, slots=True)
class WriterOptions:
    """Tuning of the writer; :meth:`from_settings` maps ``OrgPolicy.spec.audit``.

    ``checkpoint_every``: records between signed checkpoints. ``checkpoint_interval_seconds``: the
    longest a record waits for a signature — the head is signed at the first commit after the oldest
    unsigned record reached this age, or by the writer thread's timer when nothing is written; with
    ``checkpoint_every`` this bounds the part of a chain that only a witness can vouch for
    (docs/audit.md). ``rotate_max_bytes`` / ``rotate_max_age_seconds``: a segment is closed (with a
    ``rotate`` checkpoint) at the first commit after it reached either limit. ``max_batch_records``:
    the most records one group commit takes. ``group_commit=False`` writes and fsyncs every record
    on its own (the benchmark's baseline).
    """

    checkpoint_every: int = 1000
    checkpoint_interval_seconds: float = 10.0
    rotate_max_bytes: int = 64 * 1024 * 1024
    rotate_max_age_seconds: float = 24 * 3600.0
    max_batch_records: int = 1024
    group_commit: bool = True

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1 or self.max_batch_records < 1:
            raise ValueError("checkpoint_every and max_batch_records must be at least 1")
        if self.rotate_max_bytes < 1 or self.rotate_max_age_seconds <= 0:
            raise ValueError("rotation limits must be positive")
        if self.checkpoint_interval_seconds <= 0:
            raise ValueError("checkpoint_interval_seconds must be positive")

    @staticmethod
    def from_settings(settings: Any, **overrides: Any) -> WriterOptions:
        """Options from a :class:`mpigate.config.model.AuditSettings` (``config.org.audit``)."""
        options = WriterOptions(
            checkpoint_every=settings.checkpoint_every,
            checkpoint_interval_seconds=float(settings.checkpoint_interval_seconds),
            rotate_max_bytes=settings.rotate_max_bytes,
            rotate_max_age_seconds=float(settings.rotate_max_age_seconds),
        )
        return replace(options, **overrides) if overrides else options


@dataclass(frozen=True, slots=True)
class WrittenRecord:
    """A record that is on disk and fsync'ed. ``data`` is the full record as written (envelope and
    payload); ``segment``/``line`` locate it (1-based line)."""

    chain: str
    seq: int
    time: str
    hash: str
    prev: str
    stage: str
    segment: str
    line: int
    data: Mapping[str, Any] = field(repr=False)
