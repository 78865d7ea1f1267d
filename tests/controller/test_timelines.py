"""Chargeback and placement evidence through restarts, leader changes and outages (issue 20): the
real reconciler driven through the timelines of docs/controller.md ("Timelines") with a scripted
clock and the fake API (tests/controller/sim.py). Every figure is compared with GPU-hours computed
by hand: GPUs × pod run time.

``llm-finetune`` (nlp-team, in eu) runs a launcher and one node pod with 8 GPUs each, and two
initializers with none.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import kmock as kmock_lib
import pytest
import pytest_asyncio
from tests.controller.kube import TJ, alive, declare, events
from tests.controller.sim import (
    NAMESPACE,
    Sim,
    condition,
    finished,
    running,
    seconds,
    t,
    waiting,
)

from mpigate.admission.kube import KubeClient, KubeConfig
from mpigate.config import Config

EU = "gpu-eu-1"
EU_LABELS = {"topology.kubernetes.io/region": "eu-west-1", "nvidia.com/gpu.product": "A100-SXM4-80GB"}


@pytest_asyncio.fixture
async def sim(kmock: kmock_lib.KubernetesEmulator, org: Config) -> AsyncIterator[Sim]:
    declare(kmock, mpijobs=True)
    async with aiohttp.ClientSession(base_url=str(kmock.url)) as session:
        client = KubeClient(KubeConfig(server=str(kmock.url).rstrip("/")))
        try:
            yield Sim(kmock, session, client, org)
        finally:
            await client.close()


def charged(sim: Sim) -> float:
    """GPU-seconds the report charges for these records (each (uid, segment, event) once)."""
    return sim.records.charged()


async def run_two_pods(sim: Sim, job: str, start: str = "10:01:00", node_start: str = "10:01:30") -> None:
    """The launcher and the node pod of ``job`` start running."""
    await sim.create_pod(job, f"{job}-launcher-0-0-aaaaa", "launcher", EU, waiting())
    await sim.create_pod(job, f"{job}-node-0-0-bbbbb", "node", EU, waiting())
    sim.at(t(start))
    await sim.set_pod(f"{job}-launcher-0-0-aaaaa", running(t(start)))
    sim.at(t(node_start))
    await sim.set_pod(f"{job}-node-0-0-bbbbb", running(t(node_start)))


async def finish_two_pods(
    sim: Sim,
    job: str,
    launcher_end: str,
    node_end: str,
    *,
    start: str = "10:01:00",
    node_start: str = "10:01:30",
    deliver: bool = True,
) -> None:
    await sim.set_pod(f"{job}-launcher-0-0-aaaaa", finished(t(start), t(launcher_end)), deliver=deliver)
    await sim.set_pod(f"{job}-node-0-0-bbbbb", finished(t(node_start), t(node_end)), deliver=deliver)


# ---------------------------------------------------------------------------- what holds (and must)


async def test_queued_pending_running_done(sim: Sim) -> None:
    """Timeline 1: queued → admitted → pods pending → running → finished → Complete → deleted."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:31:30"))
    await finish_two_pods(sim, job, "10:31:00", "10:31:30")
    sim.at(t("10:32:00"))
    await sim.complete(job)
    sim.at(t("11:00:00"))
    await sim.delete_job(job)
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("succeeded", 1), ("deleted", 1)]
    done = sim.records.closing()[0]
    expected = 8 * seconds("10:01:00", "10:31:00") + 8 * seconds("10:01:30", "10:31:30")
    assert done["gpuSeconds"] == expected == 28800
    assert (done["basis"], done["pods"], done["started"], done["finished"]) == (
        "observed",
        2,
        "2026-11-22T10:01:00Z",
        "2026-11-22T10:32:00Z",
    )
    assert done["byDay"] == {"2026-11-22": expected}
    assert done["usage"] == {
        "from": "2026-11-22T10:01:00Z",
        "steps": [[0, 8], [30, 16], [1800, 8], [1830, 0]],
    }
    assert sim.records.closing()[1]["gpuSeconds"] == 0.0  # the deletion closes nothing
    assert charged(sim) == expected
    assert [(e["pod"], e["region"], e["details"]["compliant"]) for e in sim.records.evidence()] == [
        (f"{job}-launcher-0-0-aaaaa", "eu", True),
        (f"{job}-node-0-0-bbbbb", "eu", True),
    ]


