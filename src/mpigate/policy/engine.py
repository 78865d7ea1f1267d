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

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from fractions import Fraction
from typing import Any

from mpigate.catalogue import all_rules
from mpigate.config import Config, parse_quantity
from mpigate.config.model import Team
from mpigate.config.mpienv import Implementation
from mpigate.trainjob import (
    PreparedRuntime,
    Problem,
    Resolution,
    format_quantity,
    prepare_runtime,
    resolve,
    resolve_runtime,
)
from mpigate.trainjob.jsontypes import is_mapping
from mpigate.trainjob.mpijob import resolve_mpijob
from mpigate.trainjob.paths import Key, PathPart, format_path
from mpigate.trainjob.resolve import MPIGATE_MANAGER, with_last_patch

from .context import (
    CLASSIFICATION_LABEL,
    QUEUE_LABEL,
    JobContext,
    RuntimeContext,
    as_int,
    as_mapping,
    as_str,
    labels_of,
)
from .custom import custom_findings, custom_rule_meta
from .decision import (
    AdmissionInput,
    AppliedException,
    Decision,
    Demand,
    JobDemand,
    LiveContext,
    Mode,
    Operation,
    UserInfo,
    Violation,
)
from .demand import build_demand, is_gpu
from .findings import Finding, short_warning
from .jsonpatch import diff, unescape
from .kinds import unrecognized
from .mpijob import MPIJOB_PROBLEM_RULES, mutate_mpijob
from .mutation import build_patch_entry, mutate
from .prepared import config_gpu_resources, config_image_refs, prepared_runtime
from .requester import personas_of
from .rules.image import check_image_ref, check_images
from .rules.lifecycle import check_lifecycle, check_update_guard, own_patch_entry, same_patch_entry
from .rules.network import check_network, implementation_note
from .rules.quota import check_quota
from .rules.residency import check_residency
from .rules.runtime import check_managed_by, check_mpi_sanity, check_runtime_approval, check_runtime_drift
from .rules.secrets import check_secret_refs
from .rules.security import (
    check_pod_security,
    check_secrets,
    check_service_accounts,
    credential_reason,
    value_digest,
)
from .shapes import MPIJOB, TRAINJOB, JobShape

__all__ = ["RUNTIME_KINDS", "evaluate", "judge", "mutations"]

log = logging.getLogger(__name__)

RUNTIME_KINDS = frozenset({"ClusterTrainingRuntime", "TrainingRuntime"})
# Jobs judged on their effective pods: a TrainJob on its runtime, an MPIJob on its replica templates.
JOB_KINDS = frozenset({"TrainJob", "MPIJob"})
# Rule families whose violations also evidence the data classification's own controls.
_CLASSIFICATION_FAMILIES = ("MPG-RES-", "MPG-NET-", "MPG-IMG-")
_OWN_MANAGER = frozenset({MPIGATE_MANAGER})
# Never grandfathered: a TrainJob without a queue label is ignored by Kueue (its
# manageJobsWithoutQueueName defaults to false), so nothing would limit it once it runs.
_QUEUE_PATH = f'metadata.labels["{QUEUE_LABEL}"]'


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
            return _trainjob(config, request, live, moment, mutate=mutate)
        if request.kind in RUNTIME_KINDS:
            return _runtime(config, request, moment)
        # Unreachable while every pair of kinds.UNDERSTOOD has a branch above: fail closed anyway.
        return Decision.bare(
            request,
            config.revision,
            allowed=False,
            message=f"mpigate has no judge for {request.kind}; denied to fail closed",
        )
    except Exception:  # pragma: no cover - defensive: the fuzz tests keep this path unused
        return _failed_closed(config, request, "evaluating")


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
        obj = _object(request) if request.obj is not None else as_mapping(request.old_obj)
        namespace, name = _identity(request, obj)
        team = config.team_for_namespace(namespace) if namespace else None
        patch: list[dict[str, Any]] = []
        if not unknown and request.operation == "CREATE":
            ctx0, _ = _job_context(
                config, "CREATE", obj, namespace, name, team, live, request.user, exclude=_OWN_MANAGER
            )
            patch, _ = _mutation(ctx0, obj)
        return Decision(
            allowed=True,
            operation=request.operation,
            kind=request.kind,
            namespace=namespace or None,
            name=name,
            team=team.name if team else None,
            revision=config.revision,
            patch=tuple(patch),
        )
    except Exception:  # pragma: no cover - defensive: the fuzz tests keep this path unused
        return _failed_closed(config, request, "mutating")


