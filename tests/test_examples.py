"""Every example's ``# expect:`` header is true: the decision, the enforced rules, the warnings.

Header grammar: ``expect: allowed`` | ``expect: denied ID, ID ...`` (exactly these rules deny),
optionally followed by ``warning ID ...`` (these rules warn); IDs may be wrapped over comment lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.policy.helpers import decide, example_org, read

EXAMPLES = sorted((REPO / "examples").glob("*/*.yaml"))
_ID = re.compile(r"MPG-[A-Z0-9-]*[A-Z0-9]")


def expectation(path: Path) -> tuple[bool, set[str], set[str]]:
    header = " ".join(
        line.lstrip("#").strip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    )
    assert "expect:" in header, f"{path.name} has no '# expect:' header"
    text = header.split("expect:", 1)[1]
    allowed = text.strip().startswith("allowed")
    denied_part, _, warn_part = text.partition("warning")
    denied = set() if allowed else set(_ID.findall(denied_part))
    return allowed, denied, set(_ID.findall(warn_part))


@pytest.fixture(scope="module")
def org():  # type: ignore[no-untyped-def]
    return example_org()


def requester(path: Path) -> str:
    """``# as: USER`` names who submits the example (default: maria, an nlp-team data scientist)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# as:"):
            return line.split(":", 1)[1].split()[0]
    return "maria@acme.example"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_header_is_true(org, path: Path) -> None:  # type: ignore[no-untyped-def]
    allowed, denied, warned = expectation(path)
    decision = decide(org, read(path), user=requester(path))
    assert decision.allowed is allowed, decision.message
    enforced = {v.rule for v in decision.violations if v.denies}
    assert enforced == denied
    warning_ids = {w.split("]")[0].lstrip("[") for w in decision.warnings}
    assert warned <= warning_ids, decision.warnings
    if path.name.startswith("deny-"):
        assert not allowed
    elif path.name.startswith("warn-"):
        assert allowed and decision.warnings
