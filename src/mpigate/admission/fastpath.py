"""The webhook's fast path: AdmissionReviews parsed and answered by one compiled protocol.

What the API server sends a webhook is always the same shape of request: ``POST /validate`` (or
``/mutate``) with a ``?timeout=`` query, ``Content-Type: application/json``, a ``Content-Length``
and the review, on a kept-alive TLS connection (k8s.io/apiserver:
``pkg/admission/plugin/webhook/validating/dispatcher.go`` ``client.Post().Body(request)`` with the
deadline as ``timeout``, ``pkg/util/webhook/client.go`` content type ``runtime.ContentTypeJSON``;
Go's ``net/http``, ``src/net/http/transfer.go``, writes a known length as ``Content-Length``).
aiohttp's web layer — request and response objects, its stream reader, the router, the middleware
and its writer, all interpreted — cost about as much CPU per review as the rest of the HTTP path
together (docs/webhook.md, "Performance"). :class:`ReviewConnection` serves exactly that shape
itself and hands every other request to aiohttp, on the same connection, with the bytes it has
read: the connection's protocol becomes the guard's aiohttp handler, which parses them from the
first byte of that request.

What it serves itself is a strict subset of HTTP/1.1 that needs no judgement: the request line
``POST /mutate|/validate[?query] HTTP/1.1``; header fields that are tokens, a colon and a value
of visible characters (RFC 9110 5.1, 5.5; no obsolete line folding, no field name with a space
before its colon); exactly one ``Content-Length`` of digits, at most ``max_body``;
``Content-Type: application/json``; no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``; no
``Content-Encoding`` but ``identity``; ``Connection`` absent, ``keep-alive`` or ``close``. Any
other request — a gzip body, chunked framing, ``100-continue``, ``GET /readyz``, an unknown path,
a malformed line, a header line longer than aiohttp's 8,190-byte limit — goes to aiohttp, whose
answers (404/405/413/415, 400 for a malformed request) and limits apply unchanged. The two agree
on every request the fast path takes: both read the same ``Content-Length`` framing, and only
aiohttp ever judges an ambiguous one.

The guard's deadlines hold as for aiohttp's handler (:mod:`.guard`): the header deadline from a
request's first byte, the body deadline (``body_timeout``) from its headers — answered 408 and
closed as the review handler answers it —, and the keep-alive timeout for an idle connection.
A review that may wait (live lookups, the audit trail, a worker thread, tracing) runs in a task of
its own, as aiohttp's handler runs it, so that a client that goes away does not cancel it half-way
through its audit record; one that cannot (:meth:`AdmissionService.inline`) is answered within the
read that completed it, its coroutine driven here. Requests a client sends before its
answer (pipelining) wait in the buffer and are answered in order; while a review is judged, or
while the client does not read its answers (the transport's ``pause_writing``), no next request
starts and reading pauses once 64 KiB of them are in.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import secrets
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final, Protocol

from aiohttp.http import SERVER_SOFTWARE

from .logjson import fields
from .review import Stage, encode_json
from .routes import MUTATE_PATH, VALIDATE_PATH
from .service import AdmissionService, Reply, status_body

__all__ = [
    "REQUEST_ID_HEADER",
    "Guard",
    "RequestIds",
    "ReviewConnection",
    "ReviewRoutes",
    "bad_request",
    "client_gone",
    "request_id_for",
]

log = logging.getLogger("mpigate.admission.server")

REQUEST_ID_HEADER: Final = "X-Request-Id"
_SAFE_ID: Final = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

# aiohttp's parser limits (aiohttp/http_parser.py HttpParser: max_line_size, max_field_size):
# a longer line goes to aiohttp, which refuses it
_MAX_LINE: Final = 8190
# a head with no end within this many bytes goes to aiohttp (which applies its own limits)
_MAX_HEAD: Final = 65536
_REQUEST_LINE: Final = re.compile(rb"POST (/[!-~]*) HTTP/1\.1")
# RFC 9110 5.1 (field-name = token), 5.5 (field-value: visible characters and obs-text, spaces
# and tabs inside); optional whitespace around the value
_FIELD: Final = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):(.*)", re.DOTALL)
# what a field value must not hold: control characters but the tab (RFC 9110 5.5)
_CONTROL: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_DIGITS: Final = re.compile(rb"[0-9]{1,15}")
_HANDED_OVER: Final = frozenset({b"transfer-encoding", b"expect", b"upgrade"})
_STAGES: Final[dict[bytes, Stage]] = {MUTATE_PATH.encode(): "mutate", VALIDATE_PATH.encode(): "validate"}
_REASONS: Final = {status.value: status.phrase for status in HTTPStatus}


class RequestIds:
    """Request ids: a random 32-bit per-process prefix and a counter (distinct across restarts and
    ``--workers`` processes in practice, without the ``os.urandom`` call of a UUID per request)."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(4)
        self._next = itertools.count(1)

    def new(self) -> str:
        return f"{self._prefix}{next(self._next):08x}"


