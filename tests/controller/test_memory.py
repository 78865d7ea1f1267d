"""What the controller keeps between watch events (issue 25): slim records of the jobs of managed
team namespaces only, no pods of jobs that do not exist, paged listings."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import kmock as kmock_lib
import pytest
from tests.admission.test_live_pages import TJ_PATH as TRAINJOBS
from tests.admission.test_live_pages import FakeApi, api, jobs
from tests.controller.conftest import example_job
from tests.controller.test_reconciler import FlakyRecorder, client, events_of, reconciler, stored_job

from mpigate.admission.kube import LIST_RESTARTS, KubeClient, KubeError
from mpigate.config import Config
from mpigate.controller.api import ControllerApi
from mpigate.controller.kinds import TRAINJOB
from mpigate.controller.slim import is_slim, slim_pod

__all__ = ["api", "client"]  # the fixtures, shared with test_reconciler and test_live_pages

TJ_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/nlp-team/trainjobs/minimal"


def heavy(job: dict[str, Any]) -> dict[str, Any]:
    """A job as a watch delivers it: managedFields and kopf's copy of the last handled spec."""
    job = copy.deepcopy(job)
    job["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {"x": "y" * 4000}}}]
    job["metadata"].setdefault("annotations", {})["mpigate.io/last-handled-configuration"] = "z" * 4000
    return job


def a_pod(job: str, name: str, *, uid: str, namespace: str = "nlp-team") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "labels": {"jobset.sigs.k8s.io/jobset-name": job, "app": "x" * 100},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": "s" * 4000}}],
        },
        "spec": {
            "nodeName": "gpu-eu-1",
            "containers": [
                {
                    "name": "node",
                    "image": "img",
                    "env": [{"name": "E", "value": "v" * 2000}],
                    "resources": {"requests": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
        "status": {
            "startTime": "2026-11-22T09:00:00Z",
            "containerStatuses": [
                {
                    "name": "node",
                    "restartCount": 0,
                    "image": "img",
                    "imageID": "sha" * 30,
                    "state": {"running": {"startedAt": "2026-11-22T09:00:05Z"}},
                }
            ],
        },
    }


async def test_a_managed_job_is_kept_slim_and_still_reconciled(
    org: Config, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    recorder = FlakyRecorder()
    r = reconciler(org, client, recorder)
    job = stored_job(kmock, heavy(example_job("minimal", uid="u-slim")))
    await r.on_trainjob_event(None, job)
    assert events_of(recorder) == ["admitted"]
    [kept] = r.jobs
    assert is_slim(kept)
    assert "spec" not in kept and "managedFields" not in kept["metadata"]
    assert set(kept["metadata"]["annotations"]) <= {
        "mpigate.io/lifecycle",
        "mpigate.io/pods",
        "mpigate.io/evidence",
        "mpigate.io/seal",
    }
    assert kept["metadata"]["annotations"]["mpigate.io/lifecycle"].startswith("admitted@")
    assert len(repr(kept)) < len(repr(job)) / 10


async def test_jobs_outside_managed_team_namespaces_are_not_kept(
    org: Config, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    recorder = FlakyRecorder()
    r = reconciler(org, client, recorder)
    outside = example_job("minimal", uid="u-out")
    outside["metadata"]["namespace"] = "default"  # no team's
    unlabelled = example_job("cv-large", uid="u-cv")  # cv-team's namespace lacks the label
    for job in (outside, unlabelled):
        await r.on_trainjob_event(None, stored_job(kmock, job))
    assert r.jobs == []
    assert events_of(recorder) == []
    # nor the pods of such jobs
    await r.on_pod_event(None, a_pod("minimal", "minimal-node-0-0", uid="p-out", namespace="default"))
    assert r.accounts.orphans == {}


async def test_pods_of_a_jobset_without_trainjob_are_dropped_at_the_resync(
    org: Config, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    recorder = FlakyRecorder()
    r = reconciler(org, client, recorder)
    pod = a_pod("plain-jobset", "plain-jobset-w-0-0", uid="p-1")
    await r.on_pod_event(None, pod)
    await r.on_pod_event("DELETED", pod)
    [(key, kept)] = r.accounts.orphans.items()
    assert key == ("TrainJob", "nlp-team", "plain-jobset")
    kept_pod = kept["p-1"][0]
    assert "managedFields" not in kept_pod["metadata"] and "env" not in kept_pod["spec"]["containers"][0]
    r.clock = lambda: r.accounts.orphaned_at[key] + dt.timedelta(seconds=1)
    await r.resync()
    assert r.accounts.orphans == {}


async def test_a_pod_kept_before_its_job_still_charges(
    org: Config, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    """A slim pod is what :func:`observe` reads: the same facts as the whole pod."""
    from mpigate.controller.usage import observe

    pod = a_pod("minimal", "minimal-node-0-0", uid="p-2")
    whole = observe(pod, gpus=1, spec_gpus=1, role="node")
    assert observe(slim_pod(TRAINJOB, pod), gpus=1, spec_gpus=1, role="node") == whole


async def test_listing_follows_continue_tokens(
    client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    collection = "/apis/trainer.kubeflow.org/v1alpha1/trainjobs"
    kmock["get", collection, kmock_lib.params(**{"continue": "t2"})] << {"items": [{"n": 3}], "metadata": {}}
    kmock["get", collection, kmock_lib.params(**{"continue": "t1"})] << {
        "items": [{"n": 2}],
        "metadata": {"continue": "t2"},
    }
    kmock["get", collection] << {"items": [{"n": 1}], "metadata": {"continue": "t1"}}
    api = ControllerApi(client)
    seen = [page.items async for page in api.pages(collection, limit=1)]
    assert seen == [[{"n": 1}], [{"n": 2}], [{"n": 3}]]
    assert all(r.params.get("limit") == "1" for r in kmock["get", collection])


# The controller lists through the webhook's paginated LIST (KubeClient.list_pages), against a real
# server that pages and expires continue tokens as the API server does (tests/admission/test_live_pages).


async def test_the_controller_lists_in_pages_of_its_size(api: tuple[FakeApi, KubeClient]) -> None:
    fake, client = api
    fake.snapshots = [jobs(1200)]
    pages = [page async for page in ControllerApi(client).pages(TRAINJOBS)]
    assert [len(p.items) for p in pages] == [500, 500, 200]  # PAGE_SIZE, not the webhook's 100
    assert [r["limit"] for r in fake.requests] == ["500"] * 3
    assert [j["metadata"]["name"] for p in pages for j in p.items] == [f"j{i}" for i in range(1200)]
    assert not any(p.restarted for p in pages)


async def test_an_expired_continue_restarts_the_controllers_list_from_a_fresh_snapshot(
    api: tuple[FakeApi, KubeClient],
) -> None:
    """It used to give up until the next pass; now it lists the fresh snapshot, and says where."""
    fake, client = api
    fake.snapshots = [jobs(1200, "old"), jobs(700, "new")]
    fake.expire_continues = 1
    pages = [page async for page in ControllerApi(client).pages(TRAINJOBS)]
    assert [(len(p.items), p.restarted) for p in pages] == [
        (500, False),
        (0, True),
        (500, False),
        (200, False),
    ]
    after = [j["metadata"]["name"] for p in pages[2:] for j in p.items]
    assert after == [f"new{i}" for i in range(700)]


async def test_a_list_that_keeps_expiring_fails_as_an_error(api: tuple[FakeApi, KubeClient]) -> None:
    fake, client = api
    fake.snapshots = [jobs(1200)]
    fake.expire_continues = LIST_RESTARTS + 1
    with pytest.raises(KubeError) as failed:
        async for _ in ControllerApi(client).pages(TRAINJOBS):
            pass
    assert failed.value.status == 410
