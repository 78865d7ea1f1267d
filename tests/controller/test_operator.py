"""The controller end to end, in-process, against kmock: kopf watches, leader Lease, NetworkPolicies
created and repaired, lifecycle and evidence records in a real audit trail, Events, metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import kmock as kmock_lib
import kopf
import pytest
import pytest_asyncio
from tests.conftest import REPO, TODAY
from tests.controller.conftest import example_job, example_mpijob
from tests.controller.kube import MPIJ, NP, PODS, TJ, Api, alive, declare, events, holds, wait_for

from mpigate.admission.kube import KubeConfig
from mpigate.audit import KeyRing, generate_key, read_chains
from mpigate.config import load
from mpigate.controller import runner
from mpigate.controller.handlers import build_registry
from mpigate.controller.leader import LeaseSettings
from mpigate.controller.metrics import ControllerMetrics
from mpigate.controller.runner import ControllerOptions, run_controller
from mpigate.render import render

JOBSET = "jobset.sigs.k8s.io/jobset-name"
RECONCILES = "mpigate_controller_reconciles_total"


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
    path.write_bytes(generate_key("ed25519")[0])  # the example org signs with ed25519
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
        # A lease long enough that a loaded machine cannot lose it between two renewals; the
        # handover test releases it (shutdown), which hands over at once.
        lease=LeaseSettings(
            namespace="mpigate-system", lease_duration=60.0, renew_deadline=45.0, retry_period=0.2
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

    phi = await wait_for(
        lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.phi-finetune"), what="phi policy"
    )
    minimal = await wait_for(
        lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"), what="minimal policy"
    )
    smoke = await wait_for(
        lambda: alive(kmock, NP, "research", "mpigate-trainjob.cpu-smoke"), what="research policy"
    )

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
    assert (await wait_for(lambda: events(kmock, "nlp-team", "phi-finetune")))[0] == (
        "Normal",
        "NetworkPolicyCreated",
        "Created NetworkPolicy mpigate-trainjob.phi-finetune: profile pinned-ports "
        "(data classification phi).",
    )
    # the phi job has no pinned environment (no webhook here): the controller says so
    missing = await wait_for(
        lambda: [e for e in events(kmock, "nlp-team", "phi-finetune") if e[1] == "PinnedPortsEnvMissing"]
    )
    assert "lacks OMPI_MCA_btl_tcp_port_min_v4, OMPI_MCA_btl_tcp_port_range_v4" in missing[0][2]
    assert alive(kmock, NP, "cv-team", "mpigate-trainjob.cv-large") is None
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
    await wait_for(lambda: controller.metric(RECONCILES, kind="networkpolicy", result="created") == 3)


async def test_metrics_endpoint_serves_the_controller_metrics(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
    await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"))
    # The policy is visible in the API a moment before the reconcile that made it returns and
    # counts itself: wait for the count, then check that the endpoint exposes it.
    await wait_for(
        lambda: controller.metric(RECONCILES, kind="networkpolicy", result="created") == 1,
        what="the reconcile to be counted",
    )
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
    original = await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"))

    await api.delete(NP, "nlp-team", "mpigate-trainjob.minimal")
    again = await wait_for(
        lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"), what="recreated policy"
    )
    assert again["spec"] == original["spec"]
    assert again["metadata"]["ownerReferences"][0]["uid"] == "uid-min"
    assert (
        "Warning",
        "NetworkPolicyRepaired",
        "NetworkPolicy mpigate-trainjob.minimal had been deleted; recreated it.",
    ) in (await wait_for(lambda: events(kmock, "nlp-team", "minimal")[1:]))

    opened = {"spec": {"ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}}
    await api.patch(NP, "nlp-team", "mpigate-trainjob.minimal", opened)
    restored = await wait_for(
        lambda: (
            (p := alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"))
            and p["spec"] == original["spec"]
            and p
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
            "NetworkPolicy mpigate-trainjob.minimal had been changed (spec); restored it.",
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
        await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"))
        await api.patch(
            NP,
            "nlp-team",
            "mpigate-trainjob.minimal",
            {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}},
        )
        await wait_for(
            lambda: (
                alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal")["metadata"]["labels"].get(
                    "app.kubernetes.io/managed-by"
                )
                == "mpigate"
            ),
            what="label restored",
        )
        # the Event is posted after the repair itself: wait for it too
        repaired = (
            "Warning",
            "NetworkPolicyRepaired",
            "NetworkPolicy mpigate-trainjob.minimal had been changed (labels); restored it.",
        )
        await wait_for(lambda: repaired in events(kmock, "nlp-team", "minimal"), what="the repair Event")
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
    assert "Could not create or repair NetworkPolicy mpigate-trainjob.minimal: POST" in failed[0][2]
    assert "HTTP 500" in failed[0][2]
    # Wait on what kopf writes, not on a metric: the policy kmock kept from the failed POST also
    # arrives as a watch event, and its repair check counts "unchanged" before (or without) kopf's
    # retry, so that count says nothing about the retry (under load it came first).
    patches = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/nlp-team/trainjobs/minimal"

    def annotations(key: str) -> list[str]:
        return [
            r.data["metadata"]["annotations"][key]
            for r in kmock["patch", patches]
            if key in ((r.data.get("metadata") or {}).get("annotations") or {})
        ]

    # kopf kept the retry in the TrainJob's mpigate.io annotations ...
    progress = await wait_for(
        lambda: [p for p in annotations("mpigate.io/network-policy") if p and '"retries":1' in p],
        what="kopf's retry record",
    )
    assert "HTTP 500" in progress[0]
    # ... then retried, succeeded (kopf stores the handled state only after a success) ...
    await wait_for(lambda: annotations("mpigate.io/last-handled-configuration"), what="a successful retry")
    # ... and never wrote into the TrainJob's status (Trainer's)
    assert not [r.data for r in kmock["patch", patches] if "status" in r.data]
    assert controller.metric("mpigate_controller_errors_total", kind="networkpolicy", reason="http-500") == 1
    policy = alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal")
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-min"


async def test_409_on_create_reads_compares_and_repairs_its_own_policy(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    """The job's own policy (its ownership label and uid: e.g. written by the previous leader)
    appeared between the controller's read and its create: it is read, compared and repaired."""
    earlier = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "mpigate-trainjob.minimal",
            "namespace": "nlp-team",
            "labels": {
                "owner.example/x": "y",
                "app.kubernetes.io/managed-by": "mpigate",
                "mpigate.io/trainjob-uid": "uid-min",
            },
        },
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]},
    }
    kmock.objects[NP, "nlp-team", "mpigate-trainjob.minimal"] = earlier
    path = "/apis/networking.k8s.io/v1/namespaces/nlp-team/networkpolicies/mpigate-trainjob.minimal"
    kmock["get", path][:1] << 404
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
    repaired = await wait_for(
        lambda: (
            (p := alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"))
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


SQUATTER: dict[str, Any] = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {
        "name": "mpigate-trainjob.minimal",
        "namespace": "nlp-team",
        # mpigate's labels, but another job's uid (or none): not this job's policy
        "labels": {"app.kubernetes.io/managed-by": "mpigate", "mpigate.io/trainjob": "minimal"},
    },
    "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]},
}
CONFLICT = "mpigate_controller_conflicts_total"


@pytest.mark.parametrize("race", [False, True], ids=["present", "created-between-read-and-create"])
async def test_a_policy_the_job_does_not_own_is_a_conflict_never_a_rewrite(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller, race: bool
) -> None:
    """An object under the job's policy name without the job's uid (another tool's, a forged one, a
    previous job's) is reported — a Warning Event on the TrainJob and a metric — and left as it is."""
    path = "/apis/networking.k8s.io/v1/namespaces/nlp-team/networkpolicies/mpigate-trainjob.minimal"
    if race:
        kmock.objects[NP, "nlp-team", "mpigate-trainjob.minimal"] = SQUATTER
        kmock["get", path][:1] << 404
    else:
        await api.create(NP, "nlp-team", SQUATTER)
    before = alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal")
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
    conflict = await wait_for(
        lambda: [e for e in events(kmock, "nlp-team", "minimal") if e[1] == "NetworkPolicyConflict"],
        what="the conflict Event",
    )
    assert conflict[0][0] == "Warning"
    assert (
        "NetworkPolicy mpigate-trainjob.minimal exists but does not belong to this TrainJob" in conflict[0][2]
    )
    await wait_for(lambda: controller.metric(CONFLICT, kind="networkpolicy") >= 1, what="the metric")
    # The reconcile is counted after the conflict (when the handler returns): wait for it too.
    await wait_for(
        lambda: (
            controller.metric("mpigate_controller_reconciles_total", kind="networkpolicy", result="conflict")
            >= 1
        ),
        what="the reconcile counted as a conflict",
    )
    assert await holds(lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal") == before, window=0.5)
    assert not list(kmock["patch", path]) and not list(kmock["put", path]) and not list(kmock["delete", path])


async def test_a_job_named_like_a_rendered_policy_leaves_that_policy_alone(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    """Issue 16 item 5: a TrainJob named `default-deny-jobset` made the controller "repair" the
    namespace's rendered `mpigate-default-deny-jobset` (its selector became the job's pods and it
    gained an ownerReference, so deleting the job garbage-collected the namespace's default deny).
    The job now gets its own `mpigate-trainjob.default-deny-jobset`; the rendered one is untouched."""
    rendering = render(load(REPO, today=TODAY), today=TODAY)
    (deny,) = [
        o.data
        for o in rendering.objects
        if o.data["kind"] == "NetworkPolicy"
        and o.data["metadata"]
        == {**o.data["metadata"], "name": "mpigate-default-deny-jobset", "namespace": "nlp-team"}
    ]
    await api.create(NP, "nlp-team", deny)
    before = alive(kmock, NP, "nlp-team", "mpigate-default-deny-jobset")
    job = trainjob("minimal", uid="uid-hijack")
    job["metadata"]["name"] = "default-deny-jobset"
    await api.create(TJ, "nlp-team", job)
    own = await wait_for(
        lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.default-deny-jobset"), what="the job's policy"
    )
    assert own["spec"]["podSelector"] == {"matchLabels": {JOBSET: "default-deny-jobset"}}
    assert own["metadata"]["ownerReferences"][0]["uid"] == "uid-hijack"
    rendered_path = (
        "/apis/networking.k8s.io/v1/namespaces/nlp-team/networkpolicies/mpigate-default-deny-jobset"
    )
    assert await holds(
        lambda: alive(kmock, NP, "nlp-team", "mpigate-default-deny-jobset") == before, window=0.5
    )
    assert not list(kmock["patch", rendered_path])
    assert "ownerReferences" not in before["metadata"]


def pod(
    name: str, job: str, replicated: str, node: str, uid: str, started: str, finished: str | None = None
) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": started}}
    if finished:
        state = {"terminated": {"startedAt": started, "finishedAt": finished, "exitCode": 0}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "nlp-team",
            "uid": uid,
            "labels": {JOBSET: job, "jobset.sigs.k8s.io/replicatedjob-name": replicated},
        },
        "spec": {"nodeName": node, "containers": [{"name": "node", "image": "x"}]},
        "status": {
            "phase": "Succeeded" if finished else "Running",
            "containerStatuses": [{"name": "node", "state": state}],
        },
    }


def condition(kind: str, status: str, at: str, reason: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": "", "lastTransitionTime": at}


async def test_lifecycle_and_evidence_records_in_the_audit_trail(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller, key_file: Path
) -> None:
    """A Kueue job through admission, start, success and deletion with re-delivered events; its two
    pods run in eu and — wrongly — in us. ``minimal`` asks 4 GPUs per pod (node and launcher)."""
    job = trainjob("minimal", uid="uid-life", suspend=True)
    job["status"] = {"conditions": [condition("Suspended", "True", "2026-11-22T09:00:01Z", "Suspended")]}
    await api.create(TJ, "nlp-team", job)
    admitted = {
        "spec": {"suspend": False},
        "status": {"conditions": [condition("Suspended", "False", "2026-11-22T10:00:00Z", "Resumed")]},
    }
    await api.patch(TJ, "nlp-team", "minimal", admitted)
    await api.create(
        PODS,
        "nlp-team",
        pod("minimal-node-0-0-aaaaa", "minimal", "node", "gpu-eu-1", "p-1", "2026-11-22T10:01:00Z"),
    )
    await api.create(
        PODS,
        "nlp-team",
        pod("minimal-launcher-0-0-bbbbb", "minimal", "launcher", "gpu-us-1", "p-2", "2026-11-22T10:01:30Z"),
    )

    def annotation(key: str) -> str:
        stored = alive(kmock, TJ, "nlp-team", "minimal") or {}
        return str(stored.get("metadata", {}).get("annotations", {}).get(key, ""))

    await wait_for(lambda: annotation("mpigate.io/lifecycle").count("@") == 2, what="admitted and started")
    assert annotation("mpigate.io/lifecycle") == "admitted@2026-11-22T10:00:00Z,started@2026-11-22T10:01:00Z"
    # what a restart needs to close the segment: the pods' facts, sealed with the audit key
    await wait_for(lambda: annotation("mpigate.io/pods").count('"s":') == 2, what="both pods' starts")
    assert annotation("mpigate.io/state-seal")
    await wait_for(lambda: annotation("mpigate.io/evidence").count(",") == 1, what="both placements")
    mismatch = await wait_for(
        lambda: [e for e in events(kmock, "nlp-team", "minimal") if e[1] == "ResidencyMismatch"]
    )
    assert mismatch == [
        (
            "Warning",
            "ResidencyMismatch",
            "pod minimal-launcher-0-0-bbbbb runs on node gpu-us-1 in region us "
            "(topology.kubernetes.io/region=us-east-1); allowed: eu (team nlp-team is in eu)",
        )
    ]

    # the pods finish, Trainer marks the job Complete; then events are re-delivered many times
    for name, uid, replicated, node, start, end in (
        ("minimal-node-0-0-aaaaa", "p-1", "node", "gpu-eu-1", "2026-11-22T10:01:00Z", "2026-11-22T10:31:00Z"),
        (
            "minimal-launcher-0-0-bbbbb",
            "p-2",
            "launcher",
            "gpu-us-1",
            "2026-11-22T10:01:30Z",
            "2026-11-22T10:31:30Z",
        ),
    ):
        await api.patch(
            PODS,
            "nlp-team",
            name,
            {"status": pod(name, "minimal", replicated, node, uid, start, end)["status"]},
        )
    done = [
        condition("Suspended", "False", "2026-11-22T10:00:00Z", "Resumed"),
        condition("Complete", "True", "2026-11-22T10:32:00Z", "JobsCompleted"),
    ]
    await api.patch(TJ, "nlp-team", "minimal", {"status": {"conditions": done}})
    await wait_for(
        lambda: "succeeded@2026-11-22T10:32:00Z" in annotation("mpigate.io/lifecycle"), what="succeeded"
    )
    for i in range(3):
        await api.patch(
            TJ, "nlp-team", "minimal", {"metadata": {"annotations": {"example.com/touch": str(i)}}}
        )
        await api.patch(
            PODS, "nlp-team", "minimal-node-0-0-aaaaa", {"metadata": {"annotations": {"touch": str(i)}}}
        )
    await wait_for(lambda: annotation("example.com/touch") == "2")
    await api.delete(TJ, "nlp-team", "minimal")
    await wait_for(
        lambda: controller.metric("mpigate_controller_lifecycle_records_total", event="deleted") == 1
    )
    assert (
        controller.metric("mpigate_controller_residency_mismatches_total", team="nlp-team", region="us") == 1
    )
    assert controller.metric("mpigate_controller_gpu_seconds_total", team="nlp-team") == 14400
    assert await controller.shutdown() == 0  # closes the audit trail with a signed checkpoint
    # the ledger of open segments was written (none is open any more)
    assert alive(kmock, "v1/configmaps", "mpigate-system", "mpigate-controller-ledger") is not None

    reading = read_chains([controller.options.audit_dir], keys=KeyRing.load([key_file]))
    records = [entry.record for entry in reading]
    assert reading.ok, [r.to_dict() for r in reading.reports]
    lifecycle = [r for r in records if r["stage"] == "lifecycle"]
    assert [(r["lifecycle"]["event"], r["lifecycle"]["at"]) for r in lifecycle] == [
        ("admitted", "2026-11-22T10:00:00Z"),
        ("started", "2026-11-22T10:01:00Z"),
        ("succeeded", "2026-11-22T10:32:00Z"),
        ("deleted", lifecycle[-1]["lifecycle"]["at"]),
    ]
    succeeded = lifecycle[2]
    assert succeeded["source"] == "controller"
    assert succeeded["team"] == "nlp-team"
    assert succeeded["object"] == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "namespace": "nlp-team",
        "name": "minimal",
        "labels": {"mpigate.io/cost-center": "cc-4711"},  # what chargeback groups by
    }
    # 4 GPUs × 30 min for each pod
    assert {
        k: succeeded["lifecycle"][k] for k in ("uid", "gpus", "gpuSeconds", "started", "finished", "reason")
    } == {
        "uid": "uid-life",
        "gpus": 8,
        "gpuSeconds": 14400.0,
        "started": "2026-11-22T10:01:00Z",
        "finished": "2026-11-22T10:32:00Z",
        "reason": "JobsCompleted",
    }
    assert lifecycle[3]["lifecycle"]["gpuSeconds"] == 0.0
    evidence = sorted((r for r in records if r["stage"] == "evidence"), key=lambda r: r["evidence"]["pod"])
    assert [
        (
            e["evidence"]["pod"],
            e["evidence"]["node"],
            e["evidence"]["region"],
            e["evidence"]["details"]["compliant"],
        )
        for e in evidence
    ] == [
        ("minimal-launcher-0-0-bbbbb", "gpu-us-1", "us", False),
        ("minimal-node-0-0-aaaaa", "gpu-eu-1", "eu", True),
    ]
    assert evidence[1]["evidence"]["zone"] == "eu-west-1a"
    assert evidence[1]["evidence"]["flavor"] == "a100-eu"
    assert evidence[0]["evidence"]["details"]["expectedRegions"] == ["eu"]


async def test_only_the_lease_holder_acts_and_a_standby_takes_over(
    kmock: kmock_lib.KubernetesEmulator, api: Api, tmp_path: Path, key_file: Path
) -> None:
    first = start(options_for(kmock, tmp_path / "a", key_file, identity="controller-a"))
    second: Controller | None = None
    events_path = "/api/v1/namespaces/nlp-team/events"
    try:
        await wait_for(lambda: first.metric("mpigate_controller_leader") == 1, what="a leads")
        second = start(options_for(kmock, tmp_path / "b", key_file, identity="controller-b"))
        lease_reads = "/apis/coordination.k8s.io/v1/namespaces/mpigate-system/leases/mpigate-controller"
        await wait_for(lambda: len(list(kmock["get", lease_reads])) >= 6, what="b trying")
        assert second.metric("mpigate_controller_leader") == 0
        lease = alive(kmock, "coordination.k8s.io/v1/leases", "mpigate-system", "mpigate-controller")
        assert lease["spec"]["holderIdentity"] == "controller-a"

        await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
        posted = await wait_for(lambda: [r.data for r in kmock["post", events_path]], what="event")
        assert {e["reportingInstance"] for e in posted} == {"controller-a"}

        assert await first.shutdown() == 0  # releases the lease: b takes over at once
        await wait_for(lambda: second.metric("mpigate_controller_leader") == 1, what="b leads")
        await wait_for(
            lambda: second.metric(RECONCILES, kind="networkpolicy", result="unchanged"),
            what="b has seen the policy",
        )
        await api.delete(NP, "nlp-team", "mpigate-trainjob.minimal")
        await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"), what="b repairs")
        repaired = await wait_for(
            lambda: [
                r.data for r in kmock["post", events_path] if r.data["reportingInstance"] == "controller-b"
            ]
        )
        assert repaired[0]["reason"] == "NetworkPolicyRepaired"
        assert await second.shutdown() == 0
    finally:
        for running in (first, second):
            if running is not None and not running.task.done():
                await running.shutdown()


async def test_a_leader_that_loses_its_lease_stops(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    lease = ("coordination.k8s.io/v1/leases", "mpigate-system", "mpigate-controller")
    await wait_for(lambda: alive(kmock, *lease))
    await api.patch(
        *lease, {"spec": {"holderIdentity": "intruder", "renewTime": "2026-11-22T10:00:00.000000Z"}}
    )
    assert await asyncio.wait_for(controller.task, 60) == 1
    assert controller.metric("mpigate_controller_leader") == 0


async def test_a_stop_ends_the_controller_at_once(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    """A stop (SIGTERM sets this event in ``mpigate controller``) ends a controller whose handlers
    and background loops ran within a moment — not after kopf's 5 s for the tasks it finds still
    running in its loop once its own have stopped (kopf/_core/reactor/running.py, run_tasks): a
    rolling update and a handover to a standby wait on it. 3 s bounds a busy machine; the stop
    took 5 s and more every time while the background audit's wait was such a task."""
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
    await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"), what="a handled job")
    began = time.monotonic()
    assert await controller.shutdown() == 0
    elapsed = time.monotonic() - began
    assert elapsed < 3, f"the controller took {elapsed:.1f} s to stop"
    lease = alive(kmock, "coordination.k8s.io/v1/leases", "mpigate-system", "mpigate-controller")
    assert not lease["spec"].get("holderIdentity")  # released for a standby


async def test_a_kopf_that_stops_by_itself_ends_the_controller(
    kmock: kmock_lib.KubernetesEmulator,
    api: Api,
    tmp_path: Path,
    key_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf ending on its own ends the controller (exit 1: restart as a candidate), never a process
    that holds the Lease with nothing watching. kopf stops here as it does when an activity fails
    for good (a startup handler that refuses)."""

    def refusing_registry(*args: Any, **kwargs: Any) -> kopf.OperatorRegistry:
        registry = build_registry(*args, **kwargs)

        @kopf.on.startup(registry=registry)
        async def refuse(**_: Any) -> None:
            raise kopf.PermanentError("refused by the test")

        return registry

    monkeypatch.setattr(runner, "build_registry", refusing_registry)
    running = start(options_for(kmock, tmp_path, key_file))
    assert await asyncio.wait_for(running.task, 60) == 1
    assert running.metric("mpigate_controller_leader") == 0


async def test_a_config_that_does_not_load_is_fatal_at_startup(
    kmock: kmock_lib.KubernetesEmulator, api: Api, tmp_path: Path, key_file: Path
) -> None:
    broken = tmp_path / "config"
    broken.mkdir()
    (broken / "org.yaml").write_text(
        "apiVersion: mpigate.io/v1alpha1\nkind: OrgPolicy\nmetadata: {name: x}\nspec: {bogus: 1}\n"
    )
    running = start(options_for(kmock, tmp_path, key_file, config_path=broken))
    assert await asyncio.wait_for(running.task, 60) == 2
    assert (
        list(kmock["get", "/apis/coordination.k8s.io/v1/namespaces/mpigate-system/leases/mpigate-controller"])
        == []
    )


async def test_policy_garbage_collected_with_its_job_is_not_recreated(
    kmock: kmock_lib.KubernetesEmulator, api: Api, controller: Controller
) -> None:
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
    await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"))
    await api.delete(TJ, "nlp-team", "minimal")
    await api.delete(NP, "nlp-team", "mpigate-trainjob.minimal")  # what the garbage collector does
    await wait_for(
        lambda: controller.metric("mpigate_controller_lifecycle_records_total", event="deleted") == 1
    )
    # a negative claim needs a window: a wrong recreation would show within it
    assert await holds(lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal") is None, window=0.5)
    assert [e[1] for e in events(kmock, "nlp-team", "minimal")] == ["NetworkPolicyCreated"]


async def test_the_controller_reports_what_it_finds_of_kueues_configuration(
    kmock: kmock_lib.KubernetesEmulator, api: Api, tmp_path: Path, key_file: Path
) -> None:
    """docs/security.md: Kueue must manage jobs without a queue label and the TrainJob/MPIJob
    integrations. The controller reads Kueue's ConfigMap at start and reports each check."""
    text = "manageJobsWithoutQueueName: false\nintegrations:\n  frameworks: [trainer.kubeflow.org/trainjob]\n"
    kmock.objects["v1/configmaps", "kueue-system", "kueue-manager-config"] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kueue-manager-config", "namespace": "kueue-system"},
        "data": {"controller_manager_config.yaml": text},
    }
    running = start(options_for(kmock, tmp_path, key_file))
    try:
        gauge = "mpigate_controller_reliance"
        await wait_for(
            lambda: running.metric(gauge, check="kueue-framework-trainjob") == 1, what="the reliance gauge"
        )
        assert running.metric(gauge, check="kueue-manage-jobs-without-queue-name") == 0
        assert running.metric(gauge, check="kueue-framework-mpijob") == 0
    finally:
        assert await running.shutdown() == 0


async def test_mpijobs_where_the_mpi_operator_is_served(
    kmock: kmock_lib.KubernetesEmulator, api: Api, tmp_path: Path, key_file: Path
) -> None:
    """The API serves kubeflow.org/v2beta1 MPIJobs: the controller watches them as it watches
    TrainJobs (its NetworkPolicy, lifecycle records with GPU-seconds of the resolved demand,
    placement evidence), and the pods of both kinds (no server-side pod selector can name both)."""
    declare(kmock, mpijobs=True)
    running = start(options_for(kmock, tmp_path, key_file))
    await wait_for(lambda: running.metric("mpigate_controller_leader") == 1, what="leader")
    mpijob = example_mpijob("mpi-allreduce", uid="uid-mpi")
    mpijob["metadata"]["creationTimestamp"] = "2026-11-22T09:00:00Z"
    mpijob["spec"]["runPolicy"]["suspend"] = True
    mpijob["status"] = {
        "conditions": [condition("Suspended", "True", "2026-11-22T09:00:01Z", "MPIJobSuspended")]
    }
    await api.create(MPIJ, "nlp-team", mpijob)
    await api.create(TJ, "nlp-team", trainjob("minimal", uid="uid-min"))
    policy = await wait_for(
        lambda: alive(kmock, NP, "nlp-team", "mpigate-mpijob.mpi-allreduce"), what="MPIJob policy"
    )
    selector = {
        "training.kubeflow.org/job-name": "mpi-allreduce",
        "training.kubeflow.org/operator-name": "mpi-operator",
    }
    assert policy["spec"]["podSelector"] == {"matchLabels": selector}
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "MPIJob"
    await wait_for(lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"), what="TrainJob policy")

    admitted = {
        "spec": {"runPolicy": {"suspend": False}},
        "status": {"conditions": [condition("Suspended", "False", "2026-11-22T10:00:00Z", "MPIJobResumed")]},
    }
    await api.patch(MPIJ, "nlp-team", "mpi-allreduce", admitted)

    def mpi_pod(name: str, role: str, node: str, uid: str, finished: str | None = None) -> dict[str, Any]:
        body = pod(name, "mpi-allreduce", role, node, uid, "2026-11-22T10:01:00Z", finished)
        body["metadata"]["labels"] = {**selector, "training.kubeflow.org/job-role": role}
        return body

    for name, role, node, uid in (
        ("mpi-allreduce-worker-0", "worker", "gpu-eu-1", "m-1"),
        ("mpi-allreduce-worker-1", "worker", "gpu-us-1", "m-2"),
        ("mpi-allreduce-launcher-abcde", "launcher", "gpu-eu-1", "m-3"),
    ):
        await api.create(PODS, "nlp-team", mpi_pod(name, role, node, uid))

    def annotation() -> str:
        stored = alive(kmock, MPIJ, "nlp-team", "mpi-allreduce") or {}
        return str(stored.get("metadata", {}).get("annotations", {}).get("mpigate.io/lifecycle", ""))

    await wait_for(lambda: annotation().count("@") == 2, what="admitted and started")
    for name, role, node, uid in (
        ("mpi-allreduce-worker-0", "worker", "gpu-eu-1", "m-1"),
        ("mpi-allreduce-worker-1", "worker", "gpu-us-1", "m-2"),
        ("mpi-allreduce-launcher-abcde", "launcher", "gpu-eu-1", "m-3"),
    ):
        finished = mpi_pod(name, role, node, uid, "2026-11-22T10:31:00Z")
        await api.patch(PODS, "nlp-team", name, {"status": finished["status"]})
    done = [
        condition("Suspended", "False", "2026-11-22T10:00:00Z", "MPIJobResumed"),
        condition("Succeeded", "True", "2026-11-22T10:32:00Z", "MPIJobSucceeded"),
    ]
    await api.patch(MPIJ, "nlp-team", "mpi-allreduce", {"status": {"conditions": done}})
    await wait_for(lambda: "succeeded@2026-11-22T10:32:00Z" in annotation(), what="succeeded")
    await wait_for(
        lambda: running.metric("mpigate_controller_evidence_records_total", compliant="false") == 1,
        what="the worker in us",
    )
    assert await running.shutdown() == 0

    reading = read_chains([running.options.audit_dir], keys=KeyRing.load([key_file]))
    records = [entry.record for entry in reading]
    lifecycle = [r for r in records if r["stage"] == "lifecycle" and r["object"]["kind"] == "MPIJob"]
    assert [r["lifecycle"]["event"] for r in lifecycle] == ["admitted", "started", "succeeded"]
    succeeded = lifecycle[2]["lifecycle"]
    # 2 workers × 4 GPUs × 30 min; the launcher has none
    assert (succeeded["gpus"], succeeded["gpuSeconds"], succeeded["reason"]) == (
        8,
        2 * 4 * 1800.0,
        "MPIJobSucceeded",
    )
    placed = sorted(
        (r["evidence"]["pod"], r["evidence"]["region"], r["evidence"]["details"]["compliant"])
        for r in records
        if r["stage"] == "evidence" and r["object"]["kind"] == "MPIJob"
    )
    assert placed == [
        ("mpi-allreduce-launcher-abcde", "eu", True),
        ("mpi-allreduce-worker-0", "eu", True),
        ("mpi-allreduce-worker-1", "us", False),
    ]
