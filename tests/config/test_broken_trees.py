"""Every error class of the loader, on a broken copy of a valid fixture tree.

Each case file in tests/fixtures/config/broken/ says which files to write over tests/fixtures/
config/base and which problems `check` must report: file, line, JSON path, code and message.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpigate.config import Problem, Severity, check_tree
from tests.conftest import FIXTURES, TODAY

BASE = FIXTURES / "config" / "base"
CASES = sorted((FIXTURES / "config" / "broken").glob("*.yaml"))


def build_tree(tmp_path: Path, case: dict[str, Any]) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(BASE, root)
    for rel in case.get("delete", []):
        (root / rel).unlink()
    for rel, content in (case.get("files") or {}).items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    return root


def matches(problem: Problem, want: dict[str, Any], root: Path) -> bool:
    file = str(root) if want["file"] == "<root>" else want["file"]
    return (
        problem.location.file == file
        and problem.location.line == want["line"]
        and problem.path == want["path"]
        and problem.code == want["code"]
        and want.get("contains", "") in problem.message
        and want.get("hint", "") in problem.hint
    )


def test_base_tree_is_valid() -> None:
    result = check_tree(BASE, today=TODAY)
    assert result.problems == ()
    assert result.config is not None
    assert sorted(result.config.teams) == ["alpha", "beta"]


@pytest.mark.parametrize("case_file", CASES, ids=[c.stem for c in CASES])
def test_broken_tree(case_file: Path, tmp_path: Path) -> None:
    case = yaml.safe_load(case_file.read_text(encoding="utf-8"))
    root = build_tree(tmp_path, case)
    result = check_tree(root, today=TODAY)
    errors = [p for p in result.problems if p.severity is Severity.ERROR]
    warnings = [p for p in result.problems if p.severity is Severity.WARNING]
    report = "\n".join(str(p) + f"  [{p.code}]" for p in result.problems)
    for want in case["errors"]:
        assert any(matches(p, want, root) for p in errors), f"missing {want}\ngot:\n{report}"
    assert len(errors) == len(case["errors"]), f"unexpected errors:\n{report}"
    for want in case.get("warnings", []):
        assert any(matches(p, want, root) for p in warnings), f"missing warning {want}\ngot:\n{report}"
    assert len(warnings) == len(case.get("warnings", [])), f"unexpected warnings:\n{report}"
    assert (result.config is None) == bool(errors)
    for problem in result.problems:
        text = str(problem)
        assert "Traceback" not in text
        assert text.startswith(f"{problem.location.file}:") or problem.location.line == 0
