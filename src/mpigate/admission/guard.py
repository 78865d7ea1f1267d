"""Connection admission for the webhook: bounded connections, read deadlines, backpressure.

aiohttp's ``TCPSite`` hands the listening socket to ``loop.create_server``, which accepts every
connection the kernel offers and reads each for as long as the client likes (aiohttp's only read
deadline is its keep-alive timeout, meant for idle connections). A few thousand slow TLS clients
then hold memory and file descriptors until the process hits its limits, and asyncio logs
"socket.accept() out of system resource" on every retry. :class:`GuardedSite` replaces that accept
path, within aiohttp's own extension points (a ``BaseSite`` and the ``RequestHandler`` protocol
that ``aiohttp.web_server.Server`` builds):

* at most ``max_connections`` per server and ``max_connections_per_client`` per client address;
  a client over the second is closed before its TLS handshake costs anything; at the first, the
  connection that has waited longest without a complete request (in its TLS handshake, its
  headers or body, or idle between requests) for at least ``evict_after`` seconds is closed to
  make room
  — so slow clients cannot keep the API server's reviews out, as they would if the newcomers
  only queued behind them — and when no connection is that idle, the site stops accepting (the
  kernel's listen backlog holds the rest: backpressure);
* a TLS handshake (``handshake_timeout``), the request headers (``header_timeout``, from the
  first byte of a request) and — enforced by the review handler — the body (``body_timeout``)
  each have a deadline; a connection that misses one is closed;
* an ``accept()`` that fails for lack of descriptors or memory pauses accepting with backoff
  instead of retrying in a storm, and every such event is logged at most once per window
  (:class:`RateLimitedLog`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import ssl
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from .logjson import fields
from .metrics import Metrics

__all__ = ["ConnectionLimits", "GuardedSite", "RateLimitedLog", "raise_open_file_limit"]

log = logging.getLogger("mpigate.admission.guard")

# accept() errors that mean "out of a resource", after which asyncio's own accept loop logs and
# retries (Python: Lib/asyncio/selector_events.py BaseSelectorEventLoop._accept_connection).
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# File descriptors kept free of connections: the audit segment, config reads, certificate
# reloads, the kube client, the log.
_RESERVED_FDS: Final = 64


@dataclass(frozen=True)
class ConnectionLimits:
    """How much one server process gives to clients.

    ``keepalive_timeout`` exceeds the 90 s idle timeout of Go's ``http.Transport`` that the API
    server's webhook client uses, so that the client, not the server, closes an idle connection
    (a server that closes first races the client's next request on it)."""

    max_connections: int = 1024
    max_connections_per_client: int = 256
    handshake_timeout: float = 10.0
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    keepalive_timeout: float = 120.0
    evict_after: float = 1.0

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_connections_per_client < 1:
            raise ValueError("connection limits must be at least 1")
        timeouts = (
            self.handshake_timeout,
            self.header_timeout,
            self.body_timeout,
            self.keepalive_timeout,
            self.evict_after,
        )
        if min(timeouts) <= 0:
            raise ValueError("timeouts must be positive")


class RateLimitedLog:
    """Logs an event at most once per ``window`` seconds per key, saying how many were dropped."""

    def __init__(self, logger: logging.Logger, window: float = 10.0) -> None:
        self.logger = logger
        self.window = window
        self._last: dict[str, float] = {}
        self._dropped: Tally[str] = Tally()

    def log(self, level: int, key: str, message: str, *args: Any, **extra: Any) -> None:
        if not self.logger.isEnabledFor(level):
            return
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            self._dropped[key] += 1
            return
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        if dropped:
            message += f" ({dropped} more like it in the last {self.window:g} s not logged)"
        self.logger.log(level, message, *args, extra=fields(**extra, suppressed=dropped))


def raise_open_file_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (as Go's runtime does since
    1.19); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


class _GuardedHandler(RequestHandler):
    """aiohttp's HTTP/1.1 protocol with a header deadline and the site's slot released on close."""

    def __init__(self, manager: Any, *, site: GuardedSite, client: str, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._site = site
        self._client = client
        self._header_deadline: asyncio.TimerHandle | None = None
        self._in_request = False
        self.handshaken = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.handshaken = True
        self._arm()
        self._site._waiting_since(self, self.abort)

    def data_received(self, data: bytes) -> None:
        if not self._in_request and self._header_deadline is None:
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        self._site._not_waiting(self)
        try:
            super().connection_lost(exc)
        finally:
            self._site._released(self._client)

    def request_started(self) -> None:
        """The headers are in (the handler runs): the header deadline is met. Until its body is
        in too, the connection can still be evicted (the API server sends a review at once)."""
        self._in_request = True
        self._disarm()
        self._site._waiting_since(self, self.abort)

    def body_received(self) -> None:
        """The request is complete: it is being judged, never evicted."""
        self._site._not_waiting(self)

    def request_finished(self) -> None:
        self._in_request = False
        self._site._waiting_since(self, self.abort)

    def skip_lingering(self) -> None:
        self._lingering_time = 0.0  # RequestHandler.start reads it after the answer is sent

    def abort(self) -> None:
        """Close at once, without the TLS close_notify exchange that a hostile peer never
        answers (``transport.close`` would hold the connection for ``ssl_shutdown_timeout``)."""
        if self.transport is not None:
            self.transport.abort()
        self.force_close()

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self._loop.call_later(self._site.limits.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self._in_request:
            return
        self._site._timed_out("headers", self._client)
        self.abort()


def request_started(request: web.BaseRequest) -> None:
    """Tell the connection's guard (if any) that ``request``'s headers arrived."""
    protocol = request.protocol
    if isinstance(protocol, _GuardedHandler):
        protocol.request_started()


def body_received(request: web.BaseRequest) -> None:
    """Tell the connection's guard (if any) that ``request`` is complete."""
    protocol = request.protocol
    if isinstance(protocol, _GuardedHandler):
        protocol.body_received()


def close_after_answer(request: web.BaseRequest) -> None:
    """Close ``request``'s connection right after its answer instead of reading on, for up to
    aiohttp's ``lingering_time``, the rest of a body that is late anyway."""
    protocol = request.protocol
    if isinstance(protocol, _GuardedHandler):
        protocol.skip_lingering()


def request_finished(request: web.BaseRequest) -> None:
    protocol = request.protocol
    if isinstance(protocol, _GuardedHandler):
        protocol.request_finished()


class GuardedSite(web.BaseSite):
    """A TCP site (optionally TLS) that admits connections within :class:`ConnectionLimits`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limits: ConnectionLimits,
        metrics: Metrics,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 1024,
        reuse_port: bool = False,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._reuse_port = reuse_port
        self.limits = limits
        self._metrics = metrics
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        self._open = 0
        self._per_client: Tally[str] = Tally()
        self._slot_free = asyncio.Event()
        # connections without a request in progress, oldest first: key -> (since, close)
        self._waiting: dict[object, tuple[float, Callable[[], object]]] = {}
        self._logs = RateLimitedLog(log)
        self.capacity = limits.max_connections

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1]) if self._sock is not None else self._port

    @property
    def open_connections(self) -> int:
        return self._open

    async def start(self) -> None:
        await super().start()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.create_server(
            (self._host, self._port), family=family, backlog=self._backlog, reuse_port=self._reuse_port
        )
        sock.setblocking(False)
        self._sock = sock
        nofile = raise_open_file_limit()
        room = max(1, nofile - _RESERVED_FDS)
        if room < self.limits.max_connections:
            log.warning(
                "the open-file limit (%d) leaves room for %d connections, not %d",
                nofile,
                room,
                self.limits.max_connections,
                extra=fields(event="connection_cap_lowered", nofile=nofile, capacity=room),
            )
            self.capacity = room
        self._accepting = asyncio.create_task(self._accept_loop(), name="mpigate-accept")

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self._sock is not None:
            self._sock.close()
        for task in list(self._handshakes):
            task.cancel()
        self._runner._check_site(self)
        self._runner._unreg_site(self)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        backoff = 0.05
        while True:
            while self._open >= self.capacity:
                self._slot_free.clear()
                if not await self._newcomer_or_slot():
                    continue  # a slot is free
                # A newcomer waits: make room by evicting (then wait for that slot), or — when
                # no connection has idled long enough — leave it in the kernel's listen backlog
                # (backpressure) and look again shortly.
                wait = self.limits.handshake_timeout if self._evict_one() else self.limits.evict_after / 2
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_free.wait(), wait)
            try:
                conn, address = await loop.sock_accept(self._sock)
            except OSError as exc:
                if exc.errno not in _RESOURCE_ERRNOS:
                    raise
                self._metrics.connections_refused.labels("resources").inc()
                self._logs.log(
                    logging.WARNING,
                    "accept",
                    "cannot accept connections: %s; pausing %.2f s (%d open)",
                    exc.strerror,
                    backoff,
                    self._open,
                    event="accept_paused",
                    error=errno.errorcode.get(exc.errno or 0, "?"),
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            client = str(address[0])
            if self._per_client[client] >= self.limits.max_connections_per_client:
                conn.close()  # before the TLS handshake: a refused client costs almost nothing
                self._metrics.connections_refused.labels("per-client").inc()
                self._logs.log(
                    logging.WARNING,
                    f"per-client:{client}",
                    "refused a connection from %s: it already has %d open (the per-client limit)",
                    client,
                    self._per_client[client],
                    event="connection_refused",
                    client=client,
                )
                continue
            self._open += 1
            self._per_client[client] += 1
            self._metrics.connections_open.inc()
            task = asyncio.create_task(self._handshake(conn, client))
            self._handshakes.add(task)
            self._waiting_since(task, task.cancel)
            task.add_done_callback(self._handshake_done)

    async def _handshake(self, conn: socket.socket, client: str) -> None:
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        kwargs = {**server._kwargs, "loop": loop}  # what aiohttp's Server.__call__ passes

        made: list[_GuardedHandler] = []

        def protocol() -> _GuardedHandler:
            handler = _GuardedHandler(server, site=self, client=client, **kwargs)
            made.append(handler)
            return handler

        try:
            await loop.connect_accepted_socket(
                protocol,
                conn,
                ssl=self._ssl_context,
                ssl_handshake_timeout=self.limits.handshake_timeout if self._ssl_context else None,
                ssl_shutdown_timeout=self.limits.handshake_timeout if self._ssl_context else None,
            )
        except (OSError, TimeoutError, asyncio.CancelledError) as exc:
            if made and made[0].handshaken:  # evicted right after its handshake
                made[0].abort()  # its connection_lost releases the slot
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            conn.close()
            if isinstance(exc, TimeoutError) or "taking longer" in str(exc):
                self._timed_out("handshake", client)
            else:
                self._logs.log(
                    logging.DEBUG, "handshake", "TLS handshake with %s failed: %s", client, exc,
                    event="handshake_failed", client=client,
                )  # fmt: skip
            self._released(client)
            if isinstance(exc, asyncio.CancelledError):
                raise

    def _handshake_done(self, task: asyncio.Task[None]) -> None:
        self._handshakes.discard(task)
        self._not_waiting(task)

    def _waiting_since(self, key: object, close: Callable[[], object]) -> None:
        self._waiting.pop(key, None)
        self._waiting[key] = (time.monotonic(), close)

    def _not_waiting(self, key: object) -> None:
        self._waiting.pop(key, None)

    async def _newcomer_or_slot(self) -> bool:
        """Wait until a connection waits to be accepted (True) or a slot frees (False)."""
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        newcomer: asyncio.Future[bool] = loop.create_future()
        fd = self._sock.fileno()

        def readable() -> None:
            if not newcomer.done():
                newcomer.set_result(True)

        loop.add_reader(fd, readable)
        slot: asyncio.Future[bool] = asyncio.ensure_future(self._slot_free.wait())
        try:
            await asyncio.wait({newcomer, slot}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.remove_reader(fd)
            slot.cancel()
            newcomer.cancel()
        return not self._slot_free.is_set()

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest without a request, if it has waited at
        least ``evict_after``; True when one was closed."""
        for key, (since, close) in self._waiting.items():
            if time.monotonic() - since < self.limits.evict_after:
                return False
            del self._waiting[key]
            close()
            self._metrics.connections_refused.labels("evicted").inc()
            self._logs.log(
                logging.INFO,
                "evicted",
                "at %d connections: closed the one that waited longest without a request",
                self._open,
                event="connection_evicted",
            )
            return True
        return False

    def _timed_out(self, phase: str, client: str) -> None:
        self._metrics.connection_timeouts.labels(phase).inc()
        self._logs.log(
            logging.INFO,
            f"timeout:{phase}",
            "closed a connection from %s: no complete %s within its deadline",
            client,
            phase,
            event="connection_timeout",
            phase=phase,
            client=client,
        )

    def _released(self, client: str) -> None:
        self._open -= 1
        self._per_client[client] -= 1
        if self._per_client[client] <= 0:
            del self._per_client[client]
        self._metrics.connections_open.dec()
        self._slot_free.set()
