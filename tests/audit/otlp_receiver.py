"""A real OTLP/HTTP logs receiver for tests: aiohttp over TLS (trustme), decoding the protobuf
``ExportLogsServiceRequest``; it can be told to fail requests."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
from aiohttp import web
from google.protobuf.json_format import MessageToJson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


@dataclass
class Received:
    body: str
    attributes: dict[str, Any]
    time_unix_nano: int
    severity_text: str
    event_name: str
    resource: dict[str, Any]


@dataclass
class OtlpReceiver:
    """``fail`` decides per request number (1-based) whether to answer 500 without storing."""

    directory: Path
    fail: Callable[[int], bool] = lambda n: False
    records: list[Received] = field(default_factory=list)
    # each stored request as OTLP/JSON, as the Collector's file exporter writes it
    exported: list[str] = field(default_factory=list)
    requests: int = 0
    failed: int = 0
    url: str = ""
    ca_file: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def _handle(self, request: web.Request) -> web.Response:
        data = await request.read()
        with self._lock:
            self.requests += 1
            number = self.requests
        if request.headers.get("Content-Type") != "application/x-protobuf":
            return web.Response(status=415)
        if self.fail(number):
            with self._lock:
                self.failed += 1
            return web.Response(status=500, text="injected failure")
        message = ExportLogsServiceRequest()
        message.ParseFromString(data)
        received = []
        for resource_logs in message.resource_logs:
            resource = {a.key: _value(a.value) for a in resource_logs.resource.attributes}
            for scope_logs in resource_logs.scope_logs:
                for log in scope_logs.log_records:
                    received.append(
                        Received(
                            body=log.body.string_value,
                            attributes={a.key: _value(a.value) for a in log.attributes},
                            time_unix_nano=log.time_unix_nano,
                            severity_text=log.severity_text,
                            event_name=log.event_name,
                            resource=resource,
                        )
                    )
        with self._lock:
            self.records.extend(received)
            self.exported.append(MessageToJson(message, indent=None))
        return web.Response(status=200, body=b"", content_type="application/x-protobuf")

    def start(self) -> OtlpReceiver:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        ca_path = self.directory / "otlp-ca.pem"
        ca.cert_pem.write_to_path(str(ca_path))
        self.ca_file = str(ca_path)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_post("/v1/logs", self._handle)
            self._runner = web.AppRunner(app)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
            loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"https://127.0.0.1:{port}/v1/logs"
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        assert ready.wait(60), "the OTLP receiver did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def write_otlp_json(self, path: Path) -> None:
        """Everything stored so far, one export request per line (the file exporter's format)."""
        with self._lock:
            path.write_text("".join(line + "\n" for line in self.exported), encoding="utf-8")

    def seqs(self, chain: str) -> list[int]:
        with self._lock:
            return [
                r.attributes["mpigate.audit.seq"]
                for r in self.records
                if r.attributes["mpigate.audit.chain"] == chain
            ]
