"""Fixtures of the controller tests: the example org's config and TrainJobs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.conftest import REPO, TODAY

from mpigate.config import Config, load

FIXTURES = REPO / "tests" / "fixtures" / "controller"


@pytest.fixture(scope="session")
def org() -> Config:
    """The repository's example org (teams in both network profiles, a phi classification)."""
    return load(REPO, today=TODAY)


def example_job(name: str, *, uid: str = "uid-0001") -> dict[str, Any]:
    """An example TrainJob of examples/trainjobs/ with a uid, as the API server would hold it."""
    doc = yaml.safe_load((REPO / "examples" / "trainjobs" / f"{name}.yaml").read_text())
    doc["metadata"]["uid"] = uid
    return copy.deepcopy(doc)


def example_mpijob(name: str, *, uid: str = "uid-0001") -> dict[str, Any]:
    """An example MPIJob of examples/mpijobs/ with a uid, as the API server would hold it."""
    doc = yaml.safe_load((REPO / "examples" / "mpijobs" / f"{name}.yaml").read_text())
    doc["metadata"]["uid"] = uid
    return copy.deepcopy(doc)


def fixture(name: str) -> Any:
    return yaml.safe_load((FIXTURES / name).read_text())


def fixture_path(name: str) -> Path:
    return FIXTURES / name
