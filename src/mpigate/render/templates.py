"""The Jinja2 environment: built-in templates, per-repository overrides, strict undefined values,
and errors that name the template file and line.

Search order (first match wins), so that any template can be overridden by its relative path:

1. each ``--templates DIR`` (in the order given),
2. the config repository's own ``templates/`` folder,
3. the built-in templates shipped with mpigate.

Templates under ``cluster/`` are rendered once into ``cluster/``, those under ``team/`` once per
team into ``teams/<team>/``, those under ``mpigate/`` once into ``mpigate/``. Only ``*.yaml.j2``
files are rendered; helpers for ``{% import %}`` live in ``_lib/``. An override that renders no
document removes the file from the output.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import jinja2
import yaml

from mpigate._resources import data_path

from .errors import RenderError, RenderProblem
from .manifests import FastLoader as _Loader

__all__ = [
    "SECTIONS",
    "TemplateFailure",
    "Templates",
    "builtin_template_dir",
    "search_path",
]

SECTIONS = ("cluster", "team", "mpigate")
_SUFFIX = ".yaml.j2"
_EXPRESSION = re.compile(r"\{\{.*?\}\}")


class TemplateFailure(Exception):
    """Raised by the ``fail("...")`` helper that templates may call."""


def builtin_template_dir() -> Path:
    """The templates shipped with mpigate (``templates/`` of the repository)."""
    return data_path("templates")


def search_path(
    config_root: str | os.PathLike[str], extra: Sequence[str | os.PathLike[str]] = ()
) -> list[Path]:
    """Template folders in priority order, without duplicates."""
    root = Path(config_root)
    repo = (root if root.is_dir() else root.parent) / "templates"
    candidates = [Path(p) for p in extra] + [repo, builtin_template_dir()]
    seen: set[Path] = set()
    out: list[Path] = []
    for candidate in candidates:
        if not candidate.is_dir():
            continue
        resolved = candidate.resolve()
        if resolved not in seen:
            seen.add(resolved)
            out.append(resolved)
    return out


def _to_json(value: Any) -> str:
    """A value as JSON - which is valid YAML - for embedding config data in a template safely."""
    return json.dumps(value, ensure_ascii=False)


def _to_pretty_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True) + "\n"


def _from_yaml(text: str) -> Any:
    return yaml.safe_load(text)


def _fail(message: str) -> NoReturn:
    raise TemplateFailure(message)


def _display(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:  # pragma: no cover - another drive on Windows
        return path


@dataclass(frozen=True)
class RenderedDocument:
    """One YAML document of a template's output, with its line in that output."""

    data: Any
    line: int
    output: str  # the whole rendered text, to point at a line when the document is faulty

    def output_line(self) -> str:
        lines = self.output.splitlines()
        return lines[self.line - 1] if 0 < self.line <= len(lines) else ""


