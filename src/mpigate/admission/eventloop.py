"""The event loop ``mpigate serve`` runs on: uvloop (the default) or asyncio's own.

uvloop (libuv under a Cython ``asyncio`` loop) runs the loop, the sockets and the TLS transport
(``uvloop/sslproto.pyx``) in compiled code; asyncio's loop and TLS transport are interpreted
Python in CPython 3.11 (``Lib/asyncio/selector_events.py``, ``Lib/asyncio/sslproto.py``). The
connection guard (:mod:`.guard`) serves on either through the loop's public API; its TLS
protocol is the loop's own (see :func:`.guard.tls_protocol_for`). asyncio stays selectable
(``--loop asyncio``) as the fallback, and the webhook tests run on both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

__all__ = ["DEFAULT_LOOP", "LOOPS", "LoopUnavailable", "loop_factory", "loop_name", "run"]

LOOPS: Final = ("uvloop", "asyncio")
DEFAULT_LOOP: Final = "uvloop"

T = TypeVar("T")


class LoopUnavailable(RuntimeError):
    """The loop asked for cannot be had here (uvloop not installed)."""


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A function that makes a new event loop of kind ``name`` (one of :data:`LOOPS`)."""
    if name == "asyncio":
        return asyncio.new_event_loop
    if name == "uvloop":
        try:
            import uvloop
        except ImportError as exc:  # a dependency of mpigate: an install without it is broken
            raise LoopUnavailable(
                "uvloop is not installed (a dependency of mpigate: reinstall it) — or use --loop asyncio"
            ) from exc
        return uvloop.new_event_loop
    raise ValueError(f"unknown event loop {name!r} (one of {', '.join(LOOPS)})")


def run(main: Coroutine[Any, Any, T], loop: str) -> T:
    """``asyncio.run(main)`` on a new event loop of kind ``loop``."""
    try:
        factory = loop_factory(loop)
    except BaseException:
        main.close()  # never started: no "coroutine was never awaited" warning on top of the error
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """The kind of a running loop, as :data:`LOOPS` names it (for logs)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
