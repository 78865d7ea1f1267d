"""``mpigate serve`` (the admission webhook), ``mpigate certs`` and ``mpigate review``.

This module composes the layers: the webhook server (``admission/``) records decisions through
its ``DecisionRecorder`` protocol; here that protocol is bound to the audit trail (``audit/``),
which itself knows nothing about HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from mpigate import __version__
from mpigate._build import compiled
from mpigate.admission.certs import CertificateError, issue_certificates
from mpigate.admission.client import (
    ReplayResult,
    ReviewClient,
    ReviewClientError,
    format_outcome,
    replay,
    summarize,
)
from mpigate.admission.eventloop import DEFAULT_LOOP, LOOPS, LoopUnavailable, loop_factory
from mpigate.admission.eventloop import run as run_on_loop
from mpigate.admission.guard import ConnectionLimits
from mpigate.admission.kube import KubeConfig, KubeConfigError, in_cluster_config, load_kubeconfig
from mpigate.admission.logjson import JsonFormatter, fields
from mpigate.admission.metrics import Metrics
from mpigate.admission.recorder import RecordPosition
from mpigate.admission.review import Stage
from mpigate.admission.routes import DEFAULT_PORT
from mpigate.admission.server import ServeOptions, WebhookServer
from mpigate.admission.service import ServiceSettings
from mpigate.admission.tracing import EXPORTERS, make_tracing
from mpigate.admission.workers import reserve_port, run_workers
from mpigate.audit import (
    AsyncAuditLog,
    AuditError,
    AuditKeyError,
    AuditLog,
    AuditMetrics,
    AuditWriteError,
    WriterOptions,
    config_record,
    load_signer,
    record_from_decision,
)
from mpigate.audit.shipping import shipping_for
from mpigate.audit.signing import ED25519, key_method
from mpigate.config import Config, ConfigError, Document, Location, Problem, Severity, load, parse_quantity
from mpigate.config.model import AuditSettings
from mpigate.policy.decision import AdmissionInput, Decision, UserInfo

from ._inputs import EMPTY_INPUT, read_objects, unrouted
from ._output import OUTPUT_OPTION, dump, echo_problems

__all__ = ["AuditRecorder", "certs_command", "review_command", "serve_command"]

log = logging.getLogger("mpigate.cli.serve")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


class Duration(click.ParamType[float]):
    """``2s``, ``500ms``, ``1.5s``, ``1m`` or plain seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        match = _DURATION.match(str(value))
        if not match:
            self.fail(f"{value!r} is not a duration (examples: 2s, 500ms, 1.5s)", param, ctx)
        scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match[2] or "s"]
        return float(match[1]) * scale