def request_id_for(incoming: str | None, ids: RequestIds) -> str:
    """The client's ``X-Request-Id`` when it is a safe one (letters, digits, ``._:-``, at most 64),
    else a new one."""
    return incoming if incoming and _SAFE_ID.match(incoming) else ids.new()


class RateLimited(Protocol):
    def log(self, level: int, key: str, message: str, *args: Any, **extra: Any) -> None: ...


def bad_request(
    service: AdmissionService,
    bad_log: RateLimited,
    path: str,
    stage: str,
    request_id: str,
    status: int,
    message: str,
    reason: str,
) -> tuple[int, dict[str, Any]]:
    """A refused request's answer, counted and logged (rate-limited) as every refusal is."""
    service.metrics.bad_requests.labels(stage, reason).inc()
    bad_log.log(
        logging.WARNING,
        reason,
        "%s: %s",
        path,
        message,
        event="bad_request",
        request_id=request_id,
        status=status,
        reason=reason,
        stage=stage,
    )
    return status, status_body(status, f"{message} (request id {request_id})")


def client_gone(service: AdmissionService, path: str, request_id: str, stage: str) -> None:
    """A client went away before sending a whole body: counted, and one debug line."""
    service.metrics.bad_requests.labels(stage, "client-disconnected").inc()
    log.debug(
        "%s: the client disconnected before sending the whole body",
        path,
        extra=fields(event="client_disconnected", request_id=request_id, stage=stage),
    )


class ReviewRoutes:
    """What every fast connection of one server shares."""

    def __init__(
        self,
        service: AdmissionService,
        *,
        max_body: int,
        body_timeout: float,
        request_ids: RequestIds,
        bad_log: RateLimited,
    ) -> None:
        self.service = service
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.request_ids = request_ids
        self.bad_log = bad_log
        self._date_second = -1
        self._date = b""

    def date(self) -> bytes:
        """The ``Date`` header's value (RFC 9110 6.6.1), made once a second."""
        now = int(time.time())
        if now != self._date_second:
            self._date_second = now
            self._date = formatdate(now, usegmt=True).encode()
        return self._date


class Guard(Protocol):
    """What a fast connection tells the guard (:class:`mpigate.admission.guard.GuardedSite`)."""

    def handshaken(self, slot: Any) -> None: ...
    def awaiting_headers(self, slot: Any) -> None: ...
    def headers_in(self, slot: Any) -> None: ...
    def request_in(self, slot: Any) -> None: ...
    def answered(self, slot: Any) -> None: ...
    def idle(self, slot: Any) -> None: ...
    def not_idle(self, slot: Any) -> None: ...
    def released(self, slot: Any) -> None: ...
    def timed_out(self, phase: str, client: str) -> None: ...
    def fallback(self, slot: Any) -> asyncio.Protocol: ...
    def register(self, connection: Any, transport: asyncio.BaseTransport) -> None: ...
    def unregister(self, connection: Any) -> None: ...


class _Request:
    """A request whose head was parsed: where its body lies in the buffer and what to do."""

    __slots__ = ("body_start", "close", "end", "path", "request_id", "stage")

    def __init__(
        self, stage: Stage, path: str, body_start: int, end: int, request_id: str, close: bool
    ) -> None:
        self.stage = stage
        self.path = path
        self.body_start = body_start
        self.end = end
        self.request_id = request_id
        self.close = close


