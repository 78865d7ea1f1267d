"""The asyncio face of the audit writer (the aiohttp webhook, the kopf controller)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from .options import WrittenRecord
from .writer import AuditLog

__all__ = ["AsyncAuditLog"]


class _Deliveries:
    """Hands the writer thread's completed appends to one event loop, a group at a time.

    ``asyncio.wrap_future`` wakes the loop once per record (``call_soon_threadsafe``: a write to
    its self-pipe, during which the writer thread gives up the GIL and has to win it back from the
    busy loop). The writer completes a commit's records one after the other; here the first of
    them wakes the loop and the others only join the group it will deliver.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._done: list[tuple[concurrent.futures.Future[WrittenRecord], asyncio.Future[WrittenRecord]]] = []
        self._wake_scheduled = False

    def watch(
        self, source: concurrent.futures.Future[WrittenRecord], target: asyncio.Future[WrittenRecord]
    ) -> None:
        source.add_done_callback(lambda done: self._completed(done, target))

    def _completed(
        self, source: concurrent.futures.Future[WrittenRecord], target: asyncio.Future[WrittenRecord]
    ) -> None:  # any thread: the writer's, or the loop's when already done
        with self._lock:
            self._done.append((source, target))
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:  # the loop's thread
        with self._lock:
            done, self._done = self._done, []
            self._wake_scheduled = False
        for source, target in done:
            if target.done():  # the waiting task was cancelled
                continue
            if source.cancelled():
                target.cancel()
            elif (error := source.exception()) is not None:
                target.set_exception(error)
            else:
                target.set_result(source.result())


class AsyncAuditLog:
    """The asyncio face of :class:`AuditLog` for the aiohttp webhook.

    ``await log.append(entry)`` returns the :class:`WrittenRecord` once it is durable; the event
    loop keeps serving other requests meanwhile, concurrent appends share one fsync, and the
    records of one commit are handed back to the loop in one wake-up.
    """

    def __init__(self, log: AuditLog) -> None:
        self.log = log
        self._deliveries: _Deliveries | None = None

    @classmethod
    async def open(cls, directory: str | Path, **kwargs: Any) -> AsyncAuditLog:
        """:meth:`AuditLog.open` in a worker thread (recovery may read the last segment)."""
        log = await asyncio.to_thread(AuditLog.open, directory, **kwargs)
        return cls(log)

    @property
    def chain(self) -> str:
        return self.log.chain

    @property
    def healthy(self) -> bool:
        return self.log.healthy

    @property
    def problem(self) -> str | None:
        return self.log.problem

    async def append(self, entry: Mapping[str, Any]) -> WrittenRecord:
        """Append and wait until durable; raises :class:`AuditWriteError` when not written.

        If the awaiting task is cancelled, the record is dropped when the writer had not taken it
        yet, and written otherwise — either way no answer was given, so no decision goes
        unrecorded."""
        loop = asyncio.get_running_loop()
        deliveries = self._deliveries
        if deliveries is None or deliveries.loop is not loop:
            # appends still waiting on another loop keep the deliveries they were watched with
            deliveries = self._deliveries = _Deliveries(loop)
        source = self.log.submit(entry)
        target: asyncio.Future[WrittenRecord] = loop.create_future()
        deliveries.watch(source, target)
        try:
            return await target
        except asyncio.CancelledError:
            source.cancel()  # dropped if the writer has not taken it yet (as asyncio.wrap_future)
            raise

    async def aclose(self) -> None:
        """Drain, write the shutdown checkpoint and release the chain."""
        await asyncio.to_thread(self.log.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