class ByteSize(click.ParamType[int]):
    """``3MiB``, ``3Mi``, ``64KiB``, ``500k`` or plain bytes."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.endswith("iB"):
            text = text[:-1]
        try:
            size = parse_quantity(text)
        except ValueError:
            self.fail(f"{value!r} is not a size (examples: 3MiB, 512Ki, 1000000)", param, ctx)
        if size < 1024 or size.denominator != 1:
            self.fail(f"{value!r} is too small for a request body limit (at least 1KiB)", param, ctx)
        return int(size)


class AuditRecorder:
    """The webhook's ``DecisionRecorder`` bound to the hash-chained audit log.

    Made by :meth:`opening` when the chain may not open at once (a full or failing disk at start):
    until it does, the recorder is not healthy (``/readyz`` says why), refuses every record (the
    review fails closed) and tries to open it again every ``retry_interval`` seconds; the config
    revision served meanwhile is recorded as soon as the chain is open."""

    def __init__(
        self, log: AsyncAuditLog | None, source: str = "webhook", audit_metrics: AuditMetrics | None = None
    ) -> None:
        self._log = log
        self.source = source
        self.audit_metrics = audit_metrics
        self._problem: str | None = None
        self._served: Config | None = None
        self._retry: asyncio.Task[None] | None = None

    @classmethod
    async def opening(
        cls,
        open_log: Callable[[], Awaitable[AsyncAuditLog]],
        audit_metrics: AuditMetrics | None = None,
        retry_interval: float = 1.0,
    ) -> AuditRecorder:
        """Open the chain with ``open_log``; on an :class:`AuditWriteError` start without it and
        keep trying in the background (other audit errors — a key, a lock — are raised)."""
        try:
            return cls(await open_log(), audit_metrics=audit_metrics)
        except AuditWriteError as exc:
            recorder = cls(None, audit_metrics=audit_metrics)
            recorder._problem = f"{exc} ({exc.reason})"
            log.error(
                "audit trail not writable: %s; not ready (reviews fail closed) until it is",
                recorder._problem,
                extra=fields(event="audit_unavailable", reason=exc.reason),
            )
            recorder._retry = asyncio.create_task(recorder._reopen(open_log, retry_interval))
            return recorder

    async def _reopen(self, open_log: Callable[[], Awaitable[AsyncAuditLog]], interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                opened = await open_log()
            except AuditWriteError as exc:
                self._problem = f"{exc} ({exc.reason})"
                log.debug("audit trail still not writable: %s", self._problem)
                continue
            self._log = opened
            log.info("audit trail writable again", extra=fields(event="audit_available", chain=opened.chain))
            if self._served is not None:
                with contextlib.suppress(AuditWriteError):  # the writer reports and heals itself
                    await opened.append(config_record(self._served, self.source))
            return

    def writer(self) -> AuditLog | None:
        """The chain's writer once open (shipping and retention append through it)."""
        return self._log.log if self._log is not None else None

    def _open_log(self) -> AsyncAuditLog:
        if self._log is None:
            raise AuditWriteError(self._problem or "the audit trail is not open", "unavailable")
        return self._log

    async def record(self, decision: Decision, request: AdmissionInput, stage: Stage) -> RecordPosition:
        written = await self._open_log().append(record_from_decision(decision, request, stage, self.source))
        return RecordPosition(written.chain, written.seq, written.hash)

    async def record_config(self, config: Config) -> None:
        self._served = config
        await self._open_log().append(config_record(config, self.source))

    @property
    def healthy(self) -> bool:
        return self._log is not None and self._log.healthy

    @property
    def problem(self) -> str | None:
        return self._problem if self._log is None else self._log.problem

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
        if self._log is not None:
            await self._log.aclose()


async def open_audit(
    directory: Path, settings: AuditSettings | None, key_file: Path | None, metrics: Metrics
) -> AuditRecorder:
    """Open the audit chain under ``directory`` with the org's audit settings (if loaded).

    The key must suit the org's ``spec.audit.signing.method`` (a PEM key is never taken as an HMAC
    secret); only when the config cannot be loaded is the method read off the key file. A chain
    that cannot be written yet (a full disk) does not stop the server: see :class:`AuditRecorder`."""
    signer = None
    key = key_file or (Path(settings.signing_key_file) if settings and settings.signing_key_file else None)
    if key is not None:
        origin = "--audit-key" if key_file else "spec.audit.signing.keyFile of the OrgPolicy"
        try:
            method = settings.signing_method if settings else key_method(key)
            signer = load_signer(method, key)
        except AuditKeyError as exc:
            if key.exists():  # the key is there but does not suit the method: the message says why
                raise AuditKeyError(f"audit signing key ({origin}): {exc}") from exc
            wanted = settings.signing_method if settings else ED25519
            make = f"mpigate audit keygen --method {wanted} KEYFILE"
            raise AuditKeyError(
                f"audit signing key ({origin}): {exc} (hint: create one with `{make}` and pass "
                "`--audit-key KEYFILE`; in a cluster it is the mounted Secret, see docs/operations.md)"
            ) from exc
    options = WriterOptions.from_settings(settings) if settings else WriterOptions()
    audit_metrics = AuditMetrics(metrics.registry)

    def open_log() -> Awaitable[AsyncAuditLog]:
        return AsyncAuditLog.open(
            directory, source="webhook", signer=signer, options=options, metrics=audit_metrics
        )

    return await AuditRecorder.opening(open_log, audit_metrics)


