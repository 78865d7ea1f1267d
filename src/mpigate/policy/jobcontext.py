"""A job's :class:`~mpigate.policy.context.JobContext` (its runtime looked up and prepared, its effective pods
resolved) and the demand its pods place on the team's quota.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from mpigate.config import Config, parse_quantity
from mpigate.config.model import Team
from mpigate.trainjob import PreparedRuntime, format_quantity, prepare_runtime, resolve
from mpigate.trainjob.mpijob import resolve_mpijob
from mpigate.trainjob.resolve import MPIGATE_MANAGER

from .context import CLASSIFICATION_LABEL, JobContext, as_int, as_mapping, as_str, labels_of
from .decision import Demand, JobDemand, LiveContext, Operation, UserInfo
from .demand import build_demand, is_gpu
from .prepared import config_gpu_resources, prepared_runtime
from .shapes import MPIJOB, TRAINJOB

__all__ = ["OWN_MANAGER", "job_context", "job_demand"]

OWN_MANAGER = frozenset({MPIGATE_MANAGER})


def job_context(
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
    trusted: frozenset[str] = OWN_MANAGER,
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


def job_demand(ctx: JobContext) -> Demand | None:
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
