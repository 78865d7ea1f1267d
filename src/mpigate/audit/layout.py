"""Where chains and segments live on disk.

``<audit dir>/<chain>/<first seq, 20 digits>.jsonl`` — one directory per chain (one per writer),
segments named by the sequence number of their first record so that ``ls`` shows them in chain
order. ``<segment>.torn-<UTC time>`` holds bytes that crash recovery moved aside; ``.lock`` is the
writer's lock file; ``.otlp-state.json`` in the audit dir holds the OTLP shipper's offsets.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "LOCK_FILE",
    "SEGMENT_SUFFIX",
    "chain_dirs",
    "fsync_dir",
    "list_segments",
    "segment_name",
    "segment_seq",
    "torn_files",
    "valid_chain_id",
]

SEGMENT_SUFFIX = ".jsonl"
LOCK_FILE = ".lock"
_SEGMENT = re.compile(r"^(\d{20})\.jsonl$")
_CHAIN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def valid_chain_id(chain: str) -> bool:
    """Chain ids are directory names: letters, digits, ``.``, ``_``, ``-`` (≤ 128)."""
    return bool(_CHAIN_ID.match(chain)) and chain not in (".", "..")


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def segment_seq(path: Path | str) -> int | None:
    """The first sequence number a segment file's name announces, or None if it is not one."""
    match = _SEGMENT.match(Path(path).name)
    return int(match.group(1)) if match else None


def list_segments(chain_dir: Path) -> list[Path]:
    """Segment files of a chain in chain order."""
    try:
        names = [(segment_seq(p), p) for p in chain_dir.iterdir() if p.is_file()]
    except FileNotFoundError:
        return []
    return [p for seq, p in sorted((s, p) for s, p in names if s is not None)]


def torn_files(chain_dir: Path) -> list[Path]:
    """Fragments that crash recovery moved aside."""
    try:
        return sorted(p for p in chain_dir.iterdir() if ".jsonl.torn-" in p.name)
    except FileNotFoundError:
        return []


def chain_dirs(paths: Iterable[Path | str]) -> list[Path]:
    """Chain directories under each path: the path itself when it holds segments, else its
    subdirectories that do. Sorted, without duplicates."""
    found: set[Path] = set()
    for item in paths:
        path = Path(item)
        if list_segments(path):
            found.add(path)
            continue
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and list_segments(child):
                    found.add(child)
    return sorted(found)


def fsync_dir(directory: Path) -> None:
    """Make a directory entry (a created/renamed file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
