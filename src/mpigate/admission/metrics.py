"""Prometheus metrics of one server instance (a registry per app; no global state).

With ``--workers`` (admission/workers.py) each worker process writes its values to the directory in
``$PROMETHEUS_MULTIPROC_DIR`` (``prometheus_client``'s multiprocess mode) and the exposition sums
them, so that any worker answers ``/metrics`` for the whole replica.

What every review counts — its request, its duration, its rule hits, the reviews in flight — is
tallied in plain attributes of this (compiled) class and added to the ``prometheus_client``
children by :meth:`Metrics.flush`: a child's ``inc`` or ``observe`` takes a lock each (and in
multiprocess mode writes the worker's file), about ten per review. The server flushes before
every exposition (so a scrape shows every review answered before it), every second (what the
other workers' files show, in multiprocess mode) and when it stops. Everything else is rare and
goes to the children at once.
"""

from __future__ import annotations

import os
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from mpigate.policy.decision import Decision

__all__ = ["CONTENT_TYPE", "FLUSH_INTERVAL", "LATENCY_BUCKETS", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Up to 10 s: beyond the webhook's timeoutSeconds, so that slow outliers stay visible.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
# Seconds between the server's flushes of the tallies (what another worker's /metrics lags by).
FLUSH_INTERVAL: Final = 1.0


class _Count:
    """Increments of one counter child not yet added to it."""

    def __init__(self, child: Any) -> None:
        self.child = child
        self.pending = 0


class _Observations:
    """Observations of one histogram child not yet added to it: a count per bucket, and the sum
    as the child would hold it (the observations added one by one, in order, to its value)."""

    def __init__(self, child: Any) -> None:
        self.child = child
        # prometheus_client's Histogram (metrics.py): _upper_bounds ends with +Inf; observe()
        # adds 1 to the first bucket whose bound is >= the amount (its buckets are not
        # cumulative until collected) and the amount to _sum
        self.bounds: list[float] = [float(bound) for bound in child._upper_bounds]
        self.pending: list[int] = [0] * len(self.bounds)
        self.observed = 0
        self.total: float = child._sum.get()

    def observe(self, amount: float) -> None:
        i = 0
        for bound in self.bounds:
            if amount <= bound:
                break
            i += 1
        if i < len(self.pending):  # NaN is in no bucket (as in observe)
            self.pending[i] += 1
        self.observed += 1
        self.total += amount

    def flush(self) -> None:
        if not self.observed:
            return
        buckets = self.child._buckets
        pending = self.pending
        for i in range(len(pending)):
            if pending[i]:
                buckets[i].inc(pending[i])
                pending[i] = 0
        self.child._sum.set(self.total)
        self.observed = 0


class Metrics:
    """Every metric the webhook exports, registered in :attr:`registry` (one per server)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "mpigate_admission_requests",
            "Admission reviews answered, by endpoint, kind, operation and decision "
            "(allowed, allowed-with-warnings, denied, mutated, unchanged, invalid, error).",
            ["endpoint", "kind", "operation", "decision"],
            registry=r,
        )
        self.rule_hits = Counter(
            "mpigate_rule_hits",
            "Rule violations found at validation, by rule and mode (enforce, warn, audit, waived).",
            ["rule", "mode"],
            registry=r,
        )
        self.duration = Histogram(
            "mpigate_admission_duration_seconds",
            "Time to answer an admission review, by endpoint.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.bad_requests = Counter(
            "mpigate_bad_requests",
            "Requests that were not a valid AdmissionReview, by endpoint and reason.",
            ["endpoint", "reason"],
            registry=r,
        )
        self.live_errors = Counter(
            "mpigate_live_lookup_errors",
            "Failed or timed-out live cluster lookups, by source and reason.",
            ["source", "reason"],
            registry=r,
        )
        self.live_fallbacks = Counter(
            "mpigate_live_context_fallbacks",
            "Reviews judged on static config only because the live context was unavailable.",
            registry=r,
        )
        self.deadline_exceeded = Counter(
            "mpigate_deadline_exceeded",
            "Reviews that hit the per-request deadline, by phase (live, evaluate, audit).",
            ["phase"],
            registry=r,
        )
        self.audit_errors = Counter(
            "mpigate_admission_audit_failures",
            "Decisions whose audit record could not be written (answered with HTTP 500).",
            registry=r,
        )
        self.config_reloads = Counter(
            "mpigate_config_reloads", "Config versions loaded and swapped in.", registry=r
        )
        self.config_reload_failures = Counter(
            "mpigate_config_reload_failures",
            "Config changes rejected as invalid (the last good config keeps serving).",
            registry=r,
        )
        self.config_info = Info("mpigate_config", "The config revision being served.", registry=r)
        self.config_loaded_at = Gauge(
            "mpigate_config_last_reload_timestamp_seconds",
            "When the config being served was loaded (Unix time).",
            registry=r,
            multiprocess_mode="max",
        )
        self.tls_reloads = Counter(
            "mpigate_tls_reloads",
            "Serving certificate reloads, by result (ok, failed).",
            ["result"],
            registry=r,
        )
        self.connections_open = Gauge(
            "mpigate_admission_connections_open",
            "Client connections held now (TLS handshakes included).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.connections_refused = Counter(
            "mpigate_admission_connections_refused",
            "Connections closed unserved: per-client (over the per-address cap), full (at the cap with"
            " its queue full), evicted (slow, closed to admit a newcomer), resources (accept() out of"
            " descriptors or memory), error (accept() returned a connection's network error).",
            ["reason"],
            registry=r,
        )
        self.connection_timeouts = Counter(
            "mpigate_admission_connection_timeouts",
            "Connections closed for missing a deadline, by phase (handshake: from accept to the end of the"
            " TLS handshake; headers, body; queue: no slot within the handshake deadline).",
            ["phase"],
            registry=r,
        )
        self.in_flight = Gauge(
            "mpigate_admission_in_flight",
            "Admission reviews being handled now.",
            registry=r,
            multiprocess_mode="livesum",
        )
        # The tallies (see the module docstring), by label values, which are bounded: endpoints,
        # kinds, operations, decisions, catalogue rules and modes. labels() takes a lock and
        # builds its key each time: each child is looked up once.
        self._requests: dict[tuple[str, str, str, str], _Count] = {}
        self._durations: dict[str, _Observations] = {}
        self._rules: dict[tuple[str, str], _Count] = {}
        self._in_flight = 0
        self._in_flight_shown = 0

    def review_started(self) -> None:
        self._in_flight += 1

    def review_ended(self) -> None:
        self._in_flight -= 1

    def reviewed(self, endpoint: str, kind: str, operation: str, decision: str, seconds: float) -> None:
        """Count one answered review and observe its duration."""
        key = (endpoint, kind, operation, decision)
        count = self._requests.get(key)
        if count is None:
            count = self._requests[key] = _Count(self.requests.labels(endpoint, kind, operation, decision))
        count.pending += 1
        durations = self._durations.get(endpoint)
        if durations is None:
            durations = self._durations[endpoint] = _Observations(self.duration.labels(endpoint))
        durations.observe(seconds)

    def count_rules(self, decision: Decision) -> None:
        for violation in decision.violations:
            mode = "waived" if violation.waived_by else violation.mode
            count = self._rules.get((violation.rule, mode))
            if count is None:
                child = self.rule_hits.labels(violation.rule, mode)
                count = self._rules[(violation.rule, mode)] = _Count(child)
            count.pending += 1

    def flush(self) -> None:
        """Add the tallies to the ``prometheus_client`` children. On the thread that tallies
        (the event loop's), never concurrently with it."""
        for counts in (self._requests, self._rules):
            for count in counts.values():
                if count.pending:
                    count.child.inc(count.pending)
                    count.pending = 0
        for durations in self._durations.values():
            durations.flush()
        if self._in_flight != self._in_flight_shown:
            self.in_flight.set(self._in_flight)
            self._in_flight_shown = self._in_flight

    def config_served(self, revision: str, loaded_at: float) -> None:
        self.config_info.info({"revision": revision})
        self.config_loaded_at.set(loaded_at)

    def exposition(self) -> bytes:
        """The text exposition of what the children hold (call :meth:`flush` first, on the
        tallying thread)."""
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not directory:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=directory)  # type: ignore[no-untyped-call]
        # Info metrics have no multiprocess form: the config revision is this worker's.
        own = self.registry.restricted_registry(["mpigate_config_info"])
        return generate_latest(merged) + generate_latest(own)
