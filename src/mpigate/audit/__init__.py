"""The tamper-evident audit trail: hash-chained JSONL with group commit, signed checkpoints,
crash recovery, streaming verification, exports and an OTLP shipper.

Writing (the webhook, the controller)::

    from mpigate.audit import AsyncAuditLog, AuditMetrics, AuditWriteError, record_from_decision

    log = await AsyncAuditLog.open(directory, source="webhook", signer=load_signer(method, key_file),
                                   options=WriterOptions.from_settings(config.org.audit),
                                   metrics=AuditMetrics(registry))
    written = await log.append(record_from_decision(decision, request, "validate", "webhook"))

Reading and verifying (CLI, reports)::

    from mpigate.audit import KeyRing, read_chains

    reading = read_chains(["/var/lib/mpigate/audit"], keys=KeyRing.load(public_key_files=[pem]))
    for entry in reading:            # every record of every chain, merged by time
        ...
    reading.reports                  # per-chain integrity (complete once iterated)

See docs/audit.md for the record format and the guarantees.
"""

from .async_log import AsyncAuditLog
from .errors import AuditClosedError, AuditError, AuditKeyError, AuditLockedError, AuditWriteError
from .metrics import AuditMetrics
from .options import WriterOptions, WrittenRecord
from .reader import AuditEntry, ChainReader, ChainReport, IntegrityProblem, read_chains, verify_chain
from .records import (
    REDACTED,
    config_record,
    evidence_record,
    lifecycle_record,
    policy_summary,
    record_from_decision,
    redact,
)
from .signing import Ed25519Signer, HmacSigner, KeyRing, Signer, generate_key, load_signer
from .writer import AuditLog

__all__ = [
    "REDACTED",
    "AsyncAuditLog",
    "AuditClosedError",
    "AuditEntry",
    "AuditError",
    "AuditKeyError",
    "AuditLockedError",
    "AuditLog",
    "AuditMetrics",
    "AuditWriteError",
    "ChainReader",
    "ChainReport",
    "Ed25519Signer",
    "HmacSigner",
    "IntegrityProblem",
    "KeyRing",
    "Signer",
    "WriterOptions",
    "WrittenRecord",
    "config_record",
    "evidence_record",
    "generate_key",
    "lifecycle_record",
    "load_signer",
    "policy_summary",
    "read_chains",
    "record_from_decision",
    "redact",
    "verify_chain",
]
