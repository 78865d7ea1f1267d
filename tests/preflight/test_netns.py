"""Virtual pods: two sets on one machine at the same time (parallel test runs) never share a subnet."""

from __future__ import annotations

import pytest

from mpigate.preflight import VirtualPods


@pytest.mark.usefixtures("netns")
def test_two_sets_whose_tags_map_to_one_subnet_get_different_subnets() -> None:
    # 263 % 256 == 7: before, both took 198.18.7.0/24 and the root namespace had two routes to it.
    with VirtualPods(1, tag="00007") as first, VirtualPods(1, tag="00263") as second:
        subnets = {first.launcher_address.rsplit(".", 1)[0], second.launcher_address.rsplit(".", 1)[0]}
        assert len(subnets) == 2, (first.launcher_address, second.launcher_address)
        assert first.addresses[0].startswith(first.launcher_address.rsplit(".", 1)[0] + ".")
        assert second.addresses[0].startswith(second.launcher_address.rsplit(".", 1)[0] + ".")
