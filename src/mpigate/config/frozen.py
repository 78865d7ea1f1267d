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


_SCALARS = frozenset({str, int, float, bool, type(None)})
_MAPPINGS = frozenset({MappingProxyType, dict})
_LISTS = frozenset({tuple, list})


def thaw(value: Any) -> Any:
    """A fresh plain ``dict``/``list`` copy of frozen (or plain) JSON-like data."""
    kind = type(value)
    # exact types first (the engine thaws every effective pod): the abc checks cost more
    if kind in _SCALARS:
        return value
    if kind in _MAPPINGS:
        return {k: thaw(v) for k, v in value.items()}
    if kind in _LISTS:
        return [thaw(v) for v in value]
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [thaw(v) for v in value]
    return value
