"""The aiohttp webhook server: routes, HTTP hygiene, lifecycle (reloads, graceful shutdown).

``POST /mutate`` and ``POST /validate`` take AdmissionReview v1 bodies (``application/json``,
at most ``max_body`` bytes); ``GET /healthz`` (the process is alive), ``GET /readyz`` (a config
is loaded and the server is not draining) and ``GET /metrics`` (Prometheus). Every response
carries ``X-Request-Id``; errors are JSON ``Status`` bodies, never tracebacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import signal
import ssl
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from .fastpath import REQUEST_ID_HEADER, RequestIds, ReviewRoutes, bad_request, client_gone, request_id_for
from .guard import (
    ConnectionLimits,
    GuardedSite,
    RateLimitedLog,
    body_received,
    close_after_answer,
    request_finished,
    request_started,
)
from .kube import KubeClient, KubeConfig
from .live import KubeLiveSource, LiveSource
from .logjson import fields
from .metrics import CONTENT_TYPE, FLUSH_INTERVAL, Metrics
from .recorder import DecisionRecorder
from .reload import ConfigStore
from .review import Stage, encode_json
from .routes import DEFAULT_PORT, HEALTHZ_PATH, METRICS_PATH, MUTATE_PATH, READYZ_PATH, VALIDATE_PATH
from .service import AdmissionService, Evaluator, ServiceSettings, status_body
from .tls import ReloadingTLS
from .tracing import Tracing, make_tracing

__all__ = ["DEFAULT_MAX_BODY", "ServeOptions", "WebhookServer", "build_app"]

log = logging.getLogger("mpigate.admission.server")

# The API server caps request bodies at 3 MiB (etcd's object limit is 1.5 MiB; an
# AdmissionReview of an UPDATE carries the object twice).
DEFAULT_MAX_BODY: Final = 3 * 1024 * 1024


SERVICE_KEY: Final = web.AppKey("service", AdmissionService)
STATE_KEY: Final = web.AppKey("state", dict)
MAX_BODY_KEY: Final = web.AppKey("max_body", int)
LIMITS_KEY: Final = web.AppKey("limits", ConnectionLimits)
BAD_LOG_KEY: Final = web.AppKey("bad_log", RateLimitedLog)
REQUEST_IDS_KEY: Final = web.AppKey("request_ids", RequestIds)
REQUEST_ID_KEY: Final = web.RequestKey("request_id", str)


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=encode_json(body), status=status, content_type="application/json")


@web.middleware
async def _request_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    request_id = request_id_for(request.headers.get(REQUEST_ID_HEADER), request.app[REQUEST_IDS_KEY])
    request[REQUEST_ID_KEY] = request_id
    request_started(request)
    if request.method != "POST":
        body_received(request)  # GET /readyz, /metrics: nothing more to wait for
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # routing (404/405) and aiohttp's own limits
        response = _json(status_body(exc.status, f"{exc.reason} (request id {request_id})"), exc.status)
    except Exception:
        log.exception("unhandled error", extra=fields(request_id=request_id, path=request.path))
        response = _json(status_body(500, f"internal error (request id {request_id})"), 500)
    finally:
        request_finished(request)
    response.headers[REQUEST_ID_HEADER] = request_id
    return response


def _bad(request: web.Request, stage: str, status: int, message: str, reason: str) -> web.Response:
    app = request.app
    code, body = bad_request(
        app[SERVICE_KEY],
        app[BAD_LOG_KEY],
        request.path,
        stage,
        request[REQUEST_ID_KEY],
        status,
        message,
        reason,
    )
    return _json(body, code)


# aiohttp's payload parser decodes these (and passes any other coding through undecoded, which
# would judge bytes the client did not mean): the API server sends none of them.
_DECODED_CODINGS: Final = frozenset({"identity", "gzip", "deflate"})


def _content_coding(request: web.Request) -> str:
    coding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    return coding or "identity"


def _root_cause(exc: BaseException) -> str:
    """The innermost reason (zlib's "incorrect header check" rather than aiohttp's wrappers)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return str(exc.message if isinstance(exc, HttpProcessingError) else exc).strip()