def _configure_logging(fmt: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
    # Neither format shows the caller, thread or process: don't compute them for every record
    # (the logging HOWTO's "Optimization" knobs; one review is one record).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # aiohttp logs every malformed HTTP message with a traceback; one line is enough.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL if level != "debug" else logging.DEBUG)


def _kube_config(kubeconfig: Path | None, context: str | None, live: bool) -> KubeConfig | None:
    if not live:
        return None
    if kubeconfig is None and os.environ.get("KUBECONFIG"):
        kubeconfig = Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
    if kubeconfig is not None:
        return load_kubeconfig(kubeconfig, context)
    return in_cluster_config()


@click.command("serve")
@click.option(
    "--config", "config_path", required=True, type=click.Path(path_type=Path), help="Config tree or bundle."
)
@click.option(
    "--tls-cert", type=click.Path(path_type=Path), help="Serving certificate (PEM), reloaded on change."
)
@click.option("--tls-key", type=click.Path(path_type=Path), help="Its private key (PEM).")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535))
@click.option("--insecure-dev", is_flag=True, help="Plain HTTP on 127.0.0.1 (local development only).")
@click.option("--audit-dir", type=click.Path(path_type=Path), help="Write the hash-chained audit trail here.")
@click.option(
    "--audit-key", type=click.Path(path_type=Path, exists=True), help="Checkpoint signing key file."
)
@click.option("--deadline", default="2s", show_default=True, type=Duration(), help="Answer within this time.")
@click.option(
    "--live-timeout", default="500ms", show_default=True, type=Duration(), help="Budget for live lookups."
)
@click.option("--max-body", default="3MiB", show_default=True, type=ByteSize(), help="Largest request body.")
@click.option(
    "--max-connections",
    default=ConnectionLimits.max_connections,
    show_default=True,
    type=click.IntRange(1),
    help="Connections held at once; at the cap slow ones make room (fair per address) or newcomers wait.",
)
@click.option(
    "--max-connections-per-client",
    default=ConnectionLimits.max_connections_per_client,
    show_default=True,
    type=click.IntRange(1),
    help="Connections one client address may hold; at it, its oldest slow one makes room or newcomers close.",
)
@click.option(
    "--handshake-timeout",
    default="5s",
    show_default=True,
    type=Duration(),
    help="From accept to the end of the TLS handshake (also the longest wait for a slot).",
)
@click.option(
    "--header-timeout", default="10s", show_default=True, type=Duration(), help="Request headers limit."
)
@click.option("--body-timeout", default="10s", show_default=True, type=Duration(), help="Request body limit.")
@click.option(
    "--keepalive-timeout", default="120s", show_default=True, type=Duration(), help="Idle connection limit."
)
@click.option(
    "--evict-after",
    default="1s",
    show_default=True,
    type=Duration(),
    help="A connection slow (no complete request) this long may be closed to admit a newcomer at a cap.",
)
@click.option("--kubeconfig", type=click.Path(path_type=Path, exists=True), help="Cluster for live context.")
@click.option("--context", "kube_context", help="kubeconfig context (default: current-context).")
@click.option("--live/--no-live", default=True, show_default=True, help="Read live Kueue/TrainJob context.")
@click.option(
    "--reload-interval", default="2s", show_default=True, type=Duration(), help="Config/cert polling."
)
@click.option(
    "--shutdown-delay", default="0s", show_default=True, type=Duration(), help="Not-ready before draining."
)
@click.option("--shutdown-timeout", default="15s", show_default=True, type=Duration(), help="Drain limit.")
@click.option(
    "--trace-exporter",
    type=click.Choice(EXPORTERS),
    default=None,
    help="OpenTelemetry traces: none (default, or $MPIGATE_TRACING), console, otlp ($OTEL_EXPORTER_OTLP_*).",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Server processes on the port (SO_REUSEPORT); about one per core.",
)
@click.option(
    "--loop",
    "loop_kind",
    type=click.Choice(LOOPS),
    default=DEFAULT_LOOP,
    show_default=True,
    help="Event loop: uvloop (loop and TLS compiled) or asyncio's own (the pure-Python fallback).",
)
@click.option("--log-format", type=click.Choice(["json", "text"]), default="json", show_default=True)
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True
)
def serve_command(
    config_path: Path,
    tls_cert: Path | None,
    tls_key: Path | None,
    host: str,
    port: int,
    insecure_dev: bool,
    audit_dir: Path | None,
    audit_key: Path | None,
    deadline: float,
    live_timeout: float,
    max_body: int,
    max_connections: int,
    max_connections_per_client: int,
    handshake_timeout: float,
    header_timeout: float,
    body_timeout: float,
    keepalive_timeout: float,
    evict_after: float,
    kubeconfig: Path | None,
    kube_context: str | None,
    live: bool,
    reload_interval: float,
    shutdown_delay: float,
    shutdown_timeout: float,
    trace_exporter: str | None,
    workers: int,
    loop_kind: str,
    log_format: str,
    log_level: str,
) -> None:
    """Serve the admission webhooks: POST /mutate and /validate (AdmissionReview v1), GET /healthz,
    /readyz and /metrics, over TLS 1.2+.

    The config tree is watched and hot-reloaded (an invalid change is rejected and the last good
    config keeps serving); so is the certificate. SIGTERM drains in-flight reviews.

    \b
    Example:
      $ mpigate certs --service mpigate-webhook --namespace mpigate-system --out certs
      $ mpigate serve --config . --tls-cert certs/tls.crt --tls-key certs/tls.key \\
          --audit-dir /var/lib/mpigate/audit
    """
    _configure_logging(log_format, log_level)
    try:
        loop_factory(loop_kind)
    except LoopUnavailable as exc:
        raise click.BadParameter(str(exc), param_hint="--loop") from exc
    # which build serves (docs/building.md): the mypyc-compiled engine or its pure-Python fallback
    built = compiled()
    log.info(
        "mpigate %s starting on %s (compiled: %s)",
        __version__,
        loop_kind,
        "yes" if built else "no",
        extra=fields(event="starting", version=__version__, compiled=built, loop=loop_kind),
    )
    if insecure_dev:
        if host == "0.0.0.0":
            host = "127.0.0.1"
    elif tls_cert is None or tls_key is None:
        raise click.UsageError("--tls-cert and --tls-key are required (or --insecure-dev for local work)")
    if not config_path.exists():
        raise click.BadParameter(f"{config_path} does not exist", param_hint="--config")
    if deadline <= 0 or live_timeout < 0:
        raise click.BadParameter("must be positive", param_hint="--deadline/--live-timeout")
    try:
        limits = ConnectionLimits(
            max_connections=max_connections,
            max_connections_per_client=max_connections_per_client,
            handshake_timeout=handshake_timeout,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            keepalive_timeout=keepalive_timeout,
            evict_after=evict_after,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--*-timeout") from exc
    try:
        kube = _kube_config(kubeconfig, kube_context, live)
    except KubeConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--kubeconfig") from exc
    options = ServeOptions(
        config=config_path,
        tls_cert=tls_cert,
        tls_key=tls_key,
        host=host,
        port=port,
        insecure_dev=insecure_dev,
        max_body=max_body,
        limits=limits,
        settings=ServiceSettings(deadline=deadline, live_timeout=min(live_timeout, deadline / 2)),
        reload_interval=reload_interval,
        shutdown_delay=shutdown_delay,
        shutdown_timeout=shutdown_timeout,
        kube=kube,
    )
    if workers > 1:
        sys.exit(
            _serve_workers(
                options, workers, audit_dir, audit_key, trace_exporter, log_format, log_level, loop_kind
            )
        )
    try:
        run_on_loop(_serve(options, audit_dir, audit_key, trace_exporter), loop_kind)
    except (ValueError, OSError, AuditError) as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)


