"""Inline evaluation under a SIGALRM deadline (admission/deadline.py), and where the server runs the
engine: on the event loop's thread when it is the main thread, in a worker thread otherwise or when
told to. /mutate calls the mutation-only entry point."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import aiohttp
import pytest

from mpigate.admission.client import make_review
from mpigate.admission.deadline import AlarmClock, DeadlineExceeded
from mpigate.admission.service import ServiceSettings
from mpigate.config import Config
from mpigate.policy.decision import AdmissionInput, Decision, LiveContext

from .conftest import StartWebhook, trainjob
from .stub_engine import SLEEP, stub_evaluate


def test_a_call_within_its_deadline_returns_its_value() -> None:
    clock = AlarmClock()
    try:
        assert clock.call(lambda: 42, 5.0) == 42
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # the timer is cleared
    finally:
        clock.close()


def test_python_code_past_its_deadline_is_interrupted_even_inside_except_exception() -> None:
    clock = AlarmClock()

    def stubborn() -> str:
        # Like the engine's fail-safe guards: a BaseException must get through them.
        for _ in range(10**9):
            try:
                time.sleep(0.01)
            except Exception:  # the point of the test
                return "swallowed"
        return "finished"

    try:
        with pytest.raises(DeadlineExceeded):
            clock.call(stubborn, 0.05)
        with pytest.raises(DeadlineExceeded):
            clock.call(lambda: sum(1 for _ in range(10**10)), 0.05)
        # the clock is reusable, and a stray alarm after a call returned is ignored
        assert clock.call(lambda: "again", 5.0) == "again"
        clock._on_alarm(signal.SIGALRM, None)
    finally:
        clock.close()


def test_close_puts_the_previous_handler_back() -> None:
    def mine(signum: int, frame: Any) -> None:
        raise AssertionError("not expected to fire")

    previous = signal.signal(signal.SIGALRM, mine)
    try:
        clock = AlarmClock()
        clock.call(lambda: None, 5.0)
        assert signal.getsignal(signal.SIGALRM) != mine
        clock.close()
        assert signal.getsignal(signal.SIGALRM) == mine
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_the_alarm_is_only_available_on_the_main_thread() -> None:
    clock = AlarmClock()
    assert clock.available()
    seen: list[bool] = []
    made: list[AlarmClock] = []

    def on_a_thread() -> None:
        made.append(AlarmClock())  # made on another thread, as a server on a thread of its own
        seen.extend((clock.available(), made[0].available()))

    worker = threading.Thread(target=on_a_thread)
    worker.start()
    worker.join()
    assert seen == [False, False] and made[0].available()


class Recording:
    """An engine that notes which thread ran it and as what."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def evaluate(
        self, config: Config, request: AdmissionInput, live: LiveContext | None = None, now: Any = None
    ) -> Decision:
        self.calls.append(("evaluate", threading.current_thread().name))
        return stub_evaluate(config, request, live, now)

    def mutate(
        self, config: Config, request: AdmissionInput, live: LiveContext | None = None, now: Any = None
    ) -> Decision:
        self.calls.append(("mutate", threading.current_thread().name))
        return stub_evaluate(config, request, live, now)


@pytest.mark.parametrize("in_thread", [False, True])
async def test_where_the_engine_runs(
    start_webhook: StartWebhook, http: aiohttp.ClientSession, in_thread: bool
) -> None:
    engine = Recording()
    server = await start_webhook(
        evaluator=engine.evaluate,
        mutator=engine.mutate,
        settings=ServiceSettings(deadline=30.0, evaluate_in_thread=in_thread),
    )
    for path in ("/mutate", "/validate"):
        async with http.post(server.url + path, json=make_review(trainjob(), uid="u")) as resp:
            assert resp.status == 200
    main = threading.main_thread().name
    assert [stage for stage, _ in engine.calls] == ["mutate", "evaluate"]
    assert all((name == main) != in_thread for _, name in engine.calls), engine.calls
    assert all(name.startswith("mpigate-eval") for _, name in engine.calls) == in_thread


async def test_an_inline_engine_past_the_deadline_gets_a_500_and_the_server_goes_on(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    server = await start_webhook(settings=ServiceSettings(deadline=1.0))
    async with http.post(
        server.url + "/validate", json=make_review(trainjob(**{SLEEP: "hang"}), uid="u")
    ) as resp:
        body = await resp.json()
    # answered at the deadline, not when the engine's wait (120 s) ended
    assert resp.status == 500
    assert body["message"].startswith("mpigate could not evaluate the request within its deadline")
    assert server.metrics.deadline_exceeded.labels("evaluate")._value.get() == 1
    async with http.post(server.url + "/validate", json=make_review(trainjob(), uid="v")) as resp:
        assert resp.status == 200 and (await resp.json())["response"]["allowed"] is True
