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
import threading
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from mpigate.admission.kube import KubeClient, KubeConfig
from mpigate.admission.reload import ConfigStore
from mpigate.audit import AsyncAuditLog, AuditMetrics, Signer, WriterOptions, load_signer
from mpigate.audit.shipping import AuditShipping, shipping_for
from mpigate.config import Config

from .api import ControllerApi
from .background import DEFAULT_STATE_NAME, BackgroundAuditor, interval_wait
from .events import EventPoster
from .handlers import build_registry, build_settings
from .jobstate import Sealer
from .kinds import MPIJOB, TRAINJOB, JobKind
from .leader import LeaseElector, LeaseSettings
from .ledger import DEFAULT_LEDGER_NAME
from .metrics import ControllerMetrics
from .reconciler import Reconciler
from .recording import AuditTrailRecorder, LogRecorder, Recorder
from .reliances import DEFAULT_KUEUE_CONFIG

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
    #: ``namespace/name`` of Kueue's Configuration ConfigMap, checked at start and every resync
    #: (controller/reliances.py); None: not checked.
    kueue_config: str | None = DEFAULT_KUEUE_CONFIG
    watch_timeout: float = 300.0
    #: ``namespace/name`` of the ledger ConfigMap of open run segments (controller/ledger.py), read
    #: at start and written every ``ledger_seconds`` and when stopping; None: no ledger (a job deleted
    #: while the controller is down then gets no closing record).
    ledger: str | None = f"mpigate-system/{DEFAULT_LEDGER_NAME}"
    ledger_seconds: float = 30.0
    #: ``namespace/name`` of the ConfigMap of the background audit's standing violations
    #: (controller/background.py); None: kept in memory only (a restart reports them as new).
    audit_state: str | None = f"mpigate-system/{DEFAULT_STATE_NAME}"
    #: The first background audit pass waits this long after the start (or for a new revision):
    #: kopf's initial listing and the reconciler's first look at every job come first.
    audit_delay_seconds: float = 60.0


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
        self.kopf_done: asyncio.Future[BaseException | None] | None = None
        self.recorder: Recorder | None = None
        self.store: ConfigStore | None = None
        self.sealer: Sealer | None = None


