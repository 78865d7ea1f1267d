"""``mpigate controller``: composes config, credentials, audit trail, metrics, leader election
and kopf into one process.

Order of events: load the config (a tree that does not load is fatal at startup, later ones keep
the last good revision) → open the audit trail → serve ``/metrics``, ``/healthz``, ``/readyz`` →
wait for the leader Lease → run kopf with the handlers, a config reloader and a periodic resync
until a signal, a lost Lease (exit 1) or kopf's end → release the Lease, close the audit trail.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from mpigate.admission.kube import KubeClient, KubeConfig
from mpigate.admission.reload import ConfigStore
from mpigate.audit import AsyncAuditLog, AuditMetrics, WriterOptions, load_signer
from mpigate.config import Config

from .api import ControllerApi
from .events import EventPoster
from .handlers import build_registry, build_settings
from .leader import LeadershipLost, LeaseElector, LeaseSettings
from .metrics import ControllerMetrics
from .reconciler import Reconciler
from .recording import AuditTrailRecorder, LogRecorder, Recorder

__all__ = ["ControllerOptions", "ExitCode", "default_identity", "run_controller"]

log = logging.getLogger(__name__)


class ExitCode:
    OK = 0
    FAILED = 1  # the Lease was lost or kopf stopped by itself: restart as a candidate
    CONFIG = 2


def default_identity() -> str:
    """``<pod name>-<random>``: unique per process, recognisable in the Lease."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{host}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class ControllerOptions:
    config_path: Path
    kube: KubeConfig
    audit_dir: Path | None = None
    audit_key: Path | None = None
    namespace_label: str | None = "mpigate.io/team"
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 8080
    leader_election: bool = True
    lease: LeaseSettings = field(default_factory=lambda: LeaseSettings(namespace="mpigate-system"))
    identity: str = field(default_factory=default_identity)
    resync_seconds: float = 300.0
    reload_seconds: float = 5.0
    watch_timeout: float = 300.0


def connection_info(kube: KubeConfig) -> kopf.ConnectionInfo:
    """kopf's credentials from mpigate's KubeConfig (a token file is re-read at each login)."""
    token = kube.token
    if kube.token_file is not None:
        token = kube.token_file.read_text().strip()
    return kopf.ConnectionInfo(
        server=kube.server,
        ca_data=kube.ca_data,
        insecure=kube.insecure or None,
        scheme="Bearer" if token else None,
        token=token,
        certificate_data=kube.client_cert,
        private_key_data=kube.client_key,
    )


class _Health:
    def __init__(self) -> None:
        self.kopf_task: asyncio.Task[Any] | None = None
        self.recorder: Recorder | None = None
        self.store: ConfigStore | None = None


