"""Prometheus metrics of one server instance (a registry per app; no global state).

With ``--workers`` (admission/workers.py) each worker process writes its values to the directory in
``$PROMETHEUS_MULTIPROC_DIR`` (``prometheus_client``'s multiprocess mode) and the exposition sums
them, so that any worker answers ``/metrics`` for the whole replica.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from mpigate.policy.decision import Decision

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Up to 10 s: beyond the webhook's timeoutSeconds, so that slow outliers stay visible.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


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
        # Label children already used (label values are bounded: endpoints, kinds, operations,
        # decisions, catalogue rules and modes).
        self._review_children: dict[tuple[str, str, str, str], tuple[Any, Any]] = {}
        self._rule_children: dict[tuple[str, str], Any] = {}
        self.in_flight = Gauge(
            "mpigate_admission_in_flight",
            "Admission reviews being handled now.",
            registry=r,
            multiprocess_mode="livesum",
        )

    def reviewed(self, endpoint: str, kind: str, operation: str, decision: str, seconds: float) -> None:
        """Count one answered review and observe its duration."""
        key = (endpoint, kind, operation, decision)
        children = self._review_children.get(key)
        if children is None:  # labels() takes a lock and builds its key each time: look up once
            children = self._review_children[key] = (
                self.duration.labels(endpoint),
                self.requests.labels(endpoint, kind, operation, decision),
            )
        children[0].observe(seconds)
        children[1].inc()

    def count_rules(self, decision: Decision) -> None:
        for violation in decision.violations:
            mode = "waived" if violation.waived_by else violation.mode
            child = self._rule_children.get((violation.rule, mode))
            if child is None:
                child = self._rule_children[(violation.rule, mode)] = self.rule_hits.labels(
                    violation.rule, mode
                )
            child.inc()

    def config_served(self, revision: str, loaded_at: float) -> None:
        self.config_info.info({"revision": revision})
        self.config_loaded_at.set(loaded_at)

    def exposition(self) -> bytes:
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not directory:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=directory)  # type: ignore[no-untyped-call]
        # Info metrics have no multiprocess form: the config revision is this worker's.
        own = self.registry.restricted_registry(["mpigate_config_info"])
        return generate_latest(merged) + generate_latest(own)