class Templates:
    """The template set for one render."""

    def __init__(self, folders: Iterable[Path]) -> None:
        self.folders = tuple(folders)
        self.env = jinja2.Environment(
            loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(f)) for f in self.folders]),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            auto_reload=False,
        )
        self.env.filters["to_json"] = _to_json
        self.env.filters["to_pretty_json"] = _to_pretty_json
        self.env.filters["from_yaml"] = _from_yaml
        self.env.globals["fail"] = _fail
        self._prefixes = tuple(str(f) + os.sep for f in self.folders)

    def names(self, section: str) -> list[str]:
        """Template names of one section (``cluster``, ``team``, ``mpigate``), sorted."""
        prefix = section + "/"
        return sorted(
            n
            for n in self.env.list_templates()
            if n.startswith(prefix) and n.endswith(_SUFFIX) and "/" not in n[len(prefix) :]
        )

    def source_of(self, name: str) -> str:
        """Display path of the file that provides template ``name``."""
        try:
            template = self.env.get_template(name)
        except jinja2.TemplateError:
            return name
        return _display(template.filename or name)

    def _template_frame_line(self, tb: TracebackType | None) -> tuple[str, int] | None:
        found = None
        while tb is not None:
            filename = tb.tb_frame.f_code.co_filename
            if filename.startswith(self._prefixes):
                found = (_display(filename), tb.tb_lineno)
            tb = tb.tb_next
        return found

    def render(self, name: str, context: dict[str, Any], where: str) -> list[RenderedDocument]:
        """Render template ``name`` and parse its output into YAML documents.

        Raises :class:`RenderError` naming the template file and line for syntax errors, undefined
        values, ``fail()`` calls and output that is not YAML.
        """
        try:
            template = self.env.get_template(name)
            text = template.render(context)
        except jinja2.TemplateSyntaxError as exc:
            file = _display(exc.filename) if exc.filename else name
            raise RenderError(
                (RenderProblem(file, exc.lineno or 0, f"template syntax error: {exc.message}", where),)
            ) from None
        except (
            jinja2.TemplateError,
            TemplateFailure,
            ArithmeticError,
            LookupError,
            TypeError,
            ValueError,
        ) as exc:
            place = self._template_frame_line(exc.__traceback__)
            file, line = place if place is not None else (self.source_of(name), 0)
            kind = {
                jinja2.UndefinedError: "undefined value",
                TemplateFailure: "template failed",
            }.get(type(exc), type(exc).__name__)
            message = getattr(exc, "message", None) or str(exc)
            raise RenderError((RenderProblem(file, line, f"{kind}: {message}", where),)) from None
        return self._parse(name, text, where)

    def guess_line(self, name: str, output_line: str) -> int:
        """The template line that most plausibly produced ``output_line`` (0 when none).

        Jinja keeps no map from output to template lines, so each template line becomes a pattern
        (literal text, ``{{ ... }}`` as a wildcard) and the first one matching the output line wins.
        """
        try:
            source = self.env.loader.get_source(self.env, name)[0] if self.env.loader else ""
        except jinja2.TemplateNotFound:
            return 0
        wanted = output_line.strip()
        if not wanted:
            return 0
        for number, template_line in enumerate(source.splitlines(), start=1):
            stripped = template_line.strip()
            if not stripped or stripped.startswith(("{%", "{#")):
                continue
            parts = _EXPRESSION.split(stripped)
            pattern = ".*?".join(re.escape(p) for p in parts)
            if re.fullmatch(pattern, wanted):
                return number
        return 0

    def _parse(self, name: str, text: str, where: str) -> list[RenderedDocument]:
        documents: list[RenderedDocument] = []
        loader = _Loader(text)
        try:
            while loader.check_node():
                node = loader.get_node()
                data = loader.construct_document(node)
                if data is not None:
                    documents.append(RenderedDocument(data, node.start_mark.line + 1, text))
        except yaml.YAMLError as exc:
            problem_mark = getattr(exc, "problem_mark", None)
            context_mark = getattr(exc, "context_mark", None)
            lines = text.splitlines()
            marks = [m for m in (context_mark, problem_mark) if m is not None]
            line = marks[-1].line + 1 if marks else 0
            excerpt = f": {lines[line - 1].strip()!r}" if 0 < line <= len(lines) else ""
            problem = str(getattr(exc, "problem", None) or exc).strip()
            context = getattr(exc, "context", None)
            detail = f"{context}: {problem}" if context else problem
            message = f"rendered output is not valid YAML ({detail}) at output line {line}{excerpt}"
            # the context mark (e.g. where an unclosed bracket opened) names the culprit best
            template_line = 0
            for mark in marks:
                if mark.line < len(lines):
                    template_line = self.guess_line(name, lines[mark.line])
                if template_line:
                    break
            raise RenderError((RenderProblem(self.source_of(name), template_line, message, where),)) from None
        finally:
            loader.dispose()
        return documents
