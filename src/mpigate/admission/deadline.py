"""Run a synchronous call on the event loop's own thread, interrupted at a deadline.

The engine takes a fraction of a millisecond per review, less than handing it to a worker thread
costs: the hop itself, and above all the GIL, which the event loop's thread must win back after
every socket write while the worker computes (up to ``sys.getswitchinterval()``, 5 ms, each
time). So the server evaluates inline — and still honours the per-request deadline for an object
that would take the engine long: a ``SIGALRM`` interval timer raises :class:`DeadlineExceeded`
inside the call when the time is up, which aborts it (Python code is interrupted between two
bytecodes; a blocking sleep is interrupted too).

Signals reach only the main thread, so :func:`alarm_available` is false elsewhere (a server on a
thread of its own, as some tests and embedders run it) and on platforms without ``setitimer``; the
server then uses its worker threads as before.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["DeadlineExceeded", "alarm_available", "call_with_alarm"]

T = TypeVar("T")


class DeadlineExceeded(BaseException):
    """The call ran past its deadline. A ``BaseException``: the engine's own fail-safe handlers
    (``except Exception``) must not turn it into a finding and carry on."""


def alarm_available() -> bool:
    """Whether :func:`call_with_alarm` can work here (main thread, POSIX interval timers)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


class _Alarm:
    """The handler of one call: raises only while its call runs (a signal that arrives after the
    call returned, before the timer was cleared, is ignored)."""

    __slots__ = ("armed",)

    def __init__(self) -> None:
        self.armed = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.armed:
            self.armed = False
            raise DeadlineExceeded


def call_with_alarm(call: Callable[[], T], seconds: float) -> T:
    """``call()``, or :class:`DeadlineExceeded` once ``seconds`` have passed. Main thread only.

    Any previous ``SIGALRM`` handler is restored afterwards, and a timer someone else had set is
    re-armed with what was left of it.
    """
    alarm = _Alarm()
    previous = signal.signal(signal.SIGALRM, alarm)
    alarm.armed = True
    other, _ = signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-6))
    try:
        return call()
    finally:
        alarm.armed = False
        left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if other > 0:
            # Theirs: what remained of it when we armed ours, less the time our call took.
            signal.setitimer(signal.ITIMER_REAL, max(other - (max(seconds, 1e-6) - left), 1e-6))
