"""Bounded resources under hostile clients (issue 23, item 3), against the real ``mpigate serve``
over TLS: read deadlines for headers and bodies, connection caps per client address and per
server, fairness between client addresses at the server's cap, and a bounded queue (backpressure)
when nothing can make room. Outcomes, not timings: deadlines are generous, and the ages that
decide an eviction are either far apart (300 s) or ensured by waiting past them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from mpigate.admission.client import make_review

from .conftest import BASE_ORG, trainjob
from .serve_process import ServeProcess
from .test_faults import head, raw_request, status_and_body

pytestmark = pytest.mark.slow

REVIEW = json.dumps(make_review(trainjob(), uid="limits-1")).encode()


async def connect(
    server: ServeProcess, source: str = "127.0.0.1", ctx: ssl.SSLContext | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = server.url.removeprefix("https://").rsplit(":", 1)
    return await asyncio.open_connection(
        host, int(port), ssl=ctx or server.client_ssl, server_hostname=host, local_addr=(source, 0)
    )


async def refused(server: ServeProcess, source: str = "127.0.0.1") -> bool:
    """Whether a new connection is closed before it can send anything."""
    try:
        reader, writer = await connect(server, source=source)
    except (ConnectionError, ssl.SSLError, OSError):
        return True  # closed during the TLS handshake
    answer = await closed_by_server(reader)
    writer.close()
    return answer == b""


async def closed_by_server(reader: asyncio.StreamReader, timeout: float = 60.0) -> bytes:
    """Everything the server sends until it closes the connection (fails after ``timeout``).

    The server aborts a connection that misses a deadline (no TLS close_notify with a peer that
    would not answer it): when bytes the client sent are still unread in the server's socket, the
    kernel answers the close with a reset instead of a FIN (RFC 2525 2.17), which the client reads
    as ConnectionResetError — as much a close by the server, with nothing sent, as an EOF."""
    received = bytearray()

    async def drain() -> None:
        while chunk := await reader.read(65536):
            received.extend(chunk)

    # what arrived before a reset is kept: a test that expects nothing still sees it
    with contextlib.suppress(ConnectionResetError):
        await asyncio.wait_for(drain(), timeout)
    return bytes(received)


async def test_a_client_that_trickles_its_headers_is_cut_off(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    server = await ServeProcess(ca, tmp_path, "--config", str(BASE_ORG), "--header-timeout", "1s").start()
    serving.append(server)
    reader, writer = await connect(server)
    request = head("/validate", len(REVIEW))

    async def trickle() -> None:  # one byte every 100 ms: each byte alone would reset an idle timer
        for byte in request:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.1)

    sending = asyncio.create_task(trickle())
    try:
        assert await closed_by_server(reader) == b""
    finally:
        sending.cancel()
    assert not sending.done() or sending.cancelled()
    await server.wait_event("connection_timeout", phase="headers")
    good = await raw_request(server.url, server.client_ssl, head("/validate", len(REVIEW)), REVIEW)
    assert status_and_body(good)[0] == 200
    assert await server.stop() == 0
    assert server.tracebacks() == []


async def test_a_client_that_sends_half_a_body_gets_408_and_is_closed(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    server = await ServeProcess(ca, tmp_path, "--config", str(BASE_ORG), "--body-timeout", "1s").start()
    serving.append(server)
    reader, writer = await connect(server)
    writer.write(head("/validate", len(REVIEW)) + REVIEW[:50])
    answer = await closed_by_server(reader)
    status, body = status_and_body(answer)
    assert status == 408 and "body" in body["message"], body
    await server.wait_event("bad_request", reason="body-timeout")
    assert await server.stop() == 0
    assert server.tracebacks() == []


async def test_the_per_client_cap_refuses_the_extra_connection_while_others_are_answered(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    server = await ServeProcess(
        ca,
        tmp_path,
        "--config",
        str(BASE_ORG),
        "--max-connections-per-client",
        "2",
        "--header-timeout",
        "300s",
        "--evict-after",
        "300s",
    ).start()
    serving.append(server)
    held = [await connect(server) for _ in range(2)]  # two idle connections from 127.0.0.1
    assert await refused(server)  # a third one from 127.0.0.1
    refusal = await server.wait_event("connection_refused")
    assert refusal["client"] == "127.0.0.1"
    # another address is answered while 127.0.0.1 holds its two connections
    reader, writer = await connect(server, source="127.0.0.2")
    writer.write(head("/validate", len(REVIEW)) + REVIEW)
    status, body = status_and_body(await closed_by_server(reader))
    assert status == 200 and body["response"]["uid"] == "limits-1"
    for _, w in held:
        w.close()
    assert await server.stop() == 0
    assert server.tracebacks() == []


async def test_at_the_server_cap_the_longest_idle_connection_makes_room(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    server = await ServeProcess(
        ca, tmp_path, "--config", str(BASE_ORG), "--max-connections", "2", "--header-timeout", "300s"
    ).start()
    serving.append(server)
    held = [await connect(server, source=f"127.0.0.{i + 2}") for i in range(2)]  # idle: no request
    good = await raw_request(server.url, server.client_ssl, head("/validate", len(REVIEW)), REVIEW)
    status, body = status_and_body(good)
    assert status == 200 and body["response"]["uid"] == "limits-1"
    await server.wait_event("connection_evicted")
    assert await closed_by_server(held[0][0]) == b""  # the oldest idle one was closed
    for _, writer in held:
        writer.close()
    assert await server.stop() == 0
    assert server.tracebacks() == []


async def test_at_the_server_cap_with_every_connection_busy_newcomers_wait_in_the_backlog(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    server = await ServeProcess(
        ca, tmp_path, "--config", str(BASE_ORG), "--max-connections", "2",
        "--body-timeout", "300s", "--evict-after", "300s",
    ).start()  # fmt: skip
    serving.append(server)
    held = [await connect(server, source=f"127.0.0.{i + 2}") for i in range(2)]
    for _, writer in held:  # requests in progress: their bodies are late
        writer.write(head("/validate", len(REVIEW)) + REVIEW[:10])
    waiting = asyncio.create_task(
        raw_request(server.url, server.client_ssl, head("/validate", len(REVIEW)), REVIEW)
    )
    done, _ = await asyncio.wait([waiting], timeout=2)  # only gives a wrongly admitted one a chance
    assert not done
    held[0][1].write(REVIEW[10:])  # one request completes and its connection closes
    status, _ = status_and_body(await closed_by_server(held[0][0]))
    assert status == 200
    status, body = status_and_body(await asyncio.wait_for(waiting, 60))
    assert status == 200 and body["response"]["uid"] == "limits-1"
    held[1][1].close()
    assert await server.stop() == 0
    assert server.tracebacks() == []


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def slow_clients(server: ServeProcess, count: int, sources: list[str]) -> list[Connection]:
    """``count`` TLS connections spread over ``sources``, each with half a request's headers."""
    held = []
    for i in range(count):
        reader, writer = await connect(server, source=sources[i % len(sources)])
        writer.write(b"POST /validate HTTP/1.1\r\nHost: mpigate\r\n")
        held.append((reader, writer))
    return held


