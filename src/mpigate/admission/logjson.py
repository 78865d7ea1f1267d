"""Structured JSON logging for the server: one JSON object per line.

Code logs as usual and passes structured fields with ``extra={"fields": {...}}``; the formatter
puts them next to ``time``, ``level``, ``logger`` and ``msg``. Tracebacks of internal errors go
to the log (field ``exc``) and never to a client.

The line every review writes goes through :func:`log_fields`, which writes it straight to the
stream when logging is set up as ``mpigate serve`` sets it up (one stream handler with this
formatter) — the same line, without building a ``LogRecord`` and dispatching it through the
logging module, which cost more than the rest of the line (docs/webhook.md, "Performance").
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import time
from typing import Any, Final

import orjson

__all__ = ["JsonFormatter", "fields", "log_fields"]

# json.dumps(out, ensure_ascii=False, default=str) builds an encoder per call; this is the same one.
_encode = json.JSONEncoder(ensure_ascii=False, default=str).encode
# ".000+00:00" … ".999+00:00": a line's milliseconds without formatting a number per record
_MILLIS: Final = tuple(f".{ms:03d}+00:00" for ms in range(1000))


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call: ``log.info("answered", extra=fields(request_id=...))``."""
    return {"fields": values}


class JsonFormatter(logging.Formatter):
    """Formats records as single-line JSON."""

    def __init__(self) -> None:
        super().__init__()
        # The time's text up to the second, kept while records come within the same second.
        self._second = -1
        self._prefix = ""

    def _time(self, created: float) -> str:
        """``created`` as ``datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")``
        says it (rounded to microseconds, then cut to milliseconds), without a datetime per record."""
        # CPython's own rounding (Python/pytime.c _PyTime_DoubleToDenominator): the fraction
        # times 10**6, rounded half to even, carried into the second.
        fraction, whole = math.modf(created)
        micro = round(fraction * 1e6)
        second = int(whole)
        if micro >= 1_000_000:
            second, micro = second + 1, micro - 1_000_000
        if second != self._second:
            self._prefix = dt.datetime.fromtimestamp(second, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
            self._second = second
        return self._prefix + _MILLIS[micro // 1000]

    def format(self, record: logging.LogRecord) -> str:
        extra = getattr(record, "fields", None)
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(
            record.created,
            record.levelname,
            record.name,
            record.getMessage(),
            extra if isinstance(extra, dict) else None,
            exc,
        )

    def line(
        self,
        created: float,
        levelname: str,
        logger: str,
        message: str,
        extra: dict[str, Any] | None,
        exc: str | None = None,
    ) -> str:
        """The line of a record with these attributes (:meth:`format`, :func:`log_fields`)."""
        out: dict[str, Any] = {
            "time": self._time(created),
            "level": levelname.lower(),
            "logger": logger,
            "msg": message,
        }
        if extra:
            for key, value in extra.items():
                out.setdefault(key, value)
        if exc is not None:
            out["exc"] = exc
        try:  # orjson: one line per review, several times faster than the standard encoder
            return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # what orjson refuses (integers beyond 64 bits, ...): the standard one
            return _encode(out)


def _sole_json_handler(logger: logging.Logger, level: int) -> logging.StreamHandler[Any] | None:
    """The one handler a record of ``logger`` at ``level`` would reach, when it is a plain
    ``StreamHandler`` with a :class:`JsonFormatter` and no filter anywhere on the way (what
    ``Logger.callHandlers`` would call); None for anything else (other handlers, filters,
    a test's log capture, no handler at all: ``logging.lastResort``)."""
    found: logging.StreamHandler[Any] | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if (
                found is not None
                or type(handler) is not logging.StreamHandler
                or handler.filters
                or not isinstance(handler.formatter, JsonFormatter)
            ):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    if found is None or level < found.level:
        return None
    return found


def log_fields(logger: logging.Logger, level: int, fields: dict[str, Any], msg: str, *args: object) -> None:
    """``logger.log(level, msg, *args, extra={"fields": fields})``, written straight to the stream
    of the one JSON stream handler the record would reach (``mpigate serve``'s logging): the same
    line, under the handler's lock, without the ``LogRecord`` and the module's dispatch. Any other
    set-up — more handlers, filters, another formatter — gets the record through ``logging``."""
    if not logger.isEnabledFor(level):
        return
    handler = _sole_json_handler(logger, level)
    if handler is None:
        logger.log(level, msg, *args, extra={"fields": fields})
        return
    formatter = handler.formatter
    assert isinstance(formatter, JsonFormatter)
    lock = handler.lock  # an RLock (Handler.createLock), taken once: flush() would take it again
    if lock is not None:
        lock.acquire()
    try:
        # Handler.emit's steps: the message and the line (LogRecord.getMessage: % only with
        # arguments), the line with its terminator, then StreamHandler.flush's
        message = msg % args if args else msg
        line = formatter.line(time.time(), logging.getLevelName(level), logger.name, message, fields)
        stream = handler.stream
        stream.write(line + handler.terminator)
        if stream and hasattr(stream, "flush"):
            stream.flush()
    except RecursionError:  # as StreamHandler.emit
        raise
    except Exception:  # as StreamHandler.emit: the handler reports it (stderr), logging goes on
        record = logger.makeRecord(logger.name, level, "(log_fields)", 0, msg, args, None)
        record.fields = fields
        handler.handleError(record)
    finally:
        if lock is not None:
            lock.release()
