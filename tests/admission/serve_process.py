"""``mpigate serve`` as a real process on a free loopback port, with its JSON log lines collected
as they come (for tests that must see what an operator sees: exit codes, log lines, tracebacks)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import sys
from pathlib import Path
from typing import Any

import trustme

from mpigate.admission.eventloop import loop_name

from .conftest import write_cert


class ServeProcess:
    """One ``python -m mpigate serve`` with TLS from ``ca``; ``lines`` holds every stderr line,
    ``events`` the JSON ones. It serves on the kind of event loop the test runs on (``--loop``,
    unless the arguments choose one): the tests that start servers run once per loop."""

    def __init__(self, ca: trustme.CA, directory: Path, *args: str) -> None:
        self.ca = ca
        self.directory = directory
        self.args = args
        self.lines: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    @property
    def client_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        self.ca.configure_trust(ctx)
        return ctx

    async def start(self, *, wait_listening: bool = True) -> ServeProcess:
        cert, key = write_cert(self.ca, self.directory / "tls")
        loop = () if "--loop" in self.args else ("--loop", loop_name(asyncio.get_running_loop()))
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mpigate", "serve", "--tls-cert", str(cert), "--tls-key", str(key),
            "--host", "127.0.0.1", "--port", "0", "--no-live", *loop, *self.args,
            stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            env={**os.environ, "KUBECONFIG": ""},
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())
        if wait_listening:
            self.url = (await self.wait_event("listening"))["url"]
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(text)
            with contextlib.suppress(ValueError):
                record = json.loads(text)
                if isinstance(record, dict):
                    self.events.append(record)
            self._changed.set()
        self._changed.set()

    async def wait_event(self, event: str, timeout: float = 90.0, **match: Any) -> dict[str, Any]:
        """The first log record with ``event`` (and the given fields); fails if the process ends
        or ``timeout`` passes first."""

        async def scan() -> dict[str, Any]:
            while True:
                for record in self.events:
                    if record.get("event") == event and all(record.get(k) == v for k, v in match.items()):
                        return record
                if self._reader is not None and self._reader.done():
                    raise AssertionError(f"server exited before {event!r}: {self.lines[-10:]}")
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(scan(), timeout)

    def tracebacks(self) -> list[str]:
        return [line for line in self.lines if "Traceback" in line]

    async def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; returns the exit code (kills it after ``timeout``)."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            code = await self.proc.wait()
        if self._reader is not None:
            await self._reader
        return code

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            await self._reader
