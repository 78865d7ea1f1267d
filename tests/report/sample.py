"""A seeded, realistic audit trail of any size: four teams over two weeks, written by the real
writer from entries the real record builders made, plus the matching API-server audit log.

Used for docs/img/report.png (``make report-screenshot``), benchmarks/report.py and the scale test.
Entries come from a pool built once with :func:`record_from_decision` & co.; each job copies one
and renames it, so that a million records take seconds to produce rather than minutes.
"""

from __future__ import annotations

import datetime as dt
import heapq
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpigate.audit import AuditLog, Signer, config_record, evidence_record, lifecycle_record
from mpigate.policy.decision import AppliedException, UserInfo

from .scenario import FIXTURE_WRITER, decision_record, scenario_config, violation

START = dt.datetime(2026, 11, 16, tzinfo=dt.UTC)


@dataclass(frozen=True)
class TeamProfile:
    name: str
    region: str
    cost_center: str | None
    users: tuple[str, ...]
    weight: int


TEAMS = (
    TeamProfile("nlp-team", "eu", "cc-1001", ("maria", "li", "system:serviceaccount:nlp-team:pipeline"), 5),
    TeamProfile("cv-team", "us", "cc-2002", ("bob", "ana", "system:serviceaccount:cv-team:ci"), 3),
    TeamProfile("speech-team", "eu", "cc-3003", ("oskar", "system:serviceaccount:speech-team:argo"), 2),
    TeamProfile("rl-team", "us", None, ("kim",), 1),
)
EXCEPTION = AppliedException(
    name="speech-hostpath-cache",
    rules=("MPG-SEC-HOSTPATHVOLUMES",),
    approver="security@example.com",
    ticket="SEC-2211",
    expires=dt.date(2027, 1, 31),
    justification="read-only model cache on local NVMe",
)
# (weight, rule, mode, message) of what goes wrong with a job
DENIALS = (
    (40, "MPG-Q001", "enforce", "the job asks for 64 GPUs; the team may use at most 32"),
    (18, "MPG-IMG-002", "enforce", "image registry.example.com/train:latest uses the :latest tag"),
    (14, "MPG-SEC-PRIVILEGED", "enforce", "container launcher is privileged"),
    (
        10,
        "MPG-RES-002",
        "enforce",
        "nodeSelector topology.kubernetes.io/region=us-east-1 targets another region",
    ),
    (8, "MPG-SEC-HOSTPATHVOLUMES", "enforce", "volume scratch is a hostPath (/mnt/nvme)"),
    (
        6,
        "MPG-SEC-SECRETS",
        "enforce",
        "env HF_TOKEN has a literal credential-looking value; use secretKeyRef",
    ),
    (4, "MPG-SA-001", "enforce", "service account default-admin does not belong to the team"),
)
WARNINGS = (
    (6, "MPG-SEC-RUNASNONROOT", "warn", "pod does not set runAsNonRoot: true"),
    (4, "MPG-Q004", "warn", "slotsPerWorker 4 differs from 8 GPUs per pod"),
)


def _pick(rng: random.Random, table: tuple[tuple[int, str, str, str], ...]) -> tuple[str, str, str]:
    weights = [row[0] for row in table]
    _, rule_id, mode, message = rng.choices(table, weights=weights)[0]
    return rule_id, mode, message


def _user(name: str, team: str) -> UserInfo:
    if name.startswith("system:serviceaccount:"):
        return UserInfo(name, ("system:serviceaccounts", f"system:serviceaccounts:{team}"))
    return UserInfo(name, (f"{team}-scientists", "system:authenticated"))


@dataclass(frozen=True)
class Job:
    index: int
    team: TeamProfile
    user: str
    name: str
    time: dt.datetime
    outcome: str  # allowed | warned | denied
    rule: tuple[str, str, str] | None
    excepted: bool
    gpus: int
    hours: float
    pods: int
    deleted: bool


