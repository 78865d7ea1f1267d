"""Tolerant reading of TrainJob and runtime fields: wrong types become :class:`Problem` values
(recorded with their path) instead of exceptions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .jsontypes import is_mapping
from .model import Problem
from .paths import PathPart

__all__ = ["INT32_MAX", "Recorder", "integer", "listed", "mapping", "type_name", "valid_env"]

#: The largest value of a Kubernetes ``int32`` field (``format: int32`` in the CRDs).
INT32_MAX = 2**31 - 1


def mapping(value: Any) -> Mapping[str, Any]:
    return value if is_mapping(value) else {}


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Recorder:
    """Collects the problems of one document (the TrainJob, or a runtime: ``in_runtime``)."""

    def __init__(self, in_runtime: bool = False) -> None:
        self.problems: list[Problem] = []
        self.in_runtime = in_runtime

    def typed(self, value: Any, expected: type | tuple[type, ...], path: tuple[PathPart, ...]) -> Any:
        """``value`` when it has the expected type (or is absent), else record and return None."""
        if value is None:
            return None
        if expected is Mapping:  # the common case, without ABCMeta's isinstance (hot path)
            ok = is_mapping(value)
        else:
            ok = isinstance(value, expected) and not (isinstance(value, bool) and expected in (int, (int,)))
        if ok:
            return value
        names = {
            dict: "an object",
            Mapping: "an object",
            list: "a list",
            str: "a string",
            int: "an integer",
            bool: "a boolean",
        }
        want = names.get(expected, str(expected)) if isinstance(expected, type) else "a valid value"
        self.problems.append(Problem(path, f"expected {want}, got {type_name(value)}", True, self.in_runtime))
        return None

    def add(self, path: tuple[PathPart, ...], message: str) -> None:
        self.problems.append(Problem(path, message, False, self.in_runtime))

    def malformed(self, path: tuple[PathPart, ...], message: str) -> None:
        """A wrong type or an out-of-range value at ``path``."""
        self.problems.append(Problem(path, message, True, self.in_runtime))

    def count(self, value: Any, path: tuple[PathPart, ...], why: str = "") -> int | None:
        """``value`` when it is an int32 of at least 1 (or absent: None); anything else is
        malformed and reads as absent. ``why`` explains the lower bound in the message."""
        number: int | None = self.typed(value, int, path)
        if number is None:
            return None
        if not 1 <= number <= INT32_MAX:
            self.malformed(path, f"must be between 1 and {INT32_MAX}, got {number}{why}")
            return None
        return number


def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if is_mapping(value):
        return "object"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return f'string "{value[:40]}"'
    if value is None:
        return "null"
    return type(value).__name__


def valid_env(raw: Any, path: tuple[PathPart, ...], rec: Recorder) -> list[Mapping[str, Any]]:
    items = rec.typed(raw, list, path) or []
    out: list[Mapping[str, Any]] = []
    for i, var in enumerate(items):
        if not is_mapping(var) or not isinstance(var.get("name"), str):
            rec.problems.append(Problem((*path, i), "env entries need a string name", True, rec.in_runtime))
            continue
        out.append(var)
    return out
