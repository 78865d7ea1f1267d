"""PolicyTest suites: unique names, readable object files, known rule IDs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from mpigate.config.problems import PathPart
from mpigate.config.yamlsource import parse_file

from .base import Collector, Entry, Tree, check_unique, name_of


def check_tests(c: Collector, tree: Tree, tests: list[Entry]) -> None:
    check_unique(c, tests, name_of, "policy test", ["metadata", "name"])
    base_dir = tree.root if tree.root.is_dir() else tree.root.parent
    known_rules = tree.rule_ids
    for entry in tests:
        if not entry.valid:
            continue
        base = base_dir / entry.doc.file
        for i, case in enumerate(entry.data["spec"]["cases"]):
            for field in ("object", "oldObject"):
                src = case.get(field)
                if isinstance(src, dict) and "file" in src:
                    _check_test_file(
                        c,
                        entry,
                        ["spec", "cases", i, field, "file"],
                        base.parent / src["file"],
                        src.get("document", 0),
                    )
            expect = case["expect"]
            for key in ("violations", "includes", "excludes", "warnings"):
                for j, rid in enumerate(expect.get(key) or ()):
                    c.ref(
                        entry,
                        ["spec", "cases", i, "expect", key, j],
                        rid,
                        known_rules,
                        f"unknown rule {rid!r}",
                        "ref.rule",
                    )
        if entry.data["spec"].get("now"):
            try:
                dt.datetime.fromisoformat(entry.data["spec"]["now"].replace("Z", "+00:00"))
            except ValueError:
                c.error(
                    entry, ["spec", "now"], "not an RFC 3339 time", "value.time", "e.g. 2026-11-22T10:00:00Z"
                )


def _check_test_file(c: Collector, entry: Entry, path: list[PathPart], file: Path, index: int) -> None:
    if not file.is_file():
        c.error(
            entry,
            path,
            f"file {file.as_posix()} does not exist",
            "ref.file",
            "paths are relative to the test file",
        )
        return
    docs, problems = parse_file(str(file))
    if problems:
        c.error(entry, path, f"file {file.as_posix()} does not parse: {problems[0].message}", "ref.file")
        return
    if index >= len(docs):
        c.error(
            entry,
            path,
            f"file {file.as_posix()} has {len(docs)} document(s); document {index} asked",
            "ref.file",
        )
