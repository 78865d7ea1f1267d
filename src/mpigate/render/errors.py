"""Render errors as values: which template (or file), which line, what is wrong."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RenderError", "RenderProblem"]


@dataclass(frozen=True, slots=True)
class RenderProblem:
    """One problem: ``file`` is a template path (or a config/output file), ``line`` is 1-based
    (0 when unknown), ``where`` says for what the template was rendered (e.g. ``team nlp-team``)."""

    file: str
    line: int
    message: str
    where: str = ""

    def __str__(self) -> str:
        place = f"{self.file}:{self.line}" if self.line else self.file
        suffix = f" (rendering {self.where})" if self.where else ""
        return f"{place}: {self.message}{suffix}"

    def to_dict(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "message": self.message, "where": self.where}


class RenderError(Exception):
    """Rendering failed; ``problems`` says where and why."""

    def __init__(self, problems: tuple[RenderProblem, ...]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))
