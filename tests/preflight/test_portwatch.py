"""The /proc socket sampler: table parsing (fixture + properties) and live sockets of real processes."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from mpigate.preflight.portwatch import TCP_STATES, PortSampler, parse_tcp_table, process_tree, sample_once

pytestmark = pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc")


def test_parses_the_kernel_tables(fixtures_dir: Path) -> None:
    data = yaml.safe_load((fixtures_dir / "proc_net.yaml").read_text())
    for table, family in (("tcp", "ipv4"), ("tcp6", "ipv6")):
        rows = parse_tcp_table(data[table], family)  # type: ignore[arg-type]
        got = [
            [e.local_address, e.local_port, e.remote_address, e.remote_port, e.state, e.inode] for e in rows
        ]
        assert got == data["expected"][table]
        assert {e.family for e in rows} == {family}


def _encode(address: str) -> str:
    """Independent encoder: the kernel prints each 32-bit word in host (little-endian) order."""
    packed = ipaddress.ip_address(address).packed
    return "".join(
        int.from_bytes(packed[i : i + 4], "big").to_bytes(4, "little").hex().upper()
        for i in range(0, len(packed), 4)
    )


ports = st.integers(min_value=0, max_value=65535)
v4 = st.ip_addresses(v=4).map(str)
v6 = st.ip_addresses(v=6).filter(lambda a: a.ipv4_mapped is None).map(str)


@given(
    rows=st.lists(
        st.tuples(v4, ports, v4, ports, st.sampled_from(sorted(TCP_STATES)), st.integers(0, 2**32)),
        max_size=8,
    )
)
def test_ipv4_rows_round_trip(rows: list[tuple[str, int, str, int, int, int]]) -> None:
    text = "  sl  local_address rem_address   st ...\n" + "".join(
        f"  {i}: {_encode(la)}:{lp:04X} {_encode(ra)}:{rp:04X} {st_:02X} 0:0 00:0 0 0 0 {ino} 1 0\n"
        for i, (la, lp, ra, rp, st_, ino) in enumerate(rows)
    )
    parsed = parse_tcp_table(text, "ipv4")
    assert [(e.local_address, e.local_port, e.remote_address, e.remote_port, e.inode) for e in parsed] == [
        (la, lp, ra, rp, ino) for la, lp, ra, rp, _, ino in rows
    ]
    assert [e.state for e in parsed] == [TCP_STATES[r[4]] for r in rows]


@given(local=v6, remote=v6, lport=ports, rport=ports)
def test_ipv6_rows_round_trip(local: str, remote: str, lport: int, rport: int) -> None:
    text = f"header\n 0: {_encode(local)}:{lport:04X} {_encode(remote)}:{rport:04X} 0A 0:0 0:0 0 0 0 7 1\n"
    [entry] = parse_tcp_table(text, "ipv6")
    assert (entry.local_address, entry.local_port, entry.remote_address, entry.remote_port) == (
        local,
        lport,
        remote,
        rport,
    )
    assert entry.state == "LISTEN"


@pytest.fixture
def connected_pair() -> Iterator[tuple[socket.socket, socket.socket, socket.socket]]:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        yield server, client, accepted
    finally:
        for s in (accepted, client, server):
            s.close()


def test_sample_once_sees_this_process_sockets(
    connected_pair: tuple[socket.socket, socket.socket, socket.socket],
) -> None:
    server, client, _ = connected_pair
    port = server.getsockname()[1]
    client_port = client.getsockname()[1]
    seen = {(s.state, s.local_port, s.remote_port) for s in sample_once([os.getpid()]) if s.family == "ipv4"}
    assert ("LISTEN", port, 0) in seen
    assert ("ESTABLISHED", client_port, port) in seen  # the client end
    assert ("ESTABLISHED", port, client_port) in seen  # the accepted end
    # A process that holds no sockets contributes nothing, and neither does a pid that is gone.
    idle = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert sample_once([idle.pid]) == set()
    finally:
        idle.communicate(b"")
    assert sample_once([idle.pid]) == set()


@pytest.mark.skipif(not socket.has_ipv6, reason="Python built without IPv6")
def test_sample_once_sees_ipv6_listeners() -> None:
    try:
        server = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError as exc:
        pytest.skip(f"IPv6 loopback unavailable here: {exc}")
    with server:
        port = server.getsockname()[1]
        mine = [s for s in sample_once([os.getpid()]) if s.local_port == port]
    assert [(s.family, s.local_address, s.state, s.loopback_only) for s in mine] == [
        ("ipv6", "::1", "LISTEN", True)
    ]


GRANDCHILD = textwrap.dedent(
    """
    import socket, subprocess, sys
    if sys.argv[1:] == ["child"]:
        s = socket.create_server(("0.0.0.0", 0))
        print(s.getsockname()[1], flush=True)
        sys.stdin.readline()
    else:
        p = subprocess.Popen([sys.executable, __file__, "child"], stdin=sys.stdin)
        p.wait()
    """
)


def test_sampler_follows_the_whole_process_tree(tmp_path: Path) -> None:
    script = tmp_path / "tree.py"
    script.write_text(GRANDCHILD)
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None and parent.stdin is not None
    try:
        port = int(parent.stdout.readline())
        with PortSampler(parent.pid, interval=0.01) as sampler:
            deadline = time.monotonic() + 60
            while not any(s.local_port == port for s in sampler) and time.monotonic() < deadline:
                time.sleep(0.01)
            tree = process_tree(parent.pid)
        observed, processes = sampler.snapshot()
    finally:
        parent.stdin.write("\n")
        parent.stdin.close()
        parent.wait(timeout=60)
    [listener] = [s for s in observed if s.local_port == port]
    assert listener.state == "LISTEN" and listener.local_address == "0.0.0.0"
    assert listener.pid != parent.pid and listener.pid in tree  # the grandchild holds it
    assert parent.pid in tree and len(tree) == 2
    assert set(tree) <= set(processes)
    assert sampler.samples >= 1
    assert process_tree(parent.pid) == set()  # gone after exit
