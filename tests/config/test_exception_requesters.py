"""Issue 16 item 9: a PolicyException's benefit follows the requester, never a name or label the
tenant chooses. ``check`` refuses an exception that narrows by name or label without saying who
benefits (``match.requestedBy``), and the engine applies such an exception to nothing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mpigate.config import Severity, check_tree
from mpigate.scaffold import copy_example
from tests.conftest import TODAY

EXCEPTION = Path("policies") / "exceptions" / "cv-team-legacy-image.yaml"
REQUESTERS = "    requestedBy: {personas: [mlops-engineer]}\n"


@pytest.fixture
def org(tmp_path: Path) -> Path:
    root = tmp_path / "org"
    copy_example(root)
    return root


def codes(root: Path) -> list[tuple[str, str, str]]:
    return sorted(
        (p.location.file, p.path, p.code)
        for p in check_tree(root, today=TODAY).problems
        if p.severity is Severity.ERROR
    )


def test_a_name_glob_without_requesters_is_refused(org: Path) -> None:
    path = org / EXCEPTION
    text = path.read_text(encoding="utf-8")
    assert REQUESTERS in text
    path.write_text(text.replace(REQUESTERS, ""), encoding="utf-8")
    assert codes(org) == [(EXCEPTION.as_posix(), "spec.match.trainJobNames", "exception.tenant-chosen")]
    path.write_text(text.replace(REQUESTERS, "    requestedBy: {personas: [ml-ops]}\n"), encoding="utf-8")
    assert codes(org) == [(EXCEPTION.as_posix(), "spec.match.requestedBy.personas[0]", "ref.persona")]


@pytest.mark.parametrize(
    ("requesters", "path"),
    [
        ("{groups: [system:authenticated]}", "spec.match.requestedBy.groups[0]"),
        ("{groups: [system:serviceaccounts]}", "spec.match.requestedBy.groups[0]"),
        ("{users: [system:anonymous]}", "spec.match.requestedBy.users[0]"),
    ],
)
def test_a_requester_beyond_the_team_is_refused(org: Path, requesters: str, path: str) -> None:
    """``requestedBy: {groups: [system:authenticated]}`` would make a name glob decide again (every
    caller is in it): refused like such a TeamAccess member."""
    file = org / EXCEPTION
    text = file.read_text(encoding="utf-8")
    file.write_text(text.replace(REQUESTERS, f"    requestedBy: {requesters}\n"), encoding="utf-8")
    assert codes(org) == [(EXCEPTION.as_posix(), path, "exception.requester-broad")]
    ok = (
        "    requestedBy: {groups: [system:serviceaccounts:cv-team],"
        " users: [system:serviceaccount:cv-team:cv-pipeline]}\n"
    )
    file.write_text(text.replace(REQUESTERS, ok), encoding="utf-8")
    assert codes(org) == []


def test_the_engine_applies_a_tenant_chosen_match_to_nothing() -> None:
    """Even where no ``check`` ran (a bundle built by hand), the engine does not let a name decide."""
    from tests.policy.helpers import decide, example_org, read

    config = example_org()
    (exception,) = config.exceptions_for("cv-team")
    loose = dataclasses.replace(exception, requested_by=None)
    assert loose.tenant_chosen_only
    config = dataclasses.replace(config, _exceptions_by_team={"cv-team": (loose,)})
    legacy = read("trainjobs/legacy-vendor-image.yaml")
    assert not decide(config, legacy, user="omar@acme.example").allowed
    assert decide(example_org(), legacy, user="omar@acme.example").allowed
