"""The admission pipeline, transport-free: body in, answer out, within a deadline.

``decode → live context (bounded) → evaluate (engine) → record (durable) → encode``

Failure behaviour (documented in docs/webhook.md):

- malformed input: HTTP 400 when the request uid cannot be read, else a denying AdmissionReview
  with code 400 and a message that names the field;
- no config loaded yet: HTTP 503 (the API server applies the webhook's ``failurePolicy``);
- live lookups that fail or exceed their budget: judged on static config, with the warning
  ``live quota context unavailable: ...`` and a metric — except the manifest of a runtime approved
  as external, without which the engine cannot judge the job's pods: MPG-RT-003 denies it by
  default (``enforcement.overrides: {MPG-RT-003: warn}`` admits it with a warning);
- the engine failing or exceeding the deadline, or the audit record not durable in time:
  HTTP 500, so that ``failurePolicy`` applies — a decision is never answered without its record.
  A record still being written when the deadline passes is completed in the background (it then
  documents a decision the API server did not receive; the API server's own audit log shows the
  failed call).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from mpigate.config import Config
from mpigate.policy import judge, mutations
from mpigate.policy.decision import AdmissionInput, Decision, LiveContext

from .deadline import AlarmClock, DeadlineExceeded
from .live import LiveSource
from .logjson import fields, log_fields
from .metrics import Metrics
from .recorder import DecisionRecorder, NullRecorder, RecordPosition
from .reload import ConfigStore
from .review import (
    REASONS,
    BadReview,
    ReviewRequest,
    Stage,
    decision_response,
    decode_review,
    error_response,
    parse_json,
    response_review,
)
from .routes import WEBHOOK_OPERATIONS

__all__ = [
    "LIVE_UNAVAILABLE",
    "AdmissionService",
    "Evaluator",
    "Reply",
    "ServiceSettings",
    "default_evaluator",
    "default_mutator",
    "status_body",
]

log = logging.getLogger("mpigate.admission")

Evaluator = Callable[[Config, AdmissionInput, LiveContext | None, dt.datetime | None], Decision]
LIVE_UNAVAILABLE: Final = "live quota context unavailable"
# Never give the audit write less than this, even when the deadline is (nearly) used up: an
# fsync takes milliseconds, and answering 500 for want of 1 ms would be needlessly harsh.
MIN_RECORD_SECONDS: Final = 0.05


def default_evaluator() -> Evaluator:
    """The policy engine's verdict on an object as received, ``mpigate.policy.judge`` (the
    object reaching ``/validate`` has been through ``/mutate`` already)."""
    return judge


def default_mutator() -> Evaluator:
    """The engine's mutation-only entry point, ``mpigate.policy.mutations`` (the patch of
    ``evaluate`` without judging the object: ``/mutate`` never denies)."""
    return mutations


def status_body(code: int, message: str) -> dict[str, Any]:
    """A ``metav1.Status`` body for HTTP error answers."""
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": code,
        "reason": REASONS.get(code, "Unknown"),
        "message": message,
    }


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    """Time budgets of one review (seconds)."""

    deadline: float = 2.0
    live_timeout: float = 0.5
    # False: run the engine on the event loop's thread, interrupted at the deadline by SIGALRM
    # (admission/deadline.py) — a pathological object cannot hold the loop past the deadline, and
    # the GIL is not contended between the loop and a worker; off the main thread this falls back
    # to a worker thread. True: always a worker thread (the loop keeps serving while the engine
    # runs, at the price of the hand-off).
    evaluate_in_thread: bool = False

    def __reduce__(self) -> tuple[type[ServiceSettings], tuple[float, float, bool]]:
        # ``--workers`` sends the settings to each worker process: the compiled build's frozen
        # dataclass cannot be unpickled field by field (its __setattr__ refuses), so it is rebuilt.
        return ServiceSettings, (self.deadline, self.live_timeout, self.evaluate_in_thread)


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer: HTTP status and JSON body, plus what the logs and metrics need."""

    status: int
    body: dict[str, Any]
    outcome: str
    decision: Decision | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __init__(
        self,
        status: int,
        body: dict[str, Any],
        outcome: str,
        decision: Decision | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        # Written out (not generated by @dataclass): mypyc compiles it, where the generated one
        # stays interpreted (docs/building.md); one Reply per review. None: a fresh dict.
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "body", body)
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "decision", decision)
        object.__setattr__(self, "info", {} if info is None else info)


