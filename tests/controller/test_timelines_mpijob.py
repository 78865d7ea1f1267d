"""MPIJobs (``kubeflow.org/v2beta1``, the MPI Operator) through the same accounting as TrainJobs:
lifecycle records, GPU-seconds from the resolved demand, placement evidence, restarts and outages —
the real reconciler with both kinds, driven by the simulation harness (tests/controller/sim.py).

``mpi-allreduce`` (nlp-team, in eu): one launcher without GPUs and two workers with 4 GPUs each
(examples/mpijobs/mpi-allreduce.yaml). The operator labels its pods ``training.kubeflow.org/job-name``,
``…/job-role`` (launcher/worker) and ``…/operator-name: mpi-operator``
(mpi-operator pkg/controller/mpi_job_controller.go defaultLabels), suspends an MPIJob through
``spec.runPolicy.suspend`` and reports ``Suspended``/``Succeeded``/``Failed`` conditions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import kmock as kmock_lib
import pytest_asyncio
from tests.controller.kube import MPIJ, NP, alive, declare
from tests.controller.sim import NAMESPACE, Sim, finished, running, seconds, t, waiting

from mpigate.admission.kube import KubeClient, KubeConfig
from mpigate.config import Config
from mpigate.controller.kinds import MPIJOB

EU = "gpu-eu-1"
US = "gpu-us-1"
JOB = "mpi-allreduce"
LAUNCHER, WORKER_0, WORKER_1 = f"{JOB}-launcher-7x2kq", f"{JOB}-worker-0", f"{JOB}-worker-1"


@pytest_asyncio.fixture
async def sim(kmock: kmock_lib.KubernetesEmulator, org: Config) -> AsyncIterator[Sim]:
    declare(kmock, mpijobs=True)
    async with aiohttp.ClientSession(base_url=str(kmock.url)) as session:
        client = KubeClient(KubeConfig(server=str(kmock.url).rstrip("/")))
        try:
            yield Sim(kmock, session, client, org, kind=MPIJOB)
        finally:
            await client.close()


async def run_pods(sim: Sim, worker_node: str = EU) -> None:
    """The workers start (10:01:00, 10:01:30), then the launcher (10:02:00)."""
    await sim.create_pod(JOB, WORKER_0, "worker", EU, waiting(), gpus=4)
    await sim.create_pod(JOB, WORKER_1, "worker", worker_node, waiting(), gpus=4)
    sim.at(t("10:01:00"))
    await sim.set_pod(WORKER_0, running(t("10:01:00")))
    sim.at(t("10:01:30"))
    await sim.set_pod(WORKER_1, running(t("10:01:30")))
    await sim.create_pod(JOB, LAUNCHER, "launcher", EU, waiting(), gpus=0)
    sim.at(t("10:02:00"))
    await sim.set_pod(LAUNCHER, running(t("10:02:00")))


async def finish_pods(sim: Sim) -> None:
    sim.at(t("10:31:00"))
    await sim.set_pod(LAUNCHER, finished(t("10:02:00"), t("10:31:00")))
    await sim.set_pod(WORKER_0, finished(t("10:01:00"), t("10:31:00")))
    await sim.set_pod(WORKER_1, finished(t("10:01:30"), t("10:31:00")))


EXPECTED = 4 * seconds("10:01:00", "10:31:00") + 4 * seconds("10:01:30", "10:31:00")


async def test_an_mpijob_from_queue_to_deletion(sim: Sim) -> None:
    """Queued → admitted → workers and launcher run → Succeeded → deleted: the NetworkPolicy is the
    MPIJob's, the records name the MPIJob, GPU-seconds count the workers' 4 GPUs and the launcher's
    none (the resolved demand), and every pod leaves placement evidence."""
    controller = await sim.start()
    job = await sim.create_job()
    assert job == JOB
    assert await controller.ensure_network_policy(sim.job(job), kind=MPIJOB) == "created"
    policy = alive(sim.kmock, NP, NAMESPACE, f"mpigate-mpijob.{job}")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "training.kubeflow.org/job-name": job,
        "training.kubeflow.org/operator-name": "mpi-operator",
    }
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_pods(sim, worker_node="gpu-us-1")
    await finish_pods(sim)
    sim.at(t("10:32:00"))
    await sim.complete(job)
    sim.at(t("11:00:00"))
    await sim.delete_job(job)
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("succeeded", 1), ("deleted", 1)]
    done = sim.records.closing()[0]
    assert (done["gpuSeconds"], done["basis"], done["pods"], done["gpus"]) == (EXPECTED, "observed", 3, 8)
    assert (done["started"], done["finished"], done["reason"]) == (
        "2026-11-22T10:01:00Z",
        "2026-11-22T10:32:00Z",
        "MPIJobSucceeded",
    )
    assert "gpuSpecMismatch" not in done
    record = next(e for e in sim.records.entries if e["stage"] == "lifecycle")
    assert (record["object"]["kind"], record["object"]["name"]) == ("MPIJob", job)
    assert record["object"]["labels"] == {"mpigate.io/cost-center": "cc-4711"}
    assert sim.records.charged() == EXPECTED
    placed = {(e["pod"], e["region"], e["details"]["compliant"]) for e in sim.records.evidence()}
    assert placed == {(LAUNCHER, "eu", True), (WORKER_0, "eu", True), (WORKER_1, "us", False)}
    assert sim.metric("mpigate_controller_residency_mismatches_total", team="nlp-team", region="us") == 1
    # the job's state annotations are on the MPIJob
    assert sim.kmock.objects[MPIJ, NAMESPACE, job].deleted


async def test_an_mpijob_preempted_and_admitted_again(sim: Sim) -> None:
    """Kueue suspends the MPIJob (runPolicy.suspend), the operator deletes its pods; admitted again,
    the job runs a second segment."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_pods(sim)
    sim.at(t("10:20:00"))
    await sim.suspend(job)
    for pod, start in ((LAUNCHER, "10:02:00"), (WORKER_0, "10:01:00"), (WORKER_1, "10:01:30")):
        await sim.set_pod(pod, finished(t(start), t("10:20:00"), exit_code=137))
        await sim.delete_pod(pod)
    sim.at(t("10:50:00"))
    await sim.admit(job)
    await sim.create_pod(job, WORKER_0, "worker", EU, running(t("10:51:00")), gpus=4)
    # someone's worker asks 2 GPUs in its spec: charged what admission and quota counted, flagged
    await sim.create_pod(job, WORKER_1, "worker", EU, running(t("10:51:00")), gpus=2)
    await sim.create_pod(job, LAUNCHER, "launcher", EU, running(t("10:51:00")), gpus=0)
    sim.at(t("11:21:00"))
    for pod in (LAUNCHER, WORKER_0, WORKER_1):
        await sim.set_pod(pod, finished(t("10:51:00"), t("11:21:00")))
    await sim.complete(job)
    assert sim.records.events() == [
        ("admitted", 1),
        ("started", 1),
        ("suspended", 1),
        ("admitted", 2),
        ("started", 2),
        ("succeeded", 2),
    ]
    first = 4 * seconds("10:01:00", "10:20:00") + 4 * seconds("10:01:30", "10:20:00")
    second = 2 * 4 * seconds("10:51:00", "11:21:00")
    assert [c["gpuSeconds"] for c in sim.records.closing()] == [first, second]
    assert sim.records.closing()[1]["gpuSpecMismatch"] == [{"pod": WORKER_1, "charged": 4, "spec": 2}]
    assert sim.records.charged() == first + second
    assert sim.records.chargeback()["flags"]["gpuSpecMismatch"] == 1


