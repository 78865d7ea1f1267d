"""A stand-in policy engine for tests of the server's mechanics (transport, deadline, reload,
metrics). It follows the engine contract and is driven by the object's labels, so that a test
says in its fixture what the decision will be. End-to-end tests use the real engine."""

from __future__ import annotations

import datetime as dt
import threading
import time

from mpigate.config import Config
from mpigate.policy.decision import AdmissionInput, Decision, LiveContext, Violation

# Labels that steer the stub: deny, warn, sleep (seconds, or "hang": until released), raise.
DENY = "test.mpigate.io/deny"
WARN = "test.mpigate.io/warn"
SLEEP = "test.mpigate.io/sleep"
RAISE = "test.mpigate.io/raise"

# sleep "hang": the engine thread waits for RELEASE (set by the admission tests' teardown) and gives
# up after HANG_SECONDS, far beyond any deadline a test sets, so that a test can tell a bound's
# answer from the engine's without relying on how fast the machine is.
HANG_SECONDS = 120.0
RELEASE = threading.Event()


def stub_evaluate(
    config: Config, request: AdmissionInput, live: LiveContext | None = None, now: dt.datetime | None = None
) -> Decision:
    obj = request.obj or request.old_obj or {}
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get(SLEEP) == "hang":
        RELEASE.wait(HANG_SECONDS)
    elif SLEEP in labels:
        time.sleep(float(labels[SLEEP]))
    if RAISE in labels:
        raise RuntimeError("stub engine exploded")
    team = config.team_for_namespace(request.namespace) if request.namespace else None
    violations: list[Violation] = []
    warnings: list[str] = []
    if DENY in labels:
        violations.append(Violation("MPG-Q001", "enforce", "spec.trainer", f"denied because {labels[DENY]}"))
    if WARN in labels:
        violations.append(Violation("MPG-IMG-002", "warn", "spec.trainer.image", labels[WARN]))
        warnings.append(f"[MPG-IMG-002] {labels[WARN]}")
    if live is not None and live.active_jobs is not None:
        warnings.append(
            f"[MPG-Q008] live: {live.active_jobs} active jobs, in use {dict(live.gpus_in_use or {})}"
        )
    patch: tuple[dict[str, object], ...] = ()
    if request.operation == "CREATE" and "mpigate.io/team" not in labels and team is not None:
        patch = ({"op": "add", "path": "/metadata/labels/mpigate.io~1team", "value": team.name},)
        if not labels:
            patch = ({"op": "add", "path": "/metadata/labels", "value": {"mpigate.io/team": team.name}},)
    denying = [v for v in violations if v.denies]
    message = ""
    if denying:
        message = f"mpigate denied {request.kind} {request.namespace}/{request.name}:\n" + "\n".join(
            f"  [{v.rule}] {v.path}: {v.message}" for v in denying
        )
    return Decision(
        allowed=not denying,
        operation=request.operation,
        kind=request.kind,
        namespace=request.namespace,
        name=request.name,
        team=team.name if team else None,
        revision=config.revision,
        violations=tuple(violations),
        warnings=tuple(warnings),
        patch=patch,
        message=message,
    )
