"""Structured JSON logging for the server: one JSON object per line.

Code logs as usual and passes structured fields with ``extra={"fields": {...}}``; the formatter
puts them next to ``time``, ``level``, ``logger`` and ``msg``. Tracebacks of internal errors go
to the log (field ``exc``) and never to a client.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from typing import Any

import orjson

__all__ = ["JsonFormatter", "fields"]

# json.dumps(out, ensure_ascii=False, default=str) builds an encoder per call; this is the same one.
_encode = json.JSONEncoder(ensure_ascii=False, default=str).encode


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
        return f"{self._prefix}.{micro // 1000:03d}+00:00"

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self._time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            for key, value in extra.items():
                out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        try:  # orjson: one line per review, several times faster than the standard encoder
            return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # what orjson refuses (integers beyond 64 bits, ...): the standard one
            return _encode(out)
