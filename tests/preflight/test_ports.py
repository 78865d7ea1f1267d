"""Before a local launch: busy pinned ports are found and named with their process; a free window
is picked at run time; ``mpigate preflight --local`` refuses busy ranges with the culprit."""

from __future__ import annotations

import dataclasses
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpigate.cli import cli
from mpigate.config import Config
from mpigate.config.model import NetworkProfile
from mpigate.preflight.ports import (
    busy_ports,
    describe_busy,
    ephemeral_range,
    free_window,
    launch_ranges,
    move_ranges,
)
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc")


@pytest.fixture
def profile(example_org: Config) -> NetworkProfile:
    return example_org.network_profiles["pinned-ports"]


@pytest.fixture
def free(profile: NetworkProfile, _one_mpirun_at_a_time: None) -> NetworkProfile:
    """The example org's ranges moved to a window nothing holds right now (under the lock that
    real mpiruns of parallel test runs take, so that none of them binds it meanwhile)."""
    return free_window(profile)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket of this process (its port is set by the test)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    yield sock
    sock.close()


def _listen(sock: socket.socket, port: int) -> None:
    sock.bind(("0.0.0.0", port))
    sock.listen()


def test_move_keeps_sizes_and_distance(profile: NetworkProfile) -> None:
    moved = move_ranges(profile, 20000)
    assert launch_ranges(moved) == (("BTL", 20000, 20099), ("OOB", 20200, 20210))
    assert dataclasses.replace(moved, btl_port_min=40000, oob_port_min=40200, oob_port_max=40210) == profile
    with pytest.raises(ValueError, match="outside 1024-65535"):
        move_ranges(profile, 65400)


def test_free_window_is_free_and_below_the_ephemeral_range(free: NetworkProfile) -> None:
    assert busy_ports(launch_ranges(free)) == []
    assert max(high for _, _, high in launch_ranges(free)) < ephemeral_range()[0]


def test_a_listener_in_the_oob_range_is_named_with_its_process(
    free: NetworkProfile, listener: socket.socket
) -> None:
    _listen(listener, free.oob_port_min)

    [busy] = busy_ports(launch_ranges(free))

    assert (busy.port, busy.pid, busy.entry.state) == (free.oob_port_min, os.getpid(), "LISTEN")
    assert busy.process == Path("/proc/self/comm").read_text().strip()
    assert busy.describe() == (
        f"port {free.oob_port_min} (OOB {free.oob_port_min}-{free.oob_port_max}) is in use by "
        f"{busy.process}[{os.getpid()}]: ipv4 LISTEN 0.0.0.0:{free.oob_port_min}"
    )


def test_a_connection_from_a_pinned_port_counts(free: NetworkProfile, listener: socket.socket) -> None:
    """Not only listeners: an outgoing connection bound to a BTL port blocks the BTL's bind too."""
    _listen(listener, 0)
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        client.bind(("127.0.0.1", free.btl_port_min + 7))
        client.connect(listener.getsockname())
        busy = busy_ports(launch_ranges(free))
        assert [(b.port, b.entry.state, b.pid) for b in busy] == [
            (free.btl_port_min + 7, "ESTABLISHED", os.getpid())
        ]
        assert "(BTL " in busy[0].describe() and "->" in busy[0].describe()
    finally:
        client.close()


def test_a_closed_connection_in_time_wait_does_not_count(
    free: NetworkProfile, listener: socket.socket
) -> None:
    """OpenMPI binds with SO_REUSEADDR: the previous run's TIME_WAITs do not stop the next run."""
    port = free.btl_port_min + 3
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as OpenMPI's BTL listener
    _listen(listener, port)
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server end closes first: its port goes to TIME_WAIT
    client.close()
    listener.close()
    table = Path("/proc/net/tcp").read_text()
    assert f":{port:04X} " in table and " 06 " in table  # the TIME_WAIT is there ...
    assert busy_ports(launch_ranges(free)) == []  # ... and is not a busy port
    with socket.socket() as again:  # as OpenMPI's listener: SO_REUSEADDR, then bind
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _listen(again, port)


@pytest.mark.usefixtures("_one_mpirun_at_a_time")
def test_free_window_skips_a_busy_window(profile: NetworkProfile, listener: socket.socket) -> None:
    first = free_window(profile, rng=random.Random(7))
    _listen(listener, first.btl_port_min + 50)

    second = free_window(profile, rng=random.Random(7))  # the same start: the busy one comes first

    assert second.btl_port_min != first.btl_port_min
    assert busy_ports(launch_ranges(second)) == []


def test_describe_busy_shows_the_first_and_counts_the_rest(
    free: NetworkProfile, listener: socket.socket
) -> None:
    _listen(listener, free.oob_port_min)
    busy = busy_ports(launch_ranges(free)) * 12
    lines = describe_busy(busy, limit=10)
    assert len(lines) == 11 and lines[-1] == "... and 2 more"


def test_cli_refuses_busy_ranges_and_names_the_process(free: NetworkProfile, listener: socket.socket) -> None:
    """Before: mpirun was started anyway and failed with 'No sockets were able to be opened'."""
    _listen(listener, free.oob_port_min)
    base = min(free.btl_port_min, free.oob_port_min)

    result = CliRunner().invoke(
        cli, ["preflight", "--local", "-np", "2", "--config", str(REPO), "--port-base", str(base)]
    )

    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        f"error: the pinned ranges (BTL {free.btl_port_min}-{free.btl_port_min + 99}, "
        f"OOB {free.oob_port_min}-{free.oob_port_max}) are not free on this machine:"
    )
    assert lines[1].startswith(f"  port {free.oob_port_min} (OOB ") and f"[{os.getpid()}]" in lines[1]
    assert "--port-base auto" in lines[2]


@pytest.mark.parametrize(
    ("value", "message"),
    [("x", "a port number or 'auto'"), ("80", "between 1024 and 65535"), ("65500", "outside 1024-65535")],
)
def test_cli_port_base_errors(value: str, message: str) -> None:
    result = CliRunner().invoke(cli, ["preflight", "--local", "--config", str(REPO), "--port-base", value])
    assert result.exit_code == 2 and message in result.output, result.output


def test_cli_port_base_needs_a_pinning_profile() -> None:
    result = CliRunner().invoke(
        cli, ["preflight", "--local", "--config", str(REPO), "--profile", "isolated", "--port-base", "auto"]
    )
    assert result.exit_code == 2 and "profile 'isolated' pins no ports" in result.output, result.output


def test_free_window_prefers_a_window_without_time_waits(profile: NetworkProfile, tmp_path: Path) -> None:
    """A TIME_WAIT left by a socket without SO_REUSEADDR refuses even a SO_REUSEADDR bind (a test
    binding such a window failed with 'Address already in use' while parallel runs left them)."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "sys" / "net" / "ipv4").mkdir(parents=True)
    (proc / "sys" / "net" / "ipv4" / "ip_local_port_range").write_text("32768\t60999\n")
    header = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    )
    (proc / "net" / "tcp").write_text(header)
    first = free_window(profile, proc=proc, rng=random.Random(7))
    port = first.btl_port_min + 3
    (proc / "net" / "tcp").write_text(
        header
        + f"   0: 0100007F:{port:04X} 0100007F:9C40 06 00000000:00000000 03:00000000 00000000"
        + "     0        0 0 3 0\n"
    )
    assert busy_ports(launch_ranges(first), proc) == []  # not busy for the check before a launch ...
    second = free_window(profile, proc=proc, rng=random.Random(7))  # ... but not chosen either
    assert second.btl_port_min != first.btl_port_min