async def test_an_mpijob_deleted_while_the_controller_is_down(sim: Sim) -> None:
    """The ledger names the MPIJob: the restarted controller closes it as deleted, vanished,
    charged until it last confirmed it (the range up to when it found it gone)."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_pods(sim)
    sim.at(t("10:09:00"))
    await sim.save_ledger()
    sim.crash()
    sim.at(t("10:30:00"))
    await sim.delete_job(job)
    sim.at(t("11:00:00"))
    await sim.start()
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("deleted", 1)]
    gone = sim.records.closing()[0]
    known = 4 * seconds("10:01:00", "10:09:00") + 4 * seconds("10:01:30", "10:09:00")
    at_most = 4 * seconds("10:01:00", "11:00:00") + 4 * seconds("10:01:30", "11:00:00")
    assert (gone["gpuSeconds"], gone["gpuSecondsMin"], gone["gpuSecondsMax"]) == (known, known, at_most)
    assert (gone["basis"], gone["vanished"]) == ("partial", True)
    report = sim.records.chargeback()
    assert report["flags"]["vanished"] == 1 and sim.records.charged() == known


async def test_an_mpijob_that_finished_during_a_restart(sim: Sim) -> None:
    """The restarted controller is told of the finished MPIJob before its pods: it lists them
    itself (a TrainJob's timeline 8, for the other kind)."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_pods(sim)
    sim.at(t("10:10:00"))
    await sim.stop()
    await finish_pods(sim)
    sim.at(t("10:32:00"))
    await sim.complete(job)
    sim.at(t("10:40:00"))
    await sim.start()
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("succeeded", 1)]
    done = sim.records.closing()[0]
    assert (done["gpuSeconds"], done["basis"]) == (EXPECTED, "observed")


async def test_mpijob_pods_seen_before_the_admission(sim: Sim) -> None:
    """The pods' watch runs ahead of the MPIJob's: the controller reads the job before it takes the
    running pods of a job that reads as suspended for a segment that ran unseen."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job, deliver=False)
    sim.at(t("10:01:30"))
    await sim.create_pod(job, WORKER_0, "worker", EU, running(t("10:01:00")), gpus=4)
    await sim.create_pod(job, WORKER_1, "worker", EU, running(t("10:01:30")), gpus=4)
    await sim.create_pod(job, LAUNCHER, "launcher", EU, waiting(), gpus=0)
    assert sim.records.events() == [("admitted", 1), ("started", 1)]
    sim.at(t("10:02:00"))
    await sim.set_pod(LAUNCHER, running(t("10:02:00")))
    await finish_pods(sim)
    sim.at(t("10:32:00"))
    await sim.complete(job)
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("succeeded", 1)]
    assert sim.records.charged() == EXPECTED


async def test_pods_of_other_operators_are_not_an_mpijobs(sim: Sim) -> None:
    """The training operator's PyTorchJob pods carry the same job-name label, not the MPI Operator's
    name: they are not the MPIJob's (neither charged nor placed)."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-master-0",
            "namespace": NAMESPACE,
            "uid": "pytorch-pod",
            "labels": {
                "training.kubeflow.org/job-name": job,
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
            },
        },
        "spec": {"nodeName": EU, "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "containerStatuses": [running(t("10:01:00"))]},
    }
    assert sim.controller is not None
    await sim.controller.on_pod_event("ADDED", body)
    sim.at(t("10:10:00"))
    await sim.complete(job)
    assert sim.records.events() == [("admitted", 1), ("succeeded", 1)]
    assert sim.records.closing()[0]["gpuSeconds"] == 0.0 and sim.records.evidence() == []
