"""The caller's half of an append: validate an entry and encode the whole record once,
canonically, with placeholders for the envelope values the writer thread fills in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._canonical import ENVELOPE_KEYS, RECORD_VERSION, encode_fragment
from .records import CALLER_STAGES

__all__ = ["Sentinels", "encode_entry"]


@dataclass(frozen=True, slots=True)
class Sentinels:
    """Placeholders (JSON-encoded, with quotes) for the envelope values the writer thread fills in.

    The caller's thread encodes the whole record once, canonically, with these in place of
    ``seq``/``prev``/``time``/``hash``; the writer thread only substitutes strings. A random token
    makes them impossible to meet in a payload (checked anyway).
    """

    token: str

    @property
    def seq(self) -> str:
        return f'"@@{self.token}:seq@@"'

    @property
    def prev(self) -> str:
        return f'"@@{self.token}:prev@@"'

    @property
    def time(self) -> str:
        return f'"@@{self.token}:time@@"'

    @property
    def hash(self) -> str:
        return f'"@@{self.token}:hash@@"'

    @property
    def hash_member(self) -> str:
        return f',"hash":{self.hash}'

    def placeholders(self) -> dict[str, str]:
        return {key: f"@@{self.token}:{key}@@" for key in ("seq", "prev", "time", "hash")}


def encode_entry(entry: Mapping[str, Any], chain: str, marks: Sentinels) -> str:
    """Validate an entry and encode the whole record once, canonically, with placeholders for the
    envelope values (the caller's thread does the JSON work)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"an audit entry is a mapping, not {type(entry).__name__}")
    stage = entry.get("stage")
    if stage not in CALLER_STAGES:
        raise ValueError(f"an audit entry needs stage one of {sorted(CALLER_STAGES)}, not {stage!r}")
    if not isinstance(entry.get("source"), str) or not entry["source"]:
        raise ValueError("an audit entry needs a non-empty 'source'")
    reserved = ENVELOPE_KEYS.intersection(entry)
    if reserved:
        raise ValueError(f"the writer sets {sorted(reserved)}; an entry must not")
    for key in entry:
        if not isinstance(key, str):
            raise ValueError(f"audit entry keys are strings, not {key!r}")
    record = {**entry, **marks.placeholders(), "chain": chain, "v": RECORD_VERSION}
    try:
        template = encode_fragment(record)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"audit entry is not JSON: {exc}") from exc
    if template.count(marks.token) != 4:
        raise ValueError("audit entry contains the writer's placeholder token")
    return template