@dataclass(frozen=True)
class _WorkerSpec:
    """What one ``--workers`` process needs (picklable: workers are spawned)."""

    options: ServeOptions
    audit_dir: Path | None
    audit_key: Path | None
    exporter: str | None
    log_format: str
    log_level: str
    loop: str


def _serve_workers(
    options: ServeOptions,
    count: int,
    audit_dir: Path | None,
    audit_key: Path | None,
    exporter: str | None,
    log_format: str,
    log_level: str,
    loop: str,
) -> int:
    try:
        reserved, port = reserve_port(options.host, options.port)
    except OSError as exc:
        click.secho(f"error: cannot bind {options.host}:{options.port}: {exc}", fg="red", err=True)
        return 2
    shared = dataclasses.replace(options, port=port, reuse_port=True)
    try:
        return run_workers(
            _run_worker,
            lambda index, ready: (
                _WorkerSpec(
                    dataclasses.replace(shared, worker=index),
                    audit_dir,
                    audit_key,
                    exporter,
                    log_format,
                    log_level,
                    loop,
                ),
                ready,
            ),
            count,
            port=port,
            stop_timeout=options.shutdown_delay + options.shutdown_timeout + 5,
        )
    finally:
        reserved.close()


class _WorkerField(logging.Filter):
    """Adds ``worker`` to every JSON log line of a worker process."""

    def __init__(self, index: int | None) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            extra.setdefault("worker", self.index)
        else:
            record.fields = {"worker": self.index}
        return True


