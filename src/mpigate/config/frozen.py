"""Deeply immutable views of JSON-like data, and the way back to plain dicts and lists."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

__all__ = ["freeze", "thaw"]


def freeze(value: Any) -> Any:
    """``dict`` → read-only mapping, ``list`` → tuple, recursively; scalars unchanged."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A fresh plain ``dict``/``list`` copy of frozen (or plain) JSON-like data."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [thaw(v) for v in value]
    return value
