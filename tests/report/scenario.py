"""A small audit trail with known contents, written by the real writer and record builders.

Three days (2026-11-20..22, UTC), two teams (nlp-team in eu, cv-team in us), two webhook chains
and a controller chain. The numbers the tests expect are the constants at the bottom; the comments
next to each record say what it contributes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from mpigate.audit import (
    AuditLog,
    Signer,
    WriterOptions,
    config_record,
    evidence_record,
    lifecycle_record,
    record_from_decision,
)
from mpigate.catalogue import rule
from mpigate.config import Config, load
from mpigate.config.model import Enforcement
from mpigate.policy.decision import (
    AdmissionInput,
    AppliedException,
    Decision,
    Demand,
    JobDemand,
    UserInfo,
    Violation,
)

REPO = Path(__file__).resolve().parents[2]
REVISION = "9fb03e4c1d2a"
# The trails here run on a fake clock; the writer's age checkpoint waits on the real (monotonic)
# one, so a machine that stalls for checkpointInterval (10 s) while a trail is written would add
# a checkpoint the expected counts do not have: no age checkpoint in a fixture trail.
FIXTURE_WRITER = WriterOptions(checkpoint_interval_seconds=24 * 3600.0)
IMAGES = {"eu": ("ghcr.io/acme/llm@sha256:" + "a" * 64,), "us": ("ghcr.io/acme/vision:2.1",)}

MARIA = UserInfo("maria", ("nlp-team-scientists", "system:authenticated"))
BOB = UserInfo("bob", ("cv-team-scientists", "system:authenticated"))
CI_BOT = UserInfo("system:serviceaccount:nlp-team:ci", ("system:serviceaccounts",))
HOSTPATH_EXCEPTION = AppliedException(
    name="nlp-hostpath-scratch",
    rules=("MPG-SEC-HOSTPATHVOLUMES",),
    approver="ciso@example.com",
    ticket="SEC-1234",
    expires=dt.date(2026, 12, 31),
    justification="local NVMe scratch for checkpoints until the CSI driver lands",
)
EXPIRED_EXCEPTION = AppliedException(
    name="nlp-labels-grace",
    rules=("MPG-LIFE-002",),
    approver="platform-lead@example.com",
    ticket="PLAT-77",
    expires=dt.date(2026, 11, 21),
    justification="migration of cost-center labels",
)


def violation(rule_id: str, mode: str, message: str, waived_by: str | None = None) -> Violation:
    return Violation(
        rule=rule_id,
        mode=mode,  # type: ignore[arg-type]
        path="spec.trainer",
        message=message,
        controls=rule(rule_id).controls,
        waived_by=waived_by,
    )


def demand(gpus: int, region: str) -> Demand:
    pods = gpus // 8 or 1
    job = JobDemand("node", pods, {"nvidia.com/gpu": min(gpus, 8)}, None, None, images=IMAGES[region])
    return Demand(pods=pods, gpus={"nvidia.com/gpu": gpus}, cpu=None, memory=None, jobs=(job,), region=region)


@cache
def scenario_config() -> Config:
    """The example org at the scenario's revision, with MPG-SEC-RUNASNONROOT in warn mode (as the
    warning on 2026-11-21 shows)."""
    config = load(REPO, revision=REVISION)
    enforcement = Enforcement.build(
        config.org.enforcement.default, {**config.org.enforcement.overrides, "MPG-SEC-RUNASNONROOT": "warn"}
    )
    return dataclasses.replace(config, org=dataclasses.replace(config.org, enforcement=enforcement))


def decision_record(
    operation: str,
    team: str,
    name: str,
    user: UserInfo,
    violations: tuple[Violation, ...] = (),
    exceptions: tuple[AppliedException, ...] = (),
    region: str = "eu",
    gpus: int = 8,
    stage: str = "validate",
    kind: str = "TrainJob",
) -> dict[str, Any]:
    denying = [v for v in violations if v.denies]
    warnings = tuple(f"{v.rule}: {v.message}" for v in violations if v.mode == "warn")
    decision = Decision(
        allowed=not denying,
        operation=operation,  # type: ignore[arg-type]
        kind=kind,
        namespace=team,
        name=name,
        team=team,
        revision=REVISION,
        violations=violations,
        warnings=warnings,
        patch=({"op": "add", "path": "/metadata/labels/mpigate.io~1team", "value": team},)
        if stage == "mutate"
        else (),
        exceptions=exceptions,
        demand=demand(gpus, region) if operation != "DELETE" else None,
        message="; ".join(f"{v.rule}: {v.message}" for v in denying),
    )
    request = AdmissionInput(operation=operation, kind=kind, namespace=team, name=name, obj={}, user=user)  # type: ignore[arg-type]
    return record_from_decision(decision, request, stage, "webhook")  # type: ignore[arg-type]


@dataclass
class Clock:
    now: dt.datetime = field(default_factory=lambda: dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.UTC))

    def __call__(self) -> dt.datetime:
        return self.now

    def at(self, text: str) -> Clock:
        self.now = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        return self


@contextmanager
def open_log(root: Path, chain: str, signer: Signer | None, clock: Clock, source: str) -> Iterator[AuditLog]:
    log = AuditLog.open(root, chain=chain, source=source, signer=signer, clock=clock, options=FIXTURE_WRITER)
    try:
        yield log
    finally:
        log.close()


Q001 = "the job asks for 32 GPUs; nlp-team may use at most 16 (nominal 16)"
Q001_CI = "the job asks for 24 GPUs; nlp-team may use at most 16 (nominal 16)"
PRIVILEGED = "container launcher is privileged"
IMG002 = "image ghcr.io/acme/vision:latest uses the :latest tag"
NONROOT = "pod does not set runAsNonRoot: true"
SCRIPT_MESSAGE = 'runAsNonRoot missing <script>alert("x")</script>'


def write_scenario(root: Path, signer: Signer | None) -> None:
    """Write the three chains under ``root`` (an audit directory)."""
    clock = Clock()
    with open_log(root, "webhook-0", signer, clock, "webhook") as log:
        # each webhook records the revision it serves when it starts
        log.append(config_record(scenario_config()))
        # 2026-11-20: three allowed creates, one Q001 denial (nlp); a double denial (cv)
        for i in (1, 2, 3):
            log.append(decision_record("CREATE", "nlp-team", f"llm-ft-{i}", MARIA))
            clock.at(f"2026-11-20T09:0{i}:00Z")
        log.append(
            decision_record(
                "CREATE", "nlp-team", "big-job", MARIA, (violation("MPG-Q001", "enforce", Q001),), gpus=32
            )
        )
        clock.at("2026-11-20T10:00:00Z")
        log.append(
            decision_record(
                "CREATE",
                "cv-team",
                "vision-1",
                BOB,
                (
                    violation("MPG-SEC-PRIVILEGED", "enforce", PRIVILEGED),
                    violation("MPG-IMG-002", "enforce", IMG002),
                ),
                region="us",
            )
        )
        # 2026-11-21: a warning (cv, runAsNonRoot in warn mode, message with markup)
        clock.at("2026-11-21T08:00:00Z")
        log.append(
            decision_record(
                "CREATE",
                "cv-team",
                "vision-2",
                BOB,
                (violation("MPG-SEC-RUNASNONROOT", "warn", SCRIPT_MESSAGE),),
                region="us",
            )
        )
    with open_log(root, "webhook-1", signer, clock, "webhook") as log:
        # 2026-11-21: a hostPath volume waived by an exception (+ its mutate record); a delete
        clock.at("2026-11-21T08:59:00Z")
        log.append(config_record(scenario_config()))
        clock.at("2026-11-21T09:00:00Z")
        log.append(decision_record("CREATE", "nlp-team", "llm-ft-4", MARIA, stage="mutate"))
        clock.at("2026-11-21T09:00:01Z")
        log.append(
            decision_record(
                "CREATE",
                "nlp-team",
                "llm-ft-4",
                MARIA,
                (
                    violation(
                        "MPG-SEC-HOSTPATHVOLUMES", "enforce", "hostPath /scratch", HOSTPATH_EXCEPTION.name
                    ),
                ),
                (HOSTPATH_EXCEPTION,),
            )
        )
        clock.at("2026-11-21T18:00:00Z")
        log.append(decision_record("DELETE", "nlp-team", "llm-ft-1", MARIA))
        # 2026-11-22: the CI service account is denied; an expired exception is still applied
        clock.at("2026-11-22T07:30:00Z")
        log.append(
            decision_record(
                "CREATE",
                "nlp-team",
                "llm-ft-5",
                CI_BOT,
                (violation("MPG-Q001", "enforce", Q001_CI),),
                gpus=24,
            )
        )
        clock.at("2026-11-22T08:00:00Z")
        log.append(
            decision_record(
                "CREATE",
                "nlp-team",
                "llm-ft-6",
                MARIA,
                (
                    violation(
                        "MPG-LIFE-002",
                        "enforce",
                        "label mpigate.io/cost-center missing",
                        EXPIRED_EXCEPTION.name,
                    ),
                ),
                (EXPIRED_EXCEPTION,),
            )
        )
    clock.at("2026-11-20T09:29:00Z")
    with open_log(root, "controller-0", signer, clock, "controller") as log:
        # llm-ft-1 (nlp-team, cost center cc-nlp): two pods placed in eu; as the controller writes it
        # (docs/controller.md): started carries nothing, succeeded closes the run segment with its
        # 7200 GPU-seconds, deleted after that closes nothing (0)
        cc = {"mpigate.io/cost-center": "cc-nlp"}
        job1 = {
            "namespace": "nlp-team",
            "name": "llm-ft-1",
            "team": "nlp-team",
            "uid": "u1",
            "gpus": 8,
            "labels": cc,
        }
        clock.at("2026-11-20T09:30:00Z")
        log.append(lifecycle_record("started", **job1))  # type: ignore[arg-type]
        for pod, node in (("llm-ft-1-node-0", "gpu-eu-1"), ("llm-ft-1-node-1", "gpu-eu-2")):
            log.append(
                evidence_record(
                    "placement",
                    namespace="nlp-team",
                    name="llm-ft-1",
                    team="nlp-team",
                    pod=pod,
                    node=node,
                    region="eu",
                )
            )
        # vision-2 (cv-team, region us) had a pod placed in eu
        clock.at("2026-11-21T08:05:00Z")
        log.append(
            evidence_record(
                "placement",
                namespace="cv-team",
                name="vision-2",
                team="cv-team",
                pod="vision-2-node-0",
                node="gpu-eu-7",
                region="eu",
            )
        )
        clock.at("2026-11-21T17:00:00Z")
        log.append(lifecycle_record("succeeded", gpu_seconds=7200, **job1))  # type: ignore[arg-type]
        clock.at("2026-11-21T18:00:01Z")
        log.append(lifecycle_record("deleted", gpu_seconds=0.0, **job1))  # type: ignore[arg-type]
        # vision-2: 3 GPU-hours, no cost center
        clock.at("2026-11-22T08:05:00Z")
        log.append(
            lifecycle_record(
                "succeeded",
                namespace="cv-team",
                name="vision-2",
                team="cv-team",
                uid="u2",
                gpus=4,
                gpu_seconds=10800,
            )
        )


# What the scenario holds (validate records only for decisions).
DECISIONS = {"allowed": 6, "allowed-with-warnings": 1, "denied": 3}
DECISIONS_BY_DAY = {
    "2026-11-20": {"allowed": 3, "allowed-with-warnings": 0, "denied": 2},
    "2026-11-21": {"allowed": 2, "allowed-with-warnings": 1, "denied": 0},
    "2026-11-22": {"allowed": 1, "allowed-with-warnings": 0, "denied": 1},
}
DENIALS_BY_RULE = {"MPG-Q001": 2, "MPG-SEC-PRIVILEGED": 1, "MPG-IMG-002": 1}
GPU_HOURS = {"nlp-team": 2.0, "cv-team": 3.0}
