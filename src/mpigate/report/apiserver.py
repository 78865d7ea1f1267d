"""The API server's own log: writes of training objects (with mpigate's decision annotations, and
those without one: the webhook bypassed) and requests the authorizer refused."""

from __future__ import annotations

from collections import deque
from typing import Any

from ._bounded import OTHERS, LimitedCounter
from ._util import add_counts, merge_recent
from .activity import Activity
from .k8saudit import ApiEvent, actor_kind, exempt_from_webhook

__all__ = ["ApiServerEvents"]


class ApiServerEvents:
    """Counters and samples of API-server events in the period; mergeable."""

    def __init__(self, max_keys: int, max_examples: int) -> None:
        self.in_period = 0
        self.writes = 0
        self.write_results: dict[tuple[str, str], int] = {}  # (verb, result) -> count
        self.unjudged = 0
        self.unjudged_examples: deque[tuple[Any, ...]] = deque(maxlen=max_examples * 4)
        self.rbac: LimitedCounter[tuple[str, str, str, str]] = LimitedCounter(max_keys, (OTHERS, "", "", ""))
        self.rbac_total = 0
        self.rbac_examples: deque[tuple[Any, ...]] = deque(maxlen=max_examples * 4)

    def add(self, event: ApiEvent, activity: Activity) -> None:
        """One event of the period (a trainer write or an RBAC denial)."""
        self.in_period += 1
        time = event.time
        actor = event.actor
        kind = activity.actor_kind(actor)
        via = event.username if event.impersonated else ""
        namespace = event.namespace or ""
        name = event.name or ""
        if event.rbac_denied:
            self.rbac_total += 1
            self.rbac.add((actor, event.verb, event.resource, namespace))
            self.rbac_examples.append(
                (
                    time,
                    actor,
                    kind,
                    via,
                    event.verb,
                    event.resource,
                    namespace,
                    name,
                    event.authorization_reason or event.reason,
                    f"{event.file}:{event.line}",
                    event.audit_id,
                )
            )
        if not event.is_trainer_write:
            return
        self.writes += 1
        decision = event.mpigate_decision
        if event.rbac_denied:
            result = "rbac-denied"
        elif decision == "denied" or (event.code == 403 and decision is not None):
            result = "denied"
        elif event.succeeded:
            result = "admitted"
        else:
            result = "failed"
        rkey = (event.verb, result)
        self.write_results[rkey] = self.write_results.get(rkey, 0) + 1
        obj_kind = event.kind
        activity.add(
            "k8s-audit",
            time,
            actor,
            kind,
            via,
            event.verb,
            obj_kind,
            namespace,
            name,
            result,
            decision or "",
            event.code,
            f"{event.file}:{event.line}",
            event.audit_id,
        )
        if (
            event.succeeded
            and decision is None
            and event.verb != "deletecollection"
            and not exempt_from_webhook(actor, event.actor_groups)
        ):
            self.unjudged += 1
            self.unjudged_examples.append(
                (
                    time,
                    actor,
                    kind,
                    via,
                    event.verb,
                    obj_kind,
                    namespace,
                    name,
                    f"{event.file}:{event.line}",
                    event.audit_id,
                    event.source_ip,
                )
            )

    def merge(self, other: ApiServerEvents) -> None:
        self.in_period += other.in_period
        self.writes += other.writes
        add_counts(self.write_results, other.write_results)
        self.unjudged += other.unjudged
        self.unjudged_examples = merge_recent(self.unjudged_examples, other.unjudged_examples, 0)
        self.rbac.merge(other.rbac)
        self.rbac_total += other.rbac_total
        self.rbac_examples = merge_recent(self.rbac_examples, other.rbac_examples, 0)

    def activity_section(self, given: bool) -> dict[str, Any]:
        """The ``activity.apiServer`` part of the report."""
        return {
            "given": given,
            "writes": self.writes,
            "byVerb": [
                {"verb": verb, "result": result, "count": count}
                for (verb, result), count in sorted(self.write_results.items())
            ],
            "unjudgedWrites": self.unjudged,
            "unjudgedExamples": [
                {
                    "time": e[0],
                    "actor": e[1],
                    "actorKind": e[2],
                    "via": e[3] or None,
                    "verb": e[4],
                    "kind": e[5],
                    "namespace": e[6] or None,
                    "name": e[7] or None,
                    "source": e[8],
                    "auditID": e[9] or None,
                    "sourceIP": e[10] or None,
                }
                for e in reversed(self.unjudged_examples)
            ],
        }

    def rbac_section(self) -> dict[str, Any]:
        """The report's ``rbacDenials`` section."""
        rows: list[dict[str, Any]] = [
            {
                "actor": actor,
                "actorKind": actor_kind(actor) if actor != OTHERS else "",
                "verb": verb,
                "resource": resource,
                "namespace": namespace or None,
                "count": count,
            }
            for (actor, verb, resource, namespace), count in self.rbac.items()
        ]
        rows.sort(key=lambda r: (-r["count"], r["actor"], r["verb"], r["resource"]))
        return {
            "total": self.rbac_total,
            "byActor": rows,
            "examples": [
                {
                    "time": e[0],
                    "actor": e[1],
                    "actorKind": e[2],
                    "via": e[3] or None,
                    "verb": e[4],
                    "resource": e[5],
                    "namespace": e[6] or None,
                    "name": e[7] or None,
                    "reason": e[8],
                    "source": e[9],
                    "auditID": e[10] or None,
                }
                for e in reversed(self.rbac_examples)
            ],
        }
