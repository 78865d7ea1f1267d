"""Bounded resources under hostile clients (issue 23, item 3), against the real ``mpigate serve``
over TLS: read deadlines for headers and bodies, connection caps per client address and per
server (backpressure, not refusal, at the server's cap)."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path

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


async def refused(server: ServeProcess) -> bool:
    """Whether a new connection is closed before it can send anything."""
    try:
        reader, writer = await connect(server)
    except (ConnectionError, ssl.SSLError, OSError):
        return True  # closed during the TLS handshake
    answer = await closed_by_server(reader)
    writer.close()
    return answer == b""


async def closed_by_server(reader: asyncio.StreamReader, timeout: float = 60.0) -> bytes:
    """Everything the server sends until it closes the connection (fails after ``timeout``)."""
    return await asyncio.wait_for(reader.read(), timeout)


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
