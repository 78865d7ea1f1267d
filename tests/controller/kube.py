"""A fake cluster for the controller tests: kmock with the resources kopf and the controller use,
team namespaces, labelled nodes, and helpers to act on it through its HTTP API (so that watch
events flow exactly as they would from an API server)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import kmock as kmock_lib

TJ = "trainer.kubeflow.org/v1alpha1/trainjobs"
MPIJ = "kubeflow.org/v2beta1/mpijobs"
NP = "networking.k8s.io/v1/networkpolicies"
PODS = "v1/pods"
EVENTS = "v1/events"
LEASES = "coordination.k8s.io/v1/leases"

NODES = {
    "gpu-eu-1": {
        "topology.kubernetes.io/region": "eu-west-1",
        "topology.kubernetes.io/zone": "eu-west-1a",
        "nvidia.com/gpu.product": "A100-SXM4-80GB",
    },
    "gpu-us-1": {"topology.kubernetes.io/region": "us-east-1", "nvidia.com/gpu.product": "H100-SXM5-80GB"},
}


def declare(kmock: kmock_lib.KubernetesEmulator, *, mpijobs: bool = False) -> None:
    """The API surface: what kopf discovers and watches, and what the controller reads/writes
    (``mpijobs``: the MPI Operator is installed)."""
    rw = ["get", "list", "watch", "create", "patch", "update", "delete"]
    kmock.resources[TJ] = {"kind": "TrainJob", "namespaced": True, "verbs": rw}
    if mpijobs:
        kmock.resources[MPIJ] = {"kind": "MPIJob", "namespaced": True, "verbs": rw}
    kmock.resources[NP] = {"kind": "NetworkPolicy", "namespaced": True, "verbs": rw}
    kmock.resources[PODS] = {"kind": "Pod", "namespaced": True, "verbs": rw}
    kmock.resources[EVENTS] = {"kind": "Event", "namespaced": True, "verbs": rw}
    kmock.resources["v1/namespaces"] = {"kind": "Namespace", "namespaced": False, "verbs": rw}
    kmock.resources["v1/nodes"] = {"kind": "Node", "namespaced": False, "verbs": rw}
    kmock.resources[LEASES] = {"kind": "Lease", "namespaced": True, "verbs": rw}
    kmock.resources["v1/configmaps"] = {"kind": "ConfigMap", "namespaced": True, "verbs": rw}  # the ledger
    for ns, team in (("nlp-team", "nlp-team"), ("research", "research-team"), ("cv-team", None)):
        labels = {"kubernetes.io/metadata.name": ns}
        if team:  # cv-team's namespace lacks the label: the webhooks (and the controller) skip it
            labels["mpigate.io/team"] = team
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
        kmock.objects["v1/namespaces", None, ns] = namespace
        # kmock reads /api/v1/namespaces/NAME as "everything in namespace NAME": answer it directly
        kmock["get", f"/api/v1/namespaces/{ns}"] << namespace
    for name, labels in NODES.items():
        kmock.objects["v1/nodes", None, name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"node-{name}", "labels": labels},
        }


def alive(kmock: kmock_lib.KubernetesEmulator, resource: str, namespace: str | None, name: str) -> Any | None:
    """The stored object (plain dict), or None when absent or deleted."""
    try:
        obj = kmock.objects[resource, namespace, name]
    except KeyError:
        return None
    return None if obj.deleted else copy.deepcopy(obj.raw)


def events(kmock: kmock_lib.KubernetesEmulator, namespace: str, involved: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events posted about ``involved``, in order."""
    found = []
    for request in kmock["post", f"/api/v1/namespaces/{namespace}/events"]:
        body = request.data
        if body.get("involvedObject", {}).get("name") == involved:
            found.append((body["type"], body["reason"], body["message"]))
    return found


def requests(kmock: kmock_lib.KubernetesEmulator, method: str, path: str) -> Iterator[Any]:
    return iter(kmock[method, path])


async def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), with a deadline.

    The deadline is generous on purpose: it only bounds a failing test (a passing one returns as
    soon as the event happened), and a machine shared by parallel test runs can be slow."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.05)


async def holds(predicate: Callable[[], Any], window: float) -> bool:
    """Whether ``predicate`` stays true for ``window`` seconds (polled)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + window
    while loop.time() < end:
        if not predicate():
            return False
        await asyncio.sleep(0.02)
    return bool(predicate())


class Api:
    """Acting on the fake cluster as users and other controllers would (kubectl, Kueue, Trainer)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def _send(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        headers = {"Content-Type": content_type} if content_type else {}
        async with self.session.request(method, path, json=body, headers=headers) as resp:
            assert resp.status < 300, f"{method} {path}: {resp.status} {await resp.text()}"
            return await resp.json(content_type=None)

    async def create(self, resource: str, namespace: str, body: dict[str, Any]) -> Any:
        group_version, plural = resource.rsplit("/", 1)
        prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        return await self._send("POST", f"{prefix}/namespaces/{namespace}/{plural}", body)

    def _path(self, resource: str, namespace: str, name: str) -> str:
        group_version, plural = resource.rsplit("/", 1)
        prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        return f"{prefix}/namespaces/{namespace}/{plural}/{name}"

    async def patch(self, resource: str, namespace: str, name: str, patch: dict[str, Any]) -> Any:
        return await self._send(
            "PATCH", self._path(resource, namespace, name), patch, "application/merge-patch+json"
        )

    async def delete(self, resource: str, namespace: str, name: str) -> Any:
        return await self._send("DELETE", self._path(resource, namespace, name))
