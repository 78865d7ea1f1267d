"""Live context against a fake Kubernetes API (kmock): the TrainJob informer (list, watch,
410 Gone), Kueue ClusterQueue reads, and the server's fallback when the API is slow or fails."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock as kmock_lib
import pytest
import pytest_asyncio
import yaml

from mpigate.admission.client import make_review
from mpigate.admission.kube import KubeClient, KubeConfig, KubeConfigError, in_cluster_config, load_kubeconfig
from mpigate.admission.live import MPIJOBS, JobCache, KubeLiveSource, QueueUsage, is_active, reservations
from mpigate.admission.service import ServiceSettings
from mpigate.config import load
from mpigate.policy.decision import AdmissionInput
from tests.conftest import REPO

from .conftest import BASE_ORG, StartWebhook, as_mutated, trainjob, wait_for

TJ = "trainer.kubeflow.org/v1alpha1/trainjobs"
TJ_PATH = "/apis/trainer.kubeflow.org/v1alpha1/trainjobs"
MJ = "kubeflow.org/v2beta1/mpijobs"
CQ = "kueue.x-k8s.io/v1beta2/clusterqueues"
LQ = "kueue.x-k8s.io/v1beta2/localqueues"
CQ_PATH = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"


def job(ns: str, name: str, finished: str | None = None, kind: str = "TrainJob") -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v2beta1" if kind == "MPIJob" else "trainer.kubeflow.org/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": ns},
    }
    if finished:
        obj["status"] = {"conditions": [{"type": finished, "status": "True"}]}
    return obj


def cluster_queue(
    name: str, nominal: int, borrowing: int, reserved: int, cohort: str | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": {"mpigate.io/cohort": cohort} if cohort else {}},
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "gpu-eu",
                            "resources": [
                                {"name": "cpu", "nominalQuota": "64"},
                                {
                                    "name": "nvidia.com/gpu",
                                    "nominalQuota": nominal,
                                    "borrowingLimit": borrowing,
                                },
                            ],
                        }
                    ],
                }
            ]
        },
        "status": {
            "flavorsReservation": [
                {
                    "name": "gpu-eu",
                    "resources": [
                        {"name": "cpu", "total": "10"},
                        {"name": "nvidia.com/gpu", "total": str(reserved), "borrowed": "0"},
                    ],
                }
            ]
        },
    }


@pytest_asyncio.fixture
async def client(kmock: kmock_lib.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    c = KubeClient(KubeConfig(server=str(kmock.url).rstrip("/")))
    yield c
    await c.close()


def seed(kmock: kmock_lib.KubernetesEmulator) -> None:
    kmock.objects[TJ, "alpha", "a1"] = job("alpha", "a1")
    kmock.objects[TJ, "alpha", "a2"] = job("alpha", "a2", finished="Complete")
    kmock.objects[TJ, "alpha-dev", "d1"] = job("alpha-dev", "d1", finished="Failed")
    kmock.objects[TJ, "beta", "b1"] = job("beta", "b1")
    kmock.objects[LQ, "alpha", "alpha"] = {
        "metadata": {"name": "alpha"},
        "spec": {"clusterQueue": "alpha-cq"},
    }
    kmock.objects[CQ, None, "alpha-cq"] = cluster_queue("alpha-cq", nominal=8, borrowing=4, reserved=6)
    kmock.objects[CQ, None, "lender"] = cluster_queue(
        "lender", nominal=8, borrowing=0, reserved=3, cohort="pool"
    )


async def test_cache_counts_active_jobs_and_follows_the_watch(
    kmock: kmock_lib.KubernetesEmulator, client: KubeClient
) -> None:
    seed(kmock)
    cache = JobCache(client)
    cache.start()
    try:
        await wait_for(lambda: cache.synced)
        team = ("alpha", "alpha-dev")
        assert cache.active_jobs(team) == 1
        assert cache.active_jobs(team, exclude=("alpha", "a1")) == 0
        async with aiohttp.ClientSession(base_url=str(kmock.url)) as api:
            await api.post(
                f"{TJ_PATH.replace('/trainjobs', '')}/namespaces/alpha-dev/trainjobs",
                json=job("alpha-dev", "d2"),
            )
            await wait_for(lambda: cache.active_jobs(team) == 2)
            finished = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
            await api.patch(
                f"/apis/{TJ.replace('/trainjobs', '')}/namespaces/alpha/trainjobs/a1", json=finished
            )
            await wait_for(lambda: cache.active_jobs(team) == 1)
            await api.delete(f"/apis/{TJ.replace('/trainjobs', '')}/namespaces/alpha-dev/trainjobs/d2")
            await wait_for(lambda: cache.active_jobs(team) == 0)
        assert cache.active_jobs(("beta",)) == 1
        assert cache.lists == 1
    finally:
        await cache.stop()


async def test_cache_relists_on_410_gone(kmock: kmock_lib.KubernetesEmulator, client: KubeClient) -> None:
    lists: list[int] = []

    def listing(request: Any) -> dict[str, Any]:
        lists.append(1)
        if len(lists) == 1:  # the first LIST is old news: the watch from it is Gone
            return {"metadata": {"resourceVersion": "7"}, "items": [job("alpha", "old")]}
        return {"metadata": {"resourceVersion": "42"}, "items": [job("alpha", "n1"), job("alpha", "n2")]}

    gone = {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
    }
    kmock["get", TJ_PATH, kmock_lib.params(watch="true", resourceVersion="7")] << (gone,)
    kmock["get", TJ_PATH, lambda req: "watch" not in req.params] << listing
    cache = JobCache(client, backoff=(0.01, 0.05))
    cache.start()
    try:
        await wait_for(lambda: cache.lists >= 2 and cache.synced)
        assert cache.active_jobs(("alpha",)) == 2

        def watches() -> list[Any]:
            return [r for r in kmock if r.params.get("watch") == "true"]

        await wait_for(lambda: len(watches()) >= 2)
        assert [r.params["resourceVersion"] for r in watches()[:2]] == ["7", "42"]
        assert watches()[0].params["allowWatchBookmarks"] == "true"
    finally:
        await cache.stop()


async def test_cache_reports_api_errors_and_is_not_trusted_until_listed(
    kmock: kmock_lib.KubernetesEmulator, client: KubeClient
) -> None:
    (
        kmock["get", TJ_PATH]
        << 403
        << {"kind": "Status", "code": 403, "message": "trainjobs is forbidden: no RBAC"}
    )
    errors: list[tuple[str, str]] = []
    cache = JobCache(client, on_error=lambda s, r: errors.append((s, r)), backoff=(0.01, 0.05))
    cache.start()
    try:
        await wait_for(lambda: len(errors) >= 2)
        assert not cache.synced
        assert cache.last_error == f"GET {TJ_PATH}: HTTP 403: trainjobs is forbidden: no RBAC"
        assert errors[0] == ("trainjobs", "http-403")
    finally:
        await cache.stop()


def test_a_job_is_active_until_its_kinds_finished_condition() -> None:
    assert is_active(job("a", "t")) and not is_active(job("a", "t", finished="Complete"))
    # An MPIJob ends Succeeded or Failed (MPI Operator v2beta1 JobSucceeded, JobFailed).
    for finished, active in (("Succeeded", False), ("Failed", False), ("Complete", True), ("Running", True)):
        assert is_active(job("a", "m", finished=finished, kind="MPIJob"), MPIJOBS) is active, finished
    deleting = job("a", "m", kind="MPIJob")
    deleting["metadata"]["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    assert not is_active(deleting, MPIJOBS)


async def test_live_source_counts_mpijobs_with_trainjobs_and_gives_mpijobs_live_context(
    kmock: kmock_lib.KubernetesEmulator, client: KubeClient
) -> None:
    seed(kmock)
    kmock.objects[MJ, "alpha", "m1"] = job("alpha", "m1", kind="MPIJob")
    kmock.objects[MJ, "alpha-dev", "m2"] = job("alpha-dev", "m2", finished="Succeeded", kind="MPIJob")
    kmock.objects[MJ, "beta", "m3"] = job("beta", "m3", kind="MPIJob")
    config = load(BASE_ORG)
    source = KubeLiveSource(client)
    await source.start()
    try:
        await wait_for(lambda: source.synced)
        assert not source.mpijobs.absent and source.mpijobs.active_jobs(("alpha", "alpha-dev")) == 1
        live = await source.context(config, request_for(trainjob()), timeout=30.0)
        assert live is not None and live.active_jobs == 2  # TrainJob a1 and MPIJob m1
        # The job under review is not counted, by kind: a TrainJob called m1 is not the MPIJob m1.
        named_m1 = trainjob()
        named_m1["metadata"]["name"] = "m1"
        live = await source.context(config, request_for(named_m1), timeout=30.0)
        assert live is not None and live.active_jobs == 2
        mpijob = job("alpha", "m1", kind="MPIJob")
        live = await source.context(config, AdmissionInput("CREATE", "MPIJob", "alpha", "m1", mpijob), 30.0)
        assert live is not None and live.active_jobs == 1
        # MPIJobs get Kueue's usage as TrainJobs do (MPG-Q008).
        assert dict(live.gpus_in_use or {}) == {"gpu-eu": 6} and live.unavailable_reason is None
    finally:
        await source.stop_caches()


async def test_without_the_mpi_operator_there_are_no_mpijobs_to_count(
    kmock: kmock_lib.KubernetesEmulator, client: KubeClient
) -> None:
    seed(kmock)  # no MPIJob resource: the API server answers 404 to its LIST
    errors: list[tuple[str, str]] = []
    source = KubeLiveSource(client, on_error=lambda s, r: errors.append((s, r)))
    await source.start()
    try:
        await wait_for(lambda: source.synced)
        assert source.mpijobs.absent and errors == []
        live = await source.context(load(BASE_ORG), request_for(trainjob()), timeout=30.0)
        assert live is not None and live.active_jobs == 1 and live.unavailable_reason is None
    finally:
        await source.stop_caches()


async def test_mpijob_counts_that_cannot_be_read_silence_mpg_q007_with_a_reason(
    kmock: kmock_lib.KubernetesEmulator, client: KubeClient
) -> None:
    seed(kmock)
    kmock["get", "/apis/" + MJ] << 403 << {"kind": "Status", "code": 403, "message": "mpijobs is forbidden"}
    errors: list[tuple[str, str]] = []
    source = KubeLiveSource(client, on_error=lambda s, r: errors.append((s, r)))
    await source.start()
    try:
        await wait_for(lambda: source.jobs.synced and ("mpijobs", "http-403") in errors)
        live = await source.context(load(BASE_ORG), request_for(trainjob()), timeout=30.0)
        assert live is not None and live.active_jobs is None
        assert "MPIJob counts not synced" in (live.unavailable_reason or "")
        assert "mpijobs is forbidden" in (live.unavailable_reason or "")
    finally:
        await source.stop_caches()


def test_reservations_per_flavor_and_resource_in_kueue_units() -> None:
    assert reservations(cluster_queue("cq", nominal=16, borrowing=0, reserved=15)) == {
        "gpu-eu": {"cpu": 10_000, "nvidia.com/gpu": 15}  # cpu in milli, as Kueue counts it
    }
    assert reservations({"metadata": {"name": "x"}, "spec": {"resourceGroups": []}}) == {}
    broken = {
        "status": {"flavorsReservation": [{"name": "f", "resources": [{"name": "cpu", "total": "x"}]}, 7]}
    }
    assert reservations(broken) == {}


def test_the_teams_gpus_in_use_are_its_own_queues_gpu_figures_per_known_flavor() -> None:
    """One figure for the webhook's and the background audit's quota context."""
    config = load(BASE_ORG)
    [(flavor, known)] = [(f, v) for f, v in config.flavors.items() if f == "gpu-eu"]
    usage = QueueUsage(
        "alpha-cq",
        {
            "alpha": {
                flavor: {"cpu": 10_000, known.gpu_resource: 6},
                "gone": {known.gpu_resource: 2},
                "cpu-only": {"cpu": 4},
            },
            "lender": {flavor: {known.gpu_resource: 3}},
        },
    )
    assert usage.gpus_in_use(config, "alpha") == {"gpu-eu": 6}  # unknown flavors, other resources: out
    assert usage.gpus_in_use(config, "lender") == {"gpu-eu": 3}
    assert usage.gpus_in_use(config, "nobody") == {}


def request_for(obj: dict[str, Any]) -> AdmissionInput:
    return AdmissionInput("CREATE", "TrainJob", obj["metadata"]["namespace"], obj["metadata"]["name"], obj)


async def test_live_source_fills_the_context_from_cache_and_clusterqueue(
    kmock: kmock_lib.KubernetesEmulator, client: KubeClient
) -> None:
    seed(kmock)
    config = load(BASE_ORG)
    source = KubeLiveSource(client)
    await source.start()
    try:
        await wait_for(lambda: source.synced)
        live = await source.context(config, request_for(trainjob()), timeout=30.0)
        assert live is not None
        assert live.active_jobs == 1
        assert dict(live.gpus_in_use or {}) == {"gpu-eu": 6}
        # The job's ClusterQueue (alpha-cq, through its LocalQueue) is the team's; the other queues of
        # its cohort come from one LIST by the mpigate.io/cohort label.
        assert live.queue_usage == {
            "alpha": {"gpu-eu": {"cpu": 10_000, "nvidia.com/gpu": 6}},
            "lender": {"gpu-eu": {"cpu": 10_000, "nvidia.com/gpu": 3}},
        }
        assert live.unavailable_reason is None and live.source == "cluster (ClusterQueue alpha-cq)"
        # Unmanaged namespaces and runtimes get no live context.
        other = trainjob()
        other["metadata"]["namespace"] = "nobody"
        assert await source.context(config, request_for(other), timeout=30.0) is None
    finally:
        await source.stop_caches()


async def test_a_failed_kueue_read_cancels_the_others_and_none_outlives_the_lookup(
    kmock: kmock_lib.KubernetesEmulator, client: KubeClient
) -> None:
    # The team's ClusterQueue and its cohort's are read together. When the cohort LIST fails (a 404
    # of the collection: Kueue's v1beta2 API is not served), the ClusterQueue GET still in flight is
    # of no use: it is cancelled and awaited, not left running past the answer (it was, and a
    # review answered while its read went on, issue 17's flaky SIGTERM test).
    seed(kmock)
    asked, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        asked.set()
        await release.wait()

    kmock["get", f"{CQ_PATH}/alpha-cq"] << hold << {}
    (  # the LIST fails once the GET is in flight
        kmock["get", CQ_PATH, lambda req: "labelSelector" in req.params]
        << (lambda: asked.wait())
        << 404
        << {"kind": "Status", "code": 404, "message": "the server could not find the requested resource"}
    )
    errors: list[tuple[str, str]] = []
    source = KubeLiveSource(client, on_error=lambda s, r: errors.append((s, r)))

    def kueue_reads() -> list[asyncio.Task[Any]]:
        return [
            t
            for t in asyncio.all_tasks()
            if "KueueReader" in getattr(t.get_coro(), "__qualname__", "") and not t.done()
        ]

    try:
        live = await source.context(load(BASE_ORG), request_for(trainjob()), timeout=30.0)
        assert live is not None and live.queue_usage is None
        assert f"Kueue ClusterQueue not read: GET {CQ_PATH}: HTTP 404" in (live.unavailable_reason or "")
        assert ("clusterqueue", "http-404") in errors
        assert asked.is_set() and not release.is_set()  # the GET was in flight, and is over:
        assert kueue_reads() == []
    finally:
        release.set()
        await source.stop_caches()


# An answer that fails is given the lookup bound no loaded machine reaches (30 s); a hang (60 s) is
# cut at 0.2 s: either way the reason can only come from the reaction under test.
@pytest.mark.parametrize(
    ("reaction", "timeout", "reason", "metric"),
    [
        ((500, {"kind": "Status", "message": "etcd is sad"}), 30.0, "HTTP 500: etcd is sad", "http-500"),
        ((403, {"kind": "Status", "message": "forbidden"}), 30.0, "HTTP 403: forbidden", "http-403"),
        ((lambda: asyncio.sleep(60), {}), 0.2, "Kueue ClusterQueue not read within 200 ms", "timeout"),
    ],
)
async def test_live_source_reports_failing_or_hanging_kueue(
    kmock: kmock_lib.KubernetesEmulator,
    client: KubeClient,
    reaction: tuple[Any, Any],
    timeout: float,
    reason: str,
    metric: str,
) -> None:
    seed(kmock)
    kmock["get", f"{CQ_PATH}/alpha-cq"] << reaction[0] << reaction[1]
    errors: list[tuple[str, str]] = []
    source = KubeLiveSource(client, on_error=lambda s, r: errors.append((s, r)))
    await source.start()
    try:
        await wait_for(lambda: source.synced)
        loop = asyncio.get_running_loop()
        started = loop.time()
        live = await source.context(load(BASE_ORG), request_for(trainjob()), timeout=timeout)
        assert loop.time() - started < 45  # not the 60 s hang
        assert live is not None and live.active_jobs == 1 and live.gpus_in_use is None
        assert live.unavailable_reason is not None and reason in live.unavailable_reason
        assert ("clusterqueue", metric) in errors
    finally:
        await source.stop_caches()


async def test_server_answers_in_time_with_a_warning_when_kueue_hangs(
    kmock: kmock_lib.KubernetesEmulator, start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    seed(kmock)
    kmock["get", f"{CQ_PATH}/alpha-cq"] << (lambda: asyncio.sleep(120)) << {}
    # The live bound (0.3 s) cuts the hanging read; the request deadline (60 s) is far enough away
    # that a loaded machine still answers with the static checks.
    server = await start_webhook(
        kube=KubeConfig(server=str(kmock.url).rstrip("/")),
        settings=ServiceSettings(deadline=60.0, live_timeout=0.3),
    )
    live = server.service.live
    assert isinstance(live, KubeLiveSource)
    await wait_for(lambda: live.synced)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with http.post(server.url + "/validate", json=make_review(trainjob(), uid="u")) as resp:
        body = await resp.json()
    assert loop.time() - started < 60  # answered within the deadline, not after the 120 s hang
    response = body["response"]
    assert response["allowed"] is True
    assert response["warnings"] == [
        "[MPG-Q008] live: 1 active jobs, in use {}",
        "live quota context unavailable: Kueue ClusterQueue not read within 300 ms",
    ]
    async with http.get(server.url + "/metrics") as resp:
        text = await resp.text()
    assert 'mpigate_live_lookup_errors_total{reason="timeout",source="clusterqueue"} 1.0' in text
    assert "mpigate_live_context_fallbacks_total 1.0" in text


async def test_server_passes_live_usage_to_the_engine(
    kmock: kmock_lib.KubernetesEmulator, start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    seed(kmock)
    server = await start_webhook(kube=KubeConfig(server=str(kmock.url).rstrip("/")))
    live = server.service.live
    assert isinstance(live, KubeLiveSource)
    await wait_for(lambda: live.synced)
    async with http.post(server.url + "/validate", json=make_review(trainjob(), uid="u")) as resp:
        body = await resp.json()
    assert body["response"]["warnings"] == ["[MPG-Q008] live: 1 active jobs, in use {'gpu-eu': 6}"]
    # /mutate does not need live context: no Kueue request for it.
    before = len(list(kmock))
    async with http.post(server.url + "/mutate", json=make_review(trainjob(), uid="m")) as resp:
        assert resp.status == 200
    assert len(list(kmock)) == before


def test_kubeconfig_token_and_ca_data(tmp_path: Path) -> None:
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()
    (tmp_path / "token").write_text("tok-from-file\n")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "prod",
        "contexts": [{"name": "prod", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [
            {"name": "c", "cluster": {"server": "https://10.0.0.1:6443/", "certificate-authority-data": ca}}
        ],
        "users": [{"name": "u", "user": {"tokenFile": "token"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    config = load_kubeconfig(path)
    assert config.server == "https://10.0.0.1:6443"
    assert config.ca_data == b"-----BEGIN CERTIFICATE-----\n"
    assert config.token_file == tmp_path / "token"
    doc["users"] = [{"name": "u", "user": {"exec": {"command": "aws"}}}]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeConfigError, match="exec/auth-provider plugin"):
        load_kubeconfig(path)
    with pytest.raises(KubeConfigError, match="context 'nope' not found"):
        load_kubeconfig(path, context="nope")


def test_in_cluster_config_needs_the_service_account_and_env(tmp_path: Path) -> None:
    assert in_cluster_config(tmp_path, env={"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) is None
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_bytes(b"CA")
    config = in_cluster_config(
        tmp_path, env={"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    )
    assert config is not None and config.server == "https://[fd00::1]:443" and config.ca_data == b"CA"
    assert in_cluster_config(tmp_path, env={}) is None


async def test_runtimes_approved_as_external_are_read_from_the_cluster(
    kmock: kmock_lib.KubernetesEmulator, client: KubeClient
) -> None:
    config = load(REPO)
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "deepspeed-distributed"},
        "spec": {"mlPolicy": {"numNodes": 1, "mpi": {"mpiImplementation": "OpenMPI"}}},
    }
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "ds", "namespace": "cv-team"},
        "spec": {"runtimeRef": {"name": "deepspeed-distributed"}},
    }
    source = KubeLiveSource(client)
    live = await source.context(config, request_for(job), timeout=30.0)
    assert live is not None and live.runtimes is None
    assert "ClusterTrainingRuntime deepspeed-distributed not read: GET " in (live.unavailable_reason or "")
    assert "HTTP 404" in (live.unavailable_reason or "")
    kmock.objects["trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", None, "deepspeed-distributed"] = (
        runtime
    )
    live = await source.context(config, request_for(job), timeout=30.0)
    assert live is not None and live.runtimes is not None
    assert dict(live.runtimes) == {("ClusterTrainingRuntime", None, "deepspeed-distributed"): runtime}
    # A runtime whose manifest is in the config tree is never read from the cluster.
    job["spec"]["runtimeRef"]["name"] = "mpi-openmpi-gpu"
    live = await source.context(config, request_for(job), timeout=30.0)
    assert live is not None and live.runtimes is None


Q007_FULL = (
    "[MPG-Q007] metadata.namespace: nlp-team already has 5 active TrainJobs and MPIJobs (maxConcurrentJobs 5"
)


@pytest.mark.parametrize(
    ("review", "active", "mpijobs", "reserved", "allowed", "text"),
    [
        ("trainjobs/queue-full.yaml", 5, 0, 0, False, Q007_FULL),
        # MPG-Q007 counts MPIJobs too, and judges MPIJobs.
        ("trainjobs/queue-full.yaml", 3, 2, 0, False, Q007_FULL),
        ("mpijobs/mpi-allreduce.yaml", 2, 3, 0, False, Q007_FULL),
        (
            "trainjobs/queue-full.yaml",
            4,
            0,
            12,
            True,
            "[MPG-Q008] nlp-team needs 12 more free GPUs of flavor a100-eu; borrowing, preemption and queue "
            "order can change this",
        ),
        (
            "mpijobs/mpi-allreduce.yaml",
            2,
            2,
            12,
            True,
            "[MPG-Q008] nlp-team needs 4 more free GPUs of flavor a100-eu; borrowing, preemption and queue "
            "order can change this",
        ),
        ("trainjobs/queue-full.yaml", 2, 2, 0, True, None),
    ],
)
async def test_live_quota_context_drives_the_real_engine(
    kmock: kmock_lib.KubernetesEmulator,
    start_webhook: StartWebhook,
    http: aiohttp.ClientSession,
    review: str,
    active: int,
    mpijobs: int,
    reserved: int,
    allowed: bool,
    text: str | None,
) -> None:
    for i in range(active):
        kmock.objects[TJ, "nlp-team", f"run-{i}"] = job("nlp-team", f"run-{i}")
    for i in range(mpijobs):
        kmock.objects[MJ, "nlp-team", f"mpi-{i}"] = job("nlp-team", f"mpi-{i}", kind="MPIJob")
    kmock.objects[TJ, "nlp-team", "done"] = job("nlp-team", "done", finished="Complete")
    kmock.objects[MJ, "nlp-team", "ok"] = job("nlp-team", "ok", finished="Succeeded", kind="MPIJob")
    kmock.objects[LQ, "nlp-team", "nlp-team"] = {
        "metadata": {"name": "nlp-team"},
        "spec": {"clusterQueue": "nlp-team"},
    }
    cq = cluster_queue("nlp-team", nominal=16, borrowing=0, reserved=reserved)
    cq["spec"]["resourceGroups"][0]["flavors"][0]["name"] = "a100-eu"
    cq["status"]["flavorsReservation"][0]["name"] = "a100-eu"
    kmock.objects[CQ, None, "nlp-team"] = cq
    moment = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)
    server = await start_webhook(
        config=REPO, evaluator=None, clock=lambda: moment, kube=KubeConfig(server=str(kmock.url).rstrip("/"))
    )
    live = server.service.live
    assert isinstance(live, KubeLiveSource)
    await wait_for(lambda: live.synced)
    obj = as_mutated(yaml.safe_load((REPO / "examples" / review).read_text()), REPO)
    async with http.post(server.url + "/validate", json=make_review(obj, uid="q")) as resp:
        response = (await resp.json())["response"]
    assert response["allowed"] is allowed
    shown = [response.get("status", {}).get("message", ""), *response.get("warnings", [])]
    if text is None:
        assert "MPG-Q007" not in response["auditAnnotations"]["rules"]
        assert "MPG-Q008" not in response["auditAnnotations"]["rules"]
    else:
        assert any(text in s for s in shown), shown