async def test_restart_that_lists_a_finished_job_before_its_pods(sim: Sim) -> None:
    """Timeline 8: the job finished while the controller was down; the restarted one is told about
    the job before its pods. It was closed with gpuSeconds 0 (−100 %)."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:10:00"))
    sim.crash()
    sim.at(t("10:31:30"))
    await finish_two_pods(sim, job, "10:31:00", "10:31:30")
    sim.at(t("10:32:00"))
    await sim.complete(job)
    sim.at(t("10:40:00"))
    await sim.start()  # jobs first, then pods
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("succeeded", 1)]
    expected = 8 * seconds("10:01:00", "10:31:00") + 8 * seconds("10:01:30", "10:31:30")
    done = sim.records.closing()[0]
    assert (done["gpuSeconds"], done["basis"]) == (expected, "observed")
    assert charged(sim) == expected
    assert sim.records.chargeback()["flagged"] == []


async def test_a_job_deleted_while_the_controller_is_down(sim: Sim) -> None:
    """Timeline 9: it got no closing record at all (−100 %). Now the ledger names it: it is closed
    as ``deleted``, marked vanished, charged until the controller last confirmed it."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:09:00"))
    await sim.save_ledger()  # the runner writes it every few seconds
    sim.at(t("10:10:00"))
    sim.crash()
    sim.at(t("10:30:00"))
    await sim.delete_job(job)
    sim.at(t("11:00:00"))
    await sim.start()
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("deleted", 1)]
    gone = sim.records.closing()[0]
    known = 8 * seconds("10:01:00", "10:09:00") + 8 * seconds("10:01:30", "10:09:00")
    truth = 8 * seconds("10:01:00", "10:30:00") + 8 * seconds("10:01:30", "10:30:00")
    at_most = 8 * seconds("10:01:00", "11:00:00") + 8 * seconds("10:01:30", "11:00:00")
    assert (gone["gpuSeconds"], gone["gpuSecondsMin"], gone["gpuSecondsMax"]) == (known, known, at_most)
    assert known <= truth <= at_most
    assert gone["basis"] == "partial" and gone["vanished"] is True
    assert gone["notes"][0] == (
        "deleted while the controller was not watching (last seen 2026-11-22T10:09:00Z, found gone "
        "2026-11-22T11:00:00Z)"
    )
    # closed once: the next start finds nothing left to close
    sim.crash()
    await sim.start()
    assert len(sim.records.closing()) == 1
    # the report charges what is known and flags it with its range
    report = sim.records.chargeback()
    assert charged(sim) == known
    assert report["flags"]["vanished"] == 1 and report["flags"]["partial"] == 1
    assert report["range"] == {"gpuHoursMin": round(known / 3600, 3), "gpuHoursMax": round(at_most / 3600, 3)}


async def test_preemption_with_the_suspension_seen_before_the_pods_go(sim: Sim) -> None:
    """Timeline 2: Kueue suspends at 10:20; JobSet deletes the pods, which stop at 10:20:25. The
    segment is paid until the suspension; the next segment is charged separately."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:20:00"))
    await sim.suspend(job)
    sim.at(t("10:20:30"))
    await finish_two_pods(sim, job, "10:20:25", "10:20:25")
    await sim.delete_pod(f"{job}-launcher-0-0-aaaaa")
    await sim.delete_pod(f"{job}-node-0-0-bbbbb")
    first = 8 * seconds("10:01:00", "10:20:00") + 8 * seconds("10:01:30", "10:20:00")
    assert sim.records.closing()[0]["gpuSeconds"] == first
    sim.at(t("11:00:00"))
    await sim.admit(job)
    await sim.create_pod(job, f"{job}-launcher-0-0-ccccc", "launcher", EU, running(t("11:01:00")))
    await sim.create_pod(job, f"{job}-node-0-0-ddddd", "node", EU, running(t("11:01:00")))
    sim.at(t("11:59:00"))
    await sim.set_pod(f"{job}-launcher-0-0-ccccc", finished(t("11:01:00"), t("11:59:00")))
    await sim.set_pod(f"{job}-node-0-0-ddddd", finished(t("11:01:00"), t("11:59:00")))
    sim.at(t("12:00:00"))
    await sim.complete(job)
    assert sim.records.events() == [
        ("admitted", 1),
        ("started", 1),
        ("suspended", 1),
        ("admitted", 2),
        ("started", 2),
        ("succeeded", 2),
    ]
    second = 2 * 8 * seconds("11:01:00", "11:59:00")
    assert [r["gpuSeconds"] for r in sim.records.closing()] == [first, second]
    assert [r["basis"] for r in sim.records.closing()] == ["observed", "observed"]
    assert charged(sim) == first + second


async def test_preemption_with_the_pods_gone_before_the_suspension_is_seen(sim: Sim) -> None:
    """Timeline 3: the pods' deletions arrive before the job's Suspended event."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:20:10"))
    await finish_two_pods(sim, job, "10:20:05", "10:20:05")
    await sim.delete_pod(f"{job}-launcher-0-0-aaaaa")
    await sim.delete_pod(f"{job}-node-0-0-bbbbb")
    sim.at(t("10:20:12"))
    await sim.patch_job(
        job,
        {
            "spec": {"suspend": True},
            "status": {
                "conditions": [condition("Suspended", "True", t("10:20:00"), "Suspended", "Preempted")]
            },
        },
    )
    # the pods ran past the suspension by 5 s: the segment ends at the suspension
    expected = 8 * seconds("10:01:00", "10:20:00") + 8 * seconds("10:01:30", "10:20:00")
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("suspended", 1)]
    assert sim.records.closing()[0]["gpuSeconds"] == expected == charged(sim)


