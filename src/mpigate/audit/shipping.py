"""Shipping and retention while a writer runs (``mpigate serve``, ``mpigate controller``).

:class:`AuditShipping` runs one background thread that, every ``interval`` seconds, ships the
chains under the audit directory to the OTLP sink (``OrgPolicy.spec.audit.otlp``, through
:class:`~mpigate.audit.otlp.OtlpShipper`: at least once, the acknowledged position of each chain
kept next to it) and then applies retention to the writer's own chain:

* a *sealed* segment (every segment but the open one) is deleted once the sink acknowledged all
  of it, or once it is older than ``spec.audit.retention.maxAge``;
* with shipping configured, a segment not yet shipped is kept until that age — an unreachable
  sink fills the volume only as fast as ``maxAge`` allows;
* segments go oldest first, and each deletion is first recorded in the chain (stage
  ``retention``: the segment, its seq range and last hash, shipped or not), so the chain left on
  disk still verifies (``mpigate audit verify`` accepts a missing prefix that a retention record
  accounts for) and the shipped copy says what was removed and when.

The on-disk chain is the retry queue: it survives restarts, and it is bounded by retention.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._tail import scan_tail
from .errors import AuditClosedError, AuditWriteError
from .layout import fsync_dir, list_segments, segment_seq
from .metrics import AuditMetrics
from .otlp import OtlpShipper, ShipResult
from .writer import AuditLog

__all__ = ["AuditShipping", "RetentionPass", "shipping_for"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetentionPass:
    """Segments deleted by one pass (names), and why."""

    deleted: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


class AuditShipping:
    """Ships and prunes in a background thread; see the module docstring."""

    def __init__(
        self,
        directory: str | Path,
        writer: Callable[[], AuditLog | None],
        *,
        shipper: OtlpShipper | None,
        max_age_seconds: float | None,
        metrics: AuditMetrics | None = None,
        source: str = "webhook",
        interval: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self._writer = writer
        self.shipper = shipper
        self.max_age_seconds = max_age_seconds
        self._metrics = metrics
        self._source = source
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ one pass

    def run_once(self) -> tuple[ShipResult | None, RetentionPass]:
        """Ship what is new, then prune; never raises for a sink or disk problem."""
        shipped: ShipResult | None = None
        if self.shipper is not None:
            try:
                shipped = self.shipper.ship_once()
            except OSError as exc:
                logger.warning("audit shipping: %s", exc)
                shipped = ShipResult(0, True, -1)
        try:
            pruned = self.prune()
        except OSError as exc:
            logger.warning("audit retention: %s", exc)
            pruned = RetentionPass()
        return shipped, pruned

    def prune(self) -> RetentionPass:
        """Delete the writer's sealed segments that are shipped or past the age limit."""
        log = self._writer()
        if log is None or not log.healthy:
            return RetentionPass()  # the deletion could not be recorded
        chain_dir = log.directory
        shipped_through = self._shipped_segment(chain_dir)
        now = self._clock()
        deleted: list[str] = []
        reasons: list[str] = []
        for segment in list_segments(chain_dir)[:-1]:  # the last one is open
            shipped = shipped_through is not None and segment.name < shipped_through
            stat = segment.stat()
            aged = self.max_age_seconds is not None and now - stat.st_mtime >= self.max_age_seconds
            if not (shipped or aged):
                break  # oldest first: what is left on disk stays one unbroken stretch of the chain
            reason = "shipped" if shipped else "max-age"
            last = scan_tail(segment).last or {}
            entry: dict[str, Any] = {
                "source": self._source,
                "stage": "retention",
                "retention": {
                    "chain": log.chain,
                    "segment": segment.name,
                    "firstSeq": segment_seq(segment),
                    "lastSeq": last.get("seq"),
                    "lastHash": last.get("hash"),
                    "bytes": stat.st_size,
                    "shipped": shipped,
                    "reason": reason,
                },
            }
            try:
                log.append(entry)
            except AuditClosedError:
                break  # shutting down: the next start prunes
            except AuditWriteError as exc:
                logger.warning(
                    "audit retention: %s not deleted, its deletion was not recorded: %s", segment, exc
                )
                break
            segment.unlink()
            fsync_dir(chain_dir)
            if not shipped:
                logger.warning(
                    "audit retention: deleted %s of chain %s unshipped: older than %ss "
                    "(spec.audit.retention.maxAge)",
                    segment.name,
                    log.chain,
                    self.max_age_seconds,
                )
            if self._metrics is not None:
                self._metrics.segments_deleted.labels(reason).inc()
            deleted.append(segment.name)
            reasons.append(reason)
        return RetentionPass(tuple(deleted), tuple(reasons))

    def _shipped_segment(self, chain_dir: Path) -> str | None:
        """The segment the sink's acknowledged position is in (every earlier one is shipped)."""
        if self.shipper is None:
            return None
        position = self.shipper.position(chain_dir)
        return position[0] if position is not None else None

    # ------------------------------------------------------------------ background thread

    def _run(self) -> None:
        delay = self._interval
        while not self._stop.wait(delay):
            shipped, _ = self.run_once()
            failed = shipped is not None and shipped.failed
            delay = min(60.0, delay * 2) if failed else self._interval

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="audit-shipping", daemon=True)
        self._thread.start()

    def stop(self, final_pass: bool = True) -> None:
        """Stop the thread; then one last pass (after the writer closed: its shutdown checkpoint
        goes out too) unless ``final_pass`` is False."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            self._thread = None
        if final_pass and self.shipper is not None:
            try:
                result = self.shipper.ship_once()
                if result.lag:
                    logger.warning("audit shipping: %d record(s) left to ship at the next start", result.lag)
            except OSError as exc:
                logger.warning("audit shipping: %s", exc)
        if self.shipper is not None:
            self.shipper.close()


def shipping_for(
    directory: str | Path,
    writer: Callable[[], AuditLog | None],
    settings: Any,
    *,
    metrics: AuditMetrics | None,
    source: str,
    interval: float = 2.0,
) -> AuditShipping | None:
    """The shipping and retention that ``settings`` (``config.org.audit``) ask for, started; None
    when they ask for neither (no ``otlp.endpoint``, no ``retention.maxAge``)."""
    endpoint = settings.otlp_endpoint
    max_age = settings.retention_max_age_seconds
    if not endpoint and max_age is None:
        return None
    shipper = None
    if endpoint:
        headers: Mapping[str, str] = settings.otlp_headers
        shipper = OtlpShipper(
            directory,
            endpoint,
            headers=headers,
            certificate_file=settings.otlp_ca_file,
            metrics=metrics,
            service_name=f"mpigate-{source}",
        )
    shipping = AuditShipping(
        directory,
        writer,
        shipper=shipper,
        max_age_seconds=float(max_age) if max_age is not None else None,
        metrics=metrics,
        source=source,
        interval=interval,
    )
    shipping.start()
    logger.info(
        "audit shipping to %s, retention %s",
        endpoint or "nowhere",
        f"max age {max_age}s" if max_age is not None else "after shipping",
        extra={"fields": {"event": "audit_shipping", "endpoint": endpoint, "maxAgeSeconds": max_age}},
    )
    return shipping