def _run_worker(spec: _WorkerSpec, ready: Any) -> None:
    """One ``--workers`` process: a complete server that reports to the supervisor once serving."""
    _configure_logging(spec.log_format, spec.log_level)
    index = spec.options.worker
    for handler in logging.getLogger().handlers:
        handler.addFilter(_WorkerField(index))
    try:
        run_on_loop(
            _serve(
                spec.options,
                spec.audit_dir,
                spec.audit_key,
                spec.exporter,
                on_started=lambda: ready.put(index),
            ),
            spec.loop,
        )
    except (ValueError, OSError, AuditError) as exc:
        log.error("worker %s: %s", index, exc)
        sys.exit(2)


async def _serve(
    options: ServeOptions,
    audit_dir: Path | None,
    audit_key: Path | None,
    exporter: str | None,
    on_started: Callable[[], None] | None = None,
) -> None:
    metrics = Metrics()
    recorder = None
    shipping = None
    if audit_dir is not None:
        try:
            settings = (await asyncio.to_thread(load, options.config)).org.audit
        except ConfigError:
            settings = None  # the server reports the config problems; audit uses its defaults
        recorder = await open_audit(audit_dir, settings, audit_key, metrics)
        if settings is not None:
            shipping = shipping_for(
                audit_dir, recorder.writer, settings, metrics=recorder.audit_metrics, source="webhook"
            )
    server = WebhookServer(options, recorder=recorder, metrics=metrics, tracing=make_tracing(exporter))

    def started() -> None:
        # The cyclic collector under thousands of connections: their objects live for seconds,
        # survive the young generations and pile up for full passes over every live object. In
        # benchmarks/slow_clients.py it took 1.1 s of the server's 8.2 CPU-seconds (full passes
        # 0.6 s). What is loaded now (config, engine, libraries) lives as long as the process, so
        # it is frozen out of the passes; and a young generation ten times CPython's default
        # (700) collects far less often: 0.45 s, for ~25 MiB more peak RSS.
        gc.freeze()
        gc.set_threshold(_GC_YOUNG, 20, 10)
        if on_started is not None:
            on_started()

    try:
        await server.run_until_signalled(started)
    finally:
        if shipping is not None:  # after the writer closed: its shutdown checkpoint ships too
            await asyncio.to_thread(shipping.stop)