def _review_handler(stage: Stage) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        service = request.app[SERVICE_KEY]
        max_body = request.app[MAX_BODY_KEY]
        if request.content_type != "application/json":
            shown = request.content_type or "none"
            return _bad(
                request, stage, 415, f"content type must be application/json, got {shown}", "content-type"
            )
        if request.content_length is not None and request.content_length > max_body:
            return _bad(
                request,
                stage,
                413,
                f"body of {request.content_length} bytes exceeds {max_body} bytes",
                "too-large",
            )
        coding = _content_coding(request)
        if coding not in _DECODED_CODINGS:
            return _bad(
                request,
                stage,
                415,
                f"content encoding {coding} is not supported (send identity, gzip or deflate)",
                "content-encoding",
            )
        try:
            # The API server sends a review's body with its headers: when all of it is in, there
            # is nothing to wait for (and no deadline timer to arm and cancel).
            if request.content.is_eof():
                body = await request.read()
            else:
                async with asyncio.timeout(request.app[LIMITS_KEY].body_timeout):
                    body = await request.read()
        except TimeoutError:
            request.app[SERVICE_KEY].metrics.connection_timeouts.labels("body").inc()
            response = _bad(
                request, stage, 408, "the body did not arrive within its deadline", "body-timeout"
            )
            response.force_close()
            close_after_answer(request)
            return response
        except web.HTTPRequestEntityTooLarge:
            return _bad(request, stage, 413, f"body exceeds {max_body} bytes", "too-large")
        except (
            web.RequestPayloadError,
            HttpProcessingError,
        ) as exc:  # a gzip/deflate body that does not decode, a bad chunk
            what = f"the {coding} body" if coding != "identity" else "the body"
            return _bad(request, stage, 400, f"cannot decode {what}: {_root_cause(exc)}", "bad-body")
        except ConnectionError:  # the client went away mid-body: nobody to answer
            client_gone(request.app[SERVICE_KEY], request.path, request[REQUEST_ID_KEY], stage)
            return web.Response(status=400)
        body_received(request)
        reply = await service.review(stage, body, request[REQUEST_ID_KEY])
        return _json(reply.body, reply.status)

    return handle


async def _healthz(request: web.Request) -> web.StreamResponse:
    return _json({"status": "ok"})


async def _readyz(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE_KEY]
    state = request.app[STATE_KEY]
    loaded = service.store.current
    if state.get("draining"):
        return _json({"status": "draining"}, 503)
    if loaded is None:
        return _json({"status": "no config", "error": service.store.last_error}, 503)
    if not service.recorder.healthy:
        return _json({"status": "audit trail not writable", "reason": service.recorder.problem}, 503)
    return _json({"status": "ready", "revision": loaded.revision})


