"""The webhook's fast path (mpigate.admission.fastpath): which requests it answers itself, which it
hands to aiohttp with every byte it read, and that a review gets the same answer either way.

The protocol tests drive a :class:`ReviewConnection` with a recording transport and guard; the
server tests send raw HTTP over real TLS to a webhook on loopback."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import pytest

from mpigate._build import module_builds
from mpigate.admission.client import make_review
from mpigate.admission.fastpath import RequestIds, ReviewConnection, ReviewRoutes
from mpigate.admission.guard import ConnectionLimits, RateLimitedLog
from mpigate.admission.recorder import MemoryRecorder
from mpigate.admission.reload import ConfigStore
from mpigate.admission.server import WebhookServer
from mpigate.admission.service import AdmissionService, ServiceSettings

from .conftest import BASE_ORG, StartWebhook, trainjob, wait_for
from .stub_engine import stub_evaluate

REVIEW = json.dumps(make_review(trainjob(), uid="fast-1")).encode()


def request(body: bytes = REVIEW, *, path: str = "/validate?timeout=10s", extra: str = "") -> bytes:
    """A review as Go's net/http client sends it (the API server's webhook client)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: mpigate.mpigate-system.svc:443\r\n"
        "User-Agent: kube-apiserver-admission\r\n"
        f"Content-Length: {len(body)}\r\nAccept: application/json, */*\r\n"
        f"Content-Type: application/json\r\n{extra}Accept-Encoding: gzip\r\n\r\n"
    )
    return head.encode() + body