_GC_YOUNG = 10_000  # allocations between young-generation collections (CPython: 700)


@click.command("certs")
@click.option("--service", default="mpigate-webhook", show_default=True, help="The webhook's Service name.")
@click.option("--namespace", default="mpigate-system", show_default=True, help="Its namespace.")
@click.option(
    "--out", "out", required=True, type=click.Path(path_type=Path, file_okay=False), help="Directory."
)
@click.option(
    "--days", default=365, show_default=True, type=click.IntRange(1, 3650), help="Serving cert validity."
)
@click.option("--new-ca", is_flag=True, help="Replace the CA in DIR (the caBundle changes).")
@click.option("--extra-name", "extra", multiple=True, help="Another DNS name or IP (e.g. 127.0.0.1).")
@OUTPUT_OPTION
def certs_command(
    service: str, namespace: str, out: Path, days: int, new_ca: bool, extra: tuple[str, ...], output: str
) -> None:
    """Generate a CA and a serving certificate for the webhook (clusters without cert-manager).

    Writes ca.crt, ca.key, tls.crt and tls.key into DIR (keys mode 0600) and prints the caBundle
    for the webhook configurations on stdout. An existing CA in DIR is reused, so re-running
    rotates the serving certificate without changing the caBundle.

    \b
    Example:
      $ CA_BUNDLE=$(mpigate certs --service mpigate-webhook --namespace mpigate-system --out certs)
      $ kubectl -n mpigate-system create secret tls mpigate-webhook-tls \\
          --cert certs/tls.crt --key certs/tls.key

    \b
    For a local `mpigate serve` that `mpigate review --server https://127.0.0.1:8443` can trust:
      $ mpigate certs --out certs --extra-name 127.0.0.1 --extra-name localhost
    """
    try:
        issued = issue_certificates(
            out, service=service, namespace=namespace, days=days, new_ca=new_ca, extra_names=extra
        )
    except (CertificateError, OSError, ValueError) as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)
    if output != "text":
        data = {
            "directory": str(issued.directory),
            "caCert": str(issued.ca_cert),
            "tlsCert": str(issued.tls_cert),
            "tlsKey": str(issued.tls_key),
            "caReused": issued.ca_reused,
            "dnsNames": list(issued.dns_names),
            "notAfter": issued.not_after.isoformat(),
            "caBundle": issued.ca_bundle,
        }
        click.echo(dump(data, output), nl=False)
        return
    ca = "reused CA" if issued.ca_reused else "new CA"
    click.echo(f"wrote {issued.tls_cert} and {issued.tls_key} ({ca} {issued.ca_cert})", err=True)
    click.echo(f"names: {', '.join(issued.dns_names)}; valid until {issued.not_after:%Y-%m-%d}", err=True)
    click.echo("caBundle for the webhook configurations (clientConfig.caBundle):", err=True)
    click.echo(issued.ca_bundle)


_MANIFEST_SUFFIXES = frozenset({".yaml", ".yml", ".json"})


def _read_inputs(paths: tuple[Path, ...]) -> Iterator[tuple[Path, list[Document], list[Problem]]]:
    """Each input file with its documents and problems; a directory stands for its manifests below
    it (``*.yaml``, ``*.yml``, ``*.json``, as ``kubectl apply -R -f`` reads them)."""
    for path in paths:
        if not path.is_dir():
            yield (path, *read_objects(path))
            continue
        files = sorted(p for p in path.rglob("*") if p.suffix in _MANIFEST_SUFFIXES and p.is_file())
        if not files:
            nothing = Problem(
                Location(str(path)),
                "(directory)",
                "no *.yaml, *.yml or *.json files in it; nothing to judge",
                EMPTY_INPUT,
            )
            yield path, [], [nothing]
        for file in files:
            yield (file, *read_objects(file))


