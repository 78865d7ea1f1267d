"""Several webhook server processes on one port (``mpigate serve --workers N``).

One Python process judges reviews on one core (the engine holds the GIL); on a pod with more
cores, ``--workers N`` runs N complete servers — each with its own event loop, config watcher,
certificate reloader and audit chain (the audit writer takes the next unlocked chain, so each
worker appends to its own) — listening on the same port with ``SO_REUSEPORT``: the kernel spreads
new connections over them. This process only supervises:

* it resolves the port first (``--port 0`` picks one free port that every worker then shares) and
  logs ``listening`` once every worker is serving;
* SIGTERM/SIGINT are passed on, and each worker drains gracefully as a single server does;
* a worker that exits on its own stops the others and the supervisor exits non-zero, so that the
  pod restarts (a partially serving replica would hide the failure);
* metrics are collected across workers through ``prometheus_client``'s multiprocess mode (a
  directory of per-process files, ``$PROMETHEUS_MULTIPROC_DIR`` or a private temporary one), so
  ``/metrics`` on any worker reports the replica's totals.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any, Final

from .logjson import fields

__all__ = ["MULTIPROC_ENV", "WorkerPoolError", "reserve_port", "run_workers"]

log = logging.getLogger("mpigate.admission.workers")

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
_POLL_SECONDS: Final = 0.2


class WorkerPoolError(Exception):
    """The workers could not be started."""


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """A socket bound (not listening) to ``host:port`` with ``SO_REUSEPORT``, and its port.

    Workers bind the same port with ``SO_REUSEPORT`` too; holding this socket keeps a port chosen
    for ``port=0`` reserved until the supervisor exits. A bound socket that does not listen is
    given no connections.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock, int(sock.getsockname()[1])


def run_workers(
    target: Callable[..., None],
    make_args: Callable[[int, Any], Sequence[Any]],
    count: int,
    *,
    port: int,
    start_timeout: float = 60.0,
    stop_timeout: float = 30.0,
) -> int:
    """Run ``count`` processes of ``target(*make_args(index, ready))`` until a signal or a failure;
    the exit code for the supervisor.

    Each worker must put its index on ``ready`` once it serves. ``stop_timeout`` bounds the drain
    after SIGTERM (then the workers are killed).
    """
    context = mp.get_context("spawn")  # fresh interpreters: no inherited threads or event loop
    own_dir = None
    if not os.environ.get(MULTIPROC_ENV):
        own_dir = tempfile.mkdtemp(prefix="mpigate-metrics-")
        os.environ[MULTIPROC_ENV] = own_dir
    metrics_dir = os.environ[MULTIPROC_ENV]
    ready: Any = context.Queue()
    stopping = False
    workers = [
        context.Process(target=target, args=tuple(make_args(i, ready)), name=f"mpigate-worker-{i}")
        for i in range(count)
    ]

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            log.info("signal received: stopping the workers", extra=fields(event="draining"))
        for worker in workers:
            if worker.pid is not None and worker.exitcode is None:
                os.kill(worker.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        for worker in workers:
            worker.start()
        serving: set[int] = set()
        started = time.monotonic()
        while True:
            while len(serving) < count and not ready.empty():
                serving.add(int(ready.get_nowait()))
                if len(serving) == count:
                    log.info(
                        "%d workers listening on port %d",
                        count,
                        port,
                        extra=fields(event="listening", port=port, workers=count),
                    )
            alive = [w for w in workers if w.exitcode is None]
            if not alive:
                break
            failed = [w for w in workers if w.exitcode not in (None, 0)]
            if not stopping and (failed or len(alive) < count):
                gone = (failed or [w for w in workers if w.exitcode is not None])[0]
                log.error(
                    "worker %s exited with %s; stopping the others",
                    gone.name,
                    gone.exitcode,
                    extra=fields(event="worker_exited", worker=gone.name, exit_code=gone.exitcode),
                )
                code = 1
                on_signal(signal.SIGTERM, None)
            if not stopping and len(serving) < count and time.monotonic() - started > start_timeout:
                log.error("workers did not start within %.0f s", start_timeout)
                code = 1
                on_signal(signal.SIGTERM, None)
            wait([w.sentinel for w in alive], timeout=_POLL_SECONDS)
            if stopping:
                _reap(alive, stop_timeout)
        for worker in workers:
            if worker.exitcode not in (0, None, -signal.SIGTERM) and not code:
                code = 1
    finally:
        for worker in workers:
            if worker.exitcode is None and worker.pid is not None:
                worker.kill()
                worker.join(5)
            if worker.pid is not None:
                _mark_dead(worker.pid, metrics_dir)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ready.close()
        if own_dir is not None:
            os.environ.pop(MULTIPROC_ENV, None)
            shutil.rmtree(own_dir, ignore_errors=True)
    return code


def _reap(workers: list[Any], timeout: float) -> None:
    """Wait for draining workers; kill those still running after ``timeout``."""
    end = time.monotonic() + timeout
    for worker in workers:
        worker.join(max(end - time.monotonic(), 0.0))
        if worker.exitcode is None:
            log.error("worker %s did not stop within %.0f s: killed", worker.name, timeout)
            worker.kill()
            worker.join(5)


def _mark_dead(pid: int, directory: str) -> None:
    # Live gauges (in flight) of a dead worker must not count any more.
    from prometheus_client import multiprocess

    with contextlib.suppress(OSError):  # the directory is already gone
        multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
