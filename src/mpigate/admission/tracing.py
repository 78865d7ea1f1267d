"""OpenTelemetry tracing for the webhook: off by default, an exporter chosen by flag or env.

``none`` (default) uses a no-op tracer; ``console`` prints spans to stderr (debugging);
``otlp`` sends them over OTLP/HTTP to the endpoint in ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), as every OpenTelemetry SDK does. The provider belongs
to the server (never installed globally), so that tests and embedders stay isolated.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Final, Literal, cast

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from mpigate import __version__

__all__ = ["EXPORTERS", "TRACING_ENV", "Tracing", "make_tracing"]

TRACING_ENV: Final = "MPIGATE_TRACING"
Exporter = Literal["none", "console", "otlp"]
EXPORTERS: Final = ("none", "console", "otlp")
SERVICE_NAME: Final = "mpigate-webhook"


@dataclass(frozen=True)
class Tracing:
    """A tracer and the provider behind it (``None`` when tracing is off)."""

    tracer: trace.Tracer
    provider: TracerProvider | None = None

    def shutdown(self) -> None:
        """Flush pending spans and stop the exporter."""
        if self.provider is not None:
            self.provider.shutdown()


def make_tracing(exporter: str | None = None, *, processor: SpanProcessor | None = None) -> Tracing:
    """Tracing for ``exporter`` (or ``$MPIGATE_TRACING``, default ``none``).

    ``processor`` adds a span processor of the caller's own (tests use an in-memory exporter);
    it turns tracing on even when ``exporter`` is ``none``.
    """
    chosen = cast(Exporter, (exporter or os.environ.get(TRACING_ENV) or "none").lower())
    if chosen not in EXPORTERS:
        raise ValueError(f"unknown trace exporter {chosen!r}; choose one of {', '.join(EXPORTERS)}")
    if chosen == "none" and processor is None:
        return Tracing(trace.NoOpTracer())
    provider = TracerProvider(
        resource=Resource.create({"service.name": SERVICE_NAME, "service.version": __version__})
    )
    if chosen == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    elif chosen == "otlp":
        # Imported here: the exporter pulls in protobuf, which a server without tracing never needs.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if processor is not None:
        provider.add_span_processor(processor)
    return Tracing(provider.get_tracer("mpigate.admission", __version__), provider)
