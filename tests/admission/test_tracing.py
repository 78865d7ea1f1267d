"""OpenTelemetry spans around each review (in-memory exporter)."""

from __future__ import annotations

import aiohttp
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from mpigate.admission.client import make_review
from mpigate.admission.tracing import make_tracing

from .conftest import StartWebhook, trainjob
from .stub_engine import DENY, RAISE


async def test_each_review_is_a_server_span_with_child_spans(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    exporter = InMemorySpanExporter()
    server = await start_webhook(tracing=make_tracing("none", processor=SimpleSpanProcessor(exporter)))
    async with http.post(
        server.url + "/validate", json=make_review(trainjob(**{DENY: "x"}), uid="t1")
    ) as resp:
        request_id = resp.headers["X-Request-Id"]
    async with http.post(
        server.url + "/validate", json=make_review(trainjob(**{RAISE: "1"}), uid="t2")
    ) as resp:
        assert resp.status == 500
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.name == "admission validate"]
    assert len(roots) == 2
    root = roots[0]
    assert root.kind is SpanKind.SERVER
    assert root.attributes is not None
    assert root.attributes["mpigate.request_id"] == request_id
    assert root.attributes["mpigate.decision"] == "denied"
    assert (
        root.attributes["mpigate.namespace"] == "alpha" and root.attributes["mpigate.operation"] == "CREATE"
    )
    children = sorted(
        s.name for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id
    )
    assert children == ["audit record", "evaluate"]
    assert roots[1].status.status_code is StatusCode.ERROR


def test_tracing_is_off_by_default_and_rejects_unknown_exporters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MPIGATE_TRACING", raising=False)
    assert make_tracing().provider is None
    monkeypatch.setenv("MPIGATE_TRACING", "console")
    tracing = make_tracing()
    assert tracing.provider is not None
    tracing.shutdown()
    with pytest.raises(ValueError, match="unknown trace exporter 'jaeger'"):
        make_tracing("jaeger")
