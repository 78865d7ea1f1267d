"""A recorder that subclasses NullRecorder is a recorder: the service awaits its record and does not
take its reviews for ones that never wait (AdmissionService.inline, which lets the HTTP fast path
answer without a task). Both tests checked the exact NullRecorder only by isinstance before, so a
subclass that records saw nothing recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from mpigate.admission.client import make_review
from mpigate.admission.recorder import NullRecorder
from mpigate.admission.reload import ConfigStore
from mpigate.admission.review import Stage
from mpigate.admission.service import AdmissionService
from mpigate.policy.decision import AdmissionInput, Decision

from .conftest import trainjob

REPO = Path(__file__).resolve().parents[2]


class Keeping(NullRecorder):
    """Records in memory, after a real wait (as a trail's writer does)."""

    def __init__(self) -> None:
        self.kept: list[tuple[str, Stage]] = []

    async def record(self, decision: Decision, request: AdmissionInput, stage: Stage) -> None:
        await asyncio.sleep(0)
        self.kept.append((request.uid, stage))


def test_a_recording_subclass_of_nullrecorder_records_every_review() -> None:
    async def run() -> tuple[list[tuple[str, Stage]], bool, bool, int]:
        store = ConfigStore(REPO)
        await store.load_now()
        keeping = Keeping()
        service = AdmissionService(store, recorder=keeping)
        plain = AdmissionService(store, recorder=NullRecorder())
        body = orjson.dumps(make_review(trainjob(), uid="kept-1"))
        reply = await service.review("validate", body, "req-1")
        return keeping.kept, service.inline(), plain.inline(), reply.status

    kept, subclass_inline, plain_inline, status = asyncio.run(run())
    assert status == 200
    assert kept == [("kept-1", "validate")]
    assert subclass_inline is False  # its reviews wait: a task answers them
    assert plain_inline is True  # the exact NullRecorder never waits