def jobs(count: int, days: int, seed: int) -> Iterator[Job]:
    """``count`` jobs spread over ``days`` days, in time order."""
    rng = random.Random(seed)
    span = days * 86400
    teams = [t for t in TEAMS for _ in range(t.weight)]
    for i in range(count):
        team = rng.choice(teams)
        roll = rng.random()
        if roll < 0.12:
            outcome, rule = "denied", _pick(rng, DENIALS)
        elif roll < 0.20:
            outcome, rule = "warned", _pick(rng, WARNINGS)
        else:
            outcome, rule = "allowed", None
        excepted = team.name == "speech-team" and outcome == "allowed" and rng.random() < 0.15
        gpus = rng.choice((8, 8, 16, 16, 32))
        yield Job(
            index=i,
            team=team,
            user=rng.choice(team.users),
            name=f"{team.name.split('-')[0]}-{i:07d}",
            time=START + dt.timedelta(seconds=span * i / max(count, 1) + rng.random()),
            outcome=outcome,
            rule=rule,
            excepted=excepted,
            gpus=gpus,
            hours=round(rng.uniform(0.2, 6.0), 2),
            pods=gpus // 8,
            deleted=True,  # TTL after finishing: finished jobs do not stay stored for ever
        )


def _admission(job: Job) -> tuple[dict[str, Any], dict[str, Any]]:
    user = _user(job.user, job.team.name)
    violations = ()
    exceptions: tuple[AppliedException, ...] = ()
    if job.rule is not None:
        violations = (violation(*job.rule),)
    elif job.excepted:
        violations = (
            violation("MPG-SEC-HOSTPATHVOLUMES", "enforce", "volume cache is a hostPath", EXCEPTION.name),
        )
        exceptions = (EXCEPTION,)
    common = {
        "team": job.team.name,
        "name": job.name,
        "user": user,
        "region": job.team.region,
        "gpus": job.gpus,
    }
    mutate = decision_record("CREATE", stage="mutate", **common)  # type: ignore[arg-type]
    validate = decision_record("CREATE", violations=violations, exceptions=exceptions, **common)  # type: ignore[arg-type]
    return mutate, validate


