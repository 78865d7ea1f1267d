"""The Reconciler without kopf (against kmock): exactly one record per transition when the audit
trail or the API fails in between, and the namespace-label gate."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Mapping
from typing import Any

import kmock as kmock_lib
import pytest
import pytest_asyncio
from tests.controller.conftest import example_job
from tests.controller.kube import TJ, alive, declare

from mpigate.admission.kube import KubeClient, KubeConfig
from mpigate.audit import AuditWriteError
from mpigate.config import Config
from mpigate.controller.api import ControllerApi
from mpigate.controller.events import EventPoster
from mpigate.controller.metrics import ControllerMetrics
from mpigate.controller.reconciler import Reconciler

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


class FlakyRecorder:
    """Keeps records in memory; fails the appends it is told to fail."""

    def __init__(self) -> None:
        self.records: list[Mapping[str, Any]] = []
        self.fail_next = 0

    async def append(self, entry: Mapping[str, Any]) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise AuditWriteError("disk full", "ENOSPC")
        self.records.append(entry)

    @property
    def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        return None


@pytest_asyncio.fixture
async def client(kmock: kmock_lib.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    declare(kmock)
    c = KubeClient(KubeConfig(server=str(kmock.url).rstrip("/")))
    yield c
    await c.close()


def reconciler(org: Config, client: KubeClient, recorder: FlakyRecorder, **kw: Any) -> Reconciler:
    api = ControllerApi(client)
    metrics = ControllerMetrics()
    return Reconciler(
        config=lambda: org,
        api=api,
        recorder=recorder,
        metrics=metrics,
        events=EventPoster(api, metrics, "test"),
        clock=lambda: NOW,
        **kw,
    )


def stored_job(kmock: kmock_lib.KubernetesEmulator, job: dict[str, Any]) -> dict[str, Any]:
    kmock.objects[TJ, job["metadata"]["namespace"], job["metadata"]["name"]] = job
    return job


def events_of(recorder: FlakyRecorder) -> list[str]:
    return [r["lifecycle"]["event"] for r in recorder.records if r["stage"] == "lifecycle"]


async def test_a_failed_audit_write_is_retried_and_recorded_once(
    org: Config, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    recorder = FlakyRecorder()
    r = reconciler(org, client, recorder)
    job = stored_job(kmock, example_job("minimal", uid="u-1"))
    job["metadata"]["creationTimestamp"] = "2026-11-22T09:00:00Z"
    recorder.fail_next = 1
    with pytest.raises(AuditWriteError):
        await r.on_trainjob_event(None, job)
    assert (
        r.metrics.registry.get_sample_value(
            "mpigate_controller_errors_total", {"kind": "lifecycle", "reason": "audit"}
        )
        == 1
    )
    assert "mpigate.io/lifecycle" not in (
        alive(kmock, TJ, "nlp-team", "minimal")["metadata"].get("annotations") or {}
    )
    # the same (stale) object again, twice: one record, then the annotation
    await r.on_trainjob_event("MODIFIED", job)
    await r.on_trainjob_event("MODIFIED", job)
    assert events_of(recorder) == ["admitted"]
    stored = alive(kmock, TJ, "nlp-team", "minimal")
    assert stored["metadata"]["annotations"]["mpigate.io/lifecycle"] == "admitted@2026-11-22T09:00:00Z"


async def test_a_failed_annotation_patch_does_not_repeat_the_record(
    org: Config, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    recorder = FlakyRecorder()
    r = reconciler(org, client, recorder)
    job = stored_job(kmock, example_job("minimal", uid="u-2"))
    kmock["patch", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/nlp-team/trainjobs/minimal"][:1] << 503
    with pytest.raises(Exception, match="HTTP 503"):
        await r.on_trainjob_event(None, job)
    assert events_of(recorder) == ["admitted"]
    await r.on_trainjob_event("MODIFIED", job)  # the annotation still lacks it: memory knows
    assert events_of(recorder) == ["admitted"]
    assert alive(kmock, TJ, "nlp-team", "minimal")["metadata"]["annotations"][
        "mpigate.io/lifecycle"
    ].startswith("admitted@")


async def test_a_deletion_that_could_not_be_recorded_is_retried_by_the_resync(
    org: Config, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    recorder = FlakyRecorder()
    r = reconciler(org, client, recorder)
    job = stored_job(kmock, example_job("minimal", uid="u-3"))
    await r.on_trainjob_event(None, job)
    recorder.fail_next = 1
    with pytest.raises(AuditWriteError):
        await r.on_trainjob_event("DELETED", job)
    assert r.jobs == []  # no policy repairs for a deleted job
    assert await r.resync() == (0, 0)
    assert events_of(recorder) == ["admitted", "deleted"]
    await r.on_trainjob_event("DELETED", job)  # re-delivered
    assert events_of(recorder) == ["admitted", "deleted"]


@pytest.mark.parametrize(("label", "managed"), [("mpigate.io/team", False), (None, True)])
async def test_namespace_label_gate(
    org: Config, client: KubeClient, kmock: kmock_lib.KubernetesEmulator, label: str | None, managed: bool
) -> None:
    """cv-team's namespace lacks the label in the fake cluster: skipped unless the gate is off."""
    recorder = FlakyRecorder()
    r = reconciler(org, client, recorder, namespace_label=label)
    job = stored_job(kmock, example_job("cv-large", uid="u-4"))
    assert await r.ensure_network_policy(job) == ("created" if managed else "skipped")
    await r.on_trainjob_event(None, job)
    assert events_of(recorder) == (["admitted"] if managed else [])