async def _metrics(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE_KEY]
    service.metrics.flush()  # on the loop's thread, which tallies: every review answered so far
    body = await asyncio.to_thread(service.metrics.exposition)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def build_app(
    service: AdmissionService, *, max_body: int = DEFAULT_MAX_BODY, limits: ConnectionLimits | None = None
) -> web.Application:
    """The aiohttp application for ``service``."""
    app = web.Application(client_max_size=max_body, middlewares=[_request_middleware])
    app[SERVICE_KEY] = service
    app[STATE_KEY] = {"draining": False}
    app[MAX_BODY_KEY] = max_body
    app[LIMITS_KEY] = limits or ConnectionLimits()
    app[BAD_LOG_KEY] = RateLimitedLog(log)
    app[REQUEST_IDS_KEY] = RequestIds()
    app.router.add_post(MUTATE_PATH, _review_handler("mutate"))
    app.router.add_post(VALIDATE_PATH, _review_handler("validate"))
    app.router.add_get(HEALTHZ_PATH, _healthz)
    app.router.add_get(READYZ_PATH, _readyz)
    app.router.add_get(METRICS_PATH, _metrics)
    return app


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``mpigate serve`` is told."""

    config: Path
    tls_cert: Path | None = None
    tls_key: Path | None = None
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    insecure_dev: bool = False
    max_body: int = DEFAULT_MAX_BODY
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    settings: ServiceSettings = field(default_factory=ServiceSettings)
    reload_interval: float = 2.0
    reload_debounce: float = 0.5
    shutdown_delay: float = 0.0
    shutdown_timeout: float = 15.0
    eval_threads: int = 4
    # The cluster to read live context from (None: static checks only).
    kube: KubeConfig | None = None
    # One of several worker processes on one port (``--workers``, admission/workers.py): bind with
    # SO_REUSEPORT and log as worker ``worker``.
    reuse_port: bool = False
    worker: int | None = None


class WebhookServer:
    """Runs the webhook: bind, serve, reload config and certificate, shut down gracefully."""

    def __init__(
        self,
        options: ServeOptions,
        *,
        evaluator: Evaluator | None = None,
        mutator: Evaluator | None = None,
        recorder: DecisionRecorder | None = None,
        live: LiveSource | None = None,
        tracing: Tracing | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        if options.insecure_dev:
            if options.host not in ("127.0.0.1", "localhost", "::1"):
                raise ValueError("--insecure-dev serves plain HTTP and binds only to 127.0.0.1")
        elif options.tls_cert is None or options.tls_key is None:
            raise ValueError("a TLS certificate and key are required (--tls-cert, --tls-key)")
        self.options = options
        self.metrics = metrics or Metrics()
        self.tracing = tracing or make_tracing()
        self.store = ConfigStore(options.config, debounce=options.reload_debounce)
        self.tls = (
            None if options.insecure_dev else ReloadingTLS(options.tls_cert, options.tls_key)  # type: ignore[arg-type]
        )
        self._executor = ThreadPoolExecutor(
            max_workers=options.eval_threads, thread_name_prefix="mpigate-eval"
        )
        self.service = AdmissionService(
            self.store,
            evaluator=evaluator,
            mutator=mutator,
            recorder=recorder,
            live=live,
            metrics=self.metrics,
            tracer=self.tracing.tracer,
            settings=options.settings,
            executor=self._executor,
            clock=clock,
        )
        self.app = build_app(self.service, max_body=options.max_body, limits=options.limits)
        self._runner: web.AppRunner | None = None
        self.site: GuardedSite | None = None
        self._reloader: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        scheme = "http" if self.options.insecure_dev else "https"
        host = "127.0.0.1" if self.options.host in ("0.0.0.0", "") else self.options.host
        return f"{scheme}://{host}:{self.port}"

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        return self.tls.front if self.tls else None

    async def start(self) -> None:
        """Load the config (serving not-ready if it is invalid), start live lookups, bind."""
        if await self.store.load_now() is not None:
            self._config_swapped()
            await self._record_config()
        else:
            self.metrics.config_reload_failures.inc()
        if self.service.live is None and self.options.kube is not None:
            self.service.live = KubeLiveSource(KubeClient(self.options.kube), on_error=self._live_error)
            log.info("live context from %s", self.options.kube.source)
        if self.service.live is not None:
            await self.service.live.start()
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=self.options.shutdown_timeout,
            keepalive_timeout=self.options.limits.keepalive_timeout,
        )
        await self._runner.setup()
        self.site = GuardedSite(
            self._runner,
            self.options.host,
            self.options.port,
            limits=self.options.limits,
            metrics=self.metrics,
            ssl_context=self.ssl_context,
            backlog=1024,
            reuse_port=self.options.reuse_port,
            routes=ReviewRoutes(
                self.service,
                max_body=self.options.max_body,
                body_timeout=self.options.limits.body_timeout,
                request_ids=self.app[REQUEST_IDS_KEY],
                bad_log=self.app[BAD_LOG_KEY],
            ),
        )
        await self.site.start()
        self.port = self.site.port
        self._reloader = asyncio.create_task(self._reload_loop(), name="mpigate-reload")
        self._flusher = asyncio.create_task(self._flush_loop(), name="mpigate-metrics")
        revision = self.store.current.revision if self.store.current else None
        if self.options.worker is None:
            log.info(
                "listening on %s",
                self.url,
                extra=fields(event="listening", url=self.url, port=self.port, revision=revision),
            )
        else:  # the supervisor logs "listening" once every worker serves
            log.info(
                "worker %d listening on %s",
                self.options.worker,
                self.url,
                extra=fields(
                    event="worker_listening",
                    worker=self.options.worker,
                    pid=os.getpid(),
                    url=self.url,
                    port=self.port,
                    revision=revision,
                ),
            )

    def _live_error(self, source: str, reason: str) -> None:
        self.metrics.live_errors.labels(source, reason).inc()

    def _config_swapped(self) -> None:
        loaded = self.store.current
        if loaded is not None:
            self.metrics.config_reloads.inc()
            self.metrics.config_served(loaded.revision, loaded.loaded_at)

    async def _record_config(self) -> None:
        """Put the revision now served, and what it enforces, into the audit trail."""
        loaded = self.store.current
        if loaded is None:
            return
        try:
            await self.service.recorder.record_config(loaded.config)
        except Exception as exc:  # the trail is unhealthy: decisions fail closed on their own record
            log.error(
                "could not record config revision %s in the audit trail: %s",
                loaded.revision,
                exc,
                extra=fields(event="audit_error", revision=loaded.revision),
            )

    async def check_reload(self) -> None:
        """One poll of the config tree and the certificate files."""
        result = await self.store.poll()
        if result is True:
            self._config_swapped()
            await self._record_config()
        elif result is False:
            self.metrics.config_reload_failures.inc()
        if self.tls is not None:
            tls_result = await asyncio.to_thread(self.tls.check)
            if tls_result is not None:
                self.metrics.tls_reloads.labels("ok" if tls_result else "failed").inc()

    async def _reload_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.reload_interval)
            try:
                await self.check_reload()
            except Exception:  # a reload bug must not stop serving
                log.exception("reload check failed")

    async def _flush_loop(self) -> None:
        """The reviews' metric tallies into ``prometheus_client`` every :data:`FLUSH_INTERVAL`:
        with ``--workers``, what the other workers' ``/metrics`` read of this one's (a scrape of
        this worker flushes first; admission/metrics.py)."""
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            try:
                self.metrics.flush()
            except Exception:  # a worker's file that cannot be written must not stop serving
                log.exception("metrics flush failed")

    async def stop(self) -> None:
        """Graceful shutdown: readiness goes false, listening stops, in-flight reviews finish."""
        self.app[STATE_KEY]["draining"] = True
        if self.options.shutdown_delay > 0:
            # Give endpoints controllers time to take this replica out of the Service.
            await asyncio.sleep(self.options.shutdown_delay)
        for task in (self._reloader, self._flusher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._runner is not None:
            await self._runner.cleanup()  # stops listening, then waits for in-flight handlers
            self._runner = None
        self.metrics.flush()  # every review answered, into the worker's files in multiprocess mode
        if self.service.live is not None:
            await self.service.live.stop()
        await self.service.recorder.close()
        self.service.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.tracing.shutdown)
        log.info("stopped", extra=fields(event="stopped"))

    async def run_until_signalled(self, on_started: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT, then stop gracefully (``on_started``: called once
        serving)."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        if on_started is not None:
            on_started()
        try:
            await stop.wait()
            log.info("signal received: draining", extra=fields(event="draining"))
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self.stop()