def _placements(job: Job, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for pod in range(job.pods):
        # one placement in 400 lands in the other region (what the controller must catch)
        region = job.team.region if rng.random() > 1 / 400 else ("us" if job.team.region == "eu" else "eu")
        out.append(
            evidence_record(
                "placement",
                namespace=job.team.name,
                name=job.name,
                team=job.team.name,
                pod=f"{job.name}-node-{pod}",
                node=f"gpu-{region}-{rng.randrange(1, 40):02d}",
                region=region,
                details={"expectedRegions": [job.team.region], "compliant": region == job.team.region},
            )
        )
    return out


class _Timeline:
    """Writes entries in time order. The writer stamps a record when it commits, so entries wait
    in a heap until the generator's time passes them; then the clock is set and they are written
    (``batch`` > 1: submitted together, sharing the batch's last time — one fsync per batch)."""

    def __init__(self, root: Path, chain: str, signer: Signer | None, source: str, batch: int) -> None:
        self.now = START
        self.log = AuditLog.open(
            root, chain=chain, source=source, signer=signer, clock=lambda: self.now, options=FIXTURE_WRITER
        )
        self.batch = batch
        self.heap: list[tuple[dt.datetime, int, dict[str, Any], int | None]] = []
        self.counter = 0
        self.positions: dict[int, str] = {}  # token -> "<chain>:<seq>:<hash>" once written

    def add(self, when: dt.datetime, entry: dict[str, Any], token: int | None = None) -> None:
        """Queue an entry; with a ``token``, remember where it was written (``positions``)."""
        heapq.heappush(self.heap, (when, self.counter, entry, token))
        self.counter += 1

    def advance(self, until: dt.datetime | None) -> None:
        ready: list[tuple[dt.datetime, int, dict[str, Any], int | None]] = []
        while self.heap and (until is None or self.heap[0][0] <= until):
            ready.append(heapq.heappop(self.heap))
            if len(ready) >= self.batch:
                self._write(ready)
                ready = []
        self._write(ready)

    def _write(self, items: list[tuple[dt.datetime, int, dict[str, Any], int | None]]) -> None:
        if not items:
            return
        if self.batch == 1:
            for when, _, entry, token in items:
                self.now = max(self.now, when)
                self._remember(token, self.log.append(entry))
            return
        self.now = max(self.now, items[-1][0])
        futures = [(self.log.submit(entry), token) for _, _, entry, token in items]
        for future, token in futures:
            self._remember(token, future.result())

    def _remember(self, token: int | None, written: Any) -> None:
        if token is not None:
            self.positions[token] = f"{written.chain}:{written.seq}:{written.hash}"

    def close(self) -> None:
        self.advance(None)
        self.log.close()


def write_sample(
    root: Path,
    signer: Signer | None,
    *,
    jobs_count: int = 400,
    days: int = 14,
    seed: int = 7,
    batch: int = 1,
    k8s: bool = True,
) -> tuple[Path, Path]:
    """Write chains under ``root/audit`` (two webhook replicas and a controller) and the API
    server's log to ``root/kube-apiserver-audit.log``. About 8 records per job. ``batch`` > 1
    trades exact record times for speed (records of a batch share the last one's time). Each
    webhook records the config revision it serves first; the API server's events carry the chain
    positions of the webhooks' records (``<webhook>/record``), as the webhooks annotate them."""
    audit = root / "audit"
    rng = random.Random(seed + 1)
    webhooks = [_Timeline(audit, f"mpigate-webhook-{i}", signer, "webhook", batch) for i in (0, 1)]
    controller = _Timeline(audit, "mpigate-controller-0", signer, "controller", batch)
    k8s_path = root / "kube-apiserver-audit.log"
    pool: dict[tuple[Any, ...], tuple[dict[str, Any], dict[str, Any]]] = {}
    lifecycle_pool: dict[tuple[str, str], dict[str, Any]] = {}
    config = config_record(scenario_config())
    for webhook in webhooks:
        webhook.add(START, config)
    # (job, verb, time, chain, mutate token, validate token): the API server's events, written
    # once their records are (they carry the records' chain positions)
    requests: list[tuple[Job, str, dt.datetime, _Timeline, int | None, int]] = []
    token = 0
    for job in jobs(jobs_count, days, seed):
        key = (job.team.name, job.user, job.outcome, job.rule, job.excepted, job.gpus)
        if key not in pool:
            pool[key] = _admission(job)
        mutate_t, validate_t = pool[key]
        chain = webhooks[job.index % 2]
        mutate = {**mutate_t, "object": {**mutate_t["object"], "name": job.name}}
        validate = {**validate_t, "object": {**validate_t["object"], "name": job.name}}
        chain.add(job.time, mutate, token)
        chain.add(job.time + dt.timedelta(milliseconds=5), validate, token + 1)
        if k8s:
            requests.append((job, "create", job.time, chain, token, token + 1))
        token += 2
        if job.outcome == "denied":
            chain.advance(job.time)
            continue
        started = job.time + dt.timedelta(minutes=rng.uniform(1, 30))
        finished = started + dt.timedelta(hours=job.hours)
        gpu_seconds = round(job.gpus * job.hours * 3600, 1)
        ident = {
            "namespace": job.team.name,
            "name": job.name,
            "team": job.team.name,
            "uid": f"uid-{job.index}",
            "gpus": job.gpus,
        }
        labels = {"mpigate.io/cost-center": job.team.cost_center} if job.team.cost_center else None
        ckey = (job.team.name, str(job.gpus))
        if ckey not in lifecycle_pool:
            lifecycle_pool[ckey] = lifecycle_record("started", labels=labels, **ident)  # type: ignore[arg-type]
        base = lifecycle_pool[ckey]
        obj = {**base["object"], "name": job.name}

        uid = f"uid-{job.index}"

        def life(
            event: str,
            seconds: float,
            base: dict[str, Any] = base,
            obj: dict[str, Any] = obj,
            uid: str = uid,
        ) -> dict[str, Any]:
            lifecycle = {**base["lifecycle"], "event": event, "gpuSeconds": seconds, "uid": uid}
            return {**base, "object": obj, "lifecycle": lifecycle}

        # as the controller writes them: succeeded closes the run segment with its GPU-seconds,
        # the deletion after it closes nothing
        controller.add(started, life("started", None))
        for placement in _placements(job, rng):
            controller.add(started, placement)
        controller.add(finished, life("succeeded", gpu_seconds))
        if job.deleted:
            deleted = finished + dt.timedelta(minutes=rng.uniform(5, 120))
            controller.add(deleted, life("deleted", 0.0))
            chain.add(
                deleted,
                {
                    **validate_t,
                    "request": {**validate_t["request"], "operation": "DELETE"},
                    "object": {**validate_t["object"], "name": job.name},
                    "violations": [],
                    "decision": "allowed",
                    "exceptions": [],
                    "message": "",
                    "demand": None,
                },
                token,
            )
            if k8s:
                requests.append((job, "delete", deleted, chain, None, token))
            token += 1
        for timeline in (*webhooks, controller):
            timeline.advance(job.time)
    for timeline in (*webhooks, controller):
        timeline.close()
    events: list[tuple[dt.datetime, dict[str, Any]]] = []
    for job, verb, when, chain, mutated, validated in requests:
        positions = {"validate": chain.positions[validated]}
        if mutated is not None:
            positions["mutate"] = chain.positions[mutated]
        events.append((when, _api_event(job, verb, when, positions)))
        if verb == "create":
            events.extend(_other_events(job))
    if k8s:
        with k8s_path.open("w", encoding="utf-8") as k8s_log:
            for _, event in sorted(events, key=lambda e: e[0]):
                k8s_log.write(json.dumps(event) + "\n")
    return audit, k8s_path


def _other_events(job: Job) -> list[tuple[dt.datetime, dict[str, Any]]]:
    """A few of the events outside mpigate's judgement that a cluster's log holds: someone execs
    into a training pod, reads a secret the authorizer refuses, creates a privileged debug pod."""
    out: list[tuple[dt.datetime, dict[str, Any]]] = []
    pod = f"{job.name}-node-0-0"
    if job.index % 97 == 0:
        when = job.time + dt.timedelta(minutes=10)
        event = _base_event(job, "create", when, {"resource": "pods", "subresource": "exec", "name": pod}, 2)
        event["stage"] = "ResponseStarted"
        event["responseStatus"] = {"metadata": {}, "code": 101}
        out.append((when, event))
    if job.index % 131 == 0:
        when = job.time + dt.timedelta(minutes=3)
        event = _base_event(job, "list", when, {"resource": "secrets"}, 3)
        event["responseStatus"] = {
            "metadata": {},
            "code": 403,
            "message": f'secrets is forbidden: User "{job.user}" cannot list resource "secrets"',
        }
        event["annotations"] = {"authorization.k8s.io/decision": "forbid", "authorization.k8s.io/reason": ""}
        out.append((when, event))
    if job.index % 173 == 0:
        when = job.time + dt.timedelta(minutes=20)
        event = _base_event(job, "create", when, {"resource": "pods", "name": f"{job.name}-debug"}, 4)
        event["level"] = "Request"
        event["requestObject"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{job.name}-debug"},
            "spec": {
                "containers": [
                    {"name": "debug", "image": "busybox:1.36", "securityContext": {"privileged": True}}
                ]
            },
        }
        out.append((when, event))
    return out


def _base_event(job: Job, verb: str, when: dt.datetime, ref: dict[str, Any], serial: int) -> dict[str, Any]:
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": f"{job.index:08d}-0000-4000-8000-{serial:012d}",
        "stage": "ResponseComplete",
        "verb": verb,
        "user": {"username": job.user, "groups": ["system:authenticated"]},
        "sourceIPs": ["10.20.0.7"],
        "userAgent": "kubectl/v1.33.1",
        "objectRef": {"namespace": job.team.name, "apiVersion": "v1", **ref},
        "responseStatus": {"metadata": {}, "code": 201},
        "requestReceivedTimestamp": stamp,
        "stageTimestamp": stamp,
        "annotations": {"authorization.k8s.io/decision": "allow", "authorization.k8s.io/reason": ""},
    }


