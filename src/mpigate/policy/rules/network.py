"""MPG-NET-001 (the team label that NetworkPolicies select) and MPG-NET-002 (the pinned OpenMPI
ports of the ``pinned-ports`` profile)."""

from __future__ import annotations

from collections.abc import Iterator

from mpigate.policy.context import TEAM_LABEL, JobContext, as_list, as_mapping, as_str
from mpigate.policy.findings import Finding
from mpigate.trainjob.resolve import MPIGATE_MANAGER

__all__ = ["check_network"]


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
                if layer.kind not in ("runtime", "patch") or layer.manager == MPIGATE_MANAGER:
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
    expected = dict(profile.openmpi_env)
    why = (
        f"data classified {ctx.classification.name}"
        if ctx.classification and ctx.classification.network_profile
        else f"{team.name}'s network"
    )
    seen: set[str] = set()
    trainer_env = {as_str(as_mapping(v).get("name")): as_mapping(v) for v in as_list(ctx.trainer.get("env"))}
    for name in expected:
        var = trainer_env.get(name)
        if var is None:
            yield Finding(
                "MPG-NET-002",
                "spec.trainer.env",
                f"{name} is missing; {why} uses the pinned-ports profile, whose NetworkPolicy only opens the "
                "pinned OpenMPI ports.",
                "Let mpigate inject the OpenMPI port environment (create the TrainJob again).",
                f"{name} missing (pinned-ports profile)",
            )
    if resolution is None:
        items = [
            (f"spec.trainer.env[name={n}]", n, as_mapping(v).get("value"), v)
            for n, v in trainer_env.items()
            if n
        ]
    else:
        items = []
        for job in resolution.jobs:
            for list_field, index, container in job.containers():
                for e_index, raw in enumerate(as_list(container.get("env"))):
                    var = as_mapping(raw)
                    env_name = as_str(var.get("name"))
                    if env_name is not None and env_name in expected:
                        path = job.origin(("spec", list_field, index, "env", e_index))
                        items.append((path, env_name, var.get("value"), var))
    for path, name, value, var in items:
        if name not in expected or path in seen:
            continue
        seen.add(path)
        if value != expected[name] or "valueFrom" in as_mapping(var):
            yield Finding(
                "MPG-NET-002",
                path,
                f"overrides {name} (pinned to {expected[name]} by the pinned-ports profile for "
                f"{why}); OpenMPI "
                "would listen on ports the NetworkPolicy blocks.",
                f"Remove {name} from the env; mpigate sets it.",
                f"{name} overrides the pinned OpenMPI ports",
            )
