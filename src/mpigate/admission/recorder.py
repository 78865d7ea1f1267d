"""The one place where a decision becomes a durable record before it is answered.

The server calls :meth:`DecisionRecorder.record` once per judged request and answers only after
it returned. A recorder raises :class:`RecordError` (or any exception) when it cannot persist;
the server then fails the request with HTTP 500 so that the API server's ``failurePolicy``
applies — a decision is never answered without its record.

A recorder that writes a chain returns the durable record's :class:`RecordPosition`; the answer
carries it as the audit annotation ``record`` (``<chain>:<seq>:<hash>``), so the API server's own
audit log witnesses the chain (``mpigate audit verify --k8s-audit``, docs/audit.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from mpigate.config import Config
from mpigate.policy.decision import AdmissionInput, Decision

from .review import Stage

__all__ = [
    "DecisionRecorder",
    "MemoryRecorder",
    "NullRecorder",
    "RecordError",
    "RecordPosition",
    "RecordedDecision",
]


class RecordError(Exception):
    """The record could not be made durable."""


@dataclass(frozen=True, slots=True)
class RecordPosition:
    """Where a durable record is: its chain, sequence number and hash (hex)."""

    chain: str
    seq: int
    hash: str

    def annotation(self) -> str:
        """The ``record`` audit annotation's value, ``<chain>:<seq>:<hash>`` (chain ids hold no
        ``:``); :func:`mpigate.audit.witness.parse_position` reads it back."""
        return f"{self.chain}:{self.seq}:{self.hash}"


class DecisionRecorder(Protocol):
    """Writes the record of one decision; returns once it is durable, with the record's position
    when it has one (a chain), else None."""

    async def record(
        self, decision: Decision, request: AdmissionInput, stage: Stage
    ) -> RecordPosition | None: ...

    async def record_config(self, config: Config) -> None:
        """Record that ``config`` is now served (at start and after every reload), so that a
        report knows what each revision enforced."""
        ...

    async def close(self) -> None: ...

    @property
    def healthy(self) -> bool:
        """False while records cannot be written (the server then reports not ready)."""
        ...

    @property
    def problem(self) -> str | None:
        """While not :attr:`healthy`: why (shown by ``/readyz``)."""
        ...


class NullRecorder:
    """Records nothing (``mpigate serve`` without ``--audit-dir``)."""

    healthy = True
    problem = None

    async def record(
        self, decision: Decision, request: AdmissionInput, stage: Stage
    ) -> RecordPosition | None:
        return None

    async def record_config(self, config: Config) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class RecordedDecision:
    decision: Decision
    request: AdmissionInput
    stage: Stage


class MemoryRecorder:
    """Keeps records in memory, in order (tests, and embedding mpigate in another program)."""

    healthy = True
    problem = None

    def __init__(self) -> None:
        self._records: list[RecordedDecision] = []
        self._lock = asyncio.Lock()
        self.configs: list[str] = []  # revisions recorded as served, in order

    async def record(
        self, decision: Decision, request: AdmissionInput, stage: Stage
    ) -> RecordPosition | None:
        async with self._lock:
            self._records.append(RecordedDecision(decision, request, stage))
        return None

    async def record_config(self, config: Config) -> None:
        self.configs.append(config.revision)

    async def close(self) -> None:
        return None

    @property
    def records(self) -> tuple[RecordedDecision, ...]:
        return tuple(self._records)
