"""The one place where a decision becomes a durable record before it is answered.

The server calls :meth:`DecisionRecorder.record` once per judged request and answers only after
it returned. A recorder raises :class:`RecordError` (or any exception) when it cannot persist;
the server then fails the request with HTTP 500 so that the API server's ``failurePolicy``
applies — a decision is never answered without its record.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from mpigate.policy.decision import AdmissionInput, Decision

from .review import Stage

__all__ = ["DecisionRecorder", "MemoryRecorder", "NullRecorder", "RecordError", "RecordedDecision"]


class RecordError(Exception):
    """The record could not be made durable."""


class DecisionRecorder(Protocol):
    """Writes the record of one decision; returns once it is durable."""

    async def record(self, decision: Decision, request: AdmissionInput, stage: Stage) -> None: ...

    async def close(self) -> None: ...

    @property
    def healthy(self) -> bool:
        """False while records cannot be written (the server then reports not ready)."""
        ...


class NullRecorder:
    """Records nothing (``mpigate serve`` without ``--audit-dir``)."""

    healthy = True

    async def record(self, decision: Decision, request: AdmissionInput, stage: Stage) -> None:
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

    def __init__(self) -> None:
        self._records: list[RecordedDecision] = []
        self._lock = asyncio.Lock()

    async def record(self, decision: Decision, request: AdmissionInput, stage: Stage) -> None:
        async with self._lock:
            self._records.append(RecordedDecision(decision, request, stage))

    async def close(self) -> None:
        return None

    @property
    def records(self) -> tuple[RecordedDecision, ...]:
        return tuple(self._records)
