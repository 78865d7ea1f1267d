"""The per-request deadline and the audit-record guarantee."""

from __future__ import annotations

import asyncio
import pickle
import time
from typing import Any

import aiohttp

from mpigate.admission.client import make_review
from mpigate.admission.recorder import MemoryRecorder, RecordError
from mpigate.admission.review import Stage
from mpigate.admission.service import ServiceSettings
from mpigate.config import Config
from mpigate.policy.decision import AdmissionInput, Decision, LiveContext

from .conftest import StartWebhook, trainjob, wait_for
from .stub_engine import HANG_SECONDS, SLEEP


class HeldRecorder(MemoryRecorder):
    """Writes each record only once the test releases it: a write that outlives any deadline."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def record(self, decision: Decision, request: AdmissionInput, stage: Stage) -> None:
        self.started.set()
        await self.release.wait()
        await super().record(decision, request, stage)


class BrokenRecorder(MemoryRecorder):
    healthy = False

    async def record(self, decision: Decision, request: AdmissionInput, stage: Stage) -> None:
        raise RecordError("disk full")


class HangingLive:
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def context(
        self, config: Config, request: AdmissionInput, timeout: float, *, quota: bool = True
    ) -> LiveContext | None:
        await asyncio.Event().wait()  # ignores its own budget: the server's bound must hold
        return None


async def timed_post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[float, int, dict[str, Any]]:
    # time.monotonic(), the server's clock for its deadline (admission/service.py), not loop.time():
    # on uvloop that is libuv's millisecond clock cached per loop iteration, which can read an answer
    # that came just after the 1 s deadline as taking a little less
    started = time.monotonic()
    async with http.post(url, json=body) as resp:
        data = await resp.json()
        return time.monotonic() - started, resp.status, data


# The deadlines below are generous and the things they cut off never finish by themselves (or only
# when released): what a test shows is *which* bound answered, not how fast a loaded machine is.


async def test_a_hanging_engine_gets_a_500_at_the_deadline(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    server = await start_webhook(settings=ServiceSettings(deadline=1.0))
    elapsed, status, body = await timed_post(
        http, server.url + "/validate", make_review(trainjob(**{SLEEP: "hang"}), uid="u")
    )
    assert status == 500, body
    assert body["message"].startswith("mpigate could not evaluate the request within its deadline")
    assert 1.0 <= elapsed < HANG_SECONDS  # the deadline answered, not the engine
    # The event loop stayed free while the engine thread was stuck.
    async with http.get(server.url + "/healthz") as resp:
        assert resp.status == 200


async def test_hanging_live_lookups_fall_back_to_static_checks_in_time(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    # The live bound (0.2 s) is the source's; this one ignores it and never returns. The server's
    # outer bound cuts it a quarter of the rest after the budget (0.2 + 19.8 / 4 = 5.15 s); the
    # request deadline (20 s) is far enough away that the static checks answer whatever the load.
    server = await start_webhook(live=HangingLive(), settings=ServiceSettings(deadline=20, live_timeout=0.2))
    elapsed, status, body = await timed_post(http, server.url + "/validate", make_review(trainjob(), uid="u"))
    assert status == 200 and 4.0 <= elapsed < 20, (elapsed, body)  # the outer bound, not 0.2 s
    assert body["response"]["allowed"] is True
    assert body["response"]["warnings"] == ["live quota context unavailable: not read within 200 ms"]


async def test_no_answer_without_a_durable_record(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    held = HeldRecorder()
    server = await start_webhook(recorder=held, settings=ServiceSettings(deadline=1.0))
    _, status, body = await timed_post(http, server.url + "/validate", make_review(trainjob(), uid="late"))
    assert status == 500, body
    assert body["message"].startswith("mpigate could not make the audit record durable within its deadline")
    assert held.started.is_set() and not held.records  # answered while the write was still held
    # The write was not torn: released, it completes after the answer.
    held.release.set()
    await wait_for(lambda: [r.request.uid for r in held.records] == ["late"], timeout=60)
    async with http.get(server.url + "/metrics") as resp:
        assert 'mpigate_deadline_exceeded_total{phase="audit"} 1.0' in await resp.text()


async def test_a_failed_record_fails_the_request(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    server = await start_webhook(recorder=BrokenRecorder())
    for path in ("/mutate", "/validate"):
        _, status, body = await timed_post(http, server.url + path, make_review(trainjob(), uid="u"))
        assert status == 500 and body["reason"] == "InternalError"
        assert body["message"].startswith("mpigate could not write the audit record (RecordError)")
    async with http.get(server.url + "/metrics") as resp:
        text = await resp.text()
    assert "mpigate_admission_audit_failures_total 2.0" in text
    async with http.get(server.url + "/readyz") as resp:
        assert resp.status == 503 and (await resp.json())["status"] == "audit trail not writable"
    assert (
        'mpigate_admission_requests_total{decision="error",endpoint="validate",'
        'kind="TrainJob",operation="CREATE"} 1.0' in text
    )


def test_service_settings_cross_to_worker_processes() -> None:
    # ``serve --workers`` pickles the settings into each spawned worker; the compiled build's
    # frozen dataclass refused to be unpickled field by field (every worker exited with 1)
    settings = ServiceSettings(deadline=1.5, live_timeout=0.25, evaluate_in_thread=True)
    assert pickle.loads(pickle.dumps(settings)) == settings
