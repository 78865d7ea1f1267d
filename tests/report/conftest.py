"""Fixtures for the report tests: the scenario trail (written once per module by the real writer),
its key, and a helper that builds a report over it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mpigate.audit import HmacSigner, KeyRing
from mpigate.report import ReportOptions, build_report

from .scenario import write_scenario

SECRET = b"report-tests-secret-0123456789ab"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "report"
# Fixed so that documents compare equal across runs.
GENERATED = "2026-12-01T00:00:00.000Z"


def require_tool(found: object, reason: str) -> None:
    """Skip with the exact reason, except in CI (CI=true), where a missing tool is a failure."""
    if found:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def trail(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An audit directory holding the scenario's three chains."""
    root = tmp_path_factory.mktemp("trail")
    write_scenario(root / "audit", HmacSigner(SECRET))
    (root / "key").write_bytes(SECRET)
    return root


@pytest.fixture(scope="module")
def keyring(trail: Path) -> KeyRing:
    return KeyRing.load([trail / "key"])


@pytest.fixture(scope="module")
def k8s_log() -> Path:
    return FIXTURES / "k8s-audit.jsonl"


@pytest.fixture(scope="module")
def make_report(trail: Path, keyring: KeyRing) -> Callable[..., dict[str, Any]]:
    def factory(
        *,
        k8s: list[Path] | None = None,
        audit: Path | None = None,
        keys: KeyRing | None = keyring,
        jobs: int = 1,
        **options: Any,
    ) -> dict[str, Any]:
        options.setdefault("generated", GENERATED)
        return build_report(
            [audit or trail / "audit"], k8s or [], keys=keys, options=ReportOptions(**options), jobs=jobs
        )

    return factory


@pytest.fixture(scope="module")
def report(make_report: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The scenario's report, all frameworks, no period bounds."""
    return make_report()
