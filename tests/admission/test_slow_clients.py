"""What a slow or hostile connection costs the server before and during its TLS handshake (issue 23,
item 3): the handshake deadline runs from accept (a client that never sends a ClientHello, or
stalls inside one, is closed and counted), a connection that ends before its first byte gives
its slot back, an idle one can be evicted before it has any TLS state, no TLS session tickets are
sent (the API server never resumes a session), and an accept() error is one log line, not a
traceback per connection. Real servers on loopback with real TLS; outcomes waited on, not timed."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import ssl
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import trustme

from mpigate._build import module_builds
from mpigate.admission.client import make_review
from mpigate.admission.eventloop import loop_name
from mpigate.admission.guard import _TLSProtocol

from .conftest import BASE_ORG, StartWebhook, trainjob, wait_for
from .serve_process import ServeProcess
from .test_faults import head, raw_request, status_and_body
from .test_limits import closed_by_server, connect

REVIEW = json.dumps(make_review(trainjob(), uid="slow-1")).encode()


async def review_from(server: ServeProcess, source: str) -> tuple[int, dict[str, Any]]:
    reader, writer = await connect(server, source=source)
    writer.write(head("/validate", len(REVIEW)) + REVIEW)
    try:
        return status_and_body(await closed_by_server(reader))
    finally:
        writer.close()


def address(server_url: str) -> tuple[str, int]:
    host, port = server_url.removeprefix("https://").rsplit(":", 1)
    return host, int(port)


async def tcp_only(url: str, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection that sends nothing (no ClientHello)."""
    host, port = address(url)
    return await asyncio.open_connection(host, port, local_addr=(source, 0))


def client_hello() -> bytes:
    """The first flight of a real TLS client."""
    ctx = ssl.create_default_context()
    outgoing = ssl.MemoryBIO()
    tls = ctx.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def metric(server: ServeProcess, name: str) -> float:
    answer = await raw_request(
        server.url, server.client_ssl, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b""
    )
    for line in answer.decode().splitlines():
        if line.startswith(name + " "):  # name with its labels, as exposed
            return float(line.rpartition(" ")[2])
    return 0.0


