"""The admission engine: one request in, one :class:`~mpigate.policy.decision.Decision` out.

Pure and deterministic: no I/O, no clock unless ``now`` is omitted, no module state. The webhook,
``mpigate explain``/``test`` and the reports all call :func:`evaluate`.

CREATE of a TrainJob
    mutations are computed first (:mod:`mpigate.policy.mutation`), returned as one JSONPatch,
    and every rule then judges the *mutated* object, on its effective pods.
UPDATE of a TrainJob
    never mutated, and judged whole: every rule runs on the new object as on CREATE (MPG-Q007/Q008,
    which count live admissions, and MPG-TEAM-001, whose namespace cannot change, excepted). Only a
    finding *identical* to one of the stored object — same rule, path, message and hidden value
    (:attr:`Finding.identity`) — is grandfathered, so a label-only change by Kueue is never denied
    for a condition that predates it (a quota lowered since), while anything the update brings in
    or makes worse is. A missing queue label is never grandfathered (Kueue would ignore the job).
    MPG-LIFE-003 adds what only an UPDATE can do: mpigate's runtime patch entry must stay as CREATE
    wrote it; the policy-carrying labels (queue, priority class, data classification, cost center,
    team, required labels, labels exceptions match on) keep their admitted values unless OrgPolicy
    ``updates.labelChanges`` names the requester (matched by userInfo and TeamAccess personas);
    and what CREATE's mutation set (labels, default runtime, mirror, pinned ports) may not be taken
    back, so the stored object stays what a CREATE would store. What Kueue writes on UPDATE —
    ``spec.suspend`` and its own ``kueue.x-k8s.io/manager`` patch entry (Kueue:
    pkg/controller/jobs/trainjob/trainjob_controller.go RunWithPodSetsInfo, Stop) — passes.
mpigate's own runtime patch entry
    The rules skip the entry under mpigate's manager name (it sets the team label, the region's
    nodeSelector and security defaults) only when it is mpigate's: on CREATE, the entry mpigate
    computes for the job (recomputed on ``judge`` and compared, ignoring Trainer's ``time``
    stamp); on UPDATE, the stored object's entry, unchanged. An entry a tenant wrote under that name
    (or two of them) is judged as a tenant's patch, and MPG-LIFE-003 denies it.
MPIJobs (``kubeflow.org/v2beta1``)
    judged like TrainJobs on the Launcher and Worker pods the MPI Operator creates
    (:func:`mpigate.trainjob.mpijob.resolve_mpijob`); the rules name the MPIJob's own fields through
    its :class:`~mpigate.policy.shapes.JobShape`, and mutation writes into the pod templates
    (:mod:`mpigate.policy.mpijob`: an MPIJob has no runtime patches).
Anything else
    an ``apiVersion`` or kind outside :data:`mpigate.policy.kinds.UNDERSTOOD` is MPG-API-001.
DELETE / CONNECT
    always allowed, recorded as MPG-LIFE-004 in mode ``audit`` (who, what, when).
External runtimes
    A runtime approved as ``external`` is resolved from ``LiveContext.runtimes`` (the webhook reads
    it for /mutate and /validate, CREATE and UPDATE alike), so mutation and judgement see the same
    effective pods. When it cannot be read, MPG-RT-003 denies the job (``warn`` admits it with a
    warning, judged on ``spec.trainer`` only).
Runtimes
    ``ClusterTrainingRuntime``/``TrainingRuntime`` are judged on their own on CREATE/UPDATE:
    Pod Security on each replicated job's pod template, images, credentials in env, MPI sanity,
    and (MPG-RT-001) that an approved name carries the reviewed manifest. UPDATE again grandfathers
    only findings identical to the stored runtime's (Trainer's finalizer updates must not be denied).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from mpigate.config import Config

from .context import as_mapping, labels_of, request_identity, request_object
from .decision import AdmissionInput, Decision, LiveContext
from .findings import Finding
from .jobcontext import OWN_MANAGER, job_context
from .jobs import judge_job, mutation_patch
from .kinds import unrecognized
from .runtimes import judge_runtime
from .verdict import allowed, audited, decide, failed_closed

__all__ = ["RUNTIME_KINDS", "evaluate", "judge", "mutations"]

RUNTIME_KINDS = frozenset({"ClusterTrainingRuntime", "TrainingRuntime"})
# Jobs judged on their effective pods: a TrainJob on its runtime, an MPIJob on its replica templates.
JOB_KINDS = frozenset({"TrainJob", "MPIJob"})


def evaluate(
    config: Config,
    request: AdmissionInput,
    live: LiveContext | None = None,
    now: dt.datetime | None = None,
) -> Decision:
    """Judge one admission request (see the module docstring for what each operation does).

    Never raises for any object: malformed fields become violations; an unexpected internal error
    is logged and answered as a denial (fail closed) that says so.
    """
    return _evaluate(config, request, live, now, mutate=True)


def judge(
    config: Config,
    request: AdmissionInput,
    live: LiveContext | None = None,
    now: dt.datetime | None = None,
) -> Decision:
    """What the validating webhook needs: the verdict on the object *as it will be stored*.

    :func:`evaluate` first applies mpigate's own mutation to a CREATE and judges the result (what
    ``explain`` and ``test`` show for a manifest). The API server calls the validating webhook
    after every mutating webhook, ours included (``failurePolicy: Fail``, reinvoked when another
    webhook changes the object), so the object it sends is already mutated: judging it as received
    gives the same verdict without recomputing the patch, and judges what is actually persisted
    when a later webhook undid part of the mutation. The decision carries no patch.
    """
    return _evaluate(config, request, live, now, mutate=False)


def _evaluate(
    config: Config,
    request: AdmissionInput,
    live: LiveContext | None,
    now: dt.datetime | None,
    *,
    mutate: bool,
) -> Decision:
    moment = now or dt.datetime.now(dt.UTC)
    try:
        unknown = unrecognized(request)
        if unknown is not None:
            return _unrecognized(config, request, unknown, moment)
        if request.kind in JOB_KINDS:
            return judge_job(config, request, live, moment, mutate=mutate)
        if request.kind in RUNTIME_KINDS:
            return judge_runtime(config, request, moment)
        # Unreachable while every pair of kinds.UNDERSTOOD has a branch above: fail closed anyway.
        return Decision.bare(
            request,
            config.revision,
            allowed=False,
            message=f"mpigate has no judge for {request.kind}; denied to fail closed",
        )
    except Exception:  # pragma: no cover - defensive: the fuzz tests keep this path unused
        return failed_closed(config, request, "evaluating")


def mutations(
    config: Config,
    request: AdmissionInput,
    live: LiveContext | None = None,
    now: dt.datetime | None = None,
) -> Decision:
    """What the mutating webhook needs: mpigate's JSONPatch for a CREATE of a TrainJob, without
    judging the object.

    The decision is allowed and carries only the patch and the request's identity (team, revision)
    — no violations, warnings or demand: the API server sends the patched object to the validating
    webhook, whose :func:`evaluate` gives the verdict. The patch is exactly ``evaluate``'s for the
    same request, at the cost of one resolution instead of a full evaluation. Any other request
    (not a TrainJob, not a CREATE) is answered by :func:`evaluate`. Never raises: an internal error
    is logged and answered like ``evaluate``'s (denied, no patch).
    """
    # Nothing to mutate in an object mpigate does not understand: no patch and no verdict here; the
    # validating webhook (the same routes) denies it with MPG-API-001.
    unknown = unrecognized(request) is not None
    if not unknown and (request.kind not in JOB_KINDS or request.operation != "CREATE"):
        return evaluate(config, request, live, now)
    try:
        obj = request_object(request) if request.obj is not None else as_mapping(request.old_obj)
        namespace, name = request_identity(request, obj)
        team = config.team_for_namespace(namespace) if namespace else None
        patch: list[dict[str, Any]] = []
        if not unknown and request.operation == "CREATE":
            ctx0, _ = job_context(
                config, "CREATE", obj, namespace, name, team, live, request.user, exclude=OWN_MANAGER
            )
            patch, _ = mutation_patch(ctx0, obj)
        return allowed(config, request, namespace, name, team, patch=tuple(patch))
    except Exception:  # pragma: no cover - defensive: the fuzz tests keep this path unused
        return failed_closed(config, request, "mutating")


def _unrecognized(config: Config, request: AdmissionInput, finding: Finding, now: dt.datetime) -> Decision:
    """An object the engine does not understand (:mod:`mpigate.policy.kinds`): MPG-API-001 and
    nothing else (no rule could read it). A DELETE is recorded like any other."""
    obj = request_object(request) if request.obj is not None else as_mapping(request.old_obj)
    namespace, name = request_identity(request, obj)
    team = config.team_for_namespace(namespace) if namespace else None
    if request.operation in ("DELETE", "CONNECT"):
        return audited(config, request, namespace, name, team)
    return decide(config, request, namespace or None, name, team, [finding], [], None, labels_of(obj), now)
