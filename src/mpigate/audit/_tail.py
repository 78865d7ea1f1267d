"""Crash recovery's view of a segment's end: where the last intact record ends, what follows
it (a torn write), and moving those bytes aside before the chain continues."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._canonical import parse_time
from .layout import fsync_dir
from .reader import parse_json_object

__all__ = ["Tail", "move_aside", "scan_tail"]

# How far back recovery looks for an intact record before giving up on a tail (bytes).
_TAIL_WINDOW = 1 << 20


@dataclass(frozen=True, slots=True)
class Tail:
    intact_size: int
    torn: bytes
    last: dict[str, Any] | None
    lines: int
    first_time: float | None


def _parse_record(line: bytes) -> dict[str, Any] | None:
    value = parse_json_object(line)
    return value if value is not None and "seq" in value and "hash" in value else None


def scan_tail(path: Path) -> Tail:
    """Find the end of the last intact record of a segment.

    Bytes after the last newline are torn (a write cut short); so are trailing complete lines that
    are not JSON records (garbage a power loss can leave). A parseable record ends the scan even if
    its hash is wrong — that is tampering for ``verify`` to report, not a crash to repair.
    """
    size = path.stat().st_size
    with path.open("rb") as fh:
        window = min(size, _TAIL_WINDOW)
        while True:
            fh.seek(size - window)
            data = fh.read(window)
            cut = data.rfind(b"\n") + 1  # end of the last complete line within the window
            last: dict[str, Any] | None = None
            end = cut
            while end > 0:
                start = data.rfind(b"\n", 0, end - 1) + 1
                if start == 0 and window < size:
                    break  # the line may start before the window
                record = _parse_record(data[start : end - 1])
                if record is not None:
                    last = record
                    break
                end = start
            if last is not None or window >= size:
                break
            window = min(size, window * 2)
        intact = size - window + end
        fh.seek(intact)
        torn = fh.read()
        fh.seek(0)
        lines = 0
        first_time: float | None = None
        remaining = intact
        first = fh.readline() if intact else b""
        if first:
            record = _parse_record(first.rstrip(b"\n"))
            if record is not None:
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    first_time = parse_time(str(record.get("time"))).timestamp()
        fh.seek(0)
        while remaining > 0:
            chunk = fh.read(min(remaining, 1 << 20))
            if not chunk:
                break
            lines += chunk.count(b"\n")
            remaining -= len(chunk)
    return Tail(intact_size=intact, torn=torn, last=last, lines=lines, first_time=first_time)


def move_aside(segment: Path, tail: Tail) -> tuple[str, int]:
    """Copy the torn bytes after the last intact record to ``<segment>.torn-<UTC time>`` and cut
    them from the segment (both durable). Returns the fragment's name and size."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    aside = segment.with_name(f"{segment.name}.torn-{stamp}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
    try:
        os.write(fd, tail.torn)
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(segment, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, tail.intact_size)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(segment.parent)
    return aside.name, len(tail.torn)
