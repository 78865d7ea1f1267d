"""Policy reports of the background audit (:mod:`.background`): one report per namespace and one
cluster-scoped report, bounded in size (pure: objects in, report bodies out).

Two APIs carry the same results (OrgPolicy ``spec.backgroundAudit.reports`` picks one or both):

- ``wgpolicyk8s.io/v1alpha2`` ``PolicyReport``/``ClusterPolicyReport`` — the Policy WG's API, read
  by Policy Reporter and written by Kyverno up to 1.14, Trivy, Falco and kube-bench adapters: the
  default, since what reads reports today reads this one;
- ``openreports.io/v1alpha1`` ``Report``/``ClusterReport`` — its successor (openreports/reports-api
  ``apis/openreports.io/v1alpha1/report_types.go``, written by Kyverno from 1.15): the same result
  fields, a report-level ``source`` and ``configuration.limits.maxResults``, which says a consumer
  that the results are capped.

Bounded: a report holds at most ``max_results`` results (failures before warnings), whatever the
number of jobs; ``summary`` still counts every result, and the annotations
``mpigate.io/results-omitted`` and ``mpigate.io/results-omitted-by-rule`` say what was cut. One
report per namespace, rewritten only when its content changes (no timestamp of the pass in it):
etcd holds one bounded object per namespace instead of one per job or per evaluation (Kyverno's
reports once grew to 9.5 GB of etcd: kyverno/kyverno#8974).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from mpigate.catalogue import all_rules

from .api import MANAGED_LABELS

__all__ = [
    "CLUSTER_KIND",
    "MANAGED_LABELS",
    "NAMESPACED_KIND",
    "REPORT_APIS",
    "REPORT_NAME",
    "ReportBuilder",
    "Result",
    "report_collection",
]

REPORT_NAME: Final = "mpigate"
SOURCE: Final = "mpigate"
WGPOLICY: Final = "wgpolicyk8s.io/v1alpha2"
OPENREPORTS: Final = "openreports.io/v1alpha1"
REPORT_APIS: Final = (WGPOLICY, OPENREPORTS)
NAMESPACED_KIND: Final = {WGPOLICY: ("PolicyReport", "policyreports"), OPENREPORTS: ("Report", "reports")}
CLUSTER_KIND: Final = {
    WGPOLICY: ("ClusterPolicyReport", "clusterpolicyreports"),
    OPENREPORTS: ("ClusterReport", "clusterreports"),
}
OMITTED_ANNOTATION: Final = "mpigate.io/results-omitted"
OMITTED_BY_RULE_ANNOTATION: Final = "mpigate.io/results-omitted-by-rule"
REVISION_ANNOTATION: Final = "mpigate.io/config-revision"
# What a mode says in a report: enforce fails (scored), warn and audit warn.
_RESULT: Final = {"enforce": "fail", "warn": "warn", "audit": "warn"}
_SEVERITY: Final = {"enforce": "high", "warn": "medium", "audit": "low"}


def report_collection(api: str, namespace: str | None) -> str:
    """The API path of a report API's reports in ``namespace`` (None: the cluster's)."""
    if namespace is None:
        return f"/apis/{api}/{CLUSTER_KIND[api][1]}"
    return f"/apis/{api}/namespaces/{namespace}/{NAMESPACED_KIND[api][1]}"


@dataclass(frozen=True, slots=True)
class Result:
    """One standing violation of one object, as a report shows it."""

    rule: str
    mode: str
    path: str
    message: str
    fix: str
    action: str
    since: int  # epoch seconds: when the audit first found it (stable, so reports do not churn)
    subject: tuple[tuple[str, str], ...]  # apiVersion, kind, namespace, name, uid (as pairs)
    expired_exception: str | None = None

    @property
    def result(self) -> str:
        return _RESULT.get(self.mode, "warn")

    def body(self) -> dict[str, Any]:
        info = all_rules().get(self.rule)
        properties = {"path": self.path, "mode": self.mode, "action": self.action}
        if self.fix:
            properties["fix"] = self.fix
        if self.expired_exception:
            properties["expiredException"] = self.expired_exception
        return {
            "source": SOURCE,
            "policy": self.rule,
            "rule": self.rule,
            "category": info.family if info is not None else "custom",
            "severity": _SEVERITY.get(self.mode, "info"),
            "result": self.result,
            "scored": self.result == "fail",
            "message": self.message,
            "timestamp": {"seconds": self.since, "nanos": 0},
            "resources": [dict(self.subject)],
            "properties": properties,
        }


@dataclass
class ReportBuilder:
    """The results of one namespace (or of the cluster: ``namespace`` None) during a pass; holds
    at most ``max_results`` of each result kind, counts the rest."""

    namespace: str | None
    max_results: int
    passed: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    _kept: dict[str, list[Result]] = field(default_factory=lambda: {"fail": [], "warn": []})
    _over: Counter[str] = field(default_factory=Counter)  # by rule: not kept while adding

    def add(self, results: list[Result]) -> None:
        """The results of one object judged (none: it passed)."""
        if not results:
            self.passed += 1
            return
        for r in results:
            kind = r.result
            self.counts[kind] += 1
            kept = self._kept.setdefault(kind, [])
            if len(kept) < self.max_results:
                kept.append(r)
            else:
                self._over[r.rule] += 1

    def results(self) -> tuple[list[Result], Counter[str]]:
        """The results kept (failures first, then warnings, up to ``max_results``) and what was
        left out, by rule."""
        kept: list[Result] = []
        omitted = Counter(self._over)
        for kind in ("fail", "warn"):
            for r in self._kept.get(kind, []):
                if len(kept) < self.max_results:
                    kept.append(r)
                else:
                    omitted[r.rule] += 1
        kept.sort(
            key=lambda r: (dict(r.subject).get("name", ""), dict(r.subject).get("kind", ""), r.rule, r.path)
        )
        return kept, omitted

    def body(self, api: str, revision: str) -> dict[str, Any]:
        """The report object (create or merge-patch: every field is given, absent ones as null)."""
        kept, omitted = self.results()
        kind = (CLUSTER_KIND if self.namespace is None else NAMESPACED_KIND)[api][0]
        annotations: dict[str, str | None] = {
            REVISION_ANNOTATION: revision,
            OMITTED_ANNOTATION: str(sum(omitted.values())) if omitted else None,
            OMITTED_BY_RULE_ANNOTATION: json.dumps(dict(sorted(omitted.items()))) if omitted else None,
        }
        meta: dict[str, Any] = {
            "name": REPORT_NAME,
            "labels": dict(MANAGED_LABELS),
            "annotations": annotations,
        }
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        body: dict[str, Any] = {
            "apiVersion": api,
            "kind": kind,
            "metadata": meta,
            "summary": {
                "pass": self.passed,
                "fail": self.counts["fail"],
                "warn": self.counts["warn"],
                "error": 0,
                "skip": 0,
            },
            "results": [r.body() for r in kept],
        }
        if api == OPENREPORTS:
            body["source"] = SOURCE
            body["configuration"] = {"limits": {"maxResults": self.max_results}}
        return body


def digest(body: Mapping[str, Any]) -> str:
    """What a report says (to skip writing one that did not change)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