async def test_a_jobset_full_restart(sim: Sim) -> None:
    """Timeline 4: the node pod fails at 10:20; JobSet recreates every pod (new uids), which run
    until 10:50. Each pod is charged for its own run."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:20:00"))
    await sim.set_pod(f"{job}-node-0-0-bbbbb", finished(t("10:01:30"), t("10:20:00"), exit_code=1))
    sim.at(t("10:20:20"))
    await sim.set_pod(f"{job}-launcher-0-0-aaaaa", finished(t("10:01:00"), t("10:20:15"), exit_code=137))
    await sim.delete_pod(f"{job}-launcher-0-0-aaaaa")
    await sim.delete_pod(f"{job}-node-0-0-bbbbb")
    sim.at(t("10:21:00"))
    await sim.create_pod(job, f"{job}-launcher-1-0-ccccc", "launcher", EU, running(t("10:21:00")))
    await sim.create_pod(job, f"{job}-node-1-0-ddddd", "node", EU, running(t("10:21:10")))
    sim.at(t("10:50:00"))
    await sim.set_pod(f"{job}-launcher-1-0-ccccc", finished(t("10:21:00"), t("10:50:00")))
    await sim.set_pod(f"{job}-node-1-0-ddddd", finished(t("10:21:10"), t("10:49:50")))
    sim.at(t("10:51:00"))
    await sim.complete(job)
    expected = 8 * (
        seconds("10:01:00", "10:20:15")
        + seconds("10:01:30", "10:20:00")
        + seconds("10:21:00", "10:50:00")
        + seconds("10:21:10", "10:49:50")
    )
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("succeeded", 1)]
    assert (sim.records.closing()[0]["gpuSeconds"], sim.records.closing()[0]["pods"]) == (expected, 4)
    assert charged(sim) == expected


async def test_a_replaced_worker(sim: Sim) -> None:
    """Timeline 5: the node pod is evicted at 10:15 (drain) and replaced at 10:16."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:15:05"))
    await sim.set_pod(f"{job}-node-0-0-bbbbb", finished(t("10:01:30"), t("10:15:00"), exit_code=143))
    await sim.delete_pod(f"{job}-node-0-0-bbbbb")
    sim.at(t("10:16:00"))
    await sim.create_pod(job, f"{job}-node-0-0-eeeee", "node", EU, running(t("10:16:00")))
    sim.at(t("10:45:00"))
    await sim.set_pod(f"{job}-node-0-0-eeeee", finished(t("10:16:00"), t("10:45:00")))
    await sim.set_pod(f"{job}-launcher-0-0-aaaaa", finished(t("10:01:00"), t("10:45:00")))
    sim.at(t("10:46:00"))
    await sim.complete(job)
    expected = 8 * (
        seconds("10:01:00", "10:45:00") + seconds("10:01:30", "10:15:00") + seconds("10:16:00", "10:45:00")
    )
    assert sim.records.closing()[0]["gpuSeconds"] == expected == charged(sim)


