"""Canonical JSON and hashing of audit records.

A record's hash is SHA-256 over its *canonical encoding* without the ``hash`` key: JSON with
keys sorted by code point, no insignificant whitespace, UTF-8 (non-ASCII kept as is) and no NaN
or infinities. The same encoding (with ``hash``) is what each JSONL line holds, so a line can be
checked by parsing it, dropping ``hash`` and re-encoding.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ENVELOPE_KEYS",
    "GENESIS_PREV",
    "RECORD_VERSION",
    "canonical_bytes",
    "encode_fragment",
    "format_time",
    "parse_time",
    "record_hash",
]

RECORD_VERSION = 1
# ``prev`` of the first record of a chain.
GENESIS_PREV = "0" * 64
# Keys the writer owns; callers' entries must not set them.
ENVELOPE_KEYS = frozenset({"v", "seq", "time", "chain", "prev", "hash"})

_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_bytes(value: Any) -> bytes:
    """The canonical encoding of a JSON value (sorted keys, compact, UTF-8)."""
    return _ENCODER.encode(value).encode("utf-8")


def encode_fragment(value: Any) -> str:
    """Canonical text of one JSON value (used to pre-encode payload fields once)."""
    return _ENCODER.encode(value)


def record_hash(record: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical encoding of ``record`` without its ``hash`` key."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical_bytes(body)).hexdigest()


def format_time(moment: dt.datetime) -> str:
    """RFC 3339 UTC with milliseconds: ``2026-11-22T10:15:03.120Z``."""
    u = moment.astimezone(dt.UTC)
    # Formatted by hand: strftime does not zero-pad years before 1000 on every platform.
    date = f"{u.year:04d}-{u.month:02d}-{u.day:02d}"
    return f"{date}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}.{u.microsecond // 1000:03d}Z"


def parse_time(text: str) -> dt.datetime:
    """Parse an RFC 3339 time (``Z`` or an offset; a bare date means midnight UTC)."""
    value = text.strip()
    if len(value) == 10:
        return dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC)
    parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)
