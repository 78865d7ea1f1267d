"""Run a synchronous call on the event loop's own thread, interrupted at a deadline.

The engine takes a fraction of a millisecond per review, less than handing it to a worker thread
costs: the hop itself, and above all the GIL, which the event loop's thread must win back after
every socket write while the worker computes (up to ``sys.getswitchinterval()``, 5 ms, each
time). So the server evaluates inline — and still honours the per-request deadline for an object
that would take the engine long: a ``SIGALRM`` interval timer raises :class:`DeadlineExceeded`
inside the call when the time is up, which aborts it (Python code is interrupted between two
bytecodes; a blocking sleep is interrupted too).

Signals reach only the main thread, so :meth:`AlarmClock.available` is false elsewhere (a server
on a thread of its own, as some tests and embedders run it) and on platforms without
``setitimer``; the server then uses its worker threads as before. While a server evaluates
inline it owns ``SIGALRM``: its handler is installed once, on first use, and the previous one is
put back by :meth:`AlarmClock.close`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["AlarmClock", "DeadlineExceeded"]

T = TypeVar("T")
_MIN_SECONDS = 1e-6  # setitimer(0) would disarm instead of firing at once
_ITIMER = hasattr(signal, "setitimer")


class DeadlineExceeded(BaseException):
    """The call ran past its deadline. A ``BaseException``: the engine's own fail-safe handlers
    (``except Exception``) must not turn it into a finding and carry on."""


class AlarmClock:
    """Runs calls under a ``SIGALRM`` deadline (one at a time: the event loop's thread)."""

    def __init__(self) -> None:
        self._armed = False
        self._installed = False
        self._previous: Any = None
        # read once: available() runs twice per review, and current_thread() and Thread.ident
        # are interpreted
        self._main = threading.main_thread().ident

    def available(self) -> bool:
        """Whether :meth:`call` can work here (the main thread, POSIX interval timers)."""
        return _ITIMER and threading.get_ident() == self._main

    def _on_alarm(self, signum: int, frame: Any) -> None:
        # A signal that arrives after the call returned, before the timer was cleared, is ignored.
        if self._armed:
            self._armed = False
            raise DeadlineExceeded

    def call(self, fn: Callable[[], T], seconds: float) -> T:
        """``fn()``, or :class:`DeadlineExceeded` once ``seconds`` have passed. Main thread only."""
        if not self._installed:
            self._previous = signal.signal(signal.SIGALRM, self._on_alarm)
            self._installed = True
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, max(seconds, _MIN_SECONDS))
        try:
            return fn()
        finally:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    def close(self) -> None:
        """Put the previous ``SIGALRM`` handler back (main thread)."""
        if self._installed:
            self._installed = False
            signal.signal(signal.SIGALRM, self._previous)