async def test_initializers_hold_no_gpus_and_start_the_job(sim: Sim) -> None:
    """Timeline 6: llm-finetune's dataset and model initializers run first (0 GPUs). ``started`` is
    the first container start of any pod of the job — the initializer's (decided: from admission
    the job holds its whole quota; GPU-seconds are per pod anyway)."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    for role, suffix in (("dataset-initializer", "iiiii"), ("model-initializer", "jjjjj")):
        await sim.create_pod(job, f"{job}-{role}-0-0-{suffix}", role, EU, running(t("10:00:30")), gpus=0)
    sim.at(t("10:00:50"))
    for role, suffix in (("dataset-initializer", "iiiii"), ("model-initializer", "jjjjj")):
        await sim.set_pod(f"{job}-{role}-0-0-{suffix}", finished(t("10:00:30"), t("10:00:50")))
    await run_two_pods(sim, job)
    sim.at(t("10:31:30"))
    await finish_two_pods(sim, job, "10:31:00", "10:31:30")
    sim.at(t("10:32:00"))
    await sim.complete(job)
    started = next(r for r in sim.records.lifecycle() if r["event"] == "started")
    assert started["at"] == "2026-11-22T10:00:30Z"
    done = sim.records.closing()[0]
    assert done["gpuSeconds"] == 8 * seconds("10:01:00", "10:31:00") + 8 * seconds("10:01:30", "10:31:30")
    assert done["pods"] == 4  # the initializers ran too, with 0 GPUs
    assert charged(sim) == done["gpuSeconds"]


async def test_exactly_once_while_the_controller_stays_up(sim: Sim) -> None:
    """Timeline 7: every event delivered twice, stale objects delivered after newer ones, a resync
    in between: one record per transition, one per placement."""
    controller = await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    stale = sim.job(job)
    await run_two_pods(sim, job)
    for _ in range(2):
        await controller.on_trainjob_event("MODIFIED", stale)  # the annotation in it lags behind
        await controller.on_pod_event("MODIFIED", sim.pod(f"{job}-node-0-0-bbbbb"))
        await sim.resync()
    sim.at(t("10:31:30"))
    await finish_two_pods(sim, job, "10:31:00", "10:31:30")
    sim.at(t("10:32:00"))
    await sim.complete(job)
    done = sim.job(job)
    for _ in range(2):
        await controller.on_trainjob_event("MODIFIED", done)
        await controller.on_trainjob_event("MODIFIED", stale)
        await sim.resync()
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("succeeded", 1)]
    assert len(sim.records.evidence()) == 2
    assert charged(sim) == 8 * seconds("10:01:00", "10:31:00") + 8 * seconds("10:01:30", "10:31:30")


async def test_pods_seen_before_the_admission_that_started_them(sim: Sim) -> None:
    """The job's and its pods' watches are not ordered, and lag behind what the controller reads:
    the pods run before it is told that the job was admitted (its copy still says suspended), and
    the job's events from before the admission come after. A segment that ran unseen was recorded —
    admitted, started, and suspended at the current time — and the real admission opened another
    one (seen in test_operator under load)."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    stale = sim.job(job)
    await sim.admit(job, deliver=False)
    sim.at(t("10:01:30"))  # first seen running (a watch can skip the pending state)
    await sim.create_pod(job, f"{job}-launcher-0-0-aaaaa", "launcher", EU, running(t("10:01:00")))
    await sim.create_pod(job, f"{job}-node-0-0-bbbbb", "node", EU, running(t("10:01:30")))
    sim.at(t("10:02:00"))
    assert sim.records.events() == [("admitted", 1), ("started", 1)]
    assert sim.records.lifecycle()[0]["at"] == "2026-11-22T10:00:00Z"
    # the job's watch lags: an event from before the admission, then the admission itself
    await sim._deliver_job("MODIFIED", stale)
    await sim._deliver_job("MODIFIED", sim.job(job))
    assert sim.records.events() == [("admitted", 1), ("started", 1)]
    sim.at(t("10:31:30"))
    await finish_two_pods(sim, job, "10:31:00", "10:31:30")
    sim.at(t("10:32:00"))
    await sim.complete(job)
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("succeeded", 1)]
    assert charged(sim) == 8 * seconds("10:01:00", "10:31:00") + 8 * seconds("10:01:30", "10:31:30")


# ------------------------------------------------------------------------ restarts, leader changes, outages


@pytest.mark.parametrize("how", ["restart", "leader change"])
async def test_pods_deleted_before_a_restart_or_leader_change(sim: Sim, how: str) -> None:
    """Timelines 10 and 11: the node pod is evicted at 10:15 and replaced while the controller
    watches; then it restarts (crash) or another replica takes over (clean stop). The evicted pod's
    run time was forgotten (−7 % to −47 %): it is kept in the job's mpigate.io/pods annotation."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:15:05"))
    await sim.set_pod(f"{job}-node-0-0-bbbbb", finished(t("10:01:30"), t("10:15:00"), exit_code=143))
    await sim.delete_pod(f"{job}-node-0-0-bbbbb")
    sim.at(t("10:16:00"))
    await sim.create_pod(job, f"{job}-node-0-0-eeeee", "node", EU, running(t("10:16:00")))
    sim.at(t("10:20:00"))
    if how == "restart":
        sim.crash()
        sim.at(t("10:21:00"))
        await sim.start()
    else:
        await sim.stop()
        await sim.start(identity="b", pods_first=True)
    sim.at(t("10:45:00"))
    await sim.set_pod(f"{job}-node-0-0-eeeee", finished(t("10:16:00"), t("10:45:00")))
    await sim.set_pod(f"{job}-launcher-0-0-aaaaa", finished(t("10:01:00"), t("10:45:00")))
    sim.at(t("10:46:00"))
    await sim.complete(job)
    expected = 8 * (
        seconds("10:01:00", "10:45:00") + seconds("10:01:30", "10:15:00") + seconds("10:16:00", "10:45:00")
    )
    done = sim.records.closing()[0]
    assert (done["gpuSeconds"], done["basis"], done["pods"]) == (expected, "observed", 3)
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("succeeded", 1)]
    assert charged(sim) == expected


async def test_a_preemption_during_an_outage(sim: Sim) -> None:
    """Timeline 12: the controller is down when Kueue suspends the job and JobSet deletes its pods.
    The suspension was not recorded. Now it is, charged until the suspension: the pods are known
    from the annotation, their end from the transition that closed the segment (basis inferred)."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:09:00"))
    await sim.save_ledger()
    sim.at(t("10:10:00"))
    sim.crash()
    sim.at(t("10:20:00"))
    await sim.suspend(job)
    sim.at(t("10:20:30"))
    await sim.delete_pod(f"{job}-launcher-0-0-aaaaa")
    await sim.delete_pod(f"{job}-node-0-0-bbbbb")
    sim.at(t("10:40:00"))
    await sim.start()
    expected = 8 * seconds("10:01:00", "10:20:00") + 8 * seconds("10:01:30", "10:20:00")
    assert sim.records.events() == [("admitted", 1), ("started", 1), ("suspended", 1)]
    gone = sim.records.closing()[0]
    assert (gone["gpuSeconds"], gone["basis"], gone["at"]) == (expected, "inferred", "2026-11-22T10:20:00Z")
    at_least = 8 * seconds("10:01:00", "10:09:00") + 8 * seconds("10:01:30", "10:09:00")
    assert (gone["gpuSecondsMin"], gone["gpuSecondsMax"]) == (at_least, expected)
    assert charged(sim) == expected and sim.records.chargeback()["flags"]["inferred"] == 1
    assert gone["notes"] == [
        f"pod {job}-launcher-0-0-aaaaa: gone while the controller was not watching; charged until the "
        "segment closed at 2026-11-22T10:20:00Z (last seen running 2026-11-22T10:09:00Z)",
        f"pod {job}-node-0-0-bbbbb: gone while the controller was not watching; charged until the segment "
        "closed at 2026-11-22T10:20:00Z (last seen running 2026-11-22T10:09:00Z)",
    ]