async def review_from(server: ServeProcess, source: str) -> tuple[int, dict[str, Any]]:
    reader, writer = await connect(server, source=source)
    writer.write(head("/validate", len(REVIEW)) + REVIEW)
    try:
        return status_and_body(await closed_by_server(reader))
    finally:
        writer.close()


async def test_a_newcomer_from_another_address_is_answered_while_one_address_fills_the_server(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    """The API server's address is not crowded out by a tenant's: at the server's cap, a newcomer
    from an address holding fewer connections takes the place of the heaviest address's oldest
    slow one — here none is old enough (300 s) to make room otherwise."""
    server = await ServeProcess(
        ca, tmp_path, "--config", str(BASE_ORG), "--max-connections", "8",
        "--max-connections-per-client", "8", "--evict-after", "300s", "--header-timeout", "300s",
    ).start()  # fmt: skip
    serving.append(server)
    hostile = await slow_clients(server, 8, ["127.0.0.2"])
    status, body = await review_from(server, "127.0.0.1")
    assert status == 200 and body["response"]["uid"] == "limits-1"
    evicted = await server.wait_event("connection_evicted")
    assert evicted["client"] == "127.0.0.2" and evicted["reason"] == "cap"
    # the first of the slow ones was closed; a second review from 127.0.0.1 makes room again
    assert await closed_by_server(hostile[0][0]) == b""
    status, _ = await review_from(server, "127.0.0.1")
    assert status == 200
    for _, writer in hostile:
        writer.close()
    assert await server.stop() == 0
    assert server.tracebacks() == []


async def test_a_newcomer_from_the_heaviest_address_waits_and_is_closed_at_the_handshake_deadline(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    """No fair share to claim and nothing slow long enough: the newcomer waits in the queue, and
    is closed there when the handshake deadline passes (not held forever)."""
    server = await ServeProcess(
        ca, tmp_path, "--config", str(BASE_ORG), "--max-connections", "2", "--evict-after", "300s",
        "--header-timeout", "300s", "--handshake-timeout", "1s",
    ).start()  # fmt: skip
    serving.append(server)
    held = await slow_clients(server, 2, ["127.0.0.2"])
    # queued, it gets no TLS handshake; the server closes it at the handshake deadline
    assert await asyncio.wait_for(refused(server, source="127.0.0.2"), 60)
    timeout = await server.wait_event("connection_timeout", phase="queue")
    assert timeout["client"] == "127.0.0.2"
    for _, writer in held:
        writer.close()
    assert await server.stop() == 0
    assert server.tracebacks() == []


async def test_at_its_own_cap_an_address_replaces_its_oldest_slow_connection(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    """All clients on one address (no fairness to apply): a newcomer takes the place of the
    address's connection slow the longest, once that one has been slow for --evict-after."""
    server = await ServeProcess(
        ca, tmp_path, "--config", str(BASE_ORG), "--max-connections-per-client", "3",
        "--evict-after", "50ms", "--header-timeout", "300s",
    ).start()  # fmt: skip
    serving.append(server)
    held = await slow_clients(server, 3, ["127.0.0.1"])
    await asyncio.sleep(0.2)  # every held one has now been slow for more than --evict-after
    status, body = await review_from(server, "127.0.0.1")
    assert status == 200 and body["response"]["uid"] == "limits-1"
    evicted = await server.wait_event("connection_evicted", reason="per-client")
    assert evicted["client"] == "127.0.0.1"
    assert await closed_by_server(held[0][0]) == b""  # the oldest went
    for _, writer in held:
        writer.close()
    assert await server.stop() == 0
    assert server.tracebacks() == []


async def test_reviews_are_answered_while_hundreds_of_slow_clients_are_held(
    ca: trustme.CA, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    """Under the default caps, slow clients from tenant addresses are simply held (a held TLS
    connection is small), and a newcomer from the API server's address is answered next to
    them without closing any of them."""
    server = await ServeProcess(ca, tmp_path, "--config", str(BASE_ORG), "--header-timeout", "300s").start()
    serving.append(server)
    hostile = await slow_clients(server, 300, [f"127.0.0.{i}" for i in range(2, 8)])
    for _ in range(3):
        status, body = await review_from(server, "127.0.0.1")
        assert status == 200 and body["response"]["uid"] == "limits-1"
    metrics = await raw_request(
        server.url, server.client_ssl, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b""
    )
    held = [
        line
        for line in metrics.decode().splitlines()
        if line.startswith("mpigate_admission_connections_open")
    ]
    assert held and float(held[0].split()[-1]) >= 300, held
    assert not any(e.get("event") == "connection_evicted" for e in server.events)
    for _, writer in hostile:
        writer.close()
    assert await server.stop() == 0
    assert server.tracebacks() == []


async def test_a_server_that_aborts_with_unread_bytes_counts_as_closed() -> None:
    # The cause of a flaky failure of test_a_client_that_trickles_its_headers_is_cut_off: a byte
    # that reached the server after its last read turns its abort into a reset. Here the server
    # never reads, so its close is always a reset; closed_by_server sees a close with nothing sent.
    accepted: asyncio.Future[socket.socket] = asyncio.get_running_loop().create_future()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)

    async def accept() -> None:
        conn, _ = await asyncio.get_running_loop().sock_accept(listener)
        accepted.set_result(conn)

    task = asyncio.create_task(accept())
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
    try:
        writer.write(b"GET / HTTP/1.1\r\n")
        await writer.drain()
        conn = await asyncio.wait_for(accepted, 60)
        while not select.select([conn], [], [], 60)[0]:  # the bytes are in the server's socket
            pass
        conn.close()  # unread bytes: the kernel sends a reset
        assert await closed_by_server(reader) == b""
    finally:
        task.cancel()
        writer.close()
        listener.close()
