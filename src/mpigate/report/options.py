"""What a report is about (:class:`ReportOptions`) and the names every part of it shares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .controls import FRAMEWORK_FILES
from .k8saudit import normalize_time

__all__ = ["NO_TEAM", "OUTCOMES", "REPORT_API_VERSION", "ReportOptions"]

REPORT_API_VERSION = "mpigate.io/v1alpha1"
OUTCOMES = ("allowed", "allowed-with-warnings", "denied")
NO_TEAM = "(no team)"


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """What to report on.

    ``since``/``until`` are RFC 3339 UTC times as records write them (``until`` exclusive);
    ``namespace_teams`` and ``team_regions`` come from the config when one is given (otherwise
    the report learns them from the records); ``max_*`` bound the samples kept."""

    since: str | None = None
    until: str | None = None
    team: str | None = None
    frameworks: tuple[str, ...] = tuple(FRAMEWORK_FILES)
    namespace_teams: Mapping[str, str] = field(default_factory=dict)
    team_regions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    config_revision: str | None = None
    max_examples: int = 5
    max_events: int = 200
    max_keys: int = 10_000
    generated: str | None = None
    # what the --config tree enforces (for its revision only; records name the revisions in force)
    config_policy: Mapping[str, object] | None = None
    # completeness: the longest silence of a writer that is not a gap (seconds), and the chains
    # expected (chain ids, or SOURCE=N: at least N chains written by that source)
    heartbeat: float = 24 * 3600.0
    expect_chains: tuple[str, ...] = ()
    # --sample N --seed S: a reproducible random sample of the period's decisions
    sample: int = 0
    seed: int = 0
    # control full ID -> why it does not apply to this system (--not-applicable)
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    # set by build_report when API-server logs are given: keep the chains' side of the
    # reconciliation (one small bucket per 64 admission records)
    reconcile: bool = False
    # set by build_report for the API-server logs, from what the chains say: the Pod Security
    # level in force over time, as (time, level, version, revision)
    pss_timeline: tuple[tuple[str, str, str, str], ...] = ()

    def __post_init__(self) -> None:
        # Plain dicts: options travel to worker processes, and read-only proxies do not pickle.
        object.__setattr__(self, "namespace_teams", dict(self.namespace_teams))
        object.__setattr__(self, "team_regions", {k: tuple(v) for k, v in self.team_regions.items()})
        object.__setattr__(self, "not_applicable", dict(self.not_applicable))
        if self.config_policy is not None:
            object.__setattr__(self, "config_policy", dict(self.config_policy))
        if self.heartbeat <= 0:
            raise ValueError("the heartbeat must be a positive number of seconds")
        # Bounds compare as strings with record times: bring any RFC 3339 time or date to that form.
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, normalize_time(value))

    def in_period(self, time: str) -> bool:
        since, until = self.since, self.until
        return (since is None or time >= since) and (until is None or time < until)