async def test_a_preemption_and_readmission_during_an_outage(sim: Sim) -> None:
    """Timeline 13: suspended at 10:20 and admitted again at 10:50 while the controller was down.
    Only Suspended=False at 10:50 is left to see: the first segment is closed, charged until the
    controller's last observation (partial: the suspension time is unknown), the second opens."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:09:00"))
    await sim.save_ledger()
    sim.crash()
    sim.at(t("10:20:00"))
    await sim.suspend(job)
    await sim.delete_pod(f"{job}-launcher-0-0-aaaaa")
    await sim.delete_pod(f"{job}-node-0-0-bbbbb")
    sim.at(t("10:50:00"))
    await sim.admit(job)
    await sim.create_pod(job, f"{job}-launcher-0-0-ccccc", "launcher", EU, running(t("10:51:00")))
    await sim.create_pod(job, f"{job}-node-0-0-ddddd", "node", EU, running(t("10:51:00")))
    sim.at(t("11:00:00"))
    await sim.start()
    assert sim.records.events() == [
        ("admitted", 1),
        ("started", 1),
        ("suspended", 1),
        ("admitted", 2),
        ("started", 2),
    ]
    first = sim.records.closing()[0]
    at_least = 8 * seconds("10:01:00", "10:09:00") + 8 * seconds("10:01:30", "10:09:00")
    at_most = 8 * seconds("10:01:00", "10:50:00") + 8 * seconds("10:01:30", "10:50:00")
    truth = 8 * seconds("10:01:00", "10:20:00") + 8 * seconds("10:01:30", "10:20:00")
    assert (first["gpuSeconds"], first["gpuSecondsMin"], first["gpuSecondsMax"]) == (
        at_least,
        at_least,
        at_most,
    )
    assert at_least <= truth <= at_most and first["basis"] == "partial"
    assert first["notes"][0] == (
        "suspended between 2026-11-22T10:09:00Z and 2026-11-22T10:50:00Z; the time is not known"
    )
    sim.at(t("11:30:00"))
    await sim.set_pod(f"{job}-launcher-0-0-ccccc", finished(t("10:51:00"), t("11:30:00")))
    await sim.set_pod(f"{job}-node-0-0-ddddd", finished(t("10:51:00"), t("11:30:00")))
    await sim.complete(job)
    second = sim.records.closing()[1]
    assert (second["gpuSeconds"], second["basis"]) == (2 * 8 * seconds("10:51:00", "11:30:00"), "observed")
    assert charged(sim) == at_least + second["gpuSeconds"]
    assert sim.records.chargeback()["flags"]["partial"] == 1


async def test_a_crash_between_the_record_and_the_annotation(sim: Sim) -> None:
    """Timeline 14: the succeeded record is written, then the controller dies before the job's
    annotation says so: the restarted controller writes it again (charged twice, +100 %, since the
    report did not de-duplicate). The repeat is identical in (uid, segment, event) and figure, and
    counted once."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.at(t("10:31:30"))
    await finish_two_pods(sim, job, "10:31:00", "10:31:30")
    sim.at(t("10:32:00"))
    sim.fail_next_annotation()
    with pytest.raises(Exception, match="HTTP 503"):
        await sim.complete(job)
    sim.crash()
    sim.at(t("10:35:00"))
    await sim.start(identity="b")
    repeated = sim.records.closing()
    assert [(r["event"], r["segment"], r["uid"]) for r in repeated] == [("succeeded", 1, "job-1")] * 2
    assert repeated[0]["gpuSeconds"] == repeated[1]["gpuSeconds"]
    assert charged(sim) == 8 * seconds("10:01:00", "10:31:00") + 8 * seconds("10:01:30", "10:31:30")
    assert sim.records.chargeback()["duplicates"] == {"records": 1, "differing": 0}


