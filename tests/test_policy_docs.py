"""Every catalogue rule has a page whose example is real, current ``mpigate explain`` output."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from mpigate.catalogue import library_rules, rule_ids
from tests.conftest import REPO

DOCS = REPO / "docs" / "policies"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_policy_docs", REPO / "scripts" / "gen_policy_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_policy_docs"] = module
    spec.loader.exec_module(module)
    return module


def test_every_rule_has_a_page_listed_in_the_index() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    missing = [rule for rule in rule_ids() if not (DOCS / f"{rule}.md").is_file()]
    assert missing == []
    unlisted = [rule for rule in rule_ids() if f"[{rule}]({rule}.md)" not in index]
    assert unlisted == []


def test_every_page_shows_its_rule_firing_in_the_example() -> None:
    for rule in rule_ids():
        text = (DOCS / f"{rule}.md").read_text(encoding="utf-8")
        example = text.split("## Example", 1)[1].split("## How to fix", 1)[0]
        assert f"[{rule}]" in example, rule
        for section in ("## What", "## Why", "## How to fix", "## Modes and exceptions"):
            assert section in text, (rule, section)


@pytest.mark.slow
def test_pages_are_up_to_date() -> None:
    pages = _generator().generate()
    stale = [path.name for path, text in pages.items() if path.read_text(encoding="utf-8") != text]
    assert stale == [], "run: .venv/bin/python scripts/gen_policy_docs.py"


def test_every_library_rule_has_a_page_listed_in_the_library_index() -> None:
    index = (DOCS / "library.md").read_text(encoding="utf-8")
    for rule in library_rules().values():
        text = (DOCS / f"{rule.id}.md").read_text(encoding="utf-8")
        assert f"[{rule.id}]({rule.id}.md)" in index
        example = text.split("## Example", 1)[1].split("## Modes and exceptions", 1)[0]
        assert f"[{rule.id}]" in example, rule.id
        for section in ("## What", "## Parameters", "## Enable it"):
            assert section in text, (rule.id, section)
