"""Cheap shape tests for decoded JSON, for the admission hot path.

``isinstance(x, Mapping)`` goes through ``ABCMeta.__instancecheck__`` (a Python-level call) on
every test, several times slower than an exact type test; the engine makes hundreds per request.
Decoded JSON holds only ``dict``/``list``/scalars and the frozen config only ``MappingProxyType``/
``tuple``, so an exact type test answers nearly every case and the ABC check remains the fallback
for other mappings (same answers as ``isinstance(x, Mapping)``, only faster).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, TypeGuard

__all__ = ["as_mapping", "is_mapping"]

_NOT_MAPPINGS: Final = frozenset({str, int, float, bool, type(None), list, tuple})


def is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, answered by exact type tests where possible."""
    kind = type(value)
    if kind is dict or kind is MappingProxyType:
        return True
    if kind in _NOT_MAPPINGS:
        return False
    return isinstance(value, Mapping)


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else a new empty dict."""
    kind = type(value)
    if kind is dict or kind is MappingProxyType:
        return value  # type: ignore[no-any-return]
    if kind in _NOT_MAPPINGS:
        return {}
    return value if isinstance(value, Mapping) else {}
