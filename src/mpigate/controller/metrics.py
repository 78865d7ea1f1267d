"""Prometheus metrics of the controller (a registry per controller; no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

__all__ = ["ControllerMetrics"]

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ControllerMetrics:
    """Every metric the controller exports, registered in :attr:`registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reconciles = Counter(
            "mpigate_controller_reconciles",
            "Reconciliations, by kind (networkpolicy, lifecycle, evidence) and result (created, "
            "repaired, unchanged, conflict, recorded, skipped, error).",
            ["kind", "result"],
            registry=r,
        )
        self.errors = Counter(
            "mpigate_controller_errors",
            "Failed reconciliations, by kind and reason (http-409, http-500, timeout, audit, ...).",
            ["kind", "reason"],
            registry=r,
        )
        self.conflicts = Counter(
            "mpigate_controller_conflicts",
            "Objects found under the name of an object the controller would manage, but not owned by "
            "it (left unchanged), by kind; counted every time one is seen.",
            ["kind"],
            registry=r,
        )
        self.duration = Histogram(
            "mpigate_controller_reconcile_duration_seconds",
            "Time of one reconciliation, by kind.",
            ["kind"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.lifecycle_records = Counter(
            "mpigate_controller_lifecycle_records",
            "Lifecycle records written, by event (admitted, started, suspended, succeeded, failed, deleted).",
            ["event"],
            registry=r,
        )
        self.gpu_seconds = Counter(
            "mpigate_controller_gpu_seconds",
            "GPU-seconds recorded when run segments closed, by team.",
            ["team"],
            registry=r,
        )
        self.evidence_records = Counter(
            "mpigate_controller_evidence_records",
            "Placement evidence records written, by compliance (true, false; unknown: the node is gone "
            "and nothing tells its region).",
            ["compliant"],
            registry=r,
        )
        self.segments_not_observed = Counter(
            "mpigate_controller_segments_not_observed",
            "Run segments closed from partly unobserved facts, by basis (inferred: from the job's own "
            "later state; partial: bounded by the controller's last observation).",
            ["basis"],
            registry=r,
        )
        self.vanished = Counter(
            "mpigate_controller_vanished_jobs",
            "Jobs found deleted without their deletion being seen (closed from what was known), by kind.",
            ["kind"],
            registry=r,
        )
        self.state_tampered = Counter(
            "mpigate_controller_state_tampered",
            "Jobs whose mpigate.io state annotations did not carry the controller's seal (ignored), by kind.",
            ["kind"],
            registry=r,
        )
        self.ledger_writes = Counter(
            "mpigate_controller_ledger_writes",
            "Writes of the ledger of open run segments, by result (written, truncated, error).",
            ["result"],
            registry=r,
        )
        self.residency_mismatches = Counter(
            "mpigate_controller_residency_mismatches",
            "Pods placed outside the regions their team or data classification allows, by team and "
            "region (none: the node maps to no region).",
            ["team", "region"],
            registry=r,
        )
        self.events_failed = Counter(
            "mpigate_controller_event_post_failures",
            "Kubernetes Events that could not be posted (the action itself is unaffected).",
            registry=r,
        )
        self.leader = Gauge(
            "mpigate_controller_leader",
            "1 while this instance holds the leader Lease and runs the handlers, else 0.",
            registry=r,
        )
        self.config_reload_failures = Counter(
            "mpigate_controller_config_reload_failures",
            "Config bundles that failed to load (the last good one stays in use).",
            registry=r,
        )
        self.reliance = Gauge(
            "mpigate_controller_reliance",
            "Whether what the gate relies on holds in the cluster (docs/security.md), by check "
            "(kueue-manage-jobs-without-queue-name, kueue-framework-trainjob, kueue-framework-mpijob): "
            "1 holds, 0 does not, -1 could not be checked.",
            ["check"],
            registry=r,
        )
        self.config = Info("mpigate_controller_config", "The config revision in use.", registry=r)
        # the background audit (controller/background.py)
        self.standing_violations = Gauge(
            "mpigate_controller_standing_violations",
            "Violations of the policy in force by objects in the cluster, found by the background audit, "
            "by rule, team and the action configured for the rule (report, event, suspend).",
            ["rule", "team", "action"],
            registry=r,
        )
        self.audit_passes = Counter(
            "mpigate_controller_audit_passes",
            "Background audit passes, by what started them (start, config, interval, exception-expired) "
            "and result (done, error).",
            ["reason", "result"],
            registry=r,
        )
        self.audit_pass_seconds = Gauge(
            "mpigate_controller_audit_pass_seconds",
            "How long the last background audit pass took.",
            registry=r,
        )
        self.audit_objects = Gauge(
            "mpigate_controller_audit_objects",
            "Jobs and runtimes the last background audit pass judged.",
            registry=r,
        )
        self.audit_suspensions = Counter(
            "mpigate_controller_audit_suspensions",
            "Queued jobs kept from admission (their Kueue Workload deactivated) by the background audit.",
            registry=r,
        )
        self.report_writes = Counter(
            "mpigate_controller_report_writes",
            "Policy reports written, by API and result (written, error, unavailable: the API is not served, "
            "foreign: an object of the report's name that mpigate does not own, left as it is).",
            ["api", "result"],
            registry=r,
        )
        self.report_results_omitted = Gauge(
            "mpigate_controller_report_results_omitted",
            "Results left out of the policy reports by maxResultsPerReport in the last pass (the summary "
            "counts them; the audit trail and the gauge keep them).",
            registry=r,
        )