class Transport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.protocol: Any = None
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Handler:
    """aiohttp's handler, as far as a handover reaches it."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.data = bytearray()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data


class Slot:
    client = "127.0.0.1"

    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class Guard:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.handler: Handler | None = None

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any) -> None:
            self.calls.append(name)

        return record

    def fallback(self, slot: Any) -> Handler:
        self.calls.append("fallback")
        self.handler = Handler()
        return self.handler


async def connection(
    max_body: int = 1 << 20, body_timeout: float = 30.0, settings: ServiceSettings | None = None
) -> tuple[ReviewConnection, Transport, Guard]:
    store = ConfigStore(BASE_ORG)
    assert await store.load_now() is not None
    service = AdmissionService(store, evaluator=stub_evaluate, mutator=stub_evaluate, settings=settings)
    routes = ReviewRoutes(
        service,
        max_body=max_body,
        body_timeout=body_timeout,
        request_ids=RequestIds(),
        bad_log=RateLimitedLog(__import__("logging").getLogger("test")),
    )
    guard = Guard()
    conn = ReviewConnection(routes, guard, Slot())
    transport = Transport()
    conn.connection_made(transport)
    return conn, transport, guard


def answers(written: bytes) -> list[tuple[int, dict[str, str], dict[str, Any]]]:
    """The HTTP answers in ``written``: status, headers, JSON body."""
    out = []
    rest = bytes(written)
    while rest:
        head, _, rest = rest.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        length = int(headers["Content-Length"])
        body, rest = rest[:length], rest[length:]
        out.append((int(lines[0].split(" ")[1]), headers, json.loads(body)))
    return out


async def test_a_review_as_the_api_server_sends_it_is_answered_on_the_fast_path() -> None:
    conn, transport, guard = await connection()
    conn.data_received(request(extra="X-Request-Id: trace-7\r\n"))
    await wait_for(lambda: transport.written)
    [(status, headers, body)] = answers(transport.written)
    assert status == 200 and body["response"]["uid"] == "fast-1"
    assert headers["X-Request-Id"] == "trace-7" and headers["Content-Type"] == "application/json"
    assert "fallback" not in guard.calls and not transport.closed
    # the connection's deadlines: headers met, the request in, answered, then idle
    assert guard.calls[-4:] == ["headers_in", "request_in", "answered", "idle"]


async def test_a_head_and_body_in_pieces_and_pipelined_reviews_are_answered_in_order() -> None:
    conn, transport, guard = await connection()
    data = request() + request(json.dumps(make_review(trainjob(), uid="fast-2")).encode())
    for i in range(0, len(data), 977):  # TLS records of any size
        conn.data_received(data[i : i + 977])
    await wait_for(lambda: len(answers(transport.written)) == 2)
    assert [a[2]["response"]["uid"] for a in answers(transport.written)] == ["fast-1", "fast-2"]
    assert "fallback" not in guard.calls


async def test_a_review_that_does_not_wait_is_answered_without_a_task() -> None:
    conn, transport, guard = await connection()
    tasks = len(asyncio.all_tasks())
    conn.data_received(request() + request(json.dumps(make_review(trainjob(), uid="fast-2")).encode()))
    # answered within data_received: no task made, none scheduled
    assert [a[2]["response"]["uid"] for a in answers(transport.written)] == ["fast-1", "fast-2"]
    assert len(asyncio.all_tasks()) == tasks
    assert guard.calls[-4:] == ["headers_in", "request_in", "answered", "idle"] and not transport.closed
    conn.data_received(request(extra="Connection: close\r\n"))
    assert len(answers(transport.written)) == 3 and transport.closed


async def test_a_review_that_waits_is_answered_from_its_task() -> None:
    conn, transport, guard = await connection(settings=ServiceSettings(evaluate_in_thread=True))
    conn.data_received(request())
    assert not transport.written and guard.calls[-1] == "request_in"
    await wait_for(lambda: transport.written)
    [(status, _, body)] = answers(transport.written)
    assert status == 200 and body["response"]["uid"] == "fast-1"
    assert guard.calls[-2:] == ["answered", "idle"]


@pytest.mark.skipif(
    module_builds()["mpigate.admission.service"], reason="replaces a method of a compiled class"
)
async def test_a_review_that_waits_where_it_should_not_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    conn, transport, _ = await connection()
    conn._routes.service.recorder = MemoryRecorder()  # the audit record makes the review wait
    monkeypatch.setattr(AdmissionService, "inline", lambda self: True)  # ... which inline() denies
    conn.data_received(request())
    [(status, _, body)] = answers(transport.written)
    assert status == 500 and "internal error" in body["message"]
    assert any(getattr(r, "fields", {}).get("event") == "review_waited" for r in caplog.records)
    monkeypatch.undo()
    conn.data_received(request())  # the connection serves on
    await wait_for(lambda: len(answers(transport.written)) == 2)
    assert answers(transport.written)[1][0] == 200


async def test_reading_pauses_while_pipelined_requests_pile_up_behind_a_review() -> None:
    # a review that waits (on a worker thread): a service that does not is answered at once
    conn, transport, _ = await connection(settings=ServiceSettings(evaluate_in_thread=True))
    conn.data_received(request())  # being judged (its task has not run yet)
    count = 65536 // len(request()) + 2
    conn.data_received(request() * count)
    assert not transport.reading  # more than 64 KiB wait behind it: the rest stays in the kernel
    await wait_for(lambda: len(answers(transport.written)) == count + 1)
    assert transport.reading


async def test_a_client_that_does_not_read_its_answers_gets_no_more_of_them() -> None:
    conn, transport, _ = await connection()
    conn.data_received(request())
    await wait_for(lambda: answers(transport.written))
    conn.pause_writing()  # the transport's buffer is full: the client is not reading
    count = 65536 // len(request()) + 2
    conn.data_received(request() * count)
    await asyncio.sleep(0.2)  # a window in which a review would be answered: none may be
    assert len(answers(transport.written)) == 1 and not transport.reading
    conn.resume_writing()
    await wait_for(lambda: len(answers(transport.written)) == count + 1)
    assert transport.reading


HANDED_OVER = {
    "GET /readyz": b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n",
    "unknown path": request(path="/validate/"),
    "escaped path": request(path="/%76alidate"),
    "HTTP/1.0": request().replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    "chunked": request().replace(b"Content-Length:", b"Transfer-Encoding: chunked\r\nX-Length:"),
    "100-continue": request(extra="Expect: 100-continue\r\n"),
    "gzip": request(extra="Content-Encoding: gzip\r\n"),
    "two lengths": request(extra=f"Content-Length: {len(REVIEW)}\r\n"),
    "signed length": request().replace(b"Content-Length: ", b"Content-Length: +"),
    "no length": request().replace(b"Content-Length:", b"X-Length:"),
    "charset": request().replace(b"application/json", b"application/json; charset=utf-8"),
    "two types": request(extra="Content-Type: application/json\r\n"),
    "no type": request().replace(b"Content-Type:", b"X-Type:"),
    "folded line": request(extra="X-A: 1\r\n 2\r\n"),
    "space before colon": request(extra="X-A : 1\r\n"),
    "control character": request(extra="X-A: 1\x012\r\n"),
    "connection upgrade": request(extra="Connection: Upgrade\r\nUpgrade: h2c\r\n"),
    "bare LF": request().replace(b"\r\n", b"\n"),
    "long line": request(extra=f"X-A: {'a' * 9000}\r\n"),
    "too large": request(extra="").replace(
        f"Content-Length: {len(REVIEW)}".encode(), b"Content-Length: 99999999"
    ),
}


@pytest.mark.parametrize("name", HANDED_OVER)
async def test_anything_else_goes_to_aiohttp_with_every_byte_read(name: str) -> None:
    conn, transport, guard = await connection()
    data = HANDED_OVER[name]
    conn.data_received(data)
    assert guard.handler is not None, name
    assert bytes(guard.handler.data) == data and guard.handler.transport is transport
    assert transport.protocol is guard.handler and transport.written == b""


async def test_a_handover_after_answered_reviews_passes_on_only_the_next_request() -> None:
    conn, transport, guard = await connection()
    conn.data_received(request())
    await wait_for(lambda: transport.written)
    ready = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
    conn.data_received(request() + ready)
    await wait_for(lambda: guard.handler is not None)
    assert guard.handler is not None and bytes(guard.handler.data) == ready
    assert len(answers(transport.written)) == 2


async def test_a_head_that_never_ends_is_handed_over_past_the_limit() -> None:
    conn, _, guard = await connection()
    conn.data_received(b"POST /validate HTTP/1.1\r\n")
    for _ in range(70_000 // 16):
        conn.data_received(b"X-Padding: 12345")  # never a line end: a head with no end
        if guard.handler is not None:
            break
    assert guard.handler is not None and len(guard.handler.data) > 65536


async def test_a_body_that_never_comes_is_answered_408_and_closed() -> None:
    conn, transport, _ = await connection(body_timeout=0.2)
    conn.data_received(request()[:-10])
    await wait_for(lambda: transport.closed)
    [(status, headers, body)] = answers(transport.written)
    assert status == 408 and "did not arrive within its deadline" in body["message"]
    assert headers["Connection"] == "close"


async def test_connection_close_is_honoured() -> None:
    conn, transport, _ = await connection()
    conn.data_received(request(extra="Connection: close\r\n"))
    await wait_for(lambda: transport.closed)
    [(status, headers, _)] = answers(transport.written)
    assert status == 200 and headers["Connection"] == "close"


# ------------------------------------------------------------------------ a real server over TLS


async def exchange(server: WebhookServer, ctx: ssl.SSLContext, data: bytes, answers_expected: int) -> bytes:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=ctx, server_hostname="127.0.0.1"
    )
    writer.write(data)
    got = b""
    while got.count(b"HTTP/1.1 ") < answers_expected or not _complete(got):
        chunk = await asyncio.wait_for(reader.read(65536), 60)
        if not chunk:
            break
        got += chunk
    writer.close()
    return got


def _complete(got: bytes) -> bool:
    try:
        answers(got)
    except (ValueError, KeyError):
        return False
    return True


async def test_the_fast_path_and_aiohttp_give_a_review_the_same_answer(
    start_webhook: StartWebhook, client_ssl: ssl.SSLContext
) -> None:
    server = await start_webhook()
    fast = request(extra="X-Request-Id: same\r\n")
    # the same review in a form the fast path hands over (a parameter aiohttp reads past)
    slow = fast.replace(b"application/json", b"application/json; charset=utf-8")
    got = answers(await exchange(server, client_ssl, fast + slow, 2))
    assert len(got) == 2
    (s1, h1, b1), (s2, h2, b2) = got
    assert (s1, b1) == (s2, b2) and s1 == 200
    drop = ("Date",)
    assert {k: v for k, v in h1.items() if k not in drop} == {k: v for k, v in h2.items() if k not in drop}


async def test_a_kept_alive_fast_connection_is_closed_after_the_keepalive_timeout(
    start_webhook: StartWebhook, client_ssl: ssl.SSLContext
) -> None:
    server = await start_webhook(limits=ConnectionLimits(keepalive_timeout=0.5))
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=client_ssl, server_hostname="127.0.0.1"
    )
    writer.write(request())
    got = b""
    while not got or not _complete(got):
        got += await asyncio.wait_for(reader.read(65536), 60)
    assert answers(got)[0][0] == 200
    # then nothing: the server closes the idle connection (EOF), within a generous bound
    assert await asyncio.wait_for(reader.read(), 60) == b""
    writer.close()