@pytest.mark.slow
async def test_a_connection_that_never_sends_a_client_hello_is_closed_at_the_handshake_deadline(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    server = await ServeProcess(ca, tmp_path, "--config", str(BASE_ORG), "--handshake-timeout", "1s").start()
    serving.append(server)
    reader, writer = await tcp_only(server.url)
    assert await closed_by_server(reader) == b""
    timeout = await server.wait_event("connection_timeout", phase="handshake")
    assert timeout["client"] == "127.0.0.1"
    writer.close()
    assert await metric(server, 'mpigate_admission_connection_timeouts_total{phase="handshake"}') == 1
    status, body = await review_from(server, "127.0.0.1")
    assert status == 200 and body["response"]["uid"] == "slow-1"
    assert await server.stop() == 0
    assert server.tracebacks() == []


@pytest.mark.slow
async def test_a_client_that_stalls_inside_its_handshake_is_closed_at_the_deadline(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    """Half a ClientHello starts the TLS state; the deadline still holds (counted from accept)."""
    server = await ServeProcess(ca, tmp_path, "--config", str(BASE_ORG), "--handshake-timeout", "1s").start()
    serving.append(server)
    hello = client_hello()
    (length,) = struct.unpack("!H", hello[3:5])
    assert len(hello) == 5 + length  # one TLS record
    reader, writer = await tcp_only(server.url)
    writer.write(hello[: len(hello) // 2])
    assert await closed_by_server(reader) == b""
    await server.wait_event("connection_timeout", phase="handshake")
    writer.close()
    assert await metric(server, 'mpigate_admission_connection_timeouts_total{phase="handshake"}') == 1
    assert await server.stop() == 0
    assert server.tracebacks() == []


@pytest.mark.slow
async def test_connections_that_end_before_or_during_their_handshake_give_their_slot_back(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    """One slot in all, no eviction: a slot kept by any of these would leave the review queued
    until the handshake deadline (300 s) and the test would fail waiting for it."""
    server = await ServeProcess(
        ca, tmp_path, "--config", str(BASE_ORG), "--max-connections", "1", "--evict-after", "300s",
        "--handshake-timeout", "300s",
    ).start()  # fmt: skip
    serving.append(server)
    host, port = address(server.url)
    for i in range(30):
        sock = socket.create_connection((host, port))
        if i % 3 == 1:  # reset (RST) instead of a clean close
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif i % 3 == 2:  # not TLS at all: the handshake fails
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            with contextlib.suppress(OSError):
                await asyncio.wait_for(asyncio.to_thread(sock.recv, 1024), 60)
        sock.close()
    status, body = await asyncio.wait_for(review_from(server, "127.0.0.1"), 120)
    assert status == 200 and body["response"]["uid"] == "slow-1"
    assert await server.stop() == 0
    assert server.tracebacks() == []


@pytest.mark.slow
async def test_an_idle_connection_is_evicted_before_it_has_any_tls_state(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    """At its address's cap, a newcomer replaces the oldest connection that has not sent a byte."""
    server = await ServeProcess(
        ca, tmp_path, "--config", str(BASE_ORG), "--max-connections-per-client", "2",
        "--evict-after", "50ms", "--handshake-timeout", "300s",
    ).start()  # fmt: skip
    serving.append(server)
    idle = [await tcp_only(server.url) for _ in range(2)]
    await asyncio.sleep(0.2)  # both have now been slow for more than --evict-after
    status, body = await review_from(server, "127.0.0.1")
    assert status == 200 and body["response"]["uid"] == "slow-1"
    assert await closed_by_server(idle[0][0]) == b""
    evicted = await server.wait_event("connection_evicted", reason="per-client")
    assert evicted["client"] == "127.0.0.1"
    # the other one is still held, and still gets its TLS handshake when it starts one
    reader, writer = idle[1]
    await asyncio.wait_for(writer.start_tls(server.client_ssl, server_hostname="127.0.0.1"), 60)
    writer.write(head("/validate", len(REVIEW)) + REVIEW)
    status, _ = status_and_body(await closed_by_server(reader))
    assert status == 200
    writer.close()
    assert await server.stop() == 0
    assert server.tracebacks() == []


@pytest.mark.slow
async def test_the_server_sends_no_tls_session_tickets(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    """A TLS 1.3 server sends session tickets after the handshake unless told not to; the API
    server's webhook client never resumes (no ClientSessionCache), so they are wasted work."""
    server = await ServeProcess(ca, tmp_path, "--config", str(BASE_ORG)).start()
    serving.append(server)
    ctx = server.client_ssl
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    reader, writer = await connect(server, ctx=ctx)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await closed_by_server(reader)  # tickets, when sent, arrive before the answer
    assert status_and_body(answer)[0] == 200
    session = writer.get_extra_info("ssl_object").session
    assert session is None or not session.has_ticket
    writer.close()
    assert await server.stop() == 0


async def test_the_server_serves_tls_through_the_protocol_of_the_loop_it_runs_on(
    start_webhook: StartWebhook, client_ssl: ssl.SSLContext
) -> None:
    """On uvloop the guard puts uvloop's compiled TLS protocol under aiohttp, on asyncio's loop
    its own with the 16 KiB buffer — a server on uvloop serving through asyncio's interpreted TLS
    would cost the CPU uvloop is there to save."""
    server = await start_webhook()
    assert server.site is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_ssl)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    (held,) = [slot for slow in server.site._slow.values() for slot in slow]
    assert held.transport is not None
    protocol = held.transport.get_protocol()
    if loop_name(asyncio.get_running_loop()) == "uvloop":
        import uvloop.loop

        assert type(protocol) is uvloop.loop.SSLProtocol  # type: ignore[attr-defined]
    else:
        assert type(protocol) is _TLSProtocol and protocol.max_size == 16 * 1024
    writer.close()


@pytest.mark.slow
async def test_a_served_process_runs_on_the_loop_asked_for(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    loop = loop_name(asyncio.get_running_loop())
    server = await ServeProcess(ca, tmp_path, "--config", str(BASE_ORG)).start()  # --loop as the test's
    serving.append(server)
    assert (await server.wait_event("starting"))["loop"] == loop
    assert (
        status_and_body(
            await raw_request(server.url, server.client_ssl, head("/validate", len(REVIEW)), REVIEW)
        )[0]
        == 200
    )
    assert await server.stop() == 0


class _FailingAccepts:
    """The listening socket, whose next ``failures`` accept() calls fail with ``error``."""

    def __init__(self, sock: socket.socket, error: int, failures: int) -> None:
        self._sock = sock
        self._error = error
        self.failures = failures

    def accept(self) -> tuple[socket.socket, Any]:
        if self.failures:
            self.failures -= 1
            raise OSError(self._error, "Protocol error")
        return self._sock.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


async def test_an_accept_error_is_one_log_line_without_a_traceback(
    start_webhook: StartWebhook, client_ssl: ssl.SSLContext, caplog: pytest.LogCaptureFixture
) -> None:
    """accept(2) on Linux hands back a pending connection's network error (EPROTO, EPERM from a
    firewall, ...); each must not become an "Exception in callback" traceback, and the next
    connection is served."""
    server = await start_webhook()
    site = server.site
    assert site is not None and site._sock is not None
    site._sock = _FailingAccepts(site._sock, errno.EPROTO, 5)  # type: ignore[assignment]
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    try:
        with caplog.at_level(logging.WARNING, logger="mpigate.admission.guard"):
            answer = await raw_request(server.url, client_ssl, head("/validate", len(REVIEW)), REVIEW)
    finally:
        loop.set_exception_handler(None)
    status, body = status_and_body(answer)
    assert status == 200 and body["response"]["uid"] == "slow-1"
    assert unhandled == []
    failed = [r for r in caplog.records if getattr(r, "fields", {}).get("event") == "accept_failed"]
    assert len(failed) == 1, [r.getMessage() for r in caplog.records]
    assert failed[0].exc_info is None and "Protocol error" in failed[0].getMessage()
    refused = server.metrics.connections_refused.labels("error")._value.get()
    assert refused == 5


async def test_the_address_holding_fewest_connections_gets_its_tls_handshake_started_first(
    start_webhook: StartWebhook, client_ssl: ssl.SSLContext
) -> None:
    """40 newcomers from one address and then one from another arrive together (each with its
    ClientHello): handshakes start a bounded number per loop iteration, and the lone address's
    goes first although it came last; every one of them is served in the end."""
    server = await start_webhook()
    site = server.site
    assert site is not None
    started: list[str] = []
    start = site._start

    def record(slot: Any) -> None:
        started.append(slot.client)
        start(slot)

    site._start = record  # type: ignore[method-assign]
    host, port = address(server.url)
    hello = client_hello()
    # blocking sockets, opened without yielding to the loop: the server accepts them all at once
    heavy = [socket.create_connection((host, port), source_address=("127.0.0.2", 0)) for _ in range(40)]
    lone = socket.create_connection((host, port), source_address=("127.0.0.1", 0))
    for sock in [*heavy, lone]:
        sock.sendall(hello)
    await wait_for(lambda: len(started) == 41)
    assert started[0] == "127.0.0.1", started[:3]
    for sock in [*heavy, lone]:
        sock.close()
    # and a real client is answered afterwards
    answer = await raw_request(server.url, client_ssl, head("/validate", len(REVIEW)), REVIEW)
    assert status_and_body(answer)[0] == 200


@pytest.mark.skipif(
    module_builds()["mpigate.admission.slots"], reason="replaces a method of a compiled class"
)
async def test_a_deadline_sweep_that_starts_a_connection_keeps_the_earliest_deadline_armed() -> None:
    """A sweep's expiry can admit a queued newcomer, which starts a deadline of its own; the one
    timer must then still be armed for the earliest deadline left, not the newcomer's."""
    from mpigate.admission.slots import Deadlines

    now = time.monotonic()
    expired: list[str] = []

    def on_expiry(slot: Any) -> None:
        expired.append(slot)
        deadlines.start("newcomer", time.monotonic())  # type: ignore[arg-type]

    deadlines = Deadlines(10.0, on_expiry)
    armed: list[asyncio.TimerHandle] = []  # every timer it arms (the loop's own queue is private)
    arm = deadlines._arm

    def recording(when: float) -> None:
        arm(when)
        assert deadlines._timer is not None
        armed.append(deadlines._timer)

    deadlines._arm = recording  # type: ignore[method-assign]
    deadlines.start("late", now - 11.0)  # type: ignore[arg-type]
    deadlines.start("next", now - 5.0)  # type: ignore[arg-type]
    assert deadlines._timer is not None
    deadlines._timer.cancel()
    deadlines._fire()  # as the timer would
    assert expired == ["late"]
    assert deadlines._timer is not None
    assert deadlines._timer.when() <= now + 5.0 + 1.0  # "next" at now + 5 s, not "newcomer" at + 10 s
    pending = [h for h in armed if not h.cancelled()]
    assert pending == [deadlines._timer]  # one timer, none left behind to fire for nothing
    deadlines.close()
