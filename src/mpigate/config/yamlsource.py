"""YAML documents that remember where every value came from.

PyYAML's composer gives nodes with marks; we build plain JSON-compatible values from them ourselves
so that we can (a) report duplicate keys, which ``yaml.safe_load`` silently drops, (b) keep a map
from JSON path to line/column for messages, and (c) refuse hostile input (alias bombs, deep
nesting) with an error instead of exhausting memory.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from .problems import Location, PathPart, Problem, format_path

__all__ = ["Document", "YamlLimits", "parse_documents", "parse_file"]

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

Path_ = tuple[PathPart, ...]


@dataclass(frozen=True, slots=True)
class YamlLimits:
    """Bounds that keep a hostile file from eating the process."""

    max_nodes: int = 2_000_000
    max_depth: int = 200
    max_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Document:
    """One YAML document: its value plus the position of every path in it."""

    file: str
    index: int
    data: Any
    line: int
    positions: Mapping[Path_, tuple[int, int]] = field(repr=False)
    key_positions: Mapping[Path_, tuple[int, int]] = field(repr=False)

    def locate(self, path: Path_, *, key: bool = True) -> Location:
        """Location of ``path`` (or of its nearest ancestor that exists).

        With ``key=True`` a mapping entry points at its key (``nominal:``), which is where an
        editor should put the cursor; otherwise at its value.
        """
        probe = tuple(path)
        while True:
            if key and probe in self.key_positions:
                line, col = self.key_positions[probe]
                return Location(self.file, line, col)
            if probe in self.positions:
                line, col = self.positions[probe]
                return Location(self.file, line, col)
            if not probe:
                return Location(self.file, self.line, 1)
            probe = probe[:-1]


class _Builder:
    def __init__(self, file: str, limits: YamlLimits) -> None:
        self.file = file
        self.limits = limits
        self.nodes = 0
        self.positions: dict[Path_, tuple[int, int]] = {}
        self.key_positions: dict[Path_, tuple[int, int]] = {}
        self.problems: list[Problem] = []
        self._constructor = _Loader("")

    def _loc(self, mark: Any) -> tuple[int, int]:
        return (mark.line + 1, mark.column + 1)

    def build(self, node: yaml.Node, path: Path_, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise _TooLarge(f"document expands to more than {self.limits.max_nodes} values (alias bomb?)")
        if depth > self.limits.max_depth:
            raise _TooLarge(f"document nests deeper than {self.limits.max_depth} levels")
        self.positions.setdefault(path, self._loc(node.start_mark))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i), depth + 1) for i, item in enumerate(node.value)]
        return self._scalar(node)

    def _scalar(self, node: yaml.Node) -> Any:
        value = self._constructor.construct_object(node, deep=True)
        if isinstance(value, _dt.datetime):
            return value.isoformat().replace("+00:00", "Z")
        if isinstance(value, _dt.date):
            return value.isoformat()
        if isinstance(value, bytes):
            return value.decode("latin-1")
        if isinstance(value, float) and value != value:  # NaN is not JSON
            return None
        return value

    def _key_text(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.ScalarNode):
            # Keys are always text: `no:` or `1:` stay "no" and "1" (YAML 1.1 would make them
            # a boolean and an int, which no JSON object key can be).
            return str(node.value)
        raise _BadKey(node)

    def _mapping(self, node: yaml.MappingNode, path: Path_, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        first_seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                merged = self.build(value_node, (*path, "<<"), depth + 1)
                sources = merged if isinstance(merged, list) else [merged]
                for src in sources:
                    if isinstance(src, dict):
                        for k, v in src.items():
                            out.setdefault(k, v)
                continue
            try:
                key = self._key_text(key_node)
            except _BadKey:
                line, col = self._loc(key_node.start_mark)
                self.problems.append(
                    Problem(
                        Location(self.file, line, col),
                        format_path(path),
                        "mapping keys must be plain scalars",
                        "yaml.bad-key",
                        hint="quote the key",
                    )
                )
                continue
            child = (*path, key)
            line, col = self._loc(key_node.start_mark)
            if key in first_seen:
                self.problems.append(
                    Problem(
                        Location(self.file, line, col),
                        format_path(child),
                        f"duplicate key {key!r} (first defined on line {first_seen[key]})",
                        "yaml.duplicate-key",
                        hint="remove one of the two entries; YAML keeps only the last, silently",
                    )
                )
            else:
                first_seen[key] = line
            self.key_positions[child] = (line, col)
            out[key] = self.build(value_node, child, depth + 1)
        return out


class _TooLarge(Exception):
    pass


class _BadKey(Exception):
    def __init__(self, node: yaml.Node) -> None:
        super().__init__("non-scalar key")
        self.node = node


def _yaml_error_location(file: str, exc: yaml.YAMLError) -> Location:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return Location(file, 1, 1)
    return Location(file, mark.line + 1, mark.column + 1)


def _yaml_error_message(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if problem and context:
        return f"invalid YAML: {problem} ({context})"
    if problem:
        return f"invalid YAML: {problem}"
    return f"invalid YAML: {exc}"


def parse_documents(
    text: str, file: str, limits: YamlLimits | None = None
) -> tuple[list[Document], list[Problem]]:
    """Parse every document of ``text``.

    Returns the documents that parsed (empty documents are dropped) and the problems: duplicate
    keys, a syntax error (which ends the file: later documents cannot be trusted), oversize input.
    """
    limits = limits or YamlLimits()
    docs: list[Document] = []
    problems: list[Problem] = []
    if len(text.encode("utf-8", "surrogatepass")) > limits.max_bytes:
        problems.append(
            Problem(
                Location(file, 1, 1),
                "(document)",
                f"file is larger than {limits.max_bytes} bytes",
                "yaml.too-large",
            )
        )
        return docs, problems
    nodes: Iterator[yaml.Node | None] = yaml.compose_all(text, Loader=_Loader)
    index = 0
    while True:
        try:
            node = next(nodes)
        except StopIteration:
            break
        except yaml.YAMLError as exc:
            problems.append(
                Problem(
                    _yaml_error_location(file, exc),
                    "(document)",
                    _yaml_error_message(exc),
                    "yaml.syntax",
                    hint="check indentation and quoting around this line",
                )
            )
            break
        except RecursionError:
            problems.append(
                Problem(Location(file, 1, 1), "(document)", "YAML nests too deeply", "yaml.too-large")
            )
            break
        if node is None:
            index += 1
            continue
        builder = _Builder(file, limits)
        try:
            data = builder.build(node, (), 0)
        except _TooLarge as exc:
            problems.append(
                Problem(
                    Location(file, node.start_mark.line + 1, 1),
                    "(document)",
                    str(exc),
                    "yaml.too-large",
                )
            )
            index += 1
            continue
        except (yaml.YAMLError, ValueError, TypeError) as exc:
            problems.append(
                Problem(
                    Location(file, node.start_mark.line + 1, 1),
                    "(document)",
                    f"invalid YAML value: {exc}",
                    "yaml.syntax",
                )
            )
            index += 1
            continue
        problems.extend(builder.problems)
        if data is None:  # an empty document (`---` followed by nothing)
            index += 1
            continue
        docs.append(
            Document(
                file=file,
                index=index,
                data=data,
                line=node.start_mark.line + 1,
                positions=builder.positions,
                key_positions=builder.key_positions,
            )
        )
        index += 1
    return docs, problems


def parse_file(
    path: str, display: str | None = None, limits: YamlLimits | None = None
) -> tuple[list[Document], list[Problem]]:
    """Read and parse a YAML file; unreadable or non-UTF-8 files become problems, not exceptions."""
    shown = display or path
    try:
        with open(path, "rb") as fh:
            raw = fh.read((limits or YamlLimits()).max_bytes + 1)
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return [], [
            Problem(
                Location(shown, 1, 1),
                "(document)",
                f"file is not UTF-8 (byte {exc.start})",
                "yaml.encoding",
                hint="save the file as UTF-8",
            )
        ]
    except OSError as exc:
        return [], [Problem(Location(shown, 0, 0), "(document)", f"cannot read file: {exc.strerror}", "io")]
    return parse_documents(text, shown, limits)
