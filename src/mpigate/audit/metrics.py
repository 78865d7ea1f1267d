"""Prometheus metrics of the audit trail, on a registry the caller owns.

Library code never touches prometheus-client's global default registry: the server creates its
registry, builds one :class:`AuditMetrics` on it and passes that to the writer and the shipper.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["AuditMetrics"]

_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class AuditMetrics:
    """The audit trail's instruments. Create at most one per registry (names are unique there).

    * ``mpigate_audit_records_written_total{stage}`` — records made durable.
    * ``mpigate_audit_fsync_seconds`` — latency of each fsync (one per group commit).
    * ``mpigate_audit_batch_records`` — records per group commit.
    * ``mpigate_audit_append_seconds`` — caller-side latency from submit to durable.
    * ``mpigate_audit_write_failures_total{reason}`` — failed commits (``ENOSPC``, ``EIO``, ...).
    * ``mpigate_audit_writer_healthy`` — 1 while the last commit succeeded, else 0.
    * ``mpigate_audit_shipper_lag_records{chain}`` — records on disk not yet shipped over OTLP.
    * ``mpigate_audit_records_shipped_total`` and ``mpigate_audit_ship_failures_total`` (requests);
      ``mpigate_audit_records_ship_failed_total`` (records in failed requests).
    * ``mpigate_audit_segments_deleted_total{reason}`` — sealed segments removed by retention.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # A private registry when none is given keeps the instruments usable without side effects.
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.records_written = Counter(
            "mpigate_audit_records_written", "Audit records made durable.", ["stage"], registry=reg
        )
        self.fsync_seconds = Histogram(
            "mpigate_audit_fsync_seconds",
            "Latency of one fsync of the audit log.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.batch_records = Histogram(
            "mpigate_audit_batch_records",
            "Records committed by one write+fsync (group commit).",
            buckets=_BATCH_BUCKETS,
            registry=reg,
        )
        self.append_seconds = Histogram(
            "mpigate_audit_append_seconds",
            "Latency of append() from submit until durable.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.write_failures = Counter(
            "mpigate_audit_write_failures", "Audit commits that failed, by reason.", ["reason"], registry=reg
        )
        self.writer_healthy = Gauge(
            "mpigate_audit_writer_healthy", "1 while the audit writer's last commit succeeded.", registry=reg
        )
        self.shipper_lag = Gauge(
            "mpigate_audit_shipper_lag_records",
            "Audit records not yet shipped over OTLP.",
            ["chain"],
            registry=reg,
        )
        self.records_shipped = Counter(
            "mpigate_audit_records_shipped", "Audit records acknowledged by the OTLP receiver.", registry=reg
        )
        self.ship_failures = Counter(
            "mpigate_audit_ship_failures", "OTLP export requests that failed.", registry=reg
        )
        self.records_ship_failed = Counter(
            "mpigate_audit_records_ship_failed",
            "Audit records in OTLP export requests that failed (they are sent again).",
            registry=reg,
        )
        self.segments_deleted = Counter(
            "mpigate_audit_segments_deleted",
            "Sealed audit segments deleted by retention, by reason (shipped, max-age).",
            ["reason"],
            registry=reg,
        )
