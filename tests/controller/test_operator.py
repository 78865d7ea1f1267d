"""The controller end to end, in-process, against kmock: kopf watches, leader Lease, NetworkPolicies
created and repaired, lifecycle and evidence records in a real audit trail, Events, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import kmock as kmock_lib
import pytest
import pytest_asyncio
from tests.conftest import REPO
from tests.controller.conftest import example_job
from tests.controller.kube import NP, TJ, Api, alive, declare, events, wait_for

from mpigate.admission.kube import KubeConfig
from mpigate.audit import generate_key
from mpigate.controller.leader import LeaseSettings
from mpigate.controller.metrics import ControllerMetrics
from mpigate.controller.runner import ControllerOptions, run_controller

JOBSET = "jobset.sigs.k8s.io/jobset-name"


@dataclass
class Controller:
    options: ControllerOptions
    metrics: ControllerMetrics
    stop: asyncio.Event
    task: asyncio.Task[int]
    port: asyncio.Future[int]

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    async def shutdown(self) -> int:
        self.stop.set()
        return await asyncio.wait_for(self.task, 30)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "audit.key"
    path.write_bytes(generate_key("hmac-sha256")[0])
    return path


def options_for(
    kmock: kmock_lib.KubernetesEmulator, tmp_path: Path, key_file: Path, **changes: Any
) -> ControllerOptions:
    base = ControllerOptions(
        config_path=REPO,
        kube=KubeConfig(server=str(kmock.url).rstrip("/")),
        audit_dir=tmp_path / "audit",
        audit_key=key_file,
        metrics_host="127.0.0.1",
        metrics_port=0,
        lease=LeaseSettings(
            namespace="mpigate-system", lease_duration=2.0, renew_deadline=1.5, retry_period=0.2
        ),
        identity="controller-a",
        resync_seconds=3600,
        reload_seconds=3600,
        watch_timeout=60,
    )
    return replace(base, **changes)


def start(options: ControllerOptions) -> Controller:
    loop = asyncio.get_running_loop()
    port: asyncio.Future[int] = loop.create_future()
    stop = asyncio.Event()
    metrics = ControllerMetrics()
    task = asyncio.create_task(run_controller(options, stop=stop, metrics=metrics, started=port.set_result))
    return Controller(options, metrics, stop, task, port)


@pytest_asyncio.fixture
async def api(kmock: kmock_lib.KubernetesEmulator) -> AsyncIterator[Api]:
    declare(kmock)
    async with aiohttp.ClientSession(base_url=str(kmock.url)) as session:
        yield Api(session)


@pytest_asyncio.fixture
async def controller(
    kmock: kmock_lib.KubernetesEmulator, api: Api, tmp_path: Path, key_file: Path
) -> AsyncIterator[Controller]:
    running = start(options_for(kmock, tmp_path, key_file))
    await wait_for(
        lambda: running.metric("mpigate_controller_leader") == 1 or running.task.done(), what="leader"
    )
    yield running
    if not running.task.done():
        assert await running.shutdown() == 0


def trainjob(name: str, *, uid: str, namespace: str | None = None, **spec: Any) -> dict[str, Any]:
    job = example_job(name, uid=uid)
    if namespace:
        job["metadata"]["namespace"] = namespace
    job["metadata"]["creationTimestamp"] = "2026-11-22T09:00:00Z"
    job["spec"].update(spec)
    return job


async def test_policies_for_both_profiles_owned_by_their_jobs(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    await api.create(TJ, "nlp-team", trainjob("phi-pinned", uid="uid-phi"))  # isolated team, phi → pinned
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))  # isolated
    await api.create(TJ, "research", trainjob("cpu-smoke", uid="uid-cpu"))  # pinned-ports team
    await api.create(TJ, "cv-team", trainjob("cv-large", uid="uid-cv"))  # namespace lacks mpigate.io/team

    phi = await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-phi-finetune"), what="phi policy")
    minimal = await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-minimal"), what="minimal policy")
    smoke = await wait_for(lambda: alive(kmock, NP, "research", "mpigate-cpu-smoke"), what="research policy")

    pinned = [
        {"protocol": "TCP", "port": 2222},
        {"protocol": "TCP", "port": 40000, "endPort": 40099},
        {"protocol": "TCP", "port": 40200, "endPort": 40210},
    ]
    for policy, job, uid, ports in (
        (phi, "phi-finetune", "uid-phi", pinned),
        (smoke, "cpu-smoke", "uid-cpu", pinned),
        (minimal, "minimal", "uid-min", [{"protocol": "TCP"}]),
    ):
        assert policy["spec"]["podSelector"] == {"matchLabels": {JOBSET: job}}
        assert policy["spec"]["ingress"] == [
            {"from": [{"podSelector": {"matchLabels": {JOBSET: job}}}], "ports": ports}
        ]
        assert policy["spec"]["egress"][0]["ports"] == ports
        assert policy["spec"]["egress"][1]["ports"] == [
            {"protocol": "UDP", "port": 53},
            {"protocol": "TCP", "port": 53},
        ]
        assert policy["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "name": job,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    assert events(kmock, "nlp-team", "phi-finetune")[0] == (
        "Normal",
        "NetworkPolicyCreated",
        "Created NetworkPolicy mpigate-phi-finetune: profile pinned-ports (data classification phi).",
    )
    # the phi job has no pinned environment (no webhook here): the controller says so
    missing = await wait_for(
        lambda: [e for e in events(kmock, "nlp-team", "phi-finetune") if e[1] == "PinnedPortsEnvMissing"]
    )
    assert "lacks OMPI_MCA_btl_tcp_port_min_v4, OMPI_MCA_btl_tcp_port_range_v4" in missing[0][2]
    assert alive(kmock, NP, "cv-team", "mpigate-cv-large") is None
    assert events(kmock, "cv-team", "cv-large") == []

    # kopf keeps its state in mpigate.io annotations: no status, no finalizers on the TrainJob
    def kopf_state() -> Any:
        stored = alive(kmock, TJ, "nlp-team", "phi-finetune")
        annotations = stored["metadata"].get("annotations", {})
        return "mpigate.io/last-handled-configuration" in annotations and stored

    stored = await wait_for(kopf_state, what="kopf's diff-base annotation")
    assert "status" not in stored
    assert "finalizers" not in stored["metadata"]
    foreign = [k for k in stored["metadata"]["annotations"] if not k.startswith("mpigate.io/")]
    assert foreign == []
    assert (
        controller.metric("mpigate_controller_reconciles_total", kind="networkpolicy", result="created") == 3
    )


async def test_metrics_endpoint_serves_the_controller_metrics(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
    await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-minimal"))
    port = await controller.port
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
            assert (resp.status, await resp.text()) == (200, "ok")
        async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
            assert resp.status == 200
    assert "mpigate_controller_leader 1.0" in text
    assert 'mpigate_controller_reconciles_total{kind="networkpolicy",result="created"} 1.0' in text
    assert "mpigate_audit_write_failures_total" in text  # the audit writer's metrics, same registry


async def test_deleted_and_edited_policies_are_restored(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
    original = await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-minimal"))

    await api.delete(NP, "nlp-team", "mpigate-minimal")
    again = await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-minimal"), what="recreated policy")
    assert again["spec"] == original["spec"]
    assert again["metadata"]["ownerReferences"][0]["uid"] == "uid-min"
    assert (
        "Warning",
        "NetworkPolicyRepaired",
        "NetworkPolicy mpigate-minimal had been deleted; recreated it.",
    ) in (await wait_for(lambda: events(kmock, "nlp-team", "minimal")[1:]))

    opened = {"spec": {"ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}}
    await api.patch(NP, "nlp-team", "mpigate-minimal", opened)
    restored = await wait_for(
        lambda: (
            (p := alive(kmock, NP, "nlp-team", "mpigate-minimal")) and p["spec"] == original["spec"] and p
        ),
        what="restored spec",
    )
    assert restored["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {JOBSET: "minimal"}}}]
    found = await wait_for(
        lambda: [e for e in events(kmock, "nlp-team", "minimal") if "had been changed" in e[2]], what="event"
    )
    assert found == [
        (
            "Warning",
            "NetworkPolicyRepaired",
            "NetworkPolicy mpigate-minimal had been changed (spec); restored it.",
        )
    ]
    await wait_for(
        lambda: (
            controller.metric("mpigate_controller_reconciles_total", kind="networkpolicy", result="repaired")
            == 1
        )
    )


async def test_policy_unlabelled_by_someone_is_restored_by_the_resync(
    kmock: kmock_lib.KubernetesEmulator, api: Api, tmp_path: Path, key_file: Path
) -> None:
    """A policy stripped of its managed-by label leaves the label-selected watch: the periodic
    resync still finds and repairs it."""
    running = start(options_for(kmock, tmp_path, key_file, resync_seconds=0.5))
    try:
        await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
        await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-minimal"))
        await api.patch(
            NP,
            "nlp-team",
            "mpigate-minimal",
            {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}},
        )
        await wait_for(
            lambda: (
                alive(kmock, NP, "nlp-team", "mpigate-minimal")["metadata"]["labels"].get(
                    "app.kubernetes.io/managed-by"
                )
                == "mpigate"
            ),
            what="label restored",
        )
        assert (
            "Warning",
            "NetworkPolicyRepaired",
            "NetworkPolicy mpigate-minimal had been changed (labels); restored it.",
        ) in events(kmock, "nlp-team", "minimal")
    finally:
        assert await running.shutdown() == 0


async def test_500_on_create_is_reported_and_retried(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    """The API server answers 500 to the create. (kmock keeps what was posted even when a reaction
    answers, like a write that committed before the error reached the client: the retry reads and
    compares it.)"""
    kmock["post", "/apis/networking.k8s.io/v1/namespaces/nlp-team/networkpolicies"][:1] << 500
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
    failed = await wait_for(
        lambda: [e for e in events(kmock, "nlp-team", "minimal") if e[1] == "NetworkPolicyFailed"]
    )
    assert failed[0][0] == "Warning"
    assert "Could not create or repair NetworkPolicy mpigate-minimal: POST" in failed[0][2]
    assert "HTTP 500" in failed[0][2]
    await wait_for(
        lambda: (
            controller.metric("mpigate_controller_reconciles_total", kind="networkpolicy", result="unchanged")
            >= 1
        ),
        what="a successful retry",
    )
    assert controller.metric("mpigate_controller_errors_total", kind="networkpolicy", reason="http-500") == 1
    policy = alive(kmock, NP, "nlp-team", "mpigate-minimal")
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-min"


async def test_409_on_create_reads_compares_and_repairs(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    """Someone created a policy of that name between the controller's read and its create."""
    squatter = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "mpigate-minimal", "namespace": "nlp-team", "labels": {"owner.example/x": "y"}},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]},
    }
    kmock.objects[NP, "nlp-team", "mpigate-minimal"] = squatter
    kmock["get", "/apis/networking.k8s.io/v1/namespaces/nlp-team/networkpolicies/mpigate-minimal"][:1] << 404
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
    repaired = await wait_for(
        lambda: (
            (p := alive(kmock, NP, "nlp-team", "mpigate-minimal"))
            and p["metadata"].get("ownerReferences")
            and p
        ),
        what="repaired policy",
    )
    assert repaired["spec"]["podSelector"] == {"matchLabels": {JOBSET: "minimal"}}
    assert repaired["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert repaired["metadata"]["labels"]["owner.example/x"] == "y"  # other owners' labels stay
    posts = list(kmock["post", "/apis/networking.k8s.io/v1/namespaces/nlp-team/networkpolicies"])
    assert len(posts) == 1  # created once, answered 409, then read and patched
    await wait_for(
        lambda: controller.metric(
            "mpigate_controller_reconciles_total", kind="networkpolicy", result="repaired"
        )
    )
    assert controller.metric("mpigate_controller_errors_total", kind="networkpolicy", reason="http-409") == 0
