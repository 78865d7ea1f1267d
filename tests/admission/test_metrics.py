"""The reviews' metrics are tallied natively and flushed into ``prometheus_client``
(admission/metrics.py): what a scrape shows is what observing each review at once would show —
the same samples, a scrape right after N reviews shows all N, and in multiprocess mode
(``--workers``) a worker's files get its counts every flush interval and when it stops."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, values
from prometheus_client.exposition import generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

import mpigate.admission.server as server_module
from mpigate.admission.client import make_review
from mpigate.admission.metrics import LATENCY_BUCKETS, Metrics
from mpigate.admission.server import ServeOptions, WebhookServer
from mpigate.admission.service import ServiceSettings
from mpigate.policy.decision import AdmissionInput, Decision, Violation

from .conftest import StartWebhook, trainjob, wait_for
from .stub_engine import DENY, stub_evaluate


def _samples(metrics: Metrics) -> list[str]:
    """The exposition without the ``_created`` timestamps (when each child was made)."""
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def _decision(*violations: Violation) -> Decision:
    request = AdmissionInput(operation="CREATE", kind="TrainJob", namespace="ns", name="n", obj={})
    return dataclasses.replace(Decision.bare(request, "rev"), violations=violations)


def test_flushed_tallies_show_what_observing_each_review_shows() -> None:
    rng = random.Random(25)
    # every bucket bound exactly (a bound is in its own bucket), around them, far beyond, zero
    durations = [*LATENCY_BUCKETS, *(b * (1 + 1e-12) for b in LATENCY_BUCKETS), 0.0, 1e9, 3e-7]
    durations += [rng.expovariate(300) for _ in range(2000)]
    rng.shuffle(durations)
    labels = [("validate", "TrainJob", "CREATE", "allowed"), ("mutate", "TrainJob", "CREATE", "mutated"),
              ("validate", "-", "-", "bad-request")]  # fmt: skip
    hits = [Violation("MPG-Q001", "enforce", "spec", "m"),
            Violation("MPG-SEC-001", "warn", "spec", "m"),
            Violation("MPG-Q001", "enforce", "spec", "m", waived_by="exc-1")]  # fmt: skip
    tallied, observed = Metrics(), Metrics()
    for i, seconds in enumerate(durations):
        endpoint, kind, operation, outcome = labels[i % len(labels)]
        tallied.reviewed(endpoint, kind, operation, outcome, seconds)
        observed.duration.labels(endpoint).observe(seconds)
        observed.requests.labels(endpoint, kind, operation, outcome).inc()
        decision = _decision(*hits[: i % 4])
        tallied.count_rules(decision)
        for violation in decision.violations:
            observed.rule_hits.labels(
                violation.rule, "waived" if violation.waived_by else violation.mode
            ).inc()
        if i % 700 == 0:  # flushes between reviews add up
            tallied.flush()
    tallied.review_started()
    tallied.review_started()
    tallied.review_ended()
    observed.in_flight.inc()
    tallied.flush()
    assert _samples(tallied) == _samples(observed)
    assert 'mpigate_admission_duration_seconds_count{endpoint="validate"}' in "\n".join(_samples(tallied))


def _total(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def _reviews(http: aiohttp.ClientSession, url: str, count: int) -> None:
    for i in range(count):
        labels = {DENY: "x"} if i % 3 == 0 else {}
        body = json.dumps(make_review(trainjob(**labels), uid=f"u-{i}")).encode()
        async with http.post(
            url + "/validate", data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 200


async def test_a_scrape_right_after_n_reviews_shows_all_n(
    start_webhook: StartWebhook, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "FLUSH_INTERVAL", 3600.0)  # only the scrape's own flush
    server = await start_webhook()
    await _reviews(http, server.url, 25)
    async with http.get(server.url + "/metrics") as resp:
        text = await resp.text()
    assert _total(text, "mpigate_admission_requests_total{") == 25
    assert _total(text, "mpigate_admission_duration_seconds_count{") == 25
    assert _total(text, 'mpigate_rule_hits_total{mode="enforce",rule="MPG-Q001"}') == 9
    assert _total(text, "mpigate_admission_in_flight") == 0


def _multiprocess(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as one ``--workers`` worker: its values in files of ``directory``."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    # what prometheus_client chooses at import when the variable is set (values.get_value_class)
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    return directory


def _files_total(directory: Path, name: str) -> float:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return sum(
        sample.value for family in registry.collect() for sample in family.samples if sample.name == name
    )


async def _server(org: Path, tls_files: tuple[Path, Path]) -> WebhookServer:
    options = ServeOptions(
        config=org, tls_cert=tls_files[0], tls_key=tls_files[1], host="127.0.0.1", port=0,
        settings=ServiceSettings(deadline=30.0, live_timeout=10.0), reload_interval=3600.0,
    )  # fmt: skip
    server = WebhookServer(options, evaluator=stub_evaluate)
    await server.start()
    return server


async def test_a_workers_counts_reach_its_files_when_it_stops(
    org: Path,
    tls_files: tuple[Path, Path],
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = _multiprocess(tmp_path, monkeypatch)
    monkeypatch.setattr(server_module, "FLUSH_INTERVAL", 3600.0)  # no periodic flush before the stop
    server = await _server(org, tls_files)
    try:
        await _reviews(http, server.url, 12)
    finally:
        await server.stop()
    assert _files_total(directory, "mpigate_admission_requests_total") == 12
    assert _files_total(directory, "mpigate_admission_duration_seconds_count") == 12
    assert _files_total(directory, "mpigate_rule_hits_total") == 4


async def test_a_workers_counts_reach_its_files_without_a_scrape(
    org: Path,
    tls_files: tuple[Path, Path],
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = _multiprocess(tmp_path, monkeypatch)
    monkeypatch.setattr(server_module, "FLUSH_INTERVAL", 0.05)
    server = await _server(org, tls_files)
    try:
        await _reviews(http, server.url, 12)
        # another worker's /metrics reads the files: within a flush interval they hold all 12
        await wait_for(lambda: _files_total(directory, "mpigate_admission_requests_total") == 12)
        await asyncio.sleep(0.2)  # and no more than that
        assert _files_total(directory, "mpigate_admission_requests_total") == 12
        sums = _files_total(directory, "mpigate_admission_duration_seconds_sum")
        assert 0 < sums < 12 * 30 and not math.isnan(sums)
    finally:
        await server.stop()
