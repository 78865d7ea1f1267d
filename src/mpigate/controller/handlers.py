"""The kopf side: settings and the handler registry (thin adapters onto the :class:`Reconciler`).

- Jobs of each kind the cluster serves (TrainJobs; MPIJobs where the MPI Operator's
  ``kubeflow.org/v2beta1`` is served: :mod:`.kinds`): ``on.resume``/``on.create``/``on.update``
  (labels — the data classification may change the profile) ensure the NetworkPolicy, with kopf's
  retries and backoff on API errors; ``on.event`` (every watch event, deletions included) drives
  lifecycle records and evidence.
- Pods of those jobs (JobSet's label; the MPI Operator's): ``on.event`` feeds the running times and
  placements. With one kind the watch asks the API server for that kind's pods only; with both, a
  label selector cannot ask for either of two labels, so every pod is watched and the handler takes
  the jobs' pods only (docs/controller.md, "Limits").
- NetworkPolicies labelled ``app.kubernetes.io/managed-by: mpigate``: ``on.event`` repairs an
  edited or deleted policy at once.

No finalizers: there are no deletion handlers, timers or daemons (kopf adds a finalizer for
each of those); periodic resync runs outside kopf. kopf keeps its progress and diff-base in
``mpigate.io/...`` annotations, never in the job's status (owned by Trainer or the MPI Operator).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import kopf

from mpigate.admission.kube import KubeError

from .kinds import TRAINJOB, JobKind
from .netpol import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from .reconciler import NoConfigError, Reconciler

__all__ = [
    "NETWORK_POLICIES",
    "PODS",
    "TRAINJOBS",
    "build_registry",
    "build_settings",
    "pod_selector",
]

log = logging.getLogger(__name__)

TRAINJOBS: Final = TRAINJOB.resource
PODS: Final = ("", "v1", "pods")
NETWORK_POLICIES: Final = ("networking.k8s.io", "v1", "networkpolicies")
ANNOTATION_PREFIX: Final = "mpigate.io"
# kopf's retry delays after an API error (seconds): quick first, then slower.
RETRY_DELAYS: Final = (1.0, 5.0, 15.0, 60.0)


def pod_selector(kinds: Iterable[JobKind]) -> str | None:
    """The label selector of the pod watch: the pods of one kind's jobs, or None (every pod) when
    the kinds' pods carry different labels (a selector's terms are all required)."""
    selectors = {
        ",".join([kind.name_label, *(f"{k}={v}" for k, v in sorted(kind.pod_labels.items()))])
        for kind in kinds
    }
    return selectors.pop() if len(selectors) == 1 else None


def build_settings(
    *, watch_timeout: float = 300.0, kinds: Iterable[JobKind] = (TRAINJOB,)
) -> kopf.OperatorSettings:
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
    pods = pod_selector(kinds)
    if pods is not None:
        settings.watching.label_selectors[PODS[0], PODS[2]] = pods
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

    for kind in reconciler.kinds.values():
        _register_kind(registry, reconciler, kind)
    kinds = tuple(reconciler.kinds.values())

    def a_jobs_pod(labels: Mapping[str, Any], **_: Any) -> bool:
        return any(kind.job_of_pod(labels) is not None for kind in kinds)

    @kopf.on.event(*PODS, when=a_jobs_pod, registry=registry)
    async def pod_event(event: kopf.RawEvent, **_: Any) -> None:
        await reconciler.on_pod_event(event.get("type"), event["object"])

    @kopf.on.event(*NETWORK_POLICIES, labels={MANAGED_BY_LABEL: MANAGED_BY_VALUE}, registry=registry)
    async def policy_event(event: kopf.RawEvent, **_: Any) -> None:
        await reconciler.on_policy_event(event.get("type"), event["object"])

    return registry


def _register_kind(registry: kopf.OperatorRegistry, reconciler: Reconciler, kind: JobKind) -> None:
    """The handlers of one job kind: its NetworkPolicy, and every watch event of its jobs."""

    @kopf.on.resume(*kind.resource, registry=registry, id="network-policy")
    @kopf.on.create(*kind.resource, registry=registry, id="network-policy")
    @kopf.on.update(*kind.resource, field="metadata.labels", registry=registry, id="network-policy")
    async def network_policy(body: kopf.Body, retry: int, **_: Any) -> None:
        # Returns nothing: kopf would store a result in the job's status, which is its operator's.
        try:
            await reconciler.ensure_network_policy(body, kind=kind)
        except KubeError as exc:
            raise kopf.TemporaryError(f"NetworkPolicy: {exc}", delay=_delay(retry)) from exc
        except NoConfigError as exc:
            raise kopf.TemporaryError(str(exc), delay=_delay(retry)) from exc

    @kopf.on.event(*kind.resource, registry=registry)
    async def job_event(event: kopf.RawEvent, **_: Any) -> None:
        await reconciler.on_job_event(kind, event.get("type"), event["object"])