class ReviewConnection:
    """One client connection's HTTP/1.1 protocol (after TLS), see the module docstring."""

    def __init__(self, routes: ReviewRoutes, guard: Guard, slot: Any) -> None:
        self._routes = routes
        self._guard = guard
        self._slot = slot
        self.transport: Any = None  # asyncio's or uvloop's transport (None: lost)
        self.handshaken = False
        self._buffer = bytearray()
        self._scanned = 0  # how much of the buffer's next head was searched for its end
        self._pending: _Request | None = None  # head parsed, body not all in
        self._body_timer: asyncio.TimerHandle | None = None
        self._answering: asyncio.Task[None] | None = None
        self._awaiting_headers = False
        self._closing = False
        self._paused = False  # reading paused (pipelined requests wait in the kernel)
        self._write_blocked = False  # the transport's write buffer is full: the client is not reading
        self._handed_over = False
        self._task_handler: asyncio.Task[None] | None = None  # what aiohttp's Server reads
        self._quiet: asyncio.Future[None] | None = None  # a shutdown waiting for the answer

    # -- asyncio protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # uvloop's TLS transport is no asyncio.Transport subclass
        self.handshaken = True
        self._guard.handshaken(self._slot)
        self._guard.register(self, transport)
        self._arm_headers()

    def data_received(self, data: bytes) -> None:
        if self._handed_over:  # pragma: no cover - the transport feeds the new protocol
            return
        if not self._buffer and self._pending is None and self._answering is None:
            self._guard.not_idle(self._slot)
            if not self._awaiting_headers:
                self._arm_headers()  # the first byte of the next request on a kept-alive connection
        self._buffer += data
        if self._answering is None and not self._write_blocked:
            self._serve()
        elif len(self._buffer) > _MAX_HEAD and not self._paused:
            self._pause()  # pipelined requests wait in the kernel, not here

    def eof_received(self) -> bool:
        return False  # close: a half-closed client gets no more answers (as aiohttp)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closing = True
        pending = self._pending
        if pending is not None:  # head in, body not: nobody to answer
            self._pending = None
            client_gone(self._routes.service, pending.path, pending.request_id, pending.stage)
        self._disarm_headers()
        self._cancel_body_timer()
        self._guard.unregister(self)
        self._guard.released(self._slot)
        self.transport = None
        self._quieten()

    def _quieten(self) -> None:
        if self._quiet is not None and not self._quiet.done():
            self._quiet.set_result(None)

    def pause_writing(self) -> None:
        """The transport's write buffer is full: no next request until the client reads its answers
        (aiohttp's handler waits on the writer's drain likewise), else a client that sends requests
        and never reads would grow the answers held here without bound."""
        self._write_blocked = True

    def resume_writing(self) -> None:
        self._write_blocked = False
        if self._answering is None and not self._closing and not self._handed_over and self._ready_for_next():
            self._serve()

    # -- what the guard and aiohttp's Server call ----------------------------------------------

    def headers_late(self) -> None:
        """The header deadline passed without a complete head."""
        self._awaiting_headers = False
        self._guard.timed_out("headers", self._slot.client)
        self._slot.abort()

    def idle_late(self) -> None:
        """Idle for the keep-alive timeout: close (aiohttp: ``RequestHandler._process_keepalive``)."""
        if self.transport is not None and self._answering is None and not self._buffer:
            self.transport.close()

    def close(self) -> None:
        """Shutting down: no new request; close now when idle, else once the request in progress
        is answered (aiohttp: ``Server.pre_shutdown``, ``RequestHandler.close``)."""
        self._closing = True
        if self._pending is None and self._answering is None and self.transport is not None:
            self.transport.close()

    async def shutdown(self, timeout: float | None = 15.0) -> None:
        """Let the request in progress — its body still coming, or being judged — be answered
        (up to ``timeout``), then close (aiohttp: ``RequestHandler.shutdown``)."""
        self._closing = True
        if self._pending is not None or self._answering is not None:
            self._quiet = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._quiet), timeout)
        if self.transport is not None:
            self.transport.close()

    # -- parsing ---------------------------------------------------------------------------

    def _serve(self) -> None:
        """Answer what the buffer holds, request by request, until one is incomplete."""
        while self._answering is None and not self._handed_over:
            request = self._pending
            if request is None:
                if self._closing or not self._buffer:
                    return
                request = self._parse_head()
                if request is None:
                    return
                self._pending = request
                self._disarm_headers()  # the head is in: the header deadline is met
            if len(self._buffer) < request.end:
                if self._body_timer is None:
                    loop = asyncio.get_running_loop()
                    self._body_timer = loop.call_later(self._routes.body_timeout, self._body_late)
                return
            self._cancel_body_timer()
            self._pending = None
            body = bytes(self._buffer[request.body_start : request.end])
            del self._buffer[: request.end]
            self._guard.request_in(self._slot)
            service = self._routes.service
            if not service.inline():
                self._answering = asyncio.get_running_loop().create_task(self._answer(request, body))
                return
            # Nothing in the review waits (AdmissionService.inline): its one step is taken here,
            # without the task, its scheduling and its bookkeeping (a task is what lets a review
            # that waits on live lookups or the audit trail outlive a client that goes away)
            self._respond_to(request, self._review_now(service, request, body))
            if not self._finished(request):
                return

    def _parse_head(self) -> _Request | None:
        """The next request's head, or None when it is not all in yet (or was handed over)."""
        buffer = self._buffer
        # Only what arrived since the last look is searched (a client trickling its head byte by
        # byte must not make each byte cost a scan of all before it).
        scanned = self._scanned
        end = buffer.find(b"\r\n\r\n", max(scanned - 3, 0), _MAX_HEAD + 4)
        if end < 0:
            size = len(buffer)
            # a line ended by a bare LF (RFC 9112 2.2 lets a recipient accept it): not the fast
            # path's to judge, and its head would never end here in a CRLF CRLF
            bare = buffer.count(b"\n", scanned) != buffer.count(b"\r\n", max(scanned - 1, 0))
            if bare or size > _MAX_HEAD:
                self._hand_over()
            else:
                self._scanned = size
            return None
        self._scanned = 0
        lines = bytes(buffer[:end]).split(b"\r\n")
        first = _REQUEST_LINE.fullmatch(lines[0])
        if first is None or len(lines[0]) > _MAX_LINE:
            self._hand_over()
            return None
        target = first.group(1)
        path, _, _ = target.partition(b"?")
        stage = _STAGES.get(path)
        if stage is None or b"#" in target:
            self._hand_over()
            return None
        length: int | None = None
        content_type: bytes | None = None
        request_id: str | None = None
        close = False
        for line in lines[1:]:
            match = _FIELD.fullmatch(line)
            if match is None or len(line) > _MAX_LINE:
                self._hand_over()
                return None
            name = match.group(1).lower()
            value = match.group(2).strip(b" \t")
            if _CONTROL.search(value) is not None:
                self._hand_over()
                return None
            if name == b"content-length":
                if length is not None or _DIGITS.fullmatch(value) is None:
                    self._hand_over()
                    return None
                length = int(value)
            elif name == b"content-type":
                if content_type is not None:
                    self._hand_over()
                    return None
                content_type = value.lower()
            elif name == b"x-request-id":
                if request_id is None:
                    request_id = value.decode("latin-1")
            elif name == b"connection":
                token = value.lower()
                if token == b"close":
                    close = True
                elif token != b"keep-alive":
                    self._hand_over()
                    return None
            elif name == b"content-encoding":
                if value.lower() != b"identity":
                    self._hand_over()
                    return None
            elif name in _HANDED_OVER:
                self._hand_over()
                return None
        if length is None or length > self._routes.max_body or content_type != b"application/json":
            self._hand_over()
            return None
        body_start = end + 4
        rid = request_id_for(request_id, self._routes.request_ids)
        return _Request(stage, path.decode("ascii"), body_start, body_start + length, rid, close)

    def _hand_over(self) -> None:
        """Give the connection, with the bytes read since the current request's first, to the
        guard's aiohttp handler."""
        transport = self.transport
        if transport is None:
            return
        self._handed_over = True
        self._disarm_headers()
        self._cancel_body_timer()
        self._guard.not_idle(self._slot)
        self._guard.unregister(self)
        handler = self._guard.fallback(self._slot)
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._paused:
            self._paused = False
            transport.resume_reading()
        data = bytes(self._buffer)
        self._buffer.clear()
        handler.data_received(data)

    # -- answering ---------------------------------------------------------------------------

    async def _answer(self, request: _Request, body: bytes) -> None:
        """Answer ``request`` in a task (a review that may wait), then go on with the next."""
        try:
            reply: Reply | None = await self._routes.service.review(request.stage, body, request.request_id)
        except Exception:
            _unhandled(request)
            reply = None
        self._answering = None
        self._respond_to(request, reply)
        if self._finished(request):
            self._serve()

    def _review_now(self, service: AdmissionService, request: _Request, body: bytes) -> Reply | None:
        """The reply of a review that does not wait, its coroutine driven here (None: it failed)."""
        review = service.review(request.stage, body, request.request_id)
        try:
            review.send(None)
        except StopIteration as done:
            reply: Reply = done.value
            return reply
        except Exception:
            _unhandled(request)
            return None
        # it waited after all (AdmissionService.inline is wrong): nothing here can resume it
        review.close()
        log.error(
            "a review waited outside a task",
            extra=fields(event="review_waited", request_id=request.request_id, path=request.path),
        )
        return None

    def _respond_to(self, request: _Request, reply: Reply | None) -> None:
        """Write ``reply`` (None: HTTP 500) to ``request``'s client."""
        if reply is not None:
            try:
                self._respond(reply.status, encode_json(reply.body), request.request_id, request.close)
                return
            except Exception:
                _unhandled(request)
        payload = encode_json(status_body(500, f"internal error (request id {request.request_id})"))
        self._respond(500, payload, request.request_id, request.close)

    def _respond(self, status: int, payload: bytes, request_id: str, close: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
            "Content-Type: application/json\r\n"
            f"{REQUEST_ID_HEADER}: {request_id}\r\n"
            f"Content-Length: {len(payload)}\r\n"
        ).encode("latin-1")
        tail = b"Connection: close\r\n\r\n" if close else b"\r\n"
        transport.write(
            head + b"Date: " + self._routes.date() + b"\r\nServer: " + _SERVER + b"\r\n" + tail + payload
        )

    def _finished(self, request: _Request) -> bool:
        """``request`` was answered: True when the next one in the buffer may start (the caller
        serves it), else the connection is idle, closed, or waits for its client to read."""
        if request.close:
            self._closing = True
        transport = self.transport
        if transport is None:
            return False
        self._guard.answered(self._slot)  # slow again until its next request is in
        if self._closing:
            self._quieten()
            transport.close()
            return False
        if self._write_blocked:  # resume_writing goes on
            return False
        return self._ready_for_next()

    def _ready_for_next(self) -> bool:
        """Read again; True when the buffer holds (the start of) a next request to serve, else idle."""
        transport = self.transport
        if transport is None:
            return False
        if self._paused:
            self._paused = False
            transport.resume_reading()
        if self._buffer:
            self._arm_headers()
            return True
        self._guard.idle(self._slot)
        return False

    def _body_late(self) -> None:
        """The body did not arrive within ``body_timeout`` of its head: 408, then close (as the
        review handler answers it, :func:`mpigate.admission.server._review_handler`)."""
        self._body_timer = None
        request = self._pending
        if request is None or self.transport is None:
            return
        self._pending = None
        self._closing = True
        self._routes.service.metrics.connection_timeouts.labels("body").inc()
        status, body = bad_request(
            self._routes.service,
            self._routes.bad_log,
            request.path,
            request.stage,
            request.request_id,
            408,
            "the body did not arrive within its deadline",
            "body-timeout",
        )
        self._respond(status, encode_json(body), request.request_id, True)
        self.transport.close()

    # -- deadlines and flow --------------------------------------------------------------------

    def _arm_headers(self) -> None:
        self._awaiting_headers = True
        self._guard.awaiting_headers(self._slot)

    def _disarm_headers(self) -> None:
        if self._awaiting_headers:
            self._awaiting_headers = False
            self._guard.headers_in(self._slot)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _pause(self) -> None:
        if self.transport is not None:
            self._paused = True
            self.transport.pause_reading()


def _unhandled(request: _Request) -> None:
    log.exception("unhandled error", extra=fields(request_id=request.request_id, path=request.path))


_SERVER: Final = SERVER_SOFTWARE.encode()
