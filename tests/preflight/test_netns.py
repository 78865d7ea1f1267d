"""Virtual pods: two sets on one machine at the same time (parallel test runs) never share a subnet."""

from __future__ import annotations

import os
import socket
import subprocess

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


@pytest.mark.usefixtures("netns")
def test_each_pod_has_its_own_hostname_and_an_empty_environment() -> None:
    """OpenMPI names its session directories after the node: daemons of different pods that
    shared the launcher's hostname raced to create the same ones ("mkdir ... File exists")."""
    with VirtualPods(2) as pods:
        assert pods.agent is not None
        seen = []
        for address in pods.addresses:
            done = subprocess.run(
                [str(pods.agent), "-x", address, "hostname; echo HOME=$HOME; env | wc -l"],
                env={**os.environ, "LEAK": "1"},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            name, home, count = done.stdout.split()
            seen.append(name)
            assert home == f"HOME={os.environ.get('HOME', '/')}"
            assert int(count) <= 4, done.stdout  # PATH, HOME, PWD, SHLVL: nothing of ours leaks
        assert len(set(seen)) == 2, seen
        assert socket.gethostname() not in seen
        assert socket.gethostname() == _root_hostname()


def _root_hostname() -> str:
    return subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
