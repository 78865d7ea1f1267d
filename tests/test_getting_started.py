"""docs/getting-started.md's `check` examples are what `check` prints for the edits it describes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpigate.cli import cli
from tests.conftest import REPO

GUIDE = REPO / "docs" / "getting-started.md"


def _blocks_after(marker: str) -> list[str]:
    """The lines of the first fenced block after ``marker`` in the guide."""
    text = GUIDE.read_text(encoding="utf-8")
    after = text.split(marker, 1)[1]
    block = re.search(r"```\n(.*?)```", after, re.S)
    assert block is not None, marker
    return block.group(1).splitlines()


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    runner = CliRunner()
    root = tmp_path / "acme-config"
    for args in (["--org", "acme", "--team", "nlp-team"], ["--team", "cv-team", "--namespace", "cv-team"]):
        result = runner.invoke(cli, ["init", str(root), *args])
        assert result.exit_code == 0, result.output
    return root


def _check(root: Path) -> list[str]:
    result = CliRunner().invoke(cli, ["check", str(root)])
    assert result.exit_code == 1, result.output
    return [line.replace(f"{root}/", "") for line in result.output.splitlines()]


def test_schema_mistakes_example(tree: Path) -> None:
    quota = tree / "quotas" / "cv-team.yaml"
    _edit(quota, "{nominal: 8,", '{nominal: "16",')
    _edit(quota, "maxNodesPerJob:", "maxNodesPerJb:")
    _edit(tree / "rbac" / "cv-team.yaml", "team: cv-team", "team: cv-teem")
    assert _check(tree) == _blocks_after("and `check` says:")


def test_namespace_clash_example(tree: Path) -> None:
    _edit(tree / "quotas" / "cv-team.yaml", "namespaces: [cv-team]", "namespaces: [cv-team, nlp-team]")
    expected = _blocks_after("adding `nlp-team` to cv-team's namespaces shows:")
    assert expected and all(line in _check(tree) for line in expected)