@pytest.mark.parametrize("restart_between", [False, True])
async def test_second_and_later_in_place_container_restarts(sim: Sim, restart_between: bool) -> None:
    """Timeline 15: the node pod's container crashes at 10:05 and 10:10 and runs again each time;
    the API shows only the last two runs. From the second restart on, the first run's time was lost
    (−5 % per restart): the first start is remembered (in memory and in the annotation)."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    node = f"{job}-node-0-0-bbbbb"
    sim.at(t("10:05:10"))
    await sim.set_pod(node, running(t("10:05:10"), restarts=1, last=(t("10:01:30"), t("10:05:00"))))
    if restart_between:
        sim.crash()
        sim.at(t("10:06:00"))
        await sim.start()
    sim.at(t("10:10:10"))
    await sim.set_pod(node, running(t("10:10:10"), restarts=2, last=(t("10:05:10"), t("10:10:00"))))
    sim.at(t("10:20:10"))
    await sim.set_pod(node, running(t("10:20:10"), restarts=3, last=(t("10:10:10"), t("10:20:00"))))
    sim.at(t("10:31:30"))
    await sim.set_pod(node, finished(t("10:20:10"), t("10:31:30"), restarts=3))
    await sim.set_pod(f"{job}-launcher-0-0-aaaaa", finished(t("10:01:00"), t("10:31:00")))
    sim.at(t("10:32:00"))
    await sim.complete(job)
    done = sim.records.closing()[0]
    expected = 8 * seconds("10:01:00", "10:31:00") + 8 * seconds("10:01:30", "10:31:30")
    assert (done["gpuSeconds"], done["basis"]) == (expected, "observed")
    assert charged(sim) == expected


async def test_restarts_the_controller_never_saw_are_charged_from_the_pod_start(sim: Sim) -> None:
    """Timeline 15, first seen late: the controller starts when the pod has restarted three times;
    the first run is charged from the pod's status.startTime (the earliest it can have run; basis
    inferred, the range says how much that adds)."""
    job = await sim.create_job(suspend=False)
    await sim.create_pod(
        job,
        f"{job}-node-0-0-bbbbb",
        "node",
        EU,
        running(t("10:20:10"), restarts=3, last=(t("10:10:10"), t("10:20:00"))),
        start_time=t("09:00:10"),
    )
    sim.at(t("10:25:00"))
    await sim.start()
    sim.at(t("10:31:30"))
    await sim.set_pod(f"{job}-node-0-0-bbbbb", finished(t("10:20:10"), t("10:31:30"), restarts=3))
    await sim.complete(job)
    done = sim.records.closing()[0]
    assert (done["gpuSeconds"], done["basis"]) == (8 * seconds("09:00:10", "10:31:30"), "inferred")
    assert (done["gpuSecondsMin"], done["gpuSecondsMax"]) == (
        8 * seconds("10:10:10", "10:31:30"),
        8 * seconds("09:00:10", "10:31:30"),
    )


# ---------------------------------------------------------------------------- days and periods


async def test_a_job_across_midnight_is_split_by_day(sim: Sim) -> None:
    """Timeline 16: a job running 23:00 → 01:30 closed at 01:31. It was filed wholly under the day it
    closed (±100 % per day); its record now carries the GPU-seconds per UTC day and the GPUs in use
    over time, which the report splits at any boundary (test_chargeback_report.py)."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("22:59:00"))
    await sim.admit(job)
    await run_two_pods(sim, job, "23:00:00", "23:30:00")
    sim.at(t("01:30:00", 23))
    await finish_two_pods(sim, job, "01:30:00", "01:30:00", start="23:00:00", node_start="23:30:00")
    await sim.set_pod(f"{job}-launcher-0-0-aaaaa", finished(t("23:00:00"), t("01:30:00", 23)))
    await sim.set_pod(f"{job}-node-0-0-bbbbb", finished(t("23:30:00"), t("01:30:00", 23)))
    sim.at(t("01:31:00", 23))
    await sim.complete(job)
    done = sim.records.closing()[0]
    day1 = 8 * seconds("23:00:00", "00:00:00", 22, 23) + 8 * seconds("23:30:00", "00:00:00", 22, 23)
    day2 = 2 * 8 * seconds("00:00:00", "01:30:00", 23)
    assert done["byDay"] == {"2026-11-22": day1, "2026-11-23": day2}
    assert done["gpuSeconds"] == day1 + day2
    assert done["usage"] == {"from": "2026-11-22T23:00:00Z", "steps": [[0, 8], [1800, 16], [9000, 0]]}
    # the report files each day's share under it (the record was written on the 23rd)
    by_day = {d["date"]: d["gpuHours"] for d in sim.records.chargeback()["byDay"]}
    assert by_day == {"2026-11-22": round(day1 / 3600, 3), "2026-11-23": round(day2 / 3600, 3)}
    assert sim.records.charged(since="2026-11-22", until="2026-11-23") == day1


