"""Where lifecycle and evidence records go: the hash-chained audit trail, or (without
``--audit-dir``, for development) the log."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from mpigate.audit import AsyncAuditLog

__all__ = ["AuditTrailRecorder", "LogRecorder", "Recorder"]

log = logging.getLogger(__name__)


class Recorder(Protocol):
    """Appends one entry durably; raises when it could not (the controller then retries)."""

    async def append(self, entry: Mapping[str, Any]) -> None: ...

    @property
    def healthy(self) -> bool: ...

    async def close(self) -> None: ...


class AuditTrailRecorder:
    """Records into the audit trail (``source: controller``); :meth:`append` returns once the
    record is on disk."""

    def __init__(self, audit_log: AsyncAuditLog) -> None:
        self.log = audit_log

    async def append(self, entry: Mapping[str, Any]) -> None:
        await self.log.append(entry)

    @property
    def healthy(self) -> bool:
        return self.log.healthy

    async def close(self) -> None:
        await self.log.aclose()


class LogRecorder:
    """Writes records as JSON log lines at INFO (no tamper evidence: development only)."""

    async def append(self, entry: Mapping[str, Any]) -> None:
        log.info("record %s", json.dumps(entry, sort_keys=True), extra={"record": dict(entry)})

    @property
    def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        return None
