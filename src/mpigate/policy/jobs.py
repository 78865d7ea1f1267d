"""TrainJobs and MPIJobs: mutation on CREATE, then every rule on the effective pods of the object as
it will be stored, UPDATE grandfathering only what the stored object already had (see
:mod:`mpigate.policy.engine`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from mpigate.config import Config
from mpigate.trainjob import PreparedRuntime
from mpigate.trainjob.jsontypes import is_mapping
from mpigate.trainjob.resolve import MPIGATE_MANAGER, with_last_patch

from .context import QUEUE_LABEL, JobContext, as_mapping, request_identity, request_object
from .custom import custom_findings
from .decision import AdmissionInput, Decision, LiveContext
from .findings import Finding
from .jobchecks import guarded, trainjob_findings
from .jobcontext import OWN_MANAGER, job_context, job_demand
from .jsonpatch import diff
from .mpijob import mutate_mpijob
from .mutation import build_patch_entry, mutate
from .rules.lifecycle import check_update_guard, own_patch_entry, same_patch_entry
from .rules.network import implementation_note
from .shapes import MPIJOB
from .updates import forged_entry, kept_mutations, own_entries, runtime_ref
from .verdict import audited, decide

__all__ = ["judge_job", "mutation_patch"]

# Never grandfathered: a TrainJob without a queue label is ignored by Kueue (its
# manageJobsWithoutQueueName defaults to false), so nothing would limit it once it runs.
_QUEUE_PATH = f'metadata.labels["{QUEUE_LABEL}"]'


def judge_job(
    config: Config, request: AdmissionInput, live: LiveContext | None, now: dt.datetime, *, mutate: bool
) -> Decision:
    obj = request_object(request) if request.obj is not None else as_mapping(request.old_obj)
    namespace, name = request_identity(request, obj)
    team = config.team_for_namespace(namespace) if namespace else None
    if request.operation in ("DELETE", "CONNECT"):
        return audited(config, request, namespace, name, team)

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
    trusted: frozenset[str] = OWN_MANAGER
    forged: Finding | None = None
    ctx: JobContext | None = None
    if own_entries(obj) > 1 and not (request.operation == "CREATE" and mutate):
        # The API server refuses two entries with one manager (runtimePatches is a list-map keyed
        # by manager); mpigate does not rely on it.
        trusted = frozenset()
        forged = forged_entry("there is more than one entry under its name")
    elif request.operation == "CREATE":
        present = own_patch_entry(obj)
        if mutate or present is not None:
            ctx0, runtime = job_context(
                config, "CREATE", obj, namespace, name, team, live, user, exclude=OWN_MANAGER
            )
            if mutate:
                patch, target = mutation_patch(ctx0, obj)
            elif present is not None:
                expected = build_patch_entry(ctx0, ctx0.resolution) if ctx0.resolution is not None else None
                if expected is None or not same_patch_entry(present[1], expected):
                    trusted = frozenset()
                    forged = forged_entry(
                        "mpigate writes no such entry for this job"
                        if expected is None
                        else "it is not the entry mpigate writes"
                    )
                elif ctx0.resolution is not None:
                    # The job as mpigate mutated it: its resolution is the one just computed with
                    # the entry merged in (one resolution per evaluation, not two).
                    full = with_last_patch(ctx0.resolution, obj, MPIGATE_MANAGER)
                    if full is not None:
                        ctx = ctx0.with_resolution(full)
    elif old is not None:
        before = own_patch_entry(old)
        after = own_patch_entry(obj)
        if after is not None and (before is None or not same_patch_entry(after[1], before[1])):
            trusted = frozenset()
    # judge() and UPDATE: the object as received is the one judged, so its context is built once.
    if ctx is None:
        ctx, runtime = job_context(
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
    demand = job_demand(ctx)
    findings.extend(trainjob_findings(ctx, demand))
    if forged is not None:
        findings.append(forged)

    notes: list[str] = []
    annotations: dict[str, str] = {}
    if old is not None:
        # UPDATE judges the whole new object; only a finding identical to one of the stored object
        # (same rule, path, message and value) is grandfathered — a condition that predates the
        # update (say, a quota lowered since) does not block Kueue's suspend, while anything the
        # update brings in, or makes worse, is judged as on CREATE.
        same_runtime = runtime_ref(old) == runtime_ref(obj)
        old_ctx, _ = job_context(
            config,
            "UPDATE",
            old,
            namespace,
            name,
            team,
            live,
            user,
            runtime=runtime if same_runtime else None,
            trusted=OWN_MANAGER,
        )
        findings.extend(guarded("MPG-LIFE-003", lambda: check_update_guard(ctx, old)))
        findings.extend(guarded("MPG-LIFE-003", lambda: kept_mutations(ctx, findings)))
        before_ids = {f.identity for f in trainjob_findings(old_ctx, job_demand(old_ctx))}
        before_ids.update(f.identity for f in kept_mutations(old_ctx, ()))
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

    return decide(
        config,
        request,
        namespace or None,
        name,
        team,
        findings,
        patch,
        demand,
        ctx.labels,
        now,
        classification_controls=ctx.classification.controls if ctx.classification else (),
        notes=notes,
        annotations=annotations,
    )


def mutation_patch(
    ctx0: JobContext, obj: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], Mapping[str, Any]]:
    """mpigate's JSONPatch for a CREATE and the mutated object (``ctx0``: the job resolved without
    mpigate's own runtime patch)."""
    if ctx0.shape is MPIJOB:
        mutated = mutate_mpijob(ctx0, obj, ctx0.resolution)
    else:
        mutated = mutate(ctx0, obj, ctx0.resolution)
    return diff(obj, mutated), mutated