async def test_a_job_across_a_period_boundary_is_split_by_period(sim: Sim) -> None:
    """Timeline 17: a period ends at 12:00 while the job runs 11:00–13:00; the record is written
    at 13:01. Each period gets the share it ran in (it was filed wholly under the later one)."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:59:00"))
    await sim.admit(job)
    await run_two_pods(sim, job, "11:00:00", "11:00:00")
    sim.at(t("13:00:00"))
    await finish_two_pods(sim, job, "13:00:00", "13:00:00", start="11:00:00", node_start="11:00:00")
    sim.at(t("13:01:00"))
    await sim.complete(job)
    before = sim.records.charged(since="2026-11-22T00:00:00Z", until="2026-11-22T12:00:00Z")
    after = sim.records.charged(since="2026-11-22T12:00:00Z", until="2026-11-23T00:00:00Z")
    assert (before, after) == (2 * 8 * 3600, 2 * 8 * 3600)
    assert sim.records.charged() == 2 * 8 * 7200


# ---------------------------------------------------------------------------- placement evidence


async def test_a_wrong_region_pod_during_an_outage_leaves_evidence(sim: Sim) -> None:
    """Timeline 18: while the controller is down the job is admitted, its launcher lands on a US node
    (outside nlp-team's eu), runs and is deleted when Kueue preempts the job. It left no evidence.
    The scheduler's Event (kept an hour) still says where it ran: the placement is recorded, judged a
    violation, and the segment says its pods' run time is unknown."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("09:30:00"))
    sim.crash()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    uid = await sim.create_pod(
        job, f"{job}-launcher-0-0-zzzzz", "launcher", "gpu-us-1", running(t("10:01:00"))
    )
    await sim.scheduled_event(f"{job}-launcher-0-0-zzzzz", uid, "gpu-us-1")
    sim.at(t("10:30:00"))
    await sim.suspend(job)
    await sim.delete_pod(f"{job}-launcher-0-0-zzzzz")
    sim.at(t("10:40:00"))
    await sim.start()
    evidence = sim.records.evidence()
    assert [
        (e["pod"], e["node"], e["region"], e["details"]["compliant"], e["details"]["source"])
        for e in evidence
    ] == [(f"{job}-launcher-0-0-zzzzz", "gpu-us-1", "us", False, "scheduling-event")]
    mismatch = [e for e in events(sim.kmock, NAMESPACE, job) if e[1] == "ResidencyMismatch"]
    assert len(mismatch) == 1 and "runs on node gpu-us-1 in region us" in mismatch[0][2]
    assert sim.records.events() == [("admitted", 1), ("suspended", 1)]
    closed = sim.records.closing()[0]
    assert (closed["gpuSeconds"], closed["basis"], closed["gpuSecondsMax"]) == (
        0.0,
        "partial",
        8 * seconds("10:00:00", "10:30:00"),
    )
    assert sim.records.chargeback()["flags"]["partial"] == 1  # not a silent 0


@pytest.mark.parametrize("selector", [True, False])
async def test_a_pod_whose_node_is_gone_is_not_a_violation(sim: Sim, selector: bool) -> None:
    """Timeline 19: the pod ran on gpu-eu-7, which is removed before the controller looks. It was
    reported as on a node with "no region label" (a false violation). Its region now comes from the
    pod's nodeSelector (the scheduler matched it), else it is recorded as unknown."""
    sim.add_node("gpu-eu-7", EU_LABELS)
    job = await sim.create_job(suspend=False)
    await sim.create_pod(
        job,
        f"{job}-node-0-0-bbbbb",
        "node",
        "gpu-eu-7",
        running(t("09:01:00")),
        node_selector={"topology.kubernetes.io/region": "eu-west-1"} if selector else None,
    )
    sim.remove_node("gpu-eu-7")
    sim.at(t("09:30:00"))
    await sim.start()
    (placed,) = sim.records.evidence()
    assert placed["node"] == "gpu-eu-7"
    if selector:
        assert (placed["region"], placed["details"]["compliant"], placed["details"]["basis"]) == (
            "eu",
            True,
            "nodeSelector",
        )
    else:
        assert (placed["region"], placed["details"]["compliant"], placed["details"]["basis"]) == (
            None,
            None,
            "unknown",
        )
        assert sim.metric("mpigate_controller_evidence_records_total", compliant="unknown") == 1
    assert [e for e in events(sim.kmock, NAMESPACE, job) if e[1] == "ResidencyMismatch"] == []
    assert sim.metric("mpigate_controller_residency_mismatches_total", team="nlp-team", region="none") == 0


async def test_a_lost_nodes_pod_is_charged_until_the_node_failed(sim: Sim) -> None:
    """Timeline 20: gpu-eu-5 stops reporting at 10:20; the node lifecycle controller marks its pod
    not ready at 10:20:40; the pod is force-deleted at 10:30 with containers still reading as
    running. Decided: charged until the node failed (the pod's Ready=False), not its deletion."""
    sim.add_node("gpu-eu-5", EU_LABELS)
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await sim.create_pod(job, f"{job}-node-0-0-bbbbb", "node", "gpu-eu-5", running(t("10:01:00")))
    sim.at(t("10:20:40"))
    sim.remove_node("gpu-eu-5")
    await sim.patch_pod(
        f"{job}-node-0-0-bbbbb",
        {
            "status": {
                "reason": "NodeLost",
                "conditions": [condition("Ready", "False", t("10:20:40"), "NodeLost")],
            }
        },
    )
    sim.at(t("10:30:00"))
    await sim.delete_pod(f"{job}-node-0-0-bbbbb")
    sim.at(t("10:31:00"))
    await sim.complete(job, failed=True)
    done = sim.records.closing()[0]
    assert done["gpuSeconds"] == 8 * seconds("10:01:00", "10:20:40") == charged(sim)
    assert done["notes"] == [
        f"pod {job}-node-0-0-bbbbb: its node was lost; charged until it turned not ready at "
        "2026-11-22T10:20:40Z"
    ]


async def test_gpus_come_from_the_resolved_demand_and_a_differing_pod_spec_is_flagged(sim: Sim) -> None:
    """Timeline 21: decided: a pod is charged the GPUs admission and quota counted (the job's
    resolved demand, 8 per node pod), not its live spec; a pod whose spec differs is named."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await sim.create_pod(job, f"{job}-node-0-0-bbbbb", "node", EU, running(t("10:01:00")), gpus=4)
    sim.at(t("10:11:00"))
    await sim.set_pod(f"{job}-node-0-0-bbbbb", finished(t("10:01:00"), t("10:11:00")))
    await sim.complete(job)
    done = sim.records.closing()[0]
    assert done["gpuSeconds"] == 8 * 600
    assert done["gpuSpecMismatch"] == [{"pod": f"{job}-node-0-0-bbbbb", "charged": 8, "spec": 4}]
    assert charged(sim) == 8 * 600 and sim.records.chargeback()["flags"]["gpuSpecMismatch"] == 1


async def test_state_annotations_a_tenant_edits_are_ignored(sim: Sim) -> None:
    """A tenant may patch their job's annotations: one that claims the job already succeeded (so that
    nothing more is charged) or rewrites a pod's start is not the controller's (its seal does not
    match), so it is ignored and said so; the controller's own record stands."""
    await sim.start()
    job = await sim.create_job()
    sim.at(t("10:00:00"))
    await sim.admit(job)
    await run_two_pods(sim, job)
    sim.crash()
    forged = (
        sim.job(job)["metadata"]["annotations"]["mpigate.io/lifecycle"] + ",succeeded@2026-11-22T10:02:00Z"
    )
    await sim.patch_job(job, {"metadata": {"annotations": {"mpigate.io/lifecycle": forged}}}, deliver=False)
    sim.at(t("10:31:30"))
    await finish_two_pods(sim, job, "10:31:00", "10:31:30")
    sim.at(t("10:32:00"))
    await sim.complete(job)
    sim.at(t("10:33:00"))
    await sim.start()
    assert [e[1] for e in events(sim.kmock, NAMESPACE, job)].count("StateTampered") == 1
    assert sim.metric("mpigate_controller_state_tampered_total", kind="TrainJob") == 1
    done = [r for r in sim.records.closing() if r["event"] == "succeeded"]
    assert done[-1]["gpuSeconds"] == 8 * seconds("10:01:00", "10:31:00") + 8 * seconds("10:01:30", "10:31:30")
    # its own annotation again, sealed
    stored = alive(sim.kmock, TJ, NAMESPACE, job)["metadata"]["annotations"]
    assert stored["mpigate.io/lifecycle"].endswith("succeeded@2026-11-22T10:32:00Z")