def _unrecognized(config: Config, request: AdmissionInput, finding: Finding, now: dt.datetime) -> Decision:
    """An object the engine does not understand (:mod:`mpigate.policy.kinds`): MPG-API-001 and
    nothing else (no rule could read it). A DELETE is recorded like any other."""
    obj = _object(request) if request.obj is not None else as_mapping(request.old_obj)
    namespace, name = _identity(request, obj)
    team = config.team_for_namespace(namespace) if namespace else None
    if request.operation in ("DELETE", "CONNECT"):
        return _audited(config, request, namespace, name, team)
    exceptions = config.exceptions_for(team.name) if team else ()
    return _decide(
        config, request, namespace or None, name, team, [finding], [], None, exceptions, labels_of(obj), now
    )


# -- TrainJobs -----------------------------------------------------------------------------------


def _object(request: AdmissionInput) -> Mapping[str, Any]:
    return request.obj if is_mapping(request.obj) else {}


def _identity(request: AdmissionInput, obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = as_mapping(obj.get("metadata"))
    namespace = request.namespace or as_str(meta.get("namespace")) or ""
    name = request.name or as_str(meta.get("name")) or as_str(meta.get("generateName")) or ""
    return namespace, name


def _trainjob(
    config: Config, request: AdmissionInput, live: LiveContext | None, now: dt.datetime, *, mutate: bool
) -> Decision:
    obj = _object(request) if request.obj is not None else as_mapping(request.old_obj)
    namespace, name = _identity(request, obj)
    team = config.team_for_namespace(namespace) if namespace else None
    if request.operation in ("DELETE", "CONNECT"):
        return _audited(config, request, namespace, name, team)

    findings: list[Finding] = []
    # A namespace cannot change on UPDATE, so MPG-TEAM-001 is judged on CREATE only.
    if (
        team is None
        and config.org.unmanaged_namespaces == "deny"
        and request.operation == "CREATE"
        and not namespace
    ):
        # Only offline (explain, test): the API server always sends the namespace of the request.
        findings.append(
            Finding(
                "MPG-TEAM-001",
                "metadata.namespace",
                "the TrainJob names no namespace, so it belongs to no team; this org admits "
                "TrainJobs only in team namespaces (managedNamespaces.unmanaged: deny).",
                "Set metadata.namespace to your team's namespace, or give it as kubectl does "
                "(kubectl apply -n NAMESPACE; mpigate explain --namespace NAMESPACE).",
                "no namespace",
            )
        )
    elif team is None and config.org.unmanaged_namespaces == "deny" and request.operation == "CREATE":
        shown = namespace
        findings.append(
            Finding(
                "MPG-TEAM-001",
                "metadata.namespace",
                f"namespace {shown} belongs to no team; this org admits TrainJobs only in team namespaces "
                "(managedNamespaces.unmanaged: deny).",
                f"Create the TrainJob in your team's namespace, or ask the platform team to add {shown} "
                "to a TeamQuota's spec.namespaces.",
                f"namespace {shown} belongs to no team",
            )
        )

    patch: list[dict[str, Any]] = []
    runtime: PreparedRuntime | None = None
    target: Mapping[str, Any] = obj
    user = request.user
    old = request.old_obj if request.operation == "UPDATE" and is_mapping(request.old_obj) else None
    # Whether mpigate's own runtime patch entry may be taken as mpigate's (the rules then let it
    # set the team label, the region's nodeSelector and the security defaults): on a CREATE that
    # mpigate mutated here, it is the entry just computed; on a CREATE as received, only when it is
    # exactly what mpigate computes for the job; on UPDATE, only when unchanged since the stored
    # object (which was judged on CREATE). Anything else under mpigate's name is a tenant's patch.
    trusted: frozenset[str] = _OWN_MANAGER
    forged: Finding | None = None
    ctx: JobContext | None = None
    if _own_entries(obj) > 1 and not (request.operation == "CREATE" and mutate):
        # The API server refuses two entries with one manager (runtimePatches is a list-map keyed
        # by manager); mpigate does not rely on it.
        trusted = frozenset()
        forged = _forged_entry("there is more than one entry under its name")
    elif request.operation == "CREATE":
        present = own_patch_entry(obj)
        if mutate or present is not None:
            ctx0, runtime = _job_context(
                config, "CREATE", obj, namespace, name, team, live, user, exclude=_OWN_MANAGER
            )
            if mutate:
                patch, target = _mutation(ctx0, obj)
            elif present is not None:
                expected = build_patch_entry(ctx0, ctx0.resolution) if ctx0.resolution is not None else None
                if expected is None or not same_patch_entry(present[1], expected):
                    trusted = frozenset()
                    forged = _forged_entry(
                        "mpigate writes no such entry for this job"
                        if expected is None
                        else "it is not the entry mpigate writes"
                    )
                elif ctx0.resolution is not None:
                    # The job as mpigate mutated it: its resolution is the one just computed with
                    # the entry merged in (one resolution per evaluation, not two).
                    full = with_last_patch(ctx0.resolution, obj, MPIGATE_MANAGER)
                    if full is not None:
                        ctx = dataclasses.replace(ctx0, resolution=full)
    elif old is not None:
        before = own_patch_entry(old)
        after = own_patch_entry(obj)
        if after is not None and (before is None or not same_patch_entry(after[1], before[1])):
            trusted = frozenset()
    # judge() and UPDATE: the object as received is the one judged, so its context is built once.
    if ctx is None:
        ctx, runtime = _job_context(
            config,
            request.operation,
            target,
            namespace,
            name,
            team,
            live,
            user,
            runtime=runtime,
            trusted=trusted,
        )
    demand = _demand(ctx)
    findings.extend(_trainjob_findings(ctx, demand))
    if forged is not None:
        findings.append(forged)

    notes: list[str] = []
    annotations: dict[str, str] = {}
    if old is not None:
        # UPDATE judges the whole new object; only a finding identical to one of the stored object
        # (same rule, path, message and value) is grandfathered — a condition that predates the
        # update (say, a quota lowered since) does not block Kueue's suspend, while anything the
        # update brings in, or makes worse, is judged as on CREATE.
        same_runtime = _runtime_ref(old) == _runtime_ref(obj)
        old_ctx, _ = _job_context(
            config,
            "UPDATE",
            old,
            namespace,
            name,
            team,
            live,
            user,
            runtime=runtime if same_runtime else None,
            trusted=_OWN_MANAGER,
        )
        findings.extend(_guarded("MPG-LIFE-003", lambda: check_update_guard(ctx, old)))
        findings.extend(_guarded("MPG-LIFE-003", lambda: _kept_mutations(ctx, findings)))
        before_ids = {f.identity for f in _trainjob_findings(old_ctx, _demand(old_ctx))}
        before_ids.update(f.identity for f in _kept_mutations(old_ctx, ()))
        findings = [f for f in findings if f.identity not in before_ids or f.path == _QUEUE_PATH]
    # CustomRules judge the object as received, reading oldObject themselves (as a
    # ValidatingAdmissionPolicy does): no grandfathering by the engine
    findings.extend(
        custom_findings(
            config,
            request,
            target=request.kind,
            obj=target,
            old=old,
            team=team,
            namespace=namespace,
            name=name,
            labels=ctx.labels,
            classification=ctx.classification.name if ctx.classification else None,
            resolution=ctx.resolution,
            runtime=runtime.manifest if runtime is not None else None,
            notes=notes,
            today=now.astimezone(dt.UTC).date() if now.tzinfo else now.date(),
            annotations=annotations,
        )
    )
    if ctx.resolution is not None:
        notes.extend(p.message for p in ctx.resolution.problems if p.advisory)
    if request.operation == "CREATE" and (note := implementation_note(ctx)) is not None:
        notes.append(note)

    exceptions = config.exceptions_for(team.name) if team else ()
    return _decide(
        config,
        request,
        namespace or None,
        name,
        team,
        findings,
        patch,
        demand,
        exceptions,
        ctx.labels,
        now,
        classification_controls=ctx.classification.controls if ctx.classification else (),
        notes=notes,
        annotations=annotations,
    )


def _mutation(ctx0: JobContext, obj: Mapping[str, Any]) -> tuple[list[dict[str, Any]], Mapping[str, Any]]:
    """mpigate's JSONPatch for a CREATE and the mutated object (``ctx0``: the job resolved without
    mpigate's own runtime patch)."""
    if ctx0.shape is MPIJOB:
        mutated = mutate_mpijob(ctx0, obj, ctx0.resolution)
    else:
        mutated = mutate(ctx0, obj, ctx0.resolution)
    return diff(obj, mutated), mutated


def _runtime_ref(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(as_mapping(obj.get("spec")).get("runtimeRef"))


def _own_entries(obj: Mapping[str, Any]) -> int:
    patches = as_mapping(obj.get("spec")).get("runtimePatches")
    if not isinstance(patches, list):
        return 0
    return sum(1 for p in patches if is_mapping(p) and p.get("manager") == MPIGATE_MANAGER)


def _forged_entry(what: str) -> Finding:
    return Finding(
        "MPG-LIFE-003",
        f"spec.runtimePatches[manager={MPIGATE_MANAGER}]",
        f"an entry under mpigate's own manager name was not written by mpigate ({what}); it is judged "
        "as a tenant's patch, and only the admission webhook writes that entry.",
        f"Remove the {MPIGATE_MANAGER} entry (mpigate adds its own on CREATE), and put your own changes "
        "under your own manager name.",
        "runtime patch under mpigate's manager was not written by mpigate",
    )


def _kept_mutations(ctx: JobContext, already: Iterable[Finding]) -> list[Finding]:
    """MPG-LIFE-003 on UPDATE: what mpigate sets on CREATE (queue and priority labels, the default
    runtime, the mirror, the pinned OpenMPI ports) is still there — the stored object stays what a
    CREATE would store. (mpigate's own runtime patch entry is guarded by :func:`check_update_guard`.)
    ``already``: findings whose paths need no second one."""
    target = ctx.obj
    # An MPIJob's mutation writes into its pod templates (it has no runtime patch entry), so all of
    # it is kept; a TrainJob's, without mpigate's entry.
    mutated = mutate_mpijob(ctx, target, ctx.resolution) if ctx.shape is MPIJOB else mutate(ctx, target, None)
    ops = diff(target, mutated)
    if not ops:
        return []
    taken = {f.path for f in already if f.rule == "MPG-LIFE-003"}
    # The suspension mpigate sets on CREATE (MPG-Q005) is Kueue's alone to change from then on: it
    # resumes the job on admission and suspends it again on preemption (Kueue v0.19.2
    # pkg/controller/jobframework/reconciler.go (*JobReconciler).startJob, stopJob). A tenant who
    # resumes a job would start it outside the queue, so for anyone else it stays kept. Who Kueue's
    # controller is: GPUFlavors.spec.kueue.controller.
    kueue = ctx.config.kueue.controller
    suspend = "/" + "/".join(ctx.shape.suspend) if ctx.requester.username == kueue else None
    out: list[Finding] = []
    for op in ops:
        if op["path"] == suspend:
            continue
        parts: list[PathPart] = [
            int(t) if t.isdigit() else t for t in (unescape(t) for t in str(op["path"]).split("/")[1:])
        ]
        value = op.get("value")
        if parts and isinstance(parts[-1], int) and is_mapping(value) and isinstance(value.get("name"), str):
            parts[-1] = Key("name", value["name"])
        path = format_path(parts)
        if path in taken:
            continue
        shown = _shown(value)
        what = "is missing" if op["op"] == "add" else "differs"
        out.append(
            Finding(
                "MPG-LIFE-003",
                path,
                f"{what}: mpigate sets {shown} on CREATE, and an update may not take back what the job "
                "was admitted with.",
                f"Restore {path} to {shown}.",
                f"{path} {what} (mpigate sets it on CREATE)",
                value=shown,
            )
        )
    return out


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 200 else text[:199] + "…"


def _job_context(
    config: Config,
    operation: Operation,
    obj: Mapping[str, Any],
    namespace: str,
    name: str,
    team: Team | None,
    live: LiveContext | None,
    requester: UserInfo,
    *,
    runtime: PreparedRuntime | None = None,
    exclude: frozenset[str] = frozenset(),
    trusted: frozenset[str] = _OWN_MANAGER,
) -> tuple[JobContext, PreparedRuntime | None]:
    """The context of ``obj`` and its runtime, prepared (looked up unless ``runtime`` is given:
    the config's are prepared once per config, a live one once per evaluation). ``exclude``: the
    managers whose runtime patches the resolution leaves out; ``trusted``: the managers whose
    patch the rules may take as mpigate's own (see :class:`JobContext`)."""
    org = config.org
    labels = labels_of(obj)
    shape = MPIJOB if obj.get("kind") == "MPIJob" else TRAINJOB
    ref = as_mapping(as_mapping(obj.get("spec")).get("runtimeRef")) if shape is TRAINJOB else {}
    kind = ref.get("kind", "ClusterTrainingRuntime")
    runtime_name = as_str(ref.get("name")) or ""
    kind_s = kind if isinstance(kind, str) else ""
    in_tree = config.runtime(kind_s, runtime_name, namespace) if runtime_name and kind_s else None
    if runtime is None and shape is TRAINJOB:
        if in_tree is not None:
            runtime = prepared_runtime(config, in_tree)
        elif live is not None and live.runtimes is not None and runtime_name:
            approval = org.runtime_approval(runtime_name, kind_s)
            if approval is not None and approval.external:
                manifest = live.runtimes.get(
                    (kind_s, namespace if kind_s == "TrainingRuntime" else None, runtime_name)
                )
                runtime = prepare_runtime(manifest) if manifest is not None else None
    classification = org.data_classifications.get(labels.get(CLASSIFICATION_LABEL, ""))
    region = org.regions.get(team.region) if team else None
    profile = None
    if team is not None:
        profile, _ = config.job_network_profile(
            team.name, classification.name if classification is not None else None
        )
    if classification is not None and classification.require_digest is not None:
        require_digest = classification.require_digest
        reason = f"data classified {classification.name}"
    else:
        require_digest = org.images.require_digest
        reason = "the org"
    ctx = JobContext(
        config=config,
        operation=operation,
        obj=obj,
        namespace=namespace,
        name=name,
        team=team,
        labels=labels,
        runtime_kind=kind_s,
        runtime_name=runtime_name,
        runtime_known=in_tree is not None
        or (
            bool(runtime_name)
            and (a := org.runtime_approval(runtime_name, kind_s)) is not None
            and a.external
        ),
        resolution=(
            resolve_mpijob(obj)
            if shape is MPIJOB
            else resolve(obj, runtime, exclude_managers=exclude)
            if runtime is not None
            else None
        ),
        classification=classification,
        region=region,
        profile=profile,
        gpu_resources=config_gpu_resources(config),
        require_digest=require_digest,
        require_digest_reason=reason,
        live=live,
        shape=shape,
        requester=requester,
        trusted_managers=trusted,
    )
    return ctx, runtime


def _demand(ctx: JobContext) -> Demand | None:
    region = ctx.region.name if ctx.region else None
    if ctx.resolution is not None:
        return build_demand(ctx.resolution, ctx.gpu_resources, region)
    # Runtime unknown: numNodes × resourcesPerNode is a lower bound for every MPI or torch runtime.
    resources = as_mapping(ctx.trainer.get("resourcesPerNode"))
    if not resources:
        return None
    nodes = as_int(ctx.trainer.get("numNodes")) or 1
    per_pod: dict[str, Fraction] = {}
    for section in ("limits", "requests"):
        for key, value in as_mapping(resources.get(section)).items():
            try:
                per_pod[str(key)] = parse_quantity(value)
            except (ValueError, TypeError, ZeroDivisionError, OverflowError):
                continue
    gpus = {r: int(-(-v // 1)) for r, v in per_pod.items() if is_gpu(r, ctx.gpu_resources) and v > 0}
    cpu, mem = per_pod.get("cpu"), per_pod.get("memory")
    return Demand(
        pods=nodes,
        gpus={r: g * nodes for r, g in sorted(gpus.items())},
        cpu=format_quantity(cpu * nodes, "cpu") if cpu is not None else None,
        memory=format_quantity(mem * nodes, "memory") if mem is not None else None,
        jobs=(
            JobDemand(
                "trainer (estimated)",
                nodes,
                gpus,
                format_quantity(cpu, "cpu"),
                format_quantity(mem, "memory"),
                images=(image,) if isinstance(image := ctx.trainer.get("image"), str) else (),
            ),
        ),
        region=region,
    )


def _guarded(rule: str, produce: Callable[[], Iterable[Finding]]) -> list[Finding]:
    """Run one rule family; if it fails on a malformed object, fail closed under its first rule."""
    try:
        return list(produce())
    except Exception as exc:  # pragma: no cover - defensive, see tests/policy/test_fuzz.py
        log.exception("rule %s failed", rule)
        return [
            Finding(
                rule,
                "(object)",
                f"could not be evaluated: the object is malformed ({type(exc).__name__}).",
                "Check the object against the CRD schema (kubectl apply --dry-run=server).",
                "object could not be evaluated",
            )
        ]


# Resolution problems (wrong types, patches Trainer rejects) are reported under the rule that
# needed the field, and under MPG-RT-001 where that rule never denies (MPG-Q004 is advisory, so a
# malformed numProcPerNode is MPG-RT-001): malformed is refused, never absent.
_PROBLEM_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("spec", "trainer", "numNodes"), "MPG-Q002"),
    (("spec", "trainer", "resourcesPerNode"), "MPG-Q003"),
    (("spec", "trainer", "image"), "MPG-IMG-001"),
    (("spec", "trainer", "env"), "MPG-SEC-SECRETS"),
    (("spec", "initializer"), "MPG-RES-003"),
)


def _problem_findings(problems: Iterable[Problem], shape: JobShape = TRAINJOB) -> Iterator[Finding]:
    # A TrainJob's problems are its runtime's (MPG-RT-001) unless a field of its own has the wrong
    # type; an MPIJob has no runtime: what the MPI Operator would refuse is MPI sanity (MPG-RT-002)
    # unless a rule owns the field.
    table, default = (
        (_PROBLEM_RULES, "MPG-RT-001") if shape is TRAINJOB else (MPIJOB_PROBLEM_RULES, "MPG-RT-002")
    )
    for problem in problems:
        if problem.advisory:
            continue
        rule = default
        if (problem.malformed or shape is not TRAINJOB) and not problem.in_runtime:
            rule = next((r for prefix, r in table if problem.field[: len(prefix)] == prefix), default)
        message = problem.message if problem.in_runtime else f"{problem.message}."
        path = problem.path if not problem.in_runtime else problem.message.split(": ", 1)[0]
        if problem.in_runtime:
            message = problem.message.split(": ", 1)[-1]
        fix = (
            ("Fix the field's type (see the Trainer CRD)." if shape is TRAINJOB else "Fix the field's type.")
            if problem.malformed
            else "Change the MPIJob as the message says: the MPI Operator would not run it."
            if shape is not TRAINJOB
            else (
                "Make the TrainJob fit its runtime: patch only jobs and containers it has, and "
                "configure only the "
                "initializers it runs."
            )
        )
        yield Finding(
            rule, path, message[0].upper() + message[1:] if message else message, fix, message[:100]
        )


def _trainjob_findings(ctx: JobContext, demand: Demand | None) -> list[Finding]:
    config = ctx.config
    org = config.org
    resolution = ctx.resolution
    out: list[Finding] = []
    ref = as_mapping(ctx.spec.get("runtimeRef"))
    approval: list[Finding] = []
    if ctx.shape is TRAINJOB:  # an MPIJob has no runtime: its pod templates are judged directly
        approval = _guarded(
            "MPG-RT-001",
            lambda: check_runtime_approval(
                config, ctx.team, ref, ctx.namespace, in_tree=resolution is not None or ctx.runtime_known
            ),
        )
        out += approval
    out += _guarded("MPG-RT-001", lambda: check_managed_by(ctx.spec))
    out += _guarded("MPG-Q001", lambda: check_quota(ctx, demand))
    out += _guarded("MPG-RES-001", lambda: check_residency(ctx))
    out += _guarded("MPG-NET-001", lambda: check_network(ctx))
    out += _guarded("MPG-LIFE-001", lambda: check_lifecycle(ctx))
    if resolution is not None:
        out += _guarded("MPG-RT-001", lambda: _problem_findings(resolution.problems, ctx.shape))
        root = f"runtime {resolution.runtime_name}: " if ctx.shape is TRAINJOB else ""
        declared = _declared_implementation(config, ctx.runtime_kind, ctx.runtime_name)
        out += _guarded("MPG-RT-002", lambda: check_mpi_sanity(config, resolution, root, ctx.shape, declared))
        out += _guarded("MPG-SEC-PRIVILEGED", lambda: check_pod_security(org.security, resolution.jobs))
        if org.security.forbid_plaintext_secrets:
            out += _guarded("MPG-SEC-SECRETS", lambda: check_secrets(resolution.jobs))
        out += _guarded("MPG-SA-001", lambda: check_service_accounts(ctx, resolution))
        if ctx.team is not None:
            team = ctx.team
            out += _guarded(
                "MPG-SEC-SECRETREF",
                lambda: check_secret_refs(resolution.jobs, ctx.name, team.name, config.secrets_of(team.name)),
            )
        out += _guarded(
            "MPG-IMG-001",
            lambda: check_images(
                org.images,
                resolution.jobs,
                require_digest=ctx.require_digest,
                digest_reason=ctx.require_digest_reason,
                known=config_image_refs(config),
            ),
        )
    else:
        if ctx.runtime_known and not approval:  # approved as external; its manifest is not at hand
            out += _guarded("MPG-RT-003", lambda: _unresolved_runtime(ctx))
        out += _guarded("MPG-IMG-001", lambda: _trainer_only(ctx))
    return _dedupe(out)


def _unresolved_runtime(ctx: JobContext) -> Iterator[Finding]:
    """MPG-RT-003: a runtime approved as external whose manifest could not be read. Without it the
    job's pods cannot be built, so images, Pod Security, residency, service accounts and network
    would go unjudged: denied by default, a warning where the org says ``MPG-RT-003: warn``."""
    live = ctx.live
    if live is not None and (live.runtime_reason or live.unavailable_reason):
        reason = live.runtime_reason or live.unavailable_reason
    else:
        reason = "no cluster was asked: mpigate explain/test, or serve --no-live"
    kind = ctx.runtime_kind or "ClusterTrainingRuntime"
    yield Finding(
        "MPG-RT-003",
        "spec.runtimeRef.name",
        f"{kind} {ctx.runtime_name} is approved as external, but its manifest could not be read "
        f"({reason}); without it mpigate cannot judge the job's pods (images, Pod Security, "
        "residency, service accounts, network), only spec.trainer.",
        f"Retry once the runtime can be read (kubectl get {kind.lower()} {ctx.runtime_name}); with "
        "mpigate explain, pass its manifest with --runtime FILE. To admit such jobs with a warning, "
        "set spec.enforcement.overrides MPG-RT-003: warn in the OrgPolicy.",
        f"runtime {ctx.runtime_name} could not be read; the job's pods were not judged",
    )


def _trainer_only(ctx: JobContext) -> Iterator[Finding]:
    """Checks that need no runtime: the trainer image and env (runtime unknown or external)."""
    org = ctx.config.org
    image = ctx.trainer.get("image")
    if image is not None:
        yield from check_image_ref(
            org.images,
            image,
            "spec.trainer.image",
            require_digest=ctx.require_digest,
            digest_reason=ctx.require_digest_reason,
            patchable=True,
        )
    if org.security.forbid_plaintext_secrets:
        for var in ctx.trainer.get("env") or [] if isinstance(ctx.trainer.get("env"), list) else []:
            var = as_mapping(var)
            name, value = as_str(var.get("name")), var.get("value")
            if name and isinstance(value, str) and (reason := credential_reason(name, value)):
                yield Finding(
                    "MPG-SEC-SECRETS",
                    f"spec.trainer.env[name={name}]",
                    f"env {name} has a literal value that looks like a credential: {reason} "
                    f"({len(value)} characters; the value is not shown).",
                    "Store it in a Secret and reference it with valueFrom.secretKeyRef.",
                    f"env {name} looks like a literal credential",
                    value=value_digest(value),
                )


def _dedupe(findings: Iterable[Finding]) -> list[Finding]:
    seen: set[tuple[str, str, str]] = set()
    out: list[Finding] = []
    for f in findings:
        if f.key not in seen:
            seen.add(f.key)
            out.append(f)
    return out


def _audited(
    config: Config, request: AdmissionInput, namespace: str, name: str, team: Team | None
) -> Decision:
    who = request.user.username or "(unknown user)"
    info = all_rules()["MPG-LIFE-004"]
    violation = Violation(
        rule="MPG-LIFE-004",
        mode="audit",
        path="metadata.name",
        message=f"{request.operation} of {request.kind} "
        f"{namespace + '/' if namespace else ''}{name} by {who}.",
        controls=info.controls,
    )
    return Decision(
        allowed=True,
        operation=request.operation,
        kind=request.kind,
        namespace=namespace or None,
        name=name,
        team=team.name if team else None,
        revision=config.revision,
        violations=(violation,),
    )


# -- Runtimes ------------------------------------------------------------------------------------


def _runtime(config: Config, request: AdmissionInput, now: dt.datetime) -> Decision:
    obj = _object(request) if request.obj is not None else as_mapping(request.old_obj)
    namespace, name = _identity(request, obj)
    namespace_opt = namespace if request.kind == "TrainingRuntime" else None
    team = config.team_for_namespace(namespace) if namespace_opt else None
    if request.operation in ("DELETE", "CONNECT"):
        return _audited(config, request, namespace, name, team)
    findings, notes = _runtime_findings(config, request, obj, namespace_opt, name)
    annotations: dict[str, str] = {}
    if request.operation == "UPDATE" and is_mapping(request.old_obj):
        old_findings, _ = _runtime_findings(config, request, request.old_obj, namespace_opt, name)
        before = {f.identity for f in old_findings}
        findings = [f for f in findings if f.identity not in before]
    findings.extend(
        custom_findings(
            config,
            request,
            target="Runtime",
            obj=obj,
            old=request.old_obj if request.operation == "UPDATE" and is_mapping(request.old_obj) else None,
            team=team,
            namespace=namespace,
            name=name,
            labels=labels_of(obj),
            classification=None,
            resolution=resolve_runtime(obj),
            runtime=obj,
            notes=notes,
            today=now.astimezone(dt.UTC).date() if now.tzinfo else now.date(),
            annotations=annotations,
        )
    )
    exceptions = config.exceptions_for(team.name) if team else ()
    return _decide(
        config,
        request,
        namespace or None,
        name,
        team,
        findings,
        [],
        None,
        exceptions,
        labels_of(obj),
        now,
        notes=notes,
        annotations=annotations,
    )


def _declared_implementation(config: Config, kind: str, name: str) -> Implementation | None:
    """The MPI implementation the approved-runtimes entry of runtime ``kind``/``name`` declares."""
    approval = config.org.runtime_approval(name, kind) if name else None
    return approval.mpi_implementation if approval is not None else None


def _runtime_findings(
    config: Config, request: AdmissionInput, obj: Mapping[str, Any], namespace: str | None, name: str
) -> tuple[list[Finding], list[str]]:
    """The findings on a runtime object, and the notes (what Trainer accepts but that is probably
    not meant, e.g. a trainer job where no TrainJob field can land)."""
    org = config.org
    resolution: Resolution = resolve_runtime(obj)
    ctx = RuntimeContext(config, request.operation, obj, request.kind, namespace, name, resolution)
    out: list[Finding] = []
    out += _guarded("MPG-RT-001", lambda: check_runtime_drift(config, obj, ctx.kind, namespace, name))
    out += _guarded("MPG-RT-001", lambda: _problem_findings(resolution.problems))
    declared = _declared_implementation(config, ctx.kind, name)
    out += _guarded("MPG-RT-002", lambda: check_mpi_sanity(config, resolution, "", declared=declared))
    out += _guarded(
        "MPG-SEC-PRIVILEGED", lambda: check_pod_security(org.security, resolution.jobs, pods_note=False)
    )
    if org.security.forbid_plaintext_secrets:
        out += _guarded("MPG-SEC-SECRETS", lambda: check_secrets(resolution.jobs))
    out += _guarded(
        "MPG-IMG-001",
        lambda: check_images(
            org.images,
            resolution.jobs,
            require_digest=org.images.require_digest,
            digest_reason="the org",
            known=config_image_refs(config),
        ),
    )
    return _dedupe(out), [p.message for p in resolution.problems if p.advisory]


# -- Verdict -------------------------------------------------------------------------------------


def _decide(
    config: Config,
    request: AdmissionInput,
    namespace: str | None,
    name: str,
    team: Team | None,
    findings: list[Finding],
    patch: list[dict[str, Any]],
    demand: Demand | None,
    exceptions: Iterable[Any],
    labels: Mapping[str, str],
    now: dt.datetime,
    *,
    classification_controls: tuple[str, ...] = (),
    notes: Iterable[str] = (),
    annotations: Mapping[str, str] | None = None,
) -> Decision:
    rules = all_rules()
    custom = custom_rule_meta(config)
    day = now.astimezone(dt.UTC).date() if now.tzinfo else now.date()
    user = request.user
    held = personas_of(config, team, user) if team is not None and exceptions else frozenset()
    active = [
        e
        for e in exceptions
        if e.active_on(day) and e.matches(namespace or "", name, labels, user.username, user.groups, held)
    ]
    applied: dict[str, AppliedException] = {}
    violations: list[Violation] = []
    warnings: list[str] = []
    for finding in findings:
        meta = custom.get(finding.rule)
        mode: Mode
        digest = ""
        if meta is not None:
            mode, controls, digest = meta.mode, meta.controls, meta.digest
        else:
            mode, controls = config.org.enforcement.mode_for(finding.rule), rules[finding.rule].controls
        waiver = next((e for e in active if finding.rule in e.rule_ids), None)
        if classification_controls and finding.rule.startswith(_CLASSIFICATION_FAMILIES):
            controls = (*controls, *(c for c in classification_controls if c not in controls))
        violations.append(
            Violation(
                rule=finding.rule,
                mode=mode,
                path=finding.path,
                message=finding.message,
                fix=finding.fix,
                controls=controls,
                waived_by=waiver.name if waiver else None,
                digest=digest,
            )
        )
        if waiver is not None:
            applied.setdefault(
                waiver.name,
                AppliedException(
                    waiver.name,
                    waiver.rules,
                    waiver.approver,
                    waiver.ticket,
                    waiver.expires,
                    waiver.justification,
                ),
            )
            until = waiver.expires.isoformat()
            text = f"waived by {waiver.name} until {until}: {finding.short or finding.message}"
            warnings.append(short_warning(finding.rule, text))
        elif mode == "warn":
            warnings.append(short_warning(finding.rule, finding.short or finding.message))
    warnings.extend(short_warning("mpigate", note)[len("[mpigate] ") :] for note in notes)
    denying = [v for v in violations if v.denies]
    message = ""
    if denying:
        where = f"{namespace}/{name}" if namespace else name
        lines = [f"mpigate denied {request.kind} {where}:"]
        for v in denying:
            lines.append(f"  [{v.rule}] {v.path}: {v.message}{' ' + v.fix if v.fix else ''}")
        message = "\n".join(lines)
    return Decision(
        allowed=not denying,
        operation=request.operation,
        kind=request.kind,
        namespace=namespace,
        name=name,
        team=team.name if team else None,
        revision=config.revision,
        violations=tuple(violations),
        warnings=tuple(dict.fromkeys(warnings)),
        patch=tuple(patch),
        exceptions=tuple(applied.values()),
        demand=demand,
        message=message,
        audit_annotations=tuple(sorted(annotations.items())) if annotations else (),
    )


def _failed_closed(config: Config, request: AdmissionInput, doing: str) -> Decision:
    """The answer to an internal error: logged with its traceback, denied with a clean message."""
    log.exception("internal error %s %s %s/%s", doing, request.kind, request.namespace, request.name)
    return Decision.bare(
        request,
        config.revision,
        allowed=False,
        message=f"mpigate could not evaluate {request.kind} {request.namespace}/{request.name}: "
        "internal error (logged); denied to fail closed",
    )