@click.command("review")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@click.option("--server", required=True, help="Webhook base URL, e.g. https://127.0.0.1:8443.")
@click.option("--ca", "ca_file", type=click.Path(exists=True), help="CA certificate to trust (PEM).")
@click.option("--insecure", is_flag=True, help="Do not verify the server certificate.")
@click.option(
    "--operation", type=click.Choice(["CREATE", "UPDATE", "DELETE"]), default="CREATE", show_default=True
)
@click.option("--user", default="kubernetes-admin", show_default=True, help="userInfo.username.")
@click.option("--group", "groups", multiple=True, help="userInfo.groups (repeatable).")
@click.option("--namespace", help="Namespace for objects that do not name one.")
@click.option("--dry-run", is_flag=True, help="Mark the requests as dryRun.")
@click.option(
    "--webhook-name", default="validate.team.mpigate.io", show_default=True, help="Name shown in denials."
)
@OUTPUT_OPTION
def review_command(
    files: tuple[Path, ...],
    server: str,
    ca_file: str | None,
    insecure: bool,
    operation: str,
    user: str,
    groups: tuple[str, ...],
    namespace: str | None,
    dry_run: bool,
    webhook_name: str,
    output: str,
) -> None:
    """Send TrainJobs and runtimes through a running webhook as the API server would (/mutate on
    CREATE, apply its JSONPatch, then /validate) and show what kubectl would print.

    \b
    Example:
      $ mpigate review examples/trainjobs/llm-finetune.yaml --server https://127.0.0.1:8443 --ca certs/ca.crt
      trainjob.trainer.kubeflow.org/llm-finetune created (mpigate: 9 mutations)

    A file that is not valid YAML, or holds no document at all, is reported as
    `file:line:col: message` (as `mpigate explain` reports it) and none of its objects are sent;
    the other files are still reviewed.

    Exit status: 0 all admitted, 1 something was denied, 2 the webhook could not be asked or an
    input file could not be read or was empty (2 wins over 1).
    """
    try:
        client = ReviewClient(server, ca_file=ca_file, insecure=insecure)
    except ReviewClientError as exc:
        raise click.BadParameter(str(exc), param_hint="--server") from exc
    who = UserInfo(username=user, groups=(*groups, "system:authenticated"))
    results: list[tuple[Path, ReplayResult]] = []
    unread = 0
    try:
        for file, documents, problems in _read_inputs(files):
            if any(p.severity is Severity.ERROR for p in problems):
                # As explain does, a file that does not read cleanly is judged not at all (half a
                # file sent is worse than none); the rest of the batch goes on.
                echo_problems(problems, err=True)
                unread += 1
                continue
            for document in documents:
                doc = document.data
                skipped = unrouted(document)
                if skipped is not None or not isinstance(doc, dict):
                    if output == "text":
                        click.echo(f"{file}:{document.line}: {skipped}", err=True)
                    continue
                old = doc if operation in ("UPDATE", "DELETE") else None
                result = replay(
                    client, doc, operation=operation, old=old, user=who, dry_run=dry_run, namespace=namespace
                )
                results.append((file, result))
                if output == "text":
                    click.echo(format_outcome(result, str(file), webhook=webhook_name))
    finally:
        client.close()
    if output != "text":
        click.echo(dump([{"file": str(f), **r.to_dict()} for f, r in results], output), nl=False)
    else:
        summary = summarize([r for _, r in results])
        if unread:
            summary += f"; {unread} input{'s' if unread != 1 else ''} not sent (see the errors above)"
        click.echo(summary, err=True)
    if unread or any(r.error for _, r in results):
        sys.exit(2)
    if any(not r.allowed for _, r in results):
        sys.exit(1)
