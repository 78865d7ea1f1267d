"""Fixtures of the client tests: one cluster (install base, webhook, API server emulator) per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import upstream_dir

from .cluster import Cluster, start_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    upstream = upstream_dir()
    if upstream is None:
        pytest.skip("upstream Trainer CRDs not found at ../shared/upstream (set MPIGATE_UPSTREAM)")
    started = start_cluster(tmp_path_factory.mktemp("cluster"), upstream)
    yield started
    started.close()