def _api_event(job: Job, verb: str, when: dt.datetime, positions: dict[str, str]) -> dict[str, Any]:
    denied = verb == "create" and job.outcome == "denied"
    decision = (
        {"denied": "denied", "warned": "allowed-with-warnings"}.get(job.outcome, "allowed")
        if verb == "create"
        else "allowed"
    )
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": f"{job.index:08d}-0000-4000-8000-{0 if verb == 'create' else 1:012d}",
        "stage": "ResponseComplete",
        "verb": verb,
        "user": {"username": job.user, "groups": ["system:authenticated"]},
        "objectRef": {
            "resource": "trainjobs",
            "namespace": job.team.name,
            "name": job.name,
            "apiGroup": "trainer.kubeflow.org",
            "apiVersion": "v1alpha1",
        },
        "responseStatus": {"metadata": {}, "code": 403 if denied else (201 if verb == "create" else 200)},
        "requestReceivedTimestamp": stamp,
        "stageTimestamp": stamp,
        "annotations": {
            "authorization.k8s.io/decision": "allow",
            "authorization.k8s.io/reason": "",
            "validate.team.mpigate.io/decision": decision,
            "validate.team.mpigate.io/record": positions["validate"],
            **({"mutate.trainjobs.mpigate.io/record": positions["mutate"]} if "mutate" in positions else {}),
        },
    }
