"""Kubernetes Events on TrainJobs for what the controller did (``kubectl describe trainjob``).

Core ``v1`` Events, named like client-go's recorder names them (``<object>.<unique hex>``), so that
``kubectl describe`` and every event exporter show them. Posting is best effort: a failure is
logged and counted, never retried, and never fails the action it reports.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections.abc import Mapping
from typing import Any, Final, Literal

from mpigate.admission.kube import KubeError

from .api import ControllerApi, event_path
from .lifecycle import format_time
from .metrics import ControllerMetrics

__all__ = ["COMPONENT", "EventPoster", "event_body"]

log = logging.getLogger(__name__)

COMPONENT: Final = "mpigate-controller"
REPORTING_CONTROLLER: Final = "mpigate.io/controller"
_MAX_MESSAGE: Final = 1024  # the API server rejects longer event messages

EventType = Literal["Normal", "Warning"]


def event_body(
    involved: Mapping[str, Any],
    event_type: EventType,
    reason: str,
    message: str,
    *,
    now: dt.datetime,
    instance: str,
) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` (a TrainJob as read from the API)."""
    meta = involved.get("metadata") or {}
    name, namespace = str(meta.get("name")), str(meta.get("namespace"))
    stamp = format_time(now)
    ref: dict[str, Any] = {
        "apiVersion": involved.get("apiVersion") or "trainer.kubeflow.org/v1alpha1",
        "kind": involved.get("kind") or "TrainJob",
        "name": name,
        "namespace": namespace,
    }
    if meta.get("uid"):
        ref["uid"] = meta["uid"]
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 1] + "…"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{secrets.token_hex(8)}", "namespace": namespace},
        "involvedObject": ref,
        "type": event_type,
        "reason": reason,
        "message": message,
        "source": {"component": COMPONENT},
        "reportingComponent": REPORTING_CONTROLLER,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventPoster:
    """Posts Events with the controller's identity."""

    def __init__(self, api: ControllerApi, metrics: ControllerMetrics, instance: str) -> None:
        self.api = api
        self.metrics = metrics
        self.instance = instance

    async def post(
        self,
        involved: Mapping[str, Any],
        event_type: EventType,
        reason: str,
        message: str,
        *,
        now: dt.datetime | None = None,
    ) -> None:
        body = event_body(
            involved, event_type, reason, message, now=now or dt.datetime.now(dt.UTC), instance=self.instance
        )
        namespace = body["metadata"]["namespace"]
        try:
            await self.api.create(event_path(namespace), body)
        except KubeError as exc:
            self.metrics.events_failed.inc()
            log.warning(
                "could not post event %s on %s/%s: %s", reason, namespace, body["involvedObject"]["name"], exc
            )
