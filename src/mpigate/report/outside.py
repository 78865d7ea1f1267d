"""Security-relevant API-server events outside mpigate's judgement.

mpigate's webhooks judge TrainJobs and training runtimes; the API server's log also shows what
they never see. Each event the reader classified (:data:`~.k8saudit.CATEGORIES`) is counted here
by category and outcome, and the categories are record kinds of the control catalogues, so the
controls that rest on them show these events and move to *attention* when one is a finding:

- ``k8s-workload``: pods and workloads created or replaced in a team namespace, judged against
  the Pod Security level in force with the same engine the webhook uses
  (:func:`mpigate.policy.pss.evaluate_pod` on each pod template of ``requestObject``);
- ``k8s-exec``: exec, attach and port-forward into pods;
- ``k8s-rbac-write``: RBAC writes; a finding when a binding grants ``cluster-admin``, a rule has
  a wildcard or the verbs ``escalate``, ``bind`` or ``impersonate``, or a ``system:`` role or
  binding (the API server's own) is changed;
- ``k8s-secret``: secret access by a person, or in ``kube-system`` by anyone but the control
  plane;
- ``k8s-anonymous``: writes by ``system:anonymous`` / ``system:unauthenticated``;
- ``k8s-impersonation``: requests made as someone else;
- ``k8s-rbac-denied``: requests the authorizer refused — counted as the control working, not as
  findings.

A request that was refused (status ≥ 400) is never a finding of another category: it is the
control working. Everything the reader read but did not use is counted by reason (``notEvaluated``).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from mpigate.policy.pss import evaluate_pod

from ._bounded import OTHERS, KeyedSamples, LimitedCounter
from ._util import add_counts, at, text
from .k8saudit import ApiEvent, actor_kind

__all__ = ["OUTCOMES", "OutsideEvents", "PssTimeline", "pod_templates", "rbac_findings"]

# What happened to a request of a category: a finding (admitted and unsafe), admitted and fine
# ("passed" when it was judged, "recorded" when there is nothing to judge), refused by the API
# server, or not evaluated (why is in notEvaluated).
OUTCOMES = ("finding", "passed", "recorded", "refused", "not-evaluated")

# Workload resources and where their pod templates are (apps/v1, batch/v1, v1, jobset).
_TEMPLATE_PATHS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "pods": ((),),
    "podtemplates": (("template",),),
    "replicationcontrollers": (("spec", "template"),),
    "deployments": (("spec", "template"),),
    "replicasets": (("spec", "template"),),
    "statefulsets": (("spec", "template"),),
    "daemonsets": (("spec", "template"),),
    "jobs": (("spec", "template"),),
    "cronjobs": (("spec", "jobTemplate", "spec", "template"),),
}
_RISKY_VERBS = frozenset({"escalate", "bind", "impersonate"})
_MAX_REASON = 1000  # a pod with many failing containers: the reason is cut, the count is not
# Identities of the control plane that read and write secrets as their job.
_CONTROL_PLANE = ("system:kube-controller-manager", "system:kube-scheduler", "system:apiserver")


def _walk(obj: Any, path: Sequence[str]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj


def pod_templates(resource: str, obj: Any) -> list[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """(path, metadata, spec) of every pod template of a workload object (a pod is its own)."""
    out: list[tuple[str, Mapping[str, Any], Mapping[str, Any]]] = []
    if not isinstance(obj, Mapping):
        return out
    if resource == "jobsets":
        jobs = _walk(obj, ("spec", "replicatedJobs"))
        for i, job in enumerate(jobs if isinstance(jobs, list) else ()):
            template = _walk(job, ("template", "spec", "template"))
            if isinstance(template, Mapping):
                out.append((f"spec.replicatedJobs[{i}].template.spec.template", *_meta_spec(template)))
        return out
    for path in _TEMPLATE_PATHS.get(resource, ()):
        template = _walk(obj, path)
        if isinstance(template, Mapping) and isinstance(template.get("spec"), Mapping):
            out.append((".".join(path), *_meta_spec(template)))
    return out


def _meta_spec(template: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    meta, spec = template.get("metadata"), template.get("spec")
    return (meta if isinstance(meta, Mapping) else {}), (spec if isinstance(spec, Mapping) else {})


def rbac_findings(resource: str, verb: str, name: str, obj: Any) -> list[str]:
    """Why an RBAC write needs attention (empty when it does not)."""
    found: list[str] = []
    if name.startswith("system:"):
        found.append(f"{verb} of the API server's own {resource[:-1]} {name}")
    elif name == "cluster-admin" and resource == "clusterroles":
        found.append(f"{verb} of the cluster-admin ClusterRole")
    if not isinstance(obj, Mapping) or verb not in ("create", "update"):
        return found
    labels = _walk(obj, ("metadata", "labels"))
    if (
        not found
        and isinstance(labels, Mapping)
        and labels.get("kubernetes.io/bootstrapping") == "rbac-defaults"
    ):
        found.append(f"{verb} of a default {resource[:-1]} (kubernetes.io/bootstrapping: rbac-defaults)")
    if resource in ("rolebindings", "clusterrolebindings"):
        ref = obj.get("roleRef")
        if isinstance(ref, Mapping) and ref.get("name") == "cluster-admin":
            found.append("binds cluster-admin")
        return found
    rules = obj.get("rules")
    for rule in rules if isinstance(rules, list) else ():
        if not isinstance(rule, Mapping):
            continue
        for field in ("verbs", "resources", "apiGroups"):
            values = rule.get(field)
            if isinstance(values, list) and "*" in values:
                found.append(f"wildcard {field}")
        verbs = rule.get("verbs")
        risky = sorted(_RISKY_VERBS.intersection(verbs if isinstance(verbs, list) else ()))
        if risky:
            found.append(f"grants {', '.join(risky)}")
    return sorted(set(found), key=found.index)


class PssTimeline:
    """The Pod Security level and version in force over time: (time, level, version, revision)
    from the webhook's config records, sorted by time; before the first one (or without any),
    ``default`` — the ``--config`` tree's, or None: not known."""

    def __init__(
        self,
        entries: Sequence[tuple[str, str, str, str]] = (),
        default: tuple[str, str, str] | None = None,
    ) -> None:
        self.entries = sorted(entries)
        self._times = [e[0] for e in self.entries]
        self.default = default

    def at(self, time: str) -> tuple[str, str, str] | None:
        """(level, version, revision) in force at ``time``, or None when unknown."""
        i = bisect.bisect_right(self._times, time) - 1
        if i < 0:
            return self.default
        _, level, version, revision = self.entries[i]
        return level, version, revision


