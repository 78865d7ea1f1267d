"""Connection admission for the webhook: bounded connections, read deadlines, fairness between
client addresses, backpressure.

aiohttp's ``TCPSite`` hands the listening socket to ``loop.create_server``, which accepts every
connection the kernel offers and reads each for as long as the client likes (aiohttp's only read
deadline is its keep-alive timeout, meant for idle connections). A few thousand slow TLS clients
then hold memory and file descriptors until the process hits its limits, and asyncio logs
"socket.accept() out of system resource" on every retry. :class:`GuardedSite` replaces that accept
path, within aiohttp's own extension points (a ``BaseSite`` and the ``RequestHandler`` protocol
that ``aiohttp.web_server.Server`` builds). An admitted connection's protocol is the reviews' fast
path (:mod:`.fastpath`), which hands any other request to that ``RequestHandler``; both keep the
deadlines below. What it follows:

* **The accept loop is never starved and never waits for a client.** Whenever the listening socket
  is readable, everything queued in the kernel is accepted at once (up to the backlog), as
  asyncio's own server does (CPython: ``Lib/asyncio/selector_events.py``
  ``BaseSelectorEventLoop._accept_connection``), and each newcomer is placed at once — admitted,
  queued or closed — before any TLS work: the TLS handshake runs in the connection's own task,
  as Go's ``net/http`` runs it in the connection's goroutine, never in ``Server.Serve``'s accept
  loop (Go: ``src/net/http/server.go`` ``(*conn).serve``: ``tlsConn.HandshakeContext`` under
  ``tlsHandshakeTimeout``). So a newcomer never waits in the kernel's queue behind thousands of
  others (what kept the API server's reviews out when the site stopped accepting at its cap).
* **Caps**: at most ``max_connections`` per server and ``max_connections_per_client`` per client
  address. A connection is *slow* from its accept until its request is complete (TLS handshake,
  headers, body) and again while idle between requests; only slow connections are ever closed to
  make room, the oldest first (as nginx reuses its oldest idle keep-alive connections when it
  runs out: ``src/core/ngx_connection.c`` ``ngx_drain_connections``). A newcomer from an address
  at its own cap replaces that address's oldest slow connection once it has been slow for
  ``evict_after``, or is closed (before its TLS handshake, so it costs almost nothing).
* **Fairness between addresses at the server's cap** (max-min fair share, the principle of
  kube-apiserver's API Priority and Fairness, which gives each flow its own queue so that one
  flow cannot starve the others: ``k8s.io/apiserver/pkg/util/flowcontrol/fairqueuing/queueset``):
  a newcomer from an address that holds fewer connections than the address holding the most
  takes the place of that address's oldest slow connection, whatever its age — a tenant's pod
  with hundreds of slow connections cannot crowd out the API server's address. Otherwise the
  oldest connection slow for at least ``evict_after`` makes room; when there is none, the
  newcomer waits in a bounded queue of accepted sockets (no TLS yet: a descriptor and kernel
  buffers), from which a freed slot goes to the waiting address holding the fewest connections
  (backpressure), and is closed after ``handshake_timeout`` there.
* **No load shedding by address.** Refusing newcomers from heavy addresses while the loop lags
  was tried and measured to make it worse: a refused slow client reconnects at once, and the
  accepts and closes of thousands of reconnects a second cost the loop more than holding them.
* **Deadlines**: the TLS handshake (``handshake_timeout``, from accept), the request headers
  (``header_timeout``, from the first byte of a request) and — enforced by the review handler —
  the body (``body_timeout``); a connection that misses one is aborted (no TLS shutdown with a
  peer that would not answer it). The handshake and header deadlines each last the same for every
  connection, so one timer over an insertion-ordered dict watches all of them
  (:class:`.slots.Deadlines`) instead of a ``TimerHandle`` per connection.
* **Nothing before the first byte**: a newcomer gets its TLS state, its task and aiohttp's
  protocol only once it has sent something (its ClientHello is usually there already at accept);
  until then it is a descriptor, a reader registration and a dict entry.
* **Memory**: asyncio's TLS protocol keeps a 256 KiB receive buffer per connection (CPython
  ``Lib/asyncio/sslproto.py`` ``SSLProtocol.max_size``), zero-filled, ~280 KB a connection in
  all, which put 4,000 slow clients past the install base's memory limit; on asyncio's loop it is
  16 KiB here (one TLS record): ~100 KB a held connection at the benchmark's peak RSS,
  everything included. uvloop's TLS protocol (the default loop, :mod:`.eventloop`) allocates its
  256 KiB without writing it, so only the pages its reads touch are resident
  (:func:`tls_protocol_for`): as little per slow client as on asyncio's loop with 16 KiB
  (benchmarks/slow_clients.py); a client that gets one large read in (it must send that much at
  once) keeps up to 256 KiB resident until it is closed — less than the body of up to
  ``--max-body`` that a client holding a request half-sent already costs on either loop.
* **No storms**: an ``accept()`` that fails for lack of descriptors or memory pauses accepting
  with backoff (as Go's ``Server.Serve`` and asyncio do); any other ``accept()`` error is that
  one connection's and is logged, not raised; every kind of refusal, error or timeout is logged at
  most once per window (:class:`RateLimitedLog`).
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
from asyncio import sslproto
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from .fastpath import ReviewConnection, ReviewRoutes
from .logjson import fields
from .metrics import Metrics
from .slots import ConnectionBook, Deadlines, Slot

try:  # a dependency, but the guard also serves on asyncio's loop without it (--loop asyncio)
    from uvloop import Loop as _UVLoop
    from uvloop import loop as _uvloop_module

    _UVSSLProtocol: Callable[..., asyncio.BaseProtocol] | None = _uvloop_module.SSLProtocol  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - uvloop is installed with mpigate
    _UVSSLProtocol = None

__all__ = ["ConnectionLimits", "GuardedSite", "RateLimitedLog", "raise_open_file_limit"]

log = logging.getLogger("mpigate.admission.guard")

# accept() errors that mean "out of a resource", after which asyncio's own accept loop logs and
# retries (Python: Lib/asyncio/selector_events.py BaseSelectorEventLoop._accept_connection).
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# TLS handshakes started per event-loop iteration at most (see GuardedSite._start_some).
_STARTS_PER_ITERATION: Final = 16
# File descriptors kept free of connections: the audit segment, config reads, certificate
# reloads, the kube client, the log.
_RESERVED_FDS: Final = 64


@dataclass(frozen=True)
class ConnectionLimits:
    """How much one server process gives to clients.

    ``max_connections`` × ~100 KB (a held TLS connection at the peak RSS of
    benchmarks/slow_clients.py) plus the ~105 MiB of an idle server stays inside the install
    base's 512 MiB with room to spare. ``keepalive_timeout`` exceeds the 90 s idle
    timeout of Go's ``http.Transport`` that the API server's webhook client uses, so that the
    client, not the server, closes an idle connection (a server that closes first races the
    client's next request on it)."""

    max_connections: int = 3072
    max_connections_per_client: int = 1024
    # from accept: a healthy handshake takes milliseconds, and one still unfinished after a few
    # seconds leaves the API server (10 s for the whole call) too little time anyway
    handshake_timeout: float = 5.0
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


_REFUSALS: Final = {
    "per-client": "the per-client limit",
    "full": "the server's limit and its queue",
}


_EVICTIONS: Final = {
    "per-client": "to admit a newcomer at the per-client limit",
    "cap": "to admit a newcomer at the server's limit",
}


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


class _TLSProtocol(sslproto.SSLProtocol):
    """asyncio's TLS protocol with a receive buffer of one TLS record (16 KiB) instead of 256 KiB:
    the buffer is allocated per connection, and most of what a held connection costs."""

    max_size = 16 * 1024


def tls_protocol_for(loop: asyncio.AbstractEventLoop) -> Callable[..., asyncio.BaseProtocol]:
    """The server-side TLS protocol to put between a connection and aiohttp on ``loop``.

    On uvloop its own (``uvloop/sslproto.pyx`` ``SSLProtocol``, compiled, with the constructor of
    asyncio's): uvloop's TCP transport hands it the bytes it reads without a Python call (the
    fast path for that class in ``uvloop/handles/stream.pyx`` ``__uv_stream_buffered_alloc`` and
    ``__uv_stream_buffered_on_read``). Its 256 KiB receive buffer (``SSL_READ_MAX_SIZE``,
    ``uvloop/includes/consts.pxi``) is fixed at compile time, but it is ``PyMem_RawMalloc``'d,
    never written before a read (``SSLProtocol.__cinit__``, ``get_buffer_impl``): a held
    connection's resident memory is the pages its reads touched, not the whole buffer — unlike
    asyncio's ``bytearray``, zero-filled at once, which :class:`_TLSProtocol` shrinks instead.
    """
    if _UVSSLProtocol is not None and isinstance(loop, _UVLoop):
        return _UVSSLProtocol
    return _TLSProtocol


class _GuardedHandler(RequestHandler):
    """aiohttp's HTTP/1.1 protocol with a header deadline and the site's slot released on close."""

    def __init__(self, manager: Any, *, site: GuardedSite, slot: Slot, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._site = site
        self._slot = slot
        self._awaiting_headers = False
        self._in_request = False
        self.handshaken = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.handshaken = True
        self._site._book.handshaken(self._slot)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._in_request and not self._awaiting_headers:
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        try:
            super().connection_lost(exc)
        finally:
            self._site._release(self._slot)

    def request_started(self) -> None:
        """The headers are in (the handler runs): the header deadline is met. Until its body is
        in too, the connection stays slow (the API server sends a review at once)."""
        self._in_request = True
        self._disarm()

    def body_received(self) -> None:
        """The request is complete: it is being judged, never closed to make room."""
        self._site._book.request_in(self._slot)

    def request_finished(self) -> None:
        self._in_request = False
        self._site._book.answered(self._slot)  # idle from now on

    def skip_lingering(self) -> None:
        self._lingering_time = 0.0  # RequestHandler.start reads it after the answer is sent

    def headers_late(self) -> None:
        self._awaiting_headers = False
        if not self._in_request:
            self._site._timed_out("headers", self._slot.client)
            # the transport's connection_lost tells aiohttp (and releases the slot); aiohttp's
            # own force_close would first try the TLS shutdown a hostile peer never answers
            self._slot.abort()

    def _arm(self) -> None:
        self._awaiting_headers = True
        self._site._headers.start(self._slot, time.monotonic())

    def _disarm(self) -> None:
        if self._awaiting_headers:
            self._awaiting_headers = False
            self._site._headers.stop(self._slot)


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
        routes: ReviewRoutes | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        # reviews answered by the fast path (fastpath.py), everything else by aiohttp; None: all
        # by aiohttp
        self._routes = routes
        self._host = host
        self._port = port
        self._reuse_port = reuse_port
        self.limits = limits
        self._metrics = metrics
        self._sock: socket.socket | None = None
        self._resume: asyncio.TimerHandle | None = None
        self._backoff = 0.05
        self._tasks: set[asyncio.Task[None]] = set()
        # connections that have sent their first bytes, waiting for their TLS handshake to start
        self._starting: dict[str, deque[Slot]] = {}
        self._start_scheduled = False
        self._open = 0
        self._per_client: Tally[str] = Tally()
        # accepted sockets waiting for a slot, by client address, oldest first
        self._queue: dict[str, deque[tuple[socket.socket, float]]] = {}
        self._queued = 0
        self._queue_timer: asyncio.TimerHandle | None = None
        self._logs = RateLimitedLog(log)
        self.capacity = limits.max_connections
        # the connections' states (compiled: they change several times per review)
        self._book = ConnectionBook(
            self,
            handshakes=Deadlines(limits.handshake_timeout, self._handshake_late),
            headers=Deadlines(limits.header_timeout, self._headers_late),
            idle=Deadlines(limits.keepalive_timeout, self._idle_late),
        )
        # slow connections (no complete request) by client address, oldest first: slot -> since
        self._slow = self._book.slow
        self._handshakes = self._book.handshakes
        self._headers = self._book.headers

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

    @property
    def queued_connections(self) -> int:
        return self._queued

    async def start(self) -> None:
        await super().start()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.create_server(
            (self._host, self._port), family=family, backlog=self._backlog, reuse_port=self._reuse_port
        )
        sock.setblocking(False)
        self._sock = sock
        nofile = raise_open_file_limit()
        room = max(1, nofile - _RESERVED_FDS - self._backlog)  # the queue holds descriptors too
        if room < self.limits.max_connections:
            log.warning(
                "the open-file limit (%d) leaves room for %d connections, not %d",
                nofile,
                room,
                self.limits.max_connections,
                extra=fields(event="connection_cap_lowered", nofile=nofile, capacity=room),
            )
            self.capacity = room
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept_ready)

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._resume is not None:
            self._resume.cancel()
        if self._queue_timer is not None:
            self._queue_timer.cancel()
        if self._sock is not None:
            loop.remove_reader(self._sock.fileno())
            self._sock.close()
        for waiting in self._queue.values():
            for conn, _ in waiting:
                conn.close()
        self._queue.clear()
        self._queued = 0
        self._book.close()
        for slow in list(self._slow.values()):
            for slot in list(slow):
                if not slot.started:  # no task or transport yet: nothing else will close it
                    self._release(slot)
                    slot.abort()
        self._starting.clear()
        for task in list(self._tasks):
            task.cancel()
        self._runner._check_site(self)
        self._runner._unreg_site(self)

    # -- accepting ---------------------------------------------------------------------------

    def _accept_ready(self) -> None:
        """Accept everything the kernel holds (up to the backlog) and place each newcomer."""
        assert self._sock is not None
        for _ in range(self._backlog):
            try:
                conn, address = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:
                    self._pause_accepting(exc)
                    return
                self._accept_failed(exc)  # that one connection (Linux passes its network error)
                continue
            self._backoff = 0.05
            conn.setblocking(False)
            self._place(conn, str(address[0]))

    def _accept_failed(self, exc: OSError) -> None:
        """An ``accept()`` error other than a lack of resources: accept(2) on Linux returns a
        pending connection's network error (ECONNABORTED, EPROTO, EPERM from a firewall, ...),
        after which the next connection can be accepted. One line per window, no traceback
        (asyncio's own loop logs each as an "Exception in callback" traceback)."""
        self._metrics.connections_refused.labels("error").inc()
        self._logs.log(
            logging.WARNING,
            "accept-error",
            "accept() failed: %s",
            exc.strerror or exc,
            event="accept_failed",
            error=errno.errorcode.get(exc.errno or 0, "?"),
        )

    def _pause_accepting(self, exc: OSError) -> None:
        """Out of descriptors or memory: stop accepting for a while (the kernel's listen backlog
        holds the newcomers) instead of retrying in a storm (Go: ``Server.Serve``'s tempDelay)."""
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._sock.fileno())
        self._metrics.connections_refused.labels("resources").inc()
        self._logs.log(
            logging.WARNING,
            "accept",
            "cannot accept connections: %s; pausing %.2f s (%d open)",
            exc.strerror,
            self._backoff,
            self._open,
            event="accept_paused",
            error=errno.errorcode.get(exc.errno or 0, "?"),
        )
        sock = self._sock

        def resume() -> None:
            self._resume = None
            if self._sock is sock and sock.fileno() >= 0:
                loop.add_reader(sock.fileno(), self._accept_ready)

        self._resume = loop.call_later(self._backoff, resume)
        self._backoff = min(self._backoff * 2, 1.0)

    def _place(self, conn: socket.socket, client: str) -> None:
        """Admit ``conn``, making room if the caps allow it, queue it, or close it."""
        now = time.monotonic()
        queued = len(self._queue.get(client, ()))
        if self._per_client[client] + queued >= self.limits.max_connections_per_client:
            victim = self._oldest_slow(client, now - self.limits.evict_after)
            if victim is None:
                self._refuse(conn, client, "per-client")
                return
            self._evict(victim, "per-client")
        elif self._open >= self.capacity:
            victim = self._room_for(client, now)
            if victim is None:
                self._enqueue(conn, client, now)
                return
            self._evict(victim, "cap")
        self._admit(conn, client)

    def _room_for(self, client: str, now: float) -> Slot | None:
        """At the server's cap, the slow connection to close for a newcomer from ``client``: the
        oldest of the address holding the most connections when that is more than ``client``
        would hold (fair share), else the oldest one slow for ``evict_after``; None if neither."""
        mine = self._per_client[client] + 1
        heaviest = max(
            (c for c in self._slow if self._slow[c]), key=self._per_client.__getitem__, default=None
        )
        if heaviest is not None and self._per_client[heaviest] > mine:
            return self._oldest_slow(heaviest, now)
        return self._oldest_slow(None, now - self.limits.evict_after)

    def _oldest_slow(self, client: str | None, before: float) -> Slot | None:
        """The connection of ``client`` (any client: None) slow the longest, if slow since
        ``before`` or earlier."""
        if client is not None:
            slow = self._slow.get(client)
            first = next(iter(slow.items()), None) if slow else None
        else:
            heads = (next(iter(s.items())) for s in self._slow.values() if s)
            first = min(heads, key=lambda item: item[1], default=None)
        return first[0] if first is not None and first[1] <= before else None

    def _evict(self, slot: Slot, why: str) -> None:
        """Close ``slot``'s connection; its slot is free at once (for a newcomer, when ``why`` is
        a cap: not refilled from the queue) and its transport goes on the next iteration."""
        self._release(slot, refill=False)
        slot.abort()
        self._metrics.connections_refused.labels("evicted").inc()
        self._logs.log(
            logging.INFO,
            f"evicted:{why}",
            "closed the connection from %s slow the longest (%s)",
            slot.client,
            _EVICTIONS[why],
            event="connection_evicted",
            client=slot.client,
            reason=why,
        )

    def _refuse(self, conn: socket.socket, client: str, reason: str) -> None:
        conn.close()  # before the TLS handshake: a refused client costs almost nothing
        self._metrics.connections_refused.labels(reason).inc()
        self._logs.log(
            logging.WARNING,
            f"refused:{reason}",
            "refused a connection from %s (%s: %d open from it, %d in all, %d queued)",
            client,
            _REFUSALS[reason],
            self._per_client[client],
            self._open,
            self._queued,
            event="connection_refused",
            client=client,
            reason=reason,
        )

    # -- the queue (backpressure) --------------------------------------------------------------

    def _enqueue(self, conn: socket.socket, client: str, now: float) -> None:
        if self._queued >= self._backlog:
            self._refuse(conn, client, "full")
            return
        self._queue.setdefault(client, deque()).append((conn, now))
        self._queued += 1
        self._serve_queue_later()

    def _next_queued(self) -> str:
        """The client whose queued newcomer goes next: the address holding the fewest
        connections, then the one waiting longest."""
        return min(self._queue, key=lambda c: (self._per_client[c], self._queue[c][0][1]))

    def _pop_queued(self, client: str) -> socket.socket:
        conn, _ = self._queue[client].popleft()
        if not self._queue[client]:
            del self._queue[client]
        self._queued -= 1
        return conn

    def _dequeue(self) -> None:
        """Admit queued newcomers while there is room."""
        while self._queued and self._open < self.capacity:
            client = self._next_queued()
            self._admit(self._pop_queued(client), client)

    def _serve_queue(self) -> None:
        """Close queued newcomers past the handshake deadline, make room for the others as
        slow connections come of age (``evict_after``), and look again when the next one does."""
        self._queue_timer = None
        now = time.monotonic()
        deadline = now - self.limits.handshake_timeout
        for client in list(self._queue):
            waiting = self._queue[client]
            while waiting and waiting[0][1] <= deadline:
                self._pop_queued(client).close()
                self._timed_out("queue", client)
        self._dequeue()
        while self._queued:
            client = self._next_queued()
            victim = self._room_for(client, now)
            if victim is None:
                break
            self._evict(victim, "cap")
            self._admit(self._pop_queued(client), client)
        self._serve_queue_later()

    def _serve_queue_later(self) -> None:
        if not self._queued or self._queue_timer is not None:
            return
        when = min(waiting[0][1] for waiting in self._queue.values()) + self.limits.handshake_timeout
        slow = [next(iter(s.values())) for s in self._slow.values() if s]
        if slow:
            when = min(when, min(slow) + self.limits.evict_after)
        delay = max(when - time.monotonic(), 0.01)
        self._queue_timer = asyncio.get_running_loop().call_later(delay, self._serve_queue)

    # -- admitted connections ------------------------------------------------------------------

    def _admit(self, conn: socket.socket, client: str) -> None:
        """Count ``conn`` in and start its handshake deadline. Its TLS state, its task and
        aiohttp's protocol are made only once the client has sent something: until then a
        connection is a descriptor and a dict entry (a third of a slow-client attack never sends
        a ClientHello)."""
        slot = Slot(client, conn)
        self._open += 1
        self._per_client[client] += 1
        self._metrics.connections_open.inc()
        now = time.monotonic()
        self._slow.setdefault(client, {})[slot] = now
        self._handshakes.start(slot, now)
        try:
            waiting = not conn.recv(1, socket.MSG_PEEK)  # b"": closed already; the task sees it
        except BlockingIOError:
            waiting = True
        except OSError:
            waiting = False  # reset already: the task sees it and gives the slot back
        if waiting:
            slot.reading = True
            asyncio.get_running_loop().add_reader(conn.fileno(), self._first_bytes, slot)
        else:  # the ClientHello is here (a client that is not slow)
            self._ready_to_start(slot)

    def _first_bytes(self, slot: Slot) -> None:
        slot.reading = False
        asyncio.get_running_loop().remove_reader(slot.conn.fileno())
        self._ready_to_start(slot)

    def _ready_to_start(self, slot: Slot) -> None:
        """``slot`` has sent its first bytes: its TLS handshake starts within the budget of the
        next loop iteration (:meth:`_start_some`)."""
        self._starting.setdefault(slot.client, deque()).append(slot)
        if not self._start_scheduled:
            self._start_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_some)

    def _start_some(self) -> None:
        """Start at most ``_STARTS_PER_ITERATION`` TLS handshakes, newcomers from the address
        holding the fewest connections first (the API server's, next to a tenant's hundreds),
        and leave the rest to the next iteration. A full handshake is the costliest thing a
        client can make the server do (~0.3 ms of OpenSSL, as much again around it); when
        reconnecting clients ask for more than the CPU the server gets, the excess waits here
        as accepted sockets (cheap, closed at the handshake deadline) instead of every iteration
        growing until requests already in progress miss their deadlines."""
        self._start_scheduled = False
        budget = _STARTS_PER_ITERATION
        while budget and self._starting:
            client = min(self._starting, key=self._per_client.__getitem__)
            waiting = self._starting[client]
            slot = waiting.popleft()
            if not waiting:
                del self._starting[client]
            if not slot.released and not slot.aborted:
                self._start(slot)
                budget -= 1
        if self._starting:
            self._start_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_some)

    def _start(self, slot: Slot) -> None:
        slot.started = True  # the socket now belongs to the task (and the transport it makes)
        task = asyncio.create_task(self._connect(slot.conn, slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _handshake_late(self, slot: Slot) -> None:
        if slot.released:
            return
        self._timed_out("handshake", slot.client)
        self._release(slot)
        slot.abort()

    def _headers_late(self, slot: Slot) -> None:
        if slot.handler is not None and not slot.released:
            slot.handler.headers_late()

    def _idle_late(self, slot: Slot) -> None:
        if isinstance(slot.handler, ReviewConnection) and not slot.released:
            slot.handler.idle_late()

    # -- what a fast connection's book (slots.ConnectionBook) leaves to the site ---------------

    def released(self, slot: Slot) -> None:
        self._release(slot)

    def timed_out(self, phase: str, client: str) -> None:
        self._timed_out(phase, client)

    def fallback(self, slot: Slot) -> asyncio.Protocol:
        """aiohttp's protocol for ``slot``, which a fast connection hands itself over to."""
        handler = self._handler(slot)
        slot.handler = handler
        return handler

    def register(self, connection: Any, transport: asyncio.BaseTransport) -> None:
        """Count ``connection`` among aiohttp's, so that a graceful shutdown closes it when idle
        and waits for its review in progress (aiohttp: ``Server.pre_shutdown``, ``shutdown``)."""
        server = self._runner.server
        if server is not None:
            server.connection_made(connection, transport)  # type: ignore[arg-type]

    def unregister(self, connection: Any) -> None:
        server = self._runner.server
        if server is not None:
            server._connections.pop(connection, None)

    def _handler(self, slot: Slot) -> _GuardedHandler:
        server = self._runner.server
        assert server is not None
        kwargs = {**server._kwargs, "loop": asyncio.get_running_loop()}  # as aiohttp's Server.__call__
        return _GuardedHandler(server, site=self, slot=slot, **kwargs)

    async def _connect(self, conn: socket.socket, slot: Slot) -> None:
        """Serve ``conn``: aiohttp's protocol, behind TLS when the site has a context. What
        ``loop.connect_accepted_socket(..., ssl=...)`` does (CPython:
        ``BaseEventLoop._create_connection_transport``; uvloop: ``Loop.connect_accepted_socket``
        in ``uvloop/loop.pyx``), with the loop's TLS protocol made here (:func:`tls_protocol_for`)
        and handed over as a plain protocol: both loops then return the TCP transport as soon as
        it is made, so that the handshake can be aborted from outside (its deadline, an
        eviction). Given ``ssl=``, uvloop's would return only after the handshake, and close —
        not abort — a connection whose handshake failed."""
        loop = asyncio.get_running_loop()
        if slot.gone():  # closed before its task ran
            conn.close()
            return
        handler: _GuardedHandler | ReviewConnection
        if self._routes is not None:
            handler = ReviewConnection(self._routes, self._book, slot)
        else:
            handler = self._handler(slot)
        slot.handler = handler
        waiter: asyncio.Future[None] | None = None
        protocol: asyncio.BaseProtocol = handler  # type: ignore[assignment]
        if self._ssl_context is not None:
            waiter = loop.create_future()
            protocol = tls_protocol_for(loop)(
                loop,
                handler,
                self._ssl_context,
                waiter,
                server_side=True,
                ssl_handshake_timeout=self.limits.handshake_timeout,
                ssl_shutdown_timeout=self.limits.handshake_timeout,
            )
        try:
            slot.transport, _ = await loop.connect_accepted_socket(lambda: protocol, conn)
        except OSError as exc:  # the socket was already unusable (reset before we got to it)
            conn.close()
            self._handshake_failed(slot, exc)
            return
        if slot.gone():  # evicted while its transport was being made
            slot.transport.abort()
            return
        if waiter is None:
            return
        try:
            await waiter
        except OSError as exc:
            slot.transport.abort()
            self._handshake_failed(slot, exc)
            return
        if not handler.handshaken:  # closed during the handshake (the waiter then has no error)
            self._release(slot)

    def _handshake_failed(self, slot: Slot, exc: OSError) -> None:
        if slot.released:
            return
        if "taking longer" in str(exc):  # asyncio's handshake timeout (ConnectionAbortedError)
            self._timed_out("handshake", slot.client)
        else:
            self._logs.log(
                logging.DEBUG, "handshake", "TLS handshake with %s failed: %s", slot.client, exc,
                event="handshake_failed", client=slot.client,
            )  # fmt: skip
        self._release(slot)

    def _timed_out(self, phase: str, client: str) -> None:
        self._metrics.connection_timeouts.labels(phase).inc()
        self._logs.log(
            logging.INFO,
            f"timeout:{phase}",
            "closed a connection from %s: %s",
            client,
            "no slot within the handshake deadline" if phase == "queue" else f"no complete {phase} in time",
            event="connection_timeout",
            phase=phase,
            client=client,
        )

    def _release(self, slot: Slot, *, refill: bool = True) -> None:
        """Give ``slot`` back (once, however many ways its connection ends) and, unless a
        newcomer takes its place (``refill=False``), admit the next queued one."""
        if slot.released:
            return
        slot.released = True
        self._book.forget(slot)
        self._open -= 1
        self._per_client[slot.client] -= 1
        if self._per_client[slot.client] <= 0:
            del self._per_client[slot.client]
        self._metrics.connections_open.dec()
        if refill and self._queued:
            self._dequeue()
