"""MPG-NET-001 (the team label that NetworkPolicies select) and MPG-NET-002 (the pinned ports of the
``pinned-ports`` profile, in the environment of the job's MPI implementation)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mpigate.config.mpienv import LABELS
from mpigate.policy.context import TEAM_LABEL, JobContext, as_list, as_mapping, as_str
from mpigate.policy.findings import Finding
from mpigate.policy.shapes import TRAINJOB
from mpigate.trainjob import EffectiveJob

__all__ = ["check_network", "implementation_note"]


def check_network(ctx: JobContext) -> Iterator[Finding]:
    team = ctx.team
    resolution = ctx.resolution
    if team is None:
        return
    if resolution is not None:
        for job in resolution.jobs:
            # Another document claiming another team's identity is the dangerous case: the pods
            # would be let in by that team's NetworkPolicies.
            for layer in job.layers:
                if layer.kind not in ("runtime", "patch") or layer.manager in ctx.trusted_managers:
                    continue
                value = as_mapping(as_mapping(layer.template.get("metadata")).get("labels")).get(TEAM_LABEL)
                if value is not None and value != team.name:
                    yield Finding(
                        "MPG-NET-001",
                        layer.display(("metadata", "labels", TEAM_LABEL)),
                        f"sets pod label {TEAM_LABEL}={value} in a {team.name} job (replicated job "
                        f"{job.name}); "
                        "pods would be admitted by another team's NetworkPolicies.",
                        f"Remove the label; mpigate sets {TEAM_LABEL}={team.name} itself.",
                        f"pod label {TEAM_LABEL}={value} impersonates another team",
                    )
            labels = as_mapping(job.metadata.get("labels"))
            if labels.get(TEAM_LABEL) != team.name:
                yield Finding(
                    "MPG-NET-001",
                    job.origin(("metadata", "labels", TEAM_LABEL)),
                    f"pods of replicated job {job.name} do not carry {TEAM_LABEL}={team.name}; the "
                    "namespace's "
                    "NetworkPolicies would isolate them from each other and from DNS.",
                    "Let mpigate add its runtime patch (create the TrainJob again).",
                    f"pods of {job.name} lack {TEAM_LABEL}={team.name}",
                )

    profile = ctx.profile
    if profile is None or profile.mode != "pinned-ports":
        return
    implementation = ctx.implementation
    expected = dict(profile.pinned_env(implementation))
    label = LABELS[implementation]
    why = (
        f"data classified {ctx.classification.name}"
        if ctx.classification and ctx.classification.network_profile
        else f"{team.name}'s network"
    )
    seen: set[str] = set()
    trainer_env = {as_str(as_mapping(v).get("name")): as_mapping(v) for v in as_list(ctx.trainer.get("env"))}
    mpirun_env = trainer_env if ctx.shape is TRAINJOB else _launcher_env(ctx)
    for name in expected:
        var = mpirun_env.get(name)
        if var is None:
            yield Finding(
                "MPG-NET-002",
                ctx.shape.mpirun_env,
                f"{name} is missing; {why} uses the pinned-ports profile, whose NetworkPolicy only opens the "
                f"pinned {label} ports.",
                f"Let mpigate inject the {label} port environment (create the TrainJob again).",
                f"{name} missing (pinned-ports profile)",
            )
    if resolution is None:
        for path, name, value, var in (
            (f"spec.trainer.env[name={n}]", n, as_mapping(v).get("value"), v)
            for n, v in trainer_env.items()
            if n
        ):
            if name not in expected or path in seen:
                continue
            seen.add(path)
            if _overrides(expected[name], value, var):
                yield _override(path, name, expected[name], why, label)
        return
    # An entry is judged once per path (entries that several pods share); whether it is wrong does
    # not depend on its path, so the paths (origin lookups, the costly part) are computed only for
    # wrong entries — together with those of the entries before them (``unnamed``).
    unnamed: list[tuple[EffectiveJob, tuple[str, str, int, str, int]]] = []
    for job in resolution.jobs:
        for list_field, index, e_index, var in job.env():
            env_name = as_str(var.get("name"))
            if env_name is None or env_name not in expected:
                continue
            pod_path = ("spec", list_field, index, "env", e_index)
            if not _overrides(expected[env_name], var.get("value"), var):
                unnamed.append((job, pod_path))
                continue
            seen.update(j.origin(p) for j, p in unnamed)
            unnamed.clear()
            path = job.origin(pod_path)
            if path in seen:
                continue
            seen.add(path)
            yield _override(path, env_name, expected[env_name], why, label)


def _launcher_env(ctx: JobContext) -> dict[str | None, Mapping[str, Any]]:
    """The env of the container that runs mpirun in a job that has no ``spec.trainer`` (an
    MPIJob's Launcher: its first container, where the MPI Operator puts its own MPI env)."""
    job = ctx.resolution.job(ctx.shape.launcher_job) if ctx.resolution is not None else None
    containers = as_list(job.spec.get("containers")) if job is not None else []
    first = as_mapping(containers[0]) if containers else {}
    return {as_str(as_mapping(v).get("name")): as_mapping(v) for v in as_list(first.get("env"))}


def _overrides(expected: str, value: Any, var: Mapping[str, Any]) -> bool:
    return value != expected or "valueFrom" in var


def _override(path: str, name: str, expected: str, why: str, label: str) -> Finding:
    return Finding(
        "MPG-NET-002",
        path,
        f"overrides {name} (pinned to {expected} by the pinned-ports profile for "
        f"{why}); {label} "
        "would listen on ports the NetworkPolicy blocks.",
        f"Remove {name} from the env; mpigate sets it.",
        f"{name} overrides the pinned {label} ports",
    )


def implementation_note(ctx: JobContext) -> str | None:
    """What the requester should know when a ``pinned-ports`` job runs Intel MPI or MPICH from a
    runtime without Trainer's MPI policy (the OrgPolicy declares the implementation): how it runs,
    what mpigate pinned, and what it cannot see."""
    profile = ctx.profile
    if ctx.team is None or profile is None or profile.mode != "pinned-ports" or not ctx.runtime_name:
        return None
    ml = ctx.resolution.ml_policy if ctx.resolution is not None else None
    implementation = ctx.implementation
    if implementation == "OpenMPI" or (ml is not None and ml.mpi):
        return None
    # A warning holds 120 characters: the runtime's name (any length) comes last.
    return (
        f"{LABELS[implementation]} runs as plain mpiexec.hydra (Trainer's MPI policy: OpenMPI only); "
        f"TCP ports pinned ({ctx.runtime_name})"
    )
