"""What only an UPDATE (or a CREATE judged as received) can get wrong: mpigate's own runtime patch
entry forged or repeated, and what CREATE's mutation set taken back (MPG-LIFE-003).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from mpigate.trainjob.jsontypes import is_mapping
from mpigate.trainjob.paths import Key, PathPart, format_path
from mpigate.trainjob.resolve import MPIGATE_MANAGER

from .context import JobContext, as_mapping
from .findings import Finding
from .jsonpatch import diff, unescape
from .mpijob import mutate_mpijob
from .mutation import mutate
from .shapes import MPIJOB

__all__ = ["forged_entry", "kept_mutations", "own_entries", "runtime_ref"]


def runtime_ref(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(as_mapping(obj.get("spec")).get("runtimeRef"))


def own_entries(obj: Mapping[str, Any]) -> int:
    patches = as_mapping(obj.get("spec")).get("runtimePatches")
    if not isinstance(patches, list):
        return 0
    return sum(1 for p in patches if is_mapping(p) and p.get("manager") == MPIGATE_MANAGER)


def forged_entry(what: str) -> Finding:
    return Finding(
        "MPG-LIFE-003",
        f"spec.runtimePatches[manager={MPIGATE_MANAGER}]",
        f"an entry under mpigate's own manager name was not written by mpigate ({what}); it is judged "
        "as a tenant's patch, and only the admission webhook writes that entry.",
        f"Remove the {MPIGATE_MANAGER} entry (mpigate adds its own on CREATE), and put your own changes "
        "under your own manager name.",
        "runtime patch under mpigate's manager was not written by mpigate",
    )


def kept_mutations(ctx: JobContext, already: Iterable[Finding]) -> list[Finding]:
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