class _Failed(Exception):
    """Ends a review with HTTP ``status`` (500/503) and a clean message."""

    def __init__(self, status: int, message: str, outcome: str = "error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.outcome = outcome


class AdmissionService:
    """Judges AdmissionReviews with the served config (see the module docstring)."""

    def __init__(
        self,
        store: ConfigStore,
        *,
        evaluator: Evaluator | None = None,
        mutator: Evaluator | None = None,
        recorder: DecisionRecorder | None = None,
        live: LiveSource | None = None,
        metrics: Metrics | None = None,
        tracer: trace.Tracer | None = None,
        settings: ServiceSettings | None = None,
        executor: Executor | None = None,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self.store = store
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._evaluator = evaluator
        self._mutator = mutator
        self.recorder: DecisionRecorder = recorder or NullRecorder()
        self.live = live
        self.metrics = metrics or Metrics()
        self.tracer = tracer or trace.NoOpTracer()
        # Without tracing, spans are skipped altogether (a no-op span still costs context switches).
        self._traced = not isinstance(self.tracer, trace.NoOpTracer)
        self.settings = settings or ServiceSettings()
        self._executor = executor
        self._alarm = AlarmClock()

    def inline(self) -> bool:
        """Whether :meth:`review` never waits: no live lookups, no audit trail, no tracing, and the
        engine on the loop's own thread under its ``SIGALRM`` deadline. Its coroutine then ends in
        its first step, which a caller may take itself instead of making a task for it (the HTTP
        fast path, :mod:`.fastpath`)."""
        return (
            self.live is None
            and type(self.recorder) is NullRecorder  # a subclass may record: it waits
            and not self._traced
            and not self.settings.evaluate_in_thread
            and self._alarm.available()
        )

    @property
    def evaluator(self) -> Evaluator:
        return self._evaluator or judge

    @property
    def mutator(self) -> Evaluator:
        """What ``/mutate`` calls: the given mutator, else a given evaluator (an engine without a
        mutation-only entry point), else :func:`mpigate.policy.mutations`."""
        return self._mutator or self._evaluator or mutations

    async def review(self, stage: Stage, body: bytes, request_id: str) -> Reply:
        """Judge one request body for ``stage`` (``mutate`` or ``validate``)."""
        # time.monotonic(), not loop.time(): uvloop's is libuv's clock, in whole milliseconds and
        # read once per loop iteration (uvloop/loop.pyx Loop.time, libuv uv_now), so a review
        # answered within one iteration took 0 ms by it, and its deadline ran from a stale start
        started = time.monotonic()
        deadline = started + self.settings.deadline
        self.metrics.review_started()
        try:
            with self._span(f"admission {stage}", SpanKind.SERVER) as span:
                if self._traced:
                    span.set_attribute("mpigate.stage", stage)
                    span.set_attribute("mpigate.request_id", request_id)
                reply = await self._review(stage, body, request_id, deadline, span)
                if self._traced:
                    span.set_attribute("mpigate.decision", reply.outcome)
                    span.set_attribute("http.response.status_code", reply.status)
                    if reply.status >= 500:
                        span.set_status(Status(StatusCode.ERROR, reply.outcome))
        finally:
            self.metrics.review_ended()
        elapsed = time.monotonic() - started
        info = reply.info
        kind = info.get("kind", "-")
        operation = info.get("operation", "-")
        self.metrics.reviewed(stage, kind, operation, reply.outcome, elapsed)
        if reply.decision is not None and stage == "validate":
            self.metrics.count_rules(reply.decision)
        level = logging.INFO if reply.status < 500 else logging.ERROR
        if log.isEnabledFor(level):
            # The line's fields built once, as one dict (``fields(**info)`` built two).
            line = {
                "event": "review",
                "request_id": request_id,
                "stage": stage,
                "status": reply.status,
                "decision": reply.outcome,
                "duration_ms": round(elapsed * 1000, 3),
            }
            line.update(info)
            log_fields(
                log,
                level,
                line,
                "%s %s %s/%s: %s",
                stage,
                operation,
                info.get("namespace") or "-",
                info.get("name") or "-",
                reply.outcome,
            )
        return reply

    async def _review(self, stage: Stage, body: bytes, request_id: str, deadline: float, span: Any) -> Reply:
        data = parse_json(body)
        if isinstance(data, BadReview):
            self.metrics.bad_requests.labels(stage, "json").inc()
            return Reply(400, status_body(400, f"{data} (request id {request_id})"), "bad-request")
        req = decode_review(data)
        if isinstance(req, BadReview):
            if req.uid is None:
                self.metrics.bad_requests.labels(stage, "review").inc()
                return Reply(400, status_body(400, f"{req} (request id {request_id})"), "bad-request")
            self.metrics.bad_requests.labels(stage, "request").inc()
            message = f"mpigate cannot judge this request: {req} (request id {request_id})"
            return Reply(200, error_response(req.uid, 400, message), "invalid", info={"uid": req.uid})
        info = _info(req)
        if self._traced:
            for key in ("kind", "operation", "namespace", "name"):
                span.set_attribute(f"mpigate.{key}", info.get(key) or "")
        if req.operation not in WEBHOOK_OPERATIONS[stage]:
            if stage == "mutate":  # mutation happens on CREATE only
                return Reply(200, response_review(req.uid, allowed=True), "skipped", info=info)
            message = f"mpigate does not judge {req.operation} requests (request id {request_id})"
            return Reply(200, error_response(req.uid, 400, message), "invalid", info=info)
        loaded = self.store.current
        if loaded is None:
            reason = self.store.last_error or "not loaded yet"
            message = f"mpigate has no valid config to judge with ({reason}) (request id {request_id})"
            return Reply(503, status_body(503, message), "unavailable", info=info)
        info["revision"] = loaded.config.revision  # (LoadedConfig.revision: an interpreted property)
        try:
            reply = await self._judge(stage, req, loaded.config, deadline, info, request_id)
        except _Failed as failed:
            message = f"{failed.message} (request id {request_id})"
            return Reply(failed.status, status_body(failed.status, message), failed.outcome, info=info)
        return reply

    async def _judge(
        self,
        stage: Stage,
        req: ReviewRequest,
        config: Config,
        deadline: float,
        info: dict[str, Any],
        request_id: str,
    ) -> Reply:
        loop = asyncio.get_running_loop()
        extra_warnings: list[str] = []
        live: LiveContext | None = None
        if self.live is not None and req.operation in ("CREATE", "UPDATE"):
            # One runtime resolution for both stages and both operations: an external runtime is
            # read for /mutate (which adds mpigate's patch for its jobs) as for /validate; Kueue's
            # quota context only where MPG-Q007/Q008 use it (validate, CREATE).
            quota = stage == "validate" and req.operation == "CREATE"
            live = await self._live_context(config, req.input, deadline, quota=quota)
            if live is not None and live.unavailable_reason and stage == "validate":
                extra_warnings.append(f"{LIVE_UNAVAILABLE}: {live.unavailable_reason}")
                info["live"] = live.unavailable_reason
                self.metrics.live_fallbacks.inc()
        now = self._clock()
        with self._span("evaluate"):
            engine = self.mutator if stage == "mutate" else self.evaluator
            call = functools.partial(engine, config, req.input, live, now)
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                if self.settings.evaluate_in_thread or not self._alarm.available():
                    decision = await asyncio.wait_for(loop.run_in_executor(self._executor, call), remaining)
                else:
                    decision = self._alarm.call(call, remaining)
            except (TimeoutError, DeadlineExceeded):
                self.metrics.deadline_exceeded.labels("evaluate").inc()
                raise _Failed(500, "mpigate could not evaluate the request within its deadline") from None
            except Exception:
                log.exception("policy evaluation failed", extra=fields(request_id=request_id, **info))
                raise _Failed(500, "mpigate failed to evaluate the request (internal error)") from None
        info["rules"] = list(decision.rule_ids)
        info["team"] = decision.team
        position: RecordPosition | None = None
        with self._span("audit record"):
            if type(self.recorder) is not NullRecorder:  # nothing to wait for without a trail
                position = await self._record(decision, req.input, stage, deadline, request_id)
        # Keep the engine's own live warning if it already gave one.
        extra_warnings = [
            w for w in extra_warnings if not any(LIVE_UNAVAILABLE in d for d in decision.warnings)
        ]
        # The record's chain position travels in the answer's auditAnnotations: the API server's
        # audit log then witnesses the chain, so its newest records cannot vanish unnoticed.
        body = decision_response(
            req.uid,
            decision,
            stage,
            dry_run=req.input.dry_run,
            extra_warnings=extra_warnings,
            record=position.annotation() if position is not None else None,
        )
        if stage == "mutate":
            outcome = "mutated" if decision.patch else "unchanged"
        else:
            outcome = decision.outcome
        return Reply(200, body, outcome, decision, info)

    def close(self) -> None:
        """Release what the service holds (the ``SIGALRM`` handler of inline evaluation)."""
        if self._alarm.available():
            self._alarm.close()

    def _span(self, name: str, kind: SpanKind = SpanKind.INTERNAL) -> AbstractContextManager[Span]:
        if not self._traced:
            return _NO_SPAN
        return self.tracer.start_as_current_span(name, kind=kind)

    async def _live_context(
        self, config: Config, request: AdmissionInput, deadline: float, *, quota: bool
    ) -> LiveContext | None:
        assert self.live is not None
        # Leave at least half of what remains for evaluation and the audit write.
        remaining = max(deadline - time.monotonic(), 0.0)
        budget = min(self.settings.live_timeout, remaining / 2)
        if budget <= 0.001:
            self.metrics.deadline_exceeded.labels("live").inc()
            return LiveContext(unavailable_reason="no time left for live lookups")
        # The source bounds its own lookups by ``budget`` and says which one timed out; this outer
        # bound only covers a misbehaving source. Its margin is a quarter of what the budget leaves
        # (at least 50 ms), not a fixed 50 ms: on a busy machine the loop can wake the source's own
        # timeout later than that, and the outer bound then replaced the source's precise reason
        # ("Kueue ClusterQueue not read within 300 ms") with a generic one (a flaky test, issue 21).
        outer = budget + max(0.05, (remaining - budget) / 4)
        with self._span("live context") as span:
            try:
                context = await asyncio.wait_for(
                    self.live.context(config, request, budget, quota=quota), outer
                )
            except TimeoutError:
                self.metrics.deadline_exceeded.labels("live").inc()
                self.metrics.live_errors.labels("live", "timeout").inc()
                return LiveContext(unavailable_reason=f"not read within {budget * 1000:.0f} ms")
            except Exception as exc:
                log.exception("live context lookup failed")
                self.metrics.live_errors.labels("live", "internal").inc()
                return LiveContext(unavailable_reason=f"{type(exc).__name__}: {exc}")
            if context is not None and context.unavailable_reason:
                span.set_attribute("mpigate.live.unavailable", context.unavailable_reason)
            return context

    async def _record(
        self, decision: Decision, request: AdmissionInput, stage: Stage, deadline: float, request_id: str
    ) -> RecordPosition | None:
        remaining = max(deadline - time.monotonic(), MIN_RECORD_SECONDS)
        # Shielded: a write that outlives the deadline still completes instead of being torn.
        write = asyncio.ensure_future(self.recorder.record(decision, request, stage))
        try:
            return await asyncio.wait_for(asyncio.shield(write), remaining)
        except TimeoutError:
            self.metrics.deadline_exceeded.labels("audit").inc()
            write.add_done_callback(_log_late_record)
            raise _Failed(
                500, "mpigate could not make the audit record durable within its deadline"
            ) from None
        except Exception as exc:
            self.metrics.audit_errors.inc()
            log.error(
                "audit record not written: %s", exc, extra=fields(request_id=request_id, event="audit_error")
            )
            raise _Failed(500, f"mpigate could not write the audit record ({type(exc).__name__})") from None


_NO_SPAN: Final = contextlib.nullcontext(trace.INVALID_SPAN)


def _log_late_record(task: asyncio.Future[RecordPosition | None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("late audit record failed: %s", exc)
    else:
        log.warning("audit record completed after the deadline (the request was answered with 500)")


def _info(req: ReviewRequest) -> dict[str, Any]:
    inp = req.input
    return {
        "uid": req.uid,
        "kind": inp.kind,
        "operation": inp.operation,
        "namespace": inp.namespace,
        "name": inp.name,
        "user": inp.user.username,
        "dry_run": inp.dry_run,
    }
