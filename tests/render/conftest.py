"""Renderings shared by the render tests (rendering is pure, so sharing is safe)."""

from __future__ import annotations

import pytest

from mpigate.config import Config, load
from mpigate.render import Rendering, render
from tests.conftest import REPO, TODAY

# A fixed revision keeps the golden files independent of the repository's commits.
PINNED_REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="session")
def example_config() -> Config:
    return load(REPO, revision=PINNED_REVISION, today=TODAY)


@pytest.fixture(scope="session")
def example_rendering(example_config: Config) -> Rendering:
    return render(example_config, today=TODAY)
