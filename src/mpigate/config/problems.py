"""Problems found in a config tree: values with a location, never exceptions for the user to read."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

__all__ = ["ConfigError", "Location", "Problem", "Severity", "format_path"]

PathPart = str | int


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Location:
    """A place in a file: 1-based line and column."""

    file: str
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        if self.line:
            return f"{self.file}:{self.line}:{self.column}"
        return self.file


def format_path(path: Sequence[PathPart]) -> str:
    """Render a JSON path the way Kubernetes messages do: ``spec.gpus["a100-eu"].nominal``."""
    out: list[str] = []
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif part and all(c.isalnum() or c in "_-" for c in part) and not part[0].isdigit():
            out.append(f".{part}" if out else part)
        else:
            escaped = part.replace("\\", "\\\\").replace('"', '\\"')
            out.append(f'["{escaped}"]')
    return "".join(out) or "(document)"


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong (or worth a warning) in a config tree."""

    location: Location
    path: str
    message: str
    code: str
    severity: Severity = Severity.ERROR
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.location}: {self.path}: {self.message}"
        if self.severity is Severity.WARNING:
            text = f"{self.location}: warning: {self.path}: {self.message}"
        if self.hint:
            text += f" (hint: {self.hint})"
        return text

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("location")
        data["severity"] = str(self.severity)
        return {
            "file": self.location.file,
            "line": self.location.line,
            "column": self.location.column,
            **data,
        }

    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.location.file, self.location.line, self.location.column, self.message)


class ConfigError(Exception):
    """A config tree that cannot be used: carries every problem, not only the first."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(sorted(problems, key=Problem.sort_key))
        errors = [p for p in self.problems if p.severity is Severity.ERROR]
        head = f"{len(errors)} error(s) in config"
        super().__init__(head + "".join(f"\n  {p}" for p in errors[:20]))

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity is Severity.ERROR)
