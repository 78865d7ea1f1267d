"""The controller's own API calls (kopf does the watching): paths, create/patch, small caches.

Built on :class:`mpigate.admission.kube.KubeClient`, so the webhook and the controller share one
way of reading kubeconfigs and service-account credentials.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from mpigate.admission.kube import KubeClient, KubeError, ListPage

__all__ = [
    "MANAGED_LABELS",
    "MERGE_PATCH",
    "ControllerApi",
    "TtlCache",
    "configmap_path",
    "event_path",
    "lease_path",
    "namespace_path",
    "netpol_path",
    "node_path",
    "pod_path",
    "runtime_path",
    "trainjob_path",
]

MERGE_PATCH: Final = "application/merge-patch+json"
#: The labels of the objects mpigate's controller writes for itself (state ConfigMaps, reports).
MANAGED_LABELS: Final = {"app.kubernetes.io/managed-by": "mpigate", "app.kubernetes.io/part-of": "mpigate"}
#: Objects per page of a paginated list: the controller's memory stays flat in the number of jobs.
PAGE_SIZE: Final = 500
TRAINER_API: Final = "/apis/trainer.kubeflow.org/v1alpha1"

T = TypeVar("T")


def trainjob_path(namespace: str, name: str) -> str:
    return f"{TRAINER_API}/namespaces/{namespace}/trainjobs/{name}"


def runtime_path(kind: str, name: str, namespace: str | None) -> str:
    if kind == "TrainingRuntime":
        return f"{TRAINER_API}/namespaces/{namespace}/trainingruntimes/{name}"
    return f"{TRAINER_API}/clustertrainingruntimes/{name}"


def netpol_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    return f"{base}/{name}" if name else base


def configmap_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    return f"{base}/{name}" if name else base


def pod_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def event_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/events"


def lease_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{base}/{name}" if name else base


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


def namespace_path(name: str) -> str:
    return f"/api/v1/namespaces/{name}"


def _objects(items: list[object]) -> list[dict[str, Any]]:
    """A LIST page's items that are objects (decoded whole: the controller reads them as the API
    server sends them)."""
    return [i for i in items if isinstance(i, dict)]


@dataclass
class TtlCache(Generic[T]):
    """Values fetched on demand and kept for ``ttl`` seconds (node and namespace labels change
    rarely; a watch of every node would cost more than an occasional GET)."""

    ttl: float
    clock: Callable[[], float] = time.monotonic
    _items: dict[str, tuple[float, T]] = field(default_factory=dict)

    async def get(self, key: str, fetch: Callable[[], Awaitable[T]]) -> T:
        now = self.clock()
        found = self._items.get(key)
        if found is not None and now - found[0] < self.ttl:
            return found[1]
        value = await fetch()
        self._items[key] = (now, value)
        return value

    def forget(self, key: str) -> None:
        self._items.pop(key, None)


class ControllerApi:
    """GET/create/merge-patch with 404 as a value, and cached labels of nodes and namespaces."""

    def __init__(self, client: KubeClient, *, label_ttl: float = 300.0) -> None:
        self.client = client
        self.nodes: TtlCache[dict[str, str] | None] = TtlCache(label_ttl)
        self.namespaces: TtlCache[dict[str, str] | None] = TtlCache(min(label_ttl, 60.0))

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist (404)."""
        try:
            return await self.client.get(path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list_items(
        self, path: str, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The items of a collection (one page: the controller lists one job's pods, one
        namespace's scheduling Events or every job of a kind). The selectors narrow the answer on a
        real API server; callers still check what they get."""
        params: dict[str, str] = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        answer = await self.client.get(path, params or None)
        items = answer.get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def pages(
        self, path: str, *, limit: int = PAGE_SIZE, label_selector: str | None = None
    ) -> AsyncIterator[ListPage[list[dict[str, Any]]]]:
        """The objects of a collection, one page (``limit``/``continue``) at a time, so that a
        caller holds one page at most: the webhook's paginated list
        (:meth:`~mpigate.admission.kube.KubeClient.list_pages`). A continue token that expired
        (410) starts the list again from a fresh snapshot, with a page marked ``restarted``: what
        the earlier pages gave belongs to the abandoned snapshot (a caller that keeps what it
        listed drops it, one that acts on each object skips those it has seen). Raises
        :class:`KubeError` (also after :data:`~mpigate.admission.kube.LIST_RESTARTS` restarts)."""
        return self.client.list_pages(path, object, _objects, limit=limit, label_selector=label_selector)

    async def create(self, collection: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.client.request("POST", collection, body=body)

    async def delete(self, path: str) -> None:
        """Delete the object at ``path`` (gone already: nothing to do)."""
        try:
            await self.client.request("DELETE", path)
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await self.client.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def write_configmap_data(self, namespace: str, name: str, binary_data: Mapping[str, str]) -> None:
        """Set the ``binaryData`` of the controller's own ConfigMap ``namespace/name`` (its ledger,
        the background audit's state): merge-patched, or created with :data:`MANAGED_LABELS` when
        it does not exist yet. Raises :class:`KubeError`."""
        try:
            await self.merge_patch(configmap_path(namespace, name), {"binaryData": dict(binary_data)})
        except KubeError as exc:
            if exc.status != 404:
                raise
            await self.create(
                configmap_path(namespace),
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_LABELS)},
                    "binaryData": dict(binary_data),
                },
            )

    async def _labels(self, path: str) -> dict[str, str] | None:
        obj = await self.get(path)
        if obj is None:
            return None
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}

    async def node_labels(self, name: str) -> dict[str, str] | None:
        """Labels of node ``name`` (None: no such node)."""
        return await self.nodes.get(name, lambda: self._labels(node_path(name)))

    async def node_lost(self, name: str) -> bool:
        """Whether node ``name`` is gone or not ready, read now (no cache: asked only about a pod
        whose containers still read as running after it was deleted)."""
        node = await self.get(node_path(name))
        if node is None:
            self.nodes.forget(name)
            return True
        status = node.get("status")
        conditions = status.get("conditions") if isinstance(status, Mapping) else None
        for c in conditions if isinstance(conditions, list) else []:
            if isinstance(c, Mapping) and c.get("type") == "Ready":
                return c.get("status") != "True"
        return False

    async def namespace_labels(self, name: str) -> dict[str, str] | None:
        return await self.namespaces.get(name, lambda: self._labels(namespace_path(name)))
