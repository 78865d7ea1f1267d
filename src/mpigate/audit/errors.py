"""Errors of the audit trail. All derive from :class:`AuditError`."""

from __future__ import annotations

__all__ = ["AuditClosedError", "AuditError", "AuditKeyError", "AuditLockedError", "AuditWriteError"]


class AuditError(Exception):
    """Base class of audit trail errors."""


class AuditKeyError(AuditError):
    """A signing or verification key cannot be read or has the wrong type."""


class AuditWriteError(AuditError):
    """A record could not be made durable (disk full, permission, I/O error, closed log).

    The record was NOT acknowledged: the caller must not act as if it were logged. The webhook
    fails the admission request so that the API server's ``failurePolicy`` applies. ``reason`` is
    a short machine word (``ENOSPC``, ``EACCES``, ``EIO``, ``closed``, ...) also used as the
    ``reason`` label of ``mpigate_audit_write_failures_total``.
    """

    def __init__(self, message: str, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason


class AuditClosedError(AuditWriteError):
    """The log is closed (shutting down)."""

    def __init__(self, message: str = "the audit log is closed") -> None:
        super().__init__(message, "closed")


class AuditLockedError(AuditError):
    """Another live writer holds the chain (each chain has exactly one writer)."""
