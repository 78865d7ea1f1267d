"""Structured JSON logging for the server: one JSON object per line.

Code logs as usual and passes structured fields with ``extra={"fields": {...}}``; the formatter
puts them next to ``time``, ``level``, ``logger`` and ``msg``. Tracebacks of internal errors go
to the log (field ``exc``) and never to a client.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
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

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
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
