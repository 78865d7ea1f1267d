"""Ship audit records to an OpenTelemetry Collector as OTLP/HTTP logs, at least once.

The shipper tails every chain under an audit directory. For each chain it remembers the segment
and byte offset up to which the collector acknowledged records, next to the chain in
``<chain>/.otlp-position.json`` (written atomically after every acknowledged export), so the
position moves with the chain's volume. After a restart it resumes from there, so a record is
shipped again only when the process died between the collector's acknowledgement and the
position update — at-least-once, never lost. A failed export is retried with exponential
backoff; ``mpigate_audit_shipper_lag_records`` says how many records wait. Two shippers never
work on one chain at once (each holds the chain's ``.ship-lock`` while it ships it): the replicas
of ``mpigate serve --workers``, the controller and a manual ``mpigate audit ship`` may share a
directory.

Each record becomes one OTLP log record: the body is the record's JSON line exactly as stored (a
collector-side copy can still be re-hashed), the timestamp is the record's ``time``, and the
attributes carry chain, seq, hash, stage, decision, team, object and rule IDs for querying.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from mpigate import __version__

from ._canonical import parse_time
from ._claim import try_flock
from .layout import chain_dirs, fsync_dir, list_segments
from .metrics import AuditMetrics

__all__ = ["POSITION_FILE", "STATE_FILE", "OtlpShipper", "ShipResult", "log_record_for"]

logger = logging.getLogger(__name__)

POSITION_FILE = ".otlp-position.json"
SHIP_LOCK_FILE = ".ship-lock"
# Where positions of all chains were kept before they moved next to each chain (read, not written).
STATE_FILE = ".otlp-state.json"
_SCOPE = InstrumentationScope("mpigate.audit", __version__)


@dataclass(frozen=True, slots=True)
class ShipResult:
    """One pass: records acknowledged, and whether a request failed (the rest waits)."""

    shipped: int
    failed: bool
    lag: int


@dataclass(slots=True)
class _Position:
    segment: str
    offset: int
    seq: int


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _attributes(record: Mapping[str, Any]) -> dict[str, Any]:
    obj = _mapping(record.get("object"))
    request = _mapping(record.get("request"))
    user = _mapping(request.get("user"))
    violations = [v for v in record.get("violations") or [] if isinstance(v, Mapping)]
    values: dict[str, Any] = {
        "mpigate.audit.chain": record.get("chain"),
        "mpigate.audit.seq": record.get("seq"),
        "mpigate.audit.hash": record.get("hash"),
        "mpigate.audit.prev": record.get("prev"),
        "mpigate.audit.stage": record.get("stage"),
        "mpigate.audit.source": record.get("source"),
        "mpigate.audit.decision": record.get("decision"),
        "mpigate.audit.team": record.get("team"),
        "mpigate.audit.revision": record.get("revision"),
        "k8s.namespace.name": obj.get("namespace"),
        "mpigate.audit.object.kind": obj.get("kind"),
        "mpigate.audit.object.name": obj.get("name"),
        "mpigate.audit.operation": request.get("operation"),
        "mpigate.audit.user": user.get("username"),
    }
    rules = sorted({str(v.get("id")) for v in violations})
    if rules:
        values["mpigate.audit.rules"] = rules
        values["mpigate.audit.controls"] = sorted(
            {str(c) for v in violations for c in v.get("controls") or []}
        )
    # OTLP attribute values cannot be null.
    return {k: v for k, v in values.items() if v is not None and v != ""}


def log_record_for(record: Mapping[str, Any], line: bytes, resource: Resource) -> ReadableLogRecord:
    """The OTLP log record of one audit record (``line`` is its stored JSON)."""
    try:
        moment = parse_time(str(record.get("time")))
        # exact integer nanoseconds (a float timestamp would turn .123 into .122999…)
        timestamp = (calendar.timegm(moment.utctimetuple()) * 1_000_000 + moment.microsecond) * 1000
    except ValueError:
        timestamp = time.time_ns()
    stage = str(record.get("stage", ""))
    warn = record.get("decision") == "denied" or stage == "recovered"
    return ReadableLogRecord(
        log_record=LogRecord(
            timestamp=timestamp,
            observed_timestamp=time.time_ns(),
            severity_text="WARN" if warn else "INFO",
            severity_number=SeverityNumber.WARN if warn else SeverityNumber.INFO,
            body=line.decode("utf-8", "replace"),
            attributes=_attributes(record),
            event_name=f"mpigate.audit.{stage}",
        ),
        resource=resource,
        instrumentation_scope=_SCOPE,
    )


class _ConfiguredCASession(requests.Session):
    """A session whose configured CA bundle wins over ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``:
    plain requests lets those variables override ``Session.verify`` (psf/requests#3829), which
    would silently ignore the collector CA the operator configured."""

    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
        settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
        settings["verify"] = self.verify
        return settings


def _logs_url(endpoint: str) -> str:
    parts = urllib.parse.urlsplit(endpoint)
    if parts.path in ("", "/"):
        return urllib.parse.urlunsplit(parts._replace(path="/v1/logs"))
    return endpoint


class OtlpShipper:
    """Tails the chains under ``directory`` and exports their records to ``endpoint``.

    Use :meth:`ship_once` for one pass (tests, cron) or :meth:`start`/:meth:`stop` for a
    background thread polling every ``interval`` seconds.
    """

    def __init__(
        self,
        directory: str | Path,
        endpoint: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        certificate_file: str | None = None,
        timeout: float = 10.0,
        batch_records: int = 512,
        metrics: AuditMetrics | None = None,
        exporter: LogRecordExporter | None = None,
        service_name: str = "mpigate",
    ) -> None:
        if exporter is None and not endpoint:
            raise ValueError("an OTLP endpoint (or an exporter) is needed")
        self.directory = Path(directory)
        self.state_path = self.directory / STATE_FILE
        self._exporter = exporter or OTLPLogExporter(
            endpoint=_logs_url(str(endpoint)),
            headers=dict(headers or {}),
            certificate_file=certificate_file,
            timeout=timeout,
            session=_ConfiguredCASession() if certificate_file else None,
        )
        self._batch = batch_records
        self._metrics = metrics
        self._resource = Resource.create({"service.name": service_name, "service.version": __version__})
        self._legacy = self._load_state()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ positions

    def _load_state(self) -> dict[str, _Position]:
        """Positions from the directory-wide file of earlier versions (a chain's own file wins)."""
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            # Shipping again from the start is at-least-once too; losing records is not an option.
            logger.warning("OTLP shipper: unreadable state %s (%s); ignoring it", self.state_path, exc)
            return {}
        positions: dict[str, _Position] = {}
        for chain, pos in (data.get("chains") or {}).items():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                positions[chain] = _Position(str(pos["segment"]), int(pos["offset"]), int(pos["seq"]))
        return positions

    def _load_position(self, chain_dir: Path) -> _Position | None:
        path = chain_dir / POSITION_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return _Position(str(data["segment"]), int(data["offset"]), int(data["seq"]))
        except FileNotFoundError:
            return self._legacy.get(chain_dir.name)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("OTLP shipper: unreadable position %s (%s); shipping from the start", path, exc)
            return None

    def _save_state(self, chain_dir: Path, pos: _Position) -> None:
        data = {"version": 1, "segment": pos.segment, "offset": pos.offset, "seq": pos.seq}
        path = chain_dir / POSITION_FILE
        tmp = path.with_name(f"{POSITION_FILE}.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(data, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(chain_dir)

    def position(self, chain_dir: Path) -> tuple[str, int, int] | None:
        """(segment, byte offset, seq) of ``chain_dir`` acknowledged by the collector, if any."""
        pos = self._load_position(chain_dir)
        return (pos.segment, pos.offset, pos.seq) if pos is not None else None

    @property
    def positions(self) -> dict[str, tuple[str, int, int]]:
        """Per chain: (segment, byte offset, seq) acknowledged by the collector."""
        found = {}
        for chain_dir in chain_dirs([self.directory]):
            pos = self.position(chain_dir)
            if pos is not None:
                found[chain_dir.name] = pos
        return found

    # ------------------------------------------------------------------ shipping

    def ship_once(self) -> ShipResult:
        """Export every complete record not yet acknowledged; stop at the first failed request."""
        shipped = 0
        failed = False
        for chain_dir in chain_dirs([self.directory]):
            if failed:
                break
            lock = _ship_lock(chain_dir)
            if lock is None:
                continue  # another shipper is at this chain
            try:
                count, failed = self._ship_chain(chain_dir)
            finally:
                os.close(lock)
            shipped += count
        lag = self._update_lag()
        return ShipResult(shipped, failed, lag)

    def _start_position(self, chain_dir: Path, segments: Sequence[Path]) -> _Position:
        chain = chain_dir.name
        # read again on every pass: another shipper may have moved it since
        pos = self._load_position(chain_dir)
        names = [s.name for s in segments]
        if pos is None:
            return _Position(names[0], 0, 0)
        if pos.segment not in names:
            later = [n for n in names if n > pos.segment]
            logger.warning(
                "OTLP shipper: segment %s of %s is gone; continuing with the next one", pos.segment, chain
            )
            return _Position(later[0] if later else names[-1], 0 if later else pos.offset, pos.seq)
        return pos

    def _ship_chain(self, chain_dir: Path) -> tuple[int, bool]:
        chain = chain_dir.name
        segments = list_segments(chain_dir)
        if not segments:
            return 0, False
        pos = self._start_position(chain_dir, segments)
        shipped = 0
        names = [s.name for s in segments]
        index = names.index(pos.segment)
        while index < len(segments):
            path = segments[index]
            with path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if pos.offset > size:
                    pos.offset = size  # recovery cut a torn tail we had not shipped anyway
                fh.seek(pos.offset)
                while True:
                    batch, lines_end, last_seq = self._read_batch(fh)
                    if not batch:
                        if lines_end > pos.offset:  # only unparseable lines: step over them
                            pos.offset = lines_end
                        break
                    result = self._exporter.export(batch)
                    if result is not LogRecordExportResult.SUCCESS:
                        if self._metrics is not None:
                            self._metrics.ship_failures.inc()
                            self._metrics.records_ship_failed.inc(len(batch))
                        logger.warning("OTLP shipper: export of %d record(s) of %s failed", len(batch), chain)
                        return shipped, True
                    pos = _Position(path.name, lines_end, last_seq)
                    self._save_state(chain_dir, pos)
                    shipped += len(batch)
                    if self._metrics is not None:
                        self._metrics.records_shipped.inc(len(batch))
            if index + 1 < len(segments) and pos.offset >= path.stat().st_size:
                index += 1
                pos = _Position(segments[index].name, 0, pos.seq)
                self._save_state(chain_dir, pos)
            else:
                break
        return shipped, False

    def _read_batch(self, fh: Any) -> tuple[list[ReadableLogRecord], int, int]:
        """Up to ``batch_records`` complete lines from the current position."""
        batch: list[ReadableLogRecord] = []
        end = fh.tell()
        last_seq = 0
        while len(batch) < self._batch:
            line = fh.readline()
            if not line.endswith(b"\n"):
                break  # nothing more, or a line still being written: next pass
            end += len(line)
            body = line[:-1]
            try:
                record = json.loads(body)
            except ValueError:
                logger.warning("OTLP shipper: skipping a line that is not JSON at byte %d", end - len(line))
                continue
            if not isinstance(record, dict):
                continue
            batch.append(log_record_for(record, body, self._resource))
            last_seq = int(record.get("seq", 0) or 0)
        fh.seek(end)
        return batch, end, last_seq

    def _update_lag(self) -> int:
        total = 0
        for chain_dir in chain_dirs([self.directory]):
            segments = list_segments(chain_dir)
            pos = self._load_position(chain_dir)
            lag = 0
            for path in segments:
                if pos is not None and path.name < pos.segment:
                    continue
                with path.open("rb") as fh:
                    if pos is not None and path.name == pos.segment:
                        fh.seek(pos.offset)
                    while chunk := fh.read(1 << 20):
                        lag += chunk.count(b"\n")
            if self._metrics is not None:
                self._metrics.shipper_lag.labels(chain_dir.name).set(lag)
            total += lag
        return total

    # ------------------------------------------------------------------ background loop

    def run(self, interval: float = 2.0, max_backoff: float = 60.0) -> None:
        """Ship until :meth:`stop`; back off exponentially (up to ``max_backoff``) after failures."""
        delay = interval
        while not self._stop.is_set():
            try:
                result = self.ship_once()
            except OSError as exc:
                logger.warning("OTLP shipper: %s", exc)
                result = ShipResult(0, True, -1)
            delay = min(max_backoff, delay * 2) if result.failed else interval
            self._stop.wait(delay)

    def start(self, interval: float = 2.0, max_backoff: float = 60.0) -> None:
        """Run :meth:`run` in a daemon thread."""
        self._stop.clear()
        self._thread = threading.Thread(
            target=self.run, args=(interval, max_backoff), name="audit-otlp-shipper", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the background thread after its current request and shut the exporter down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        """Shut the exporter down (its HTTP session)."""
        self._exporter.shutdown()  # type: ignore[no-untyped-call]


def _ship_lock(chain_dir: Path) -> int | None:
    """Hold ``chain_dir``'s ship lock (an fd to close), or None when another shipper holds it."""
    return try_flock(chain_dir / SHIP_LOCK_FILE)