def _metrics_app(metrics: ControllerMetrics, health: _Health) -> web.Application:
    async def metrics_view(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(_: web.Request) -> web.Response:
        problems = []
        if health.kopf_done is not None and health.kopf_done.done():
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


def _signer(options: ControllerOptions, config: Config) -> Signer | None:
    settings = config.org.audit
    key = options.audit_key or (Path(settings.signing_key_file) if settings.signing_key_file else None)
    return load_signer(settings.signing_method, key) if key is not None else None


def sealer_of(signer: Signer | None) -> Sealer | None:
    """The seal of the controller's state annotations: the audit key's signature (deterministic
    for HMAC-SHA256 and Ed25519, so every replica computes the same one)."""
    if signer is None:
        log.warning(
            "no audit key: the controller's state annotations on jobs are not sealed (a tenant who may "
            "edit a job's annotations could change what is charged)"
        )
        return None
    return signer.sign


async def _open_recorder(
    options: ControllerOptions, config: Config, metrics: ControllerMetrics, signer: Signer | None
) -> tuple[Recorder, AuditShipping | None]:
    """The controller's recorder, and the shipping and retention of its chain when the org asks
    for them (``spec.audit.otlp``, ``spec.audit.retention``)."""
    if options.audit_dir is None:
        log.warning("no --audit-dir: lifecycle and evidence records go to the log only (not tamper-evident)")
        return LogRecorder(), None
    settings = config.org.audit
    audit_metrics = AuditMetrics(metrics.registry)
    audit_log = await AsyncAuditLog.open(
        options.audit_dir,
        source="controller",
        signer=signer,
        options=WriterOptions.from_settings(settings),
        metrics=audit_metrics,
    )
    shipping = shipping_for(
        options.audit_dir, lambda: audit_log.log, settings, metrics=audit_metrics, source="controller"
    )
    return AuditTrailRecorder(audit_log), shipping


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
    signer = _signer(options, loaded.config)
    recorder, shipping = await _open_recorder(options, loaded.config, metrics, signer)
    health.recorder = recorder
    health.sealer = sealer_of(signer)
    runner = web.AppRunner(_metrics_app(metrics, health), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, options.metrics_host, options.metrics_port)
    await site.start()
    if started is not None:
        started(_bound_port(runner, options.metrics_port))
    elector = (
        LeaseElector(ControllerApi(client), options.lease, options.identity)
        if options.leader_election
        else None
    )
    try:
        if elector is not None:
            log.info(
                "waiting for lease %s/%s as %s", options.lease.namespace, options.lease.name, options.identity
            )
            if not await elector.acquire(stop):
                return ExitCode.OK
        metrics.leader.set(1)
        return await _lead(options, store, recorder, metrics, health, elector, stop)
    finally:
        metrics.leader.set(0)
        if elector is not None:
            await elector.release()
        await recorder.close()
        if shipping is not None:  # after the writer closed: its shutdown checkpoint ships too
            await asyncio.to_thread(shipping.stop)
        await runner.cleanup()
        await client.close()


async def served_kinds(api: ControllerApi) -> tuple[JobKind, ...]:
    """The job kinds the controller looks after: TrainJobs, and MPIJobs when the API server serves
    the MPI Operator's ``kubeflow.org/v2beta1`` (read once at start: installing the operator later
    takes a restart of the controller). A discovery that fails otherwise than "not found" raises:
    the controller must not run blind to a kind that may be there."""
    kinds = [TRAINJOB]
    found = await api.get(f"/apis/{MPIJOB.api_version}")
    resources = found.get("resources") if found is not None else None
    if isinstance(resources, list) and any(
        isinstance(r, Mapping) and r.get("name") == MPIJOB.plural for r in resources
    ):
        kinds.append(MPIJOB)
        log.info("%s is served: looking after MPIJobs too", MPIJOB.api_version)
    else:
        log.info("%s MPIJobs are not served (no MPI Operator): TrainJobs only", MPIJOB.api_version)
    return tuple(kinds)


class _KopfThread(threading.Thread):
    """kopf and the reconciler in a thread with its own event loop.

    kopf cancels, when it stops, every task of its loop that appeared while it ran ("hung
    tasks"); in a loop of its own that cannot hit the metrics server, the Lease renewal or an
    embedding application's tasks. The thread ends after :meth:`request_stop` or when kopf ends
    by itself."""

    def __init__(
        self,
        options: ControllerOptions,
        store: ConfigStore,
        recorder: Recorder,
        metrics: ControllerMetrics,
        done: Callable[[BaseException | None], None],
        sealer: Sealer | None = None,
    ) -> None:
        super().__init__(name="kopf", daemon=True)
        self.options = options
        self.store = store
        self.recorder = recorder
        self.metrics = metrics
        self.sealer = sealer
        #: Set by :meth:`request_stop`: True when the process stops cleanly (False: the Lease was
        #: lost and another replica may already lead, so the ledger is left to it).
        self.graceful = False
        self._done = done
        self._lock = threading.Lock()
        self._stop_requested = False
        self._wake: Callable[[], None] | None = None  # ends kopf: set by _main in kopf's loop

    def request_stop(self, *, graceful: bool) -> None:
        """Stop kopf (from any thread; before the thread runs too). kopf is told in its own loop,
        not through a flag that a worker thread of that loop waits on: asyncio.run waits for its
        worker threads, so such a flag that nobody set kept the thread from ever ending when kopf
        ended by itself."""
        with self._lock:
            self.graceful = graceful
            self._stop_requested = True
            wake = self._wake
        if wake is not None:
            wake()

    def run(self) -> None:
        error: BaseException | None = None
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the main loop, which decides the exit code
            error = exc
        self._done(error)

    async def _main(self) -> None:
        options, store, metrics = self.options, self.store, self.metrics
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: kopf has ended already
                loop.call_soon_threadsafe(stopping.set)

        with self._lock:
            self._wake = wake
            if self._stop_requested:
                stopping.set()
        client = KubeClient(options.kube, user_agent="mpigate-controller", request_timeout=30.0)
        api = ControllerApi(client)

        def current_config() -> Config | None:
            loaded = store.current
            return loaded.config if loaded is not None else None

        ledger = None
        if options.ledger:
            namespace, _, name = options.ledger.partition("/")
            ledger = (namespace, name)
        reconciler = Reconciler(
            config=current_config,
            api=api,
            recorder=self.recorder,
            metrics=metrics,
            events=EventPoster(api, metrics, options.identity),
            namespace_label=options.namespace_label,
            clock=lambda: dt.datetime.now(dt.UTC),
            kinds=await served_kinds(api),
            sealer=self.sealer,
            ledger=ledger,
        )

        state = None
        if options.audit_state:
            state_namespace, _, state_name = options.audit_state.partition("/")
            state = (state_namespace, state_name)
        auditor = BackgroundAuditor(
            config=current_config,
            api=api,
            recorder=self.recorder,
            metrics=metrics,
            events=reconciler.events,
            clock=lambda: dt.datetime.now(dt.UTC),
            kinds=tuple(reconciler.kinds.values()),
            namespace_label=options.namespace_label,
            state=state,
        )
        new_revision = asyncio.Event()

        async def reload() -> None:
            changed = await store.poll()
            if changed is False:
                metrics.config_reload_failures.inc()
            elif changed and store.current is not None:
                metrics.config.info({"revision": store.current.revision})
                new_revision.set()  # the background audit judges everything again
                await reconciler.resync()  # egress lists, profiles or teams may have changed

        async def audit() -> None:
            """Background audit passes: at start, on a new revision, when an exception expires and
            every spec.backgroundAudit.interval (controller/background.py)."""
            reason = "start"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(new_revision.wait(), timeout=options.audit_delay_seconds)
            while True:
                new_revision.clear()
                try:
                    await auditor.run_pass(reason)
                except Exception:  # logged and counted; the next pass tries again
                    log.exception("background audit pass (%s) failed", reason)
                wait, reason = interval_wait(current_config(), dt.datetime.now(dt.UTC))
                try:
                    await asyncio.wait_for(new_revision.wait(), timeout=wait)
                    reason = "config"
                except TimeoutError:
                    pass

        async def resync() -> None:
            jobs, failures = await reconciler.resync()
            log.info("resync: %d jobs, %d failures", jobs, failures)
            if options.kueue_config:
                await reconciler.check_kueue(options.kueue_config)

        if options.kueue_config:
            try:
                await reconciler.check_kueue(options.kueue_config)
            except Exception:  # reported by the gauge and the next resync; never fatal
                log.exception("checking Kueue's Configuration failed")
        try:
            # before watching: jobs the ledger names that were deleted while no controller ran
            await reconciler.start()
        except Exception:  # the resync looks for them again; never fatal
            log.exception("closing jobs deleted while the controller was down failed")

        # Created before kopf starts, so that kopf does not count them among its own tasks; the
        # tasks they create meanwhile (asyncio.wait_for's on Python 3.11) it would: they are
        # stopped with kopf's root tasks, before kopf looks for tasks left running.
        background = [
            asyncio.create_task(_every(options.reload_seconds, reload, "config reload"), name="reload"),
            asyncio.create_task(_every(options.resync_seconds, resync, "resync"), name="resync"),
            asyncio.create_task(audit(), name="background-audit"),
        ]
        if ledger is not None:
            background.append(
                asyncio.create_task(
                    _every(options.ledger_seconds, reconciler.save_ledger, "ledger write"), name="ledger"
                )
            )

        async def until_stopped() -> None:
            """One of kopf's root tasks: it ends kopf when a stop is requested (kopf stops all of
            them when one ends) and stops the controller's own loops when it ends, or when kopf
            ends by itself and cancels it."""
            try:
                await stopping.wait()
            finally:
                await _stop_tasks(background)

        settings = build_settings(watch_timeout=options.watch_timeout, kinds=tuple(reconciler.kinds.values()))
        # kopf would SIGKILL the process 10 minutes after a stop it was not told of by its own
        # stop flag; _lead bounds every stop instead (5 s or 30 s, the thread is a daemon).
        settings.process.ultimate_exiting_timeout = None
        try:
            # kopf.operator() as kopf's docs/embedding.rst ("Manual orchestration") spells it out,
            # with one more root task and no stop flag: kopf/_core/reactor/running.py operator()
            # waits on a stop flag in a task of its own that it leaves running when it ends by
            # itself (stop_flag_checker), then gives such tasks 5 s (run_tasks).
            existing = asyncio.all_tasks()
            root_tasks = await kopf.spawn_tasks(
                registry=build_registry(reconciler, login=lambda **_: connection_info(options.kube)),
                settings=settings,
                clusterwide=True,
                standalone=True,  # no kopf peering: the Lease decides who runs
            )
            stopper = asyncio.create_task(until_stopped(), name="mpigate stop")
            await kopf.run_tasks([*root_tasks, stopper], ignored=existing)
        finally:
            await _stop_tasks(background)
            if ledger is not None and self.graceful:
                try:  # what the next leader needs, confirmed until now
                    await reconciler.save_ledger()
                except Exception:
                    log.exception("writing the ledger when stopping failed")
            await client.close()


async def _stop_tasks(tasks: Collection[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until they and what they wait on have ended."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _lead(
    options: ControllerOptions,
    store: ConfigStore,
    recorder: Recorder,
    metrics: ControllerMetrics,
    health: _Health,
    elector: LeaseElector | None,
    stop: asyncio.Event,
) -> int:
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[BaseException | None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if not finished.done():
            finished.set_result(error)

    def done(error: BaseException | None) -> None:
        # kopf may end after _lead stopped waiting for it (a lost Lease waits 5 s) and the loop has
        # closed: then nobody is left to tell (seen as an unhandled exception in the kopf thread).
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, error)

    thread = _KopfThread(options, store, recorder, metrics, done, health.sealer)
    health.kopf_done = finished
    thread.start()
    waits: dict[str, asyncio.Future[Any]] = {"kopf": finished, "stop": asyncio.ensure_future(stop.wait())}
    if elector is not None:
        waits["lease"] = asyncio.ensure_future(elector.hold())
    code = ExitCode.OK
    try:
        done_set, _ = await asyncio.wait(waits.values(), return_when=asyncio.FIRST_COMPLETED)
        first = next(iter(done_set))
        if first is waits.get("lease"):
            exc = first.exception()
            log.error("%s; stopping (a standby takes over)", exc)
            code = ExitCode.FAILED
        elif first is finished:
            if finished.result() is not None:
                log.error("kopf stopped: %s", finished.result())
            else:
                log.error("kopf stopped by itself")
            code = ExitCode.FAILED
    finally:
        thread.request_stop(graceful=code == ExitCode.OK)
        for name, waiting in waits.items():
            if name != "kopf":
                waiting.cancel()
        # After a lost Lease another replica may already lead: stop at once (the kopf thread is a
        # daemon and dies with the process); a graceful stop lets handlers finish.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(finished), timeout=5 if code == ExitCode.FAILED else 30)
        await asyncio.gather(*(w for n, w in waits.items() if n != "kopf"), return_exceptions=True)
    return code
