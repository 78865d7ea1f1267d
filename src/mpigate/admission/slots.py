"""The connection guard's bookkeeping of admitted connections (:mod:`.guard`), compiled with mypyc.

A connection's requests move it between the guard's states — slow (no complete request, may be
closed to make room), busy, waiting for its headers, idle — several times per review, which the
reviews' fast path (:mod:`.fastpath`) reports through :class:`ConnectionBook`. The guard itself
stays interpreted (its aiohttp handler subclasses aiohttp's ``RequestHandler``, which mypyc cannot
compile a subclass of), so what changes per review lives here: the slow connections by client
address, and the three deadlines that last the same for every connection (:class:`Deadlines`).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["ConnectionBook", "Deadlines", "Site", "Slot"]


class Slot:
    """One admitted connection: its client address and how to close it at once."""

    def __init__(self, client: str, conn: socket.socket) -> None:
        self.client = client
        self.conn = conn
        self.released = False
        self.reading = False  # waiting for the client's first byte, before any TLS state exists
        self.started = False  # it has a task: the socket belongs to the task and its transport
        self.aborted = False
        # asyncio's or uvloop's TCP transport (uvloop's is no asyncio.Transport subclass)
        self.transport: Any = None
        # the guard's aiohttp handler or a fast connection (fastpath.ReviewConnection)
        self.handler: Any = None

    def gone(self) -> bool:
        """Whether it was closed (read again after each ``await``)."""
        return self.aborted

    def abort(self) -> None:
        """Close without the TLS close_notify exchange that a hostile peer never answers
        (``transport.close`` would hold the connection for ``ssl_shutdown_timeout``)."""
        self.aborted = True
        if self.transport is not None:
            self.transport.abort()
        elif not self.started:
            if self.reading:
                self.reading = False
                asyncio.get_running_loop().remove_reader(self.conn.fileno())
            self.conn.close()
        # else: the task is making the transport, which registers the socket's descriptor on
        # the next iteration — closing the socket now would let that registration hit another
        # connection's reused descriptor; the task aborts the transport once it has it


class Deadlines:
    """Deadlines that all last ``timeout``, watched by one timer: started connections in one
    insertion-ordered dict (so the earliest deadline is first), the timer armed for the first.
    Starting or stopping one is a dict operation — no ``TimerHandle`` per connection, which on
    thousands of connections is a heap of timers to push, cancel and skip."""

    def __init__(self, timeout: float, expired: Callable[[Slot], None]) -> None:
        self.timeout = timeout
        self._expired = expired
        self._since: dict[Slot, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def start(self, slot: Slot, now: float) -> None:
        self._since.pop(slot, None)
        self._since[slot] = now
        if self._timer is None:
            self._arm(now + self.timeout)

    def stop(self, slot: Slot) -> None:
        self._since.pop(slot, None)

    def close(self) -> None:
        self._disarm()
        self._since.clear()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, when: float) -> None:
        # a little late, so that one firing takes every deadline of that moment
        self._timer = asyncio.get_running_loop().call_at(when + 0.05, self._fire)

    def _fire(self) -> None:
        self._timer = None
        limit = time.monotonic() - self.timeout
        while self._since:
            slot, since = next(iter(self._since.items()))
            if since > limit:
                break
            del self._since[slot]
            self._expired(slot)  # may start others (a queued newcomer takes the slot)
        self._disarm()  # armed by such a start, for a later deadline than the first
        if self._since:
            self._arm(next(iter(self._since.values())) + self.timeout)


class Site(Protocol):
    """What a connection's rarer events go to (:class:`mpigate.admission.guard.GuardedSite`)."""

    def released(self, slot: Slot) -> None: ...
    def timed_out(self, phase: str, client: str) -> None: ...
    def fallback(self, slot: Slot) -> asyncio.Protocol: ...
    def register(self, connection: Any, transport: asyncio.BaseTransport) -> None: ...
    def unregister(self, connection: Any) -> None: ...


class ConnectionBook:
    """The admitted connections' states, and what a fast connection tells the guard
    (:class:`mpigate.admission.fastpath.Guard`): the per-request calls are answered here, the
    rest go to ``site``."""

    def __init__(
        self,
        site: Site,
        *,
        handshakes: Deadlines,
        headers: Deadlines,
        idle: Deadlines,
    ) -> None:
        self._site = site
        # slow connections (no complete request) by client address, oldest first: slot -> since
        self.slow: dict[str, dict[Slot, float]] = {}
        # from accept to the end of the TLS handshake; from a request's first byte to its headers;
        # idle kept-alive fast connections (aiohttp's own handler keeps its own keep-alive timer)
        self.handshakes = handshakes
        self.headers = headers
        self.idle_since = idle

    def handshaken(self, slot: Slot) -> None:
        self.handshakes.stop(slot)

    def awaiting_headers(self, slot: Slot) -> None:
        self.headers.start(slot, time.monotonic())

    def headers_in(self, slot: Slot) -> None:
        self.headers.stop(slot)

    def request_in(self, slot: Slot) -> None:
        """The request is complete: no longer slow (never closed to make room)."""
        slow = self.slow.get(slot.client)
        if slow is not None:
            slow.pop(slot, None)
            if not slow:
                del self.slow[slot.client]

    def answered(self, slot: Slot) -> None:
        """Slow again from now on, until its next request is complete."""
        if not slot.released:
            slow = self.slow.get(slot.client)
            if slow is None:
                slow = self.slow[slot.client] = {}
            else:
                slow.pop(slot, None)
            slow[slot] = time.monotonic()

    def idle(self, slot: Slot) -> None:
        if not slot.released:
            self.idle_since.start(slot, time.monotonic())

    def not_idle(self, slot: Slot) -> None:
        self.idle_since.stop(slot)

    def forget(self, slot: Slot) -> None:
        """``slot`` is released: in no state any more."""
        self.handshakes.stop(slot)
        self.headers.stop(slot)
        self.idle_since.stop(slot)
        self.request_in(slot)

    def close(self) -> None:
        self.handshakes.close()
        self.headers.close()
        self.idle_since.close()

    # -- the rarer events, the site's ------------------------------------------------------------

    def released(self, slot: Slot) -> None:
        self._site.released(slot)

    def timed_out(self, phase: str, client: str) -> None:
        self._site.timed_out(phase, client)

    def fallback(self, slot: Slot) -> asyncio.Protocol:
        return self._site.fallback(slot)

    def register(self, connection: Any, transport: asyncio.BaseTransport) -> None:
        self._site.register(connection, transport)

    def unregister(self, connection: Any) -> None:
        self._site.unregister(connection)