def _metrics_app(metrics: ControllerMetrics, health: _Health) -> web.Application:
    async def metrics_view(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(_: web.Request) -> web.Response:
        problems = []
        if health.kopf_task is not None and health.kopf_task.done():
            problems.append("kopf stopped")
        if health.recorder is not None and not health.recorder.healthy:
            problems.append("audit trail unhealthy")
        return web.Response(status=503 if problems else 200, text="; ".join(problems) or "ok")

    async def readyz(_: web.Request) -> web.Response:
        ready = health.store is not None and health.store.current is not None
        return web.Response(status=200 if ready else 503, text="ok" if ready else "no config")

    app = web.Application()
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def _bound_port(runner: web.AppRunner, default: int) -> int:
    """The port actually bound (``--metrics-port 0`` picks a free one)."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return default


async def _open_recorder(options: ControllerOptions, config: Config, metrics: ControllerMetrics) -> Recorder:
    if options.audit_dir is None:
        log.warning("no --audit-dir: lifecycle and evidence records go to the log only (not tamper-evident)")
        return LogRecorder()
    settings = config.org.audit
    key = options.audit_key or (Path(settings.signing_key_file) if settings.signing_key_file else None)
    signer = load_signer(settings.signing_method, key) if key is not None else None
    audit_log = await AsyncAuditLog.open(
        options.audit_dir,
        source="controller",
        signer=signer,
        options=WriterOptions.from_settings(settings),
        metrics=AuditMetrics(metrics.registry),
    )
    return AuditTrailRecorder(audit_log)


async def _every(seconds: float, action: Callable[[], Awaitable[object]], what: str) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await action()
        except Exception:  # a background loop must survive any single failure
            log.exception("%s failed", what)


async def run_controller(
    options: ControllerOptions,
    *,
    stop: asyncio.Event | None = None,
    metrics: ControllerMetrics | None = None,
    started: Callable[[int], None] | None = None,
) -> int:
    """Run until ``stop`` (or SIGTERM/SIGINT); returns the process exit code.

    ``started`` is called with the metrics port once it is bound (tests bind port 0)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    metrics = metrics or ControllerMetrics()
    store = ConfigStore(options.config_path)
    loaded = await store.load_now()
    if loaded is None:
        log.error("config at %s does not load: %s", options.config_path, store.last_error)
        return ExitCode.CONFIG
    metrics.config.info({"revision": loaded.revision})
    health = _Health()
    health.store = store

    client = KubeClient(options.kube, user_agent="mpigate-controller", request_timeout=30.0)
    api = ControllerApi(client)
    recorder = await _open_recorder(options, loaded.config, metrics)
    health.recorder = recorder
    runner = web.AppRunner(_metrics_app(metrics, health), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, options.metrics_host, options.metrics_port)
    await site.start()
    if started is not None:
        started(_bound_port(runner, options.metrics_port))
    elector = LeaseElector(api, options.lease, options.identity) if options.leader_election else None
    try:
        if elector is not None:
            log.info(
                "waiting for lease %s/%s as %s", options.lease.namespace, options.lease.name, options.identity
            )
            if not await elector.acquire(stop):
                return ExitCode.OK
        metrics.leader.set(1)
        return await _lead(options, store, api, recorder, metrics, health, elector, stop)
    finally:
        metrics.leader.set(0)
        if elector is not None:
            await elector.release()
        await recorder.close()
        await runner.cleanup()
        await client.close()


async def _lead(
    options: ControllerOptions,
    store: ConfigStore,
    api: ControllerApi,
    recorder: Recorder,
    metrics: ControllerMetrics,
    health: _Health,
    elector: LeaseElector | None,
    stop: asyncio.Event,
) -> int:
    def current_config() -> Config | None:
        loaded = store.current
        return loaded.config if loaded is not None else None

    reconciler = Reconciler(
        config=current_config,
        api=api,
        recorder=recorder,
        metrics=metrics,
        events=EventPoster(api, metrics, options.identity),
        namespace_label=options.namespace_label,
        clock=lambda: dt.datetime.now(dt.UTC),
    )

    async def reload() -> None:
        changed = await store.poll()
        if changed is False:
            metrics.config_reload_failures.inc()
        elif changed and store.current is not None:
            metrics.config.info({"revision": store.current.revision})
            await reconciler.resync()  # egress lists, profiles or teams may have changed

    async def resync() -> None:
        jobs, failures = await reconciler.resync()
        log.info("resync: %d TrainJobs, %d failures", jobs, failures)

    kopf_stop = asyncio.Event()
    registry = build_registry(reconciler, login=lambda **_: connection_info(options.kube))
    operator = asyncio.create_task(
        kopf.operator(
            registry=registry,
            settings=build_settings(watch_timeout=options.watch_timeout),
            clusterwide=True,
            standalone=True,  # no kopf peering: the Lease decides who runs
            stop_flag=kopf_stop,
        ),
        name="kopf",
    )
    health.kopf_task = operator
    tasks: dict[str, asyncio.Task[Any]] = {
        "kopf": operator,
        "stop": asyncio.create_task(stop.wait(), name="stop"),
        "reload": asyncio.create_task(_every(options.reload_seconds, reload, "config reload"), name="reload"),
        "resync": asyncio.create_task(_every(options.resync_seconds, resync, "resync"), name="resync"),
    }
    if elector is not None:
        tasks["lease"] = asyncio.create_task(elector.hold(), name="lease")
    code = ExitCode.OK
    try:
        done, _ = await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
        finished = next(iter(done))
        if finished is tasks.get("lease"):
            exc = finished.exception()
            if isinstance(exc, LeadershipLost):
                log.error("%s; stopping (a standby takes over)", exc)
                code = ExitCode.FAILED
        elif finished is operator and operator.exception() is not None:
            log.error("kopf stopped: %s", operator.exception())
            code = ExitCode.FAILED
    finally:
        kopf_stop.set()
        for name, task in tasks.items():
            if name != "kopf":
                task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(operator, timeout=30)
        await asyncio.gather(*(t for n, t in tasks.items() if n != "kopf"), return_exceptions=True)
    return code
