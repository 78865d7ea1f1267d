"""The kopf side: settings and the handler registry (thin adapters onto the :class:`Reconciler`).

- TrainJobs: ``on.resume``/``on.create``/``on.update`` (labels — the data classification may
  change the profile) ensure the NetworkPolicy, with kopf's retries and backoff on API errors;
  ``on.event`` (every watch event, deletions included) drives lifecycle records and evidence.
- Pods with JobSet's label: ``on.event`` feeds the running times and placements.
- NetworkPolicies labelled ``app.kubernetes.io/managed-by: mpigate``: ``on.event`` repairs an
  edited or deleted policy at once.

No finalizers: there are no deletion handlers, timers or daemons (kopf adds a finalizer for
each of those); periodic resync runs outside kopf. kopf keeps its progress and diff-base in
``mpigate.io/...`` annotations, never in the TrainJob's status (owned by Trainer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import kopf

from mpigate.admission.kube import KubeError

from .netpol import JOBSET_NAME_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE
from .reconciler import NoConfigError, Reconciler

__all__ = ["NETWORK_POLICIES", "PODS", "TRAINJOBS", "build_registry", "build_settings"]

log = logging.getLogger(__name__)

TRAINJOBS: Final = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
PODS: Final = ("", "v1", "pods")
NETWORK_POLICIES: Final = ("networking.k8s.io", "v1", "networkpolicies")
ANNOTATION_PREFIX: Final = "mpigate.io"
# kopf's retry delays after an API error (seconds): quick first, then slower.
RETRY_DELAYS: Final = (1.0, 5.0, 15.0, 60.0)


def build_settings(*, watch_timeout: float = 300.0) -> kopf.OperatorSettings:
    """kopf settings: mpigate's annotation prefix, server-side label selectors, no kopf Events."""
    settings = kopf.OperatorSettings()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/kopf-finalizer"  # never added: see module doc
    # The controller posts its own Events (events.py); kopf's would repeat every handler log line.
    settings.posting.enabled = False
    # No CRD/namespace discovery watches (least privilege); the resources are resolved at startup.
    settings.scanning.disabled = True
    settings.watching.server_timeout = watch_timeout
    settings.watching.client_timeout = watch_timeout + 30
    settings.watching.connect_timeout = 10
    # Watch only what matters; the handlers filter the same way (client-side) as well.
    settings.watching.label_selectors[PODS[0], PODS[2]] = JOBSET_NAME_LABEL
    settings.watching.label_selectors[NETWORK_POLICIES[0], NETWORK_POLICIES[2]] = (
        f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
    )
    return settings


def _delay(retry: int) -> float:
    return RETRY_DELAYS[min(retry, len(RETRY_DELAYS) - 1)]


def build_registry(
    reconciler: Reconciler, *, login: Callable[..., Any] | None = None
) -> kopf.OperatorRegistry:
    """A fresh registry with the controller's handlers bound to ``reconciler``.

    ``login``: a kopf login handler returning :class:`kopf.ConnectionInfo`.
    """
    registry = kopf.OperatorRegistry()
    if login is not None:
        kopf.on.login(registry=registry)(login)

    @kopf.on.resume(*TRAINJOBS, registry=registry, id="network-policy")
    @kopf.on.create(*TRAINJOBS, registry=registry, id="network-policy")
    @kopf.on.update(*TRAINJOBS, field="metadata.labels", registry=registry, id="network-policy")
    async def network_policy(body: kopf.Body, retry: int, **_: Any) -> None:
        # Returns nothing: kopf would store a result in the TrainJob's status, which is Trainer's.
        try:
            await reconciler.ensure_network_policy(body)
        except KubeError as exc:
            raise kopf.TemporaryError(f"NetworkPolicy: {exc}", delay=_delay(retry)) from exc
        except NoConfigError as exc:
            raise kopf.TemporaryError(str(exc), delay=_delay(retry)) from exc

    @kopf.on.event(*TRAINJOBS, registry=registry)
    async def trainjob_event(event: kopf.RawEvent, **_: Any) -> None:
        await reconciler.on_trainjob_event(event.get("type"), event["object"])

    @kopf.on.event(*PODS, labels={JOBSET_NAME_LABEL: kopf.PRESENT}, registry=registry)
    async def pod_event(event: kopf.RawEvent, **_: Any) -> None:
        await reconciler.on_pod_event(event.get("type"), event["object"])

    @kopf.on.event(*NETWORK_POLICIES, labels={MANAGED_BY_LABEL: MANAGED_BY_VALUE}, registry=registry)
    async def policy_event(event: kopf.RawEvent, **_: Any) -> None:
        await reconciler.on_policy_event(event.get("type"), event["object"])

    return registry
