"""Fixtures of the client tests: one cluster (install base, webhook, API server emulator) per test
process, shared by the modules (each test uses names of its own; tests that change routing restore it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import upstream_dir

from .cluster import Cluster, start_cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    upstream = upstream_dir()
    if upstream is None:
        pytest.skip("upstream Trainer CRDs not found at ../shared/upstream (set MPIGATE_UPSTREAM)")
    started = start_cluster(tmp_path_factory.mktemp("cluster"), upstream)
    yield started
    started.close()