def _judge_pods(resource: str, obj: Any, level: str, version: str) -> list[str] | None:
    """The failing checks of each pod template as ``path: check (detail)`` texts; None when
    the object has no pod template to judge."""
    templates = pod_templates(resource, obj)
    if not templates:
        return None
    failures: list[str] = []
    for path, metadata, spec in templates:
        for finding in evaluate_pod(metadata, spec, level, version):
            where = f"{path}: " if path else ""
            detail = f" ({finding.detail})" if finding.detail else ""
            failures.append(f"{where}{finding.reason}{detail}")
    return failures


class OutsideEvents:
    """Counters and bounded samples of the classified events of the period; mergeable."""

    def __init__(
        self,
        namespace_teams: Mapping[str, str],
        pss: PssTimeline,
        max_keys: int,
        max_examples: int,
    ) -> None:
        self.namespace_teams = namespace_teams
        self.pss = pss
        self.counts: dict[tuple[str, str], int] = {}  # (category, outcome) -> requests
        self.not_evaluated: dict[tuple[str, str], int] = {}  # (category or "", reason) -> events
        self.levels: dict[tuple[str, str, str], int] = {}  # (level, version, revision) -> judged
        self.by_actor: LimitedCounter[tuple[str, str, str, str]] = LimitedCounter(
            max_keys, ("", OTHERS, "", "")
        )  # (category, actor, actor kind, outcome)
        self.samples: KeyedSamples[tuple[str, str], tuple[Any, ...]] = KeyedSamples(max_examples * 4)

    def skip(self, category: str, reason: str, amount: int = 1) -> None:
        key = (category, reason)
        self.not_evaluated[key] = self.not_evaluated.get(key, 0) + amount

    def add(self, event: ApiEvent, kind: str) -> None:
        """One event of the period that the reader put in at least one category."""
        refused = event.code is not None and event.code >= 400
        for category in event.categories:
            if category == "k8s-activity":
                continue  # TrainJob and runtime writes: mpigate's own (ApiServerEvents)
            outcome, reason = self._judge(category, event, refused)
            if outcome == "not-evaluated":
                self.skip(category, reason)
            self._count(category, outcome, event, kind, reason)

    def _count(self, category: str, outcome: str, event: ApiEvent, kind: str, reason: str) -> None:
        key = (category, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.by_actor.add((category, event.actor, kind, outcome))
        if outcome in ("finding", "refused", "not-evaluated") or category == "k8s-workload":
            via = event.username if event.impersonated else ""
            self.samples.add(
                (category, outcome),
                (
                    event.time,
                    category,
                    outcome,
                    event.actor,
                    kind,
                    via,
                    event.verb,
                    event.resource + (f"/{event.subresource}" if event.subresource else ""),
                    event.namespace or "",
                    event.name or "",
                    event.code,
                    reason,
                    f"{event.file}:{event.line}",
                    event.audit_id,
                    event.source_ip,
                    event.user_agent,
                ),
            )

    def _judge(self, category: str, event: ApiEvent, refused: bool) -> tuple[str, str]:
        """(outcome, reason) of one event in one category."""
        if category == "k8s-rbac-denied":
            return "refused", event.authorization_reason or event.reason
        if refused:
            return "refused", event.reason
        if category == "k8s-workload":
            return self._workload(event)
        if category == "k8s-rbac-write":
            found = rbac_findings(event.resource, event.verb, event.name or "", event.obj)
            if found:
                return "finding", "; ".join(found)
            if event.obj is None and event.verb in ("create", "update"):
                return "recorded", "rules not inspected: no requestObject (audit level Metadata)"
            return "recorded", ""
        if category == "k8s-secret":
            return self._secret(event)
        if category == "k8s-exec":
            return "finding", f"{event.subresource} into pod {event.namespace}/{event.name}"
        if category == "k8s-anonymous":
            return "finding", f"unauthenticated {event.verb} of {event.resource}"
        if category == "k8s-impersonation":
            return "finding", f"{event.username} acted as {event.actor}"
        return "recorded", ""  # pragma: no cover - every category is handled above

    def _workload(self, event: ApiEvent) -> tuple[str, str]:
        namespace = event.namespace or ""
        if namespace not in self.namespace_teams:
            return "not-evaluated", "not a team namespace (no mpigate Pod Security level applies)"
        if event.verb == "patch":
            return "not-evaluated", "a patch (the log holds the patch, not the object)"
        if event.obj is None:
            return "not-evaluated", "no requestObject (the audit policy logs this at Metadata level)"
        level = self.pss.at(event.time)
        if level is None:
            return "not-evaluated", "no Pod Security level known (no config record, no --config)"
        try:
            failures = _judge_pods(event.resource, event.obj, level[0], level[1])
        except ValueError as exc:  # a level or version no Pod Security release knows
            return "not-evaluated", f"the Pod Security level in force cannot be used: {exc}"
        if failures is None:
            return "not-evaluated", "no pod template in the object"
        self.levels[level] = self.levels.get(level, 0) + 1
        if failures:
            text = f'violates PodSecurity "{level[0]}:{level[1]}": ' + "; ".join(failures)
            return "finding", text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"
        return "passed", f'meets PodSecurity "{level[0]}:{level[1]}"'

    def _secret(self, event: ApiEvent) -> tuple[str, str]:
        actor = event.actor
        kind = actor_kind(actor)
        where = f"{event.namespace}/{event.name}" if event.name else (event.namespace or "all namespaces")
        if kind == "user":
            return "finding", f"{event.verb} of secret {where} by a person"
        if event.namespace == "kube-system" and not (
            actor.startswith(_CONTROL_PLANE) or actor.startswith("system:serviceaccount:kube-system:")
        ):
            return "finding", f"{event.verb} of secret {where} in kube-system"
        return "recorded", ""

    def merge(self, other: OutsideEvents) -> None:
        add_counts(self.counts, other.counts)
        add_counts(self.not_evaluated, other.not_evaluated)
        add_counts(self.levels, other.levels)
        self.by_actor.merge(other.by_actor)
        self.samples.merge(other.samples, key=at(0))

    # ------------------------------------------------------------------ result

    def findings(self, category: str) -> int:
        return self.counts.get((category, "finding"), 0)

    def in_period_total(self, category: str) -> int:
        """Events of the category in the period (whatever their outcome)."""
        return sum(c for (cat, _), c in self.counts.items() if cat == category)

    def judged(self, category: str) -> int:
        """Events of the category in the period that were evaluated: the tested population."""
        return self.in_period_total(category) - self.counts.get((category, "not-evaluated"), 0)

    def skipped_for(self, category: str, reason_start: str) -> int:
        return sum(
            n
            for (cat, reason), n in self.not_evaluated.items()
            if cat == category and reason.startswith(reason_start)
        )

    def first_reason(self, category: str) -> str:
        samples = self.samples.get((category, "finding"))
        return text(samples[-1][11]) if samples else ""

    def section(self, categories: Mapping[str, str], controls: Mapping[str, list[str]]) -> dict[str, Any]:
        """The report's ``apiServerEvents`` section: per category its requests by outcome, the
        controls it evidences, who made them and samples (findings first)."""
        rows = []
        for category, title in categories.items():
            if category == "k8s-activity":
                continue
            counts = {o: self.counts.get((category, o), 0) for o in OUTCOMES}
            samples = []
            for outcome in OUTCOMES:
                samples.extend(self.samples.get((category, outcome)))
            samples.sort(key=lambda s: s[0], reverse=True)  # most recent first,
            samples.sort(key=lambda s: OUTCOMES.index(s[2]))  # findings before the rest
            rows.append(
                {
                    "category": category,
                    "title": title,
                    "controls": controls.get(category, []),
                    "requests": sum(counts.values()),
                    **{_camel(o): n for o, n in counts.items()},
                    "actors": sorted(
                        (
                            _actor_row(a, k, o, n)
                            for (c, a, k, o), n in self.by_actor.items()
                            if c == category
                        ),
                        key=lambda r: (-r["requests"], r["actor"], r["outcome"]),
                    ),
                    "examples": [_sample(s) for s in samples],
                }
            )
        return {
            "categories": rows,
            "findings": sum(r["finding"] for r in rows),
            "podSecurityLevels": [
                {"level": lv, "version": ver, "revision": rev or None, "requests": n}
                for (lv, ver, rev), n in sorted(self.levels.items())
            ],
        }


def _actor_row(actor: str, kind: str, outcome: str, requests: int) -> dict[str, Any]:
    return {"actor": actor, "actorKind": kind, "outcome": outcome, "requests": requests}


def _camel(word: str) -> str:
    head, *rest = word.split("-")
    return head + "".join(part.title() for part in rest)


def _sample(s: tuple[Any, ...]) -> dict[str, Any]:
    return {
        "time": s[0],
        "outcome": s[2],
        "actor": s[3],
        "actorKind": s[4],
        "via": s[5] or None,
        "verb": s[6],
        "resource": s[7],
        "namespace": s[8] or None,
        "name": s[9] or None,
        "code": s[10],
        "reason": text(s[11]),
        "source": s[12],
        "auditID": s[13] or None,
        "sourceIP": s[14] or None,
        "userAgent": s[15] or None,
    }
