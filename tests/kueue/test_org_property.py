"""End to end: random orgs (flavors, cohort membership, nominal/borrowing/lending limits, cpu,
memory and pod quotas) and random TrainJobs. mpigate's verdict "can never be admitted" (MPG-Q001)
must equal what the independent transcription of Kueue (``oracle.py``) says about the *rendered*
ClusterQueues, Cohorts, ResourceFlavors and the namespace's LimitRange for the job's pods as Trainer
builds them — 0 disagreements."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpigate.config import Config, parse_quantity
from mpigate.config.model import Flavor, GPUQuota
from mpigate.policy import apply_patch
from mpigate.policy.prepared import prepared_runtime
from mpigate.render import render
from mpigate.trainjob import resolve
from tests.conftest import TODAY
from tests.kueue.oracle import Kueue
from tests.policy.helpers import decide, example_org, runtime_patch, trainjob

ORG = example_org()
REGION_OF = {name: team.region for name, team in ORG.teams.items()}
GPUS = ("nvidia.com/gpu", "amd.com/gpu")


@st.composite
def orgs(draw: Any) -> Config:
    flavors: dict[str, Flavor] = {}
    for region in ("eu", "us"):
        for i in range(draw(st.integers(1, 2))):
            name = f"gpu{i}-{region}"
            flavors[name] = Flavor(
                name=name,
                region=region,
                gpu_resource=draw(st.sampled_from(GPUS)),
                gpus_per_node=8,
                capacity=None,
                node_labels=MappingProxyType({"example.com/product": f"p{i}"}),
                tolerations=(),
            )
    teams = {}
    for name, team in ORG.teams.items():
        cohort = draw(st.sampled_from([None, "research-pool"]))
        mine = [f for f in sorted(flavors) if flavors[f].region == REGION_OF[name]]
        chosen = draw(st.lists(st.sampled_from(mine), unique=True, max_size=len(mine)))
        gpus = {}
        for flavor in chosen:
            nominal = draw(st.integers(0, 24))
            gpus[flavor] = GPUQuota(
                flavor,
                nominal,
                draw(st.integers(0, 16)) if cohort else 0,
                draw(st.none() | st.integers(0, nominal)) if cohort else None,
            )
        cpu = draw(st.sampled_from([None, "8", "40", "100"]))
        memory = draw(st.sampled_from([None, "64Gi", "600Gi"]))
        teams[name] = dataclasses.replace(
            team,
            cohort=cohort,
            gpus=MappingProxyType(gpus),
            cpu=cpu,
            memory=memory,
            cpu_value=parse_quantity(cpu) if cpu else None,
            memory_value=parse_quantity(memory) if memory else None,
            pods=draw(st.sampled_from([None, 3, 6])),
        )
    return dataclasses.replace(
        ORG, flavors=MappingProxyType(flavors), teams=MappingProxyType(teams), cohorts=("research-pool",)
    )


@st.composite
def jobs(draw: Any) -> dict[str, Any]:
    namespace = draw(st.sampled_from(["nlp-team", "cv-team", "research"]))
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    gpu = draw(st.sampled_from(GPUS))
    count = draw(st.integers(0, 8))
    if count:
        limits[gpu] = count
    if draw(st.booleans()):
        requests["cpu"] = draw(st.sampled_from(["2", "15", "500m"]))
    elif draw(st.booleans()):
        limits["cpu"] = draw(st.sampled_from(["4", "30"]))  # limits only: Kueue counts the LimitRange default
    if draw(st.booleans()):
        requests["memory"] = draw(st.sampled_from(["8Gi", "100Gi"]))
    if draw(st.integers(0, 5)) == 0:
        requests["ephemeral-storage"] = "10Gi"
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    job = trainjob(namespace=namespace, name="prop")
    job["metadata"]["labels"]["mpigate.io/data-classification"] = "public"
    job["spec"]["trainer"]["numNodes"] = draw(st.integers(1, 4))
    job["spec"]["trainer"]["resourcesPerNode"] = resources
    selector = draw(st.sampled_from([None, "p0", "p1"]))
    if selector is not None:
        placement = {"nodeSelector": {"example.com/product": selector}}
        job["spec"]["runtimePatches"] = [runtime_patch("example.com/placement", "node", placement)]
    return job


def oracle_verdict(config: Config, obj: dict[str, Any]) -> bool:
    """Whether Kueue could ever admit the stored job, from the rendered objects."""
    rendering = render(config, today=TODAY)
    objects = [o.data for o in rendering.objects]
    namespace = obj["metadata"]["namespace"]
    team = config.team_for_namespace(namespace)
    assert team is not None
    kueue = Kueue(
        [o for o in objects if o["kind"] == "ClusterQueue"],
        [o for o in objects if o["kind"] == "Cohort"],
        [o for o in objects if o["kind"] == "ResourceFlavor"],
    )
    limit_range = next(
        o for o in objects if o["kind"] == "LimitRange" and o["metadata"]["namespace"] == namespace
    )
    runtime = config.runtime("ClusterTrainingRuntime", obj["spec"]["runtimeRef"]["name"])
    assert runtime is not None
    resolution = resolve(obj, prepared_runtime(config, runtime))
    podsets = [(job.name, job.pods, job.spec) for job in resolution.jobs if job.pods > 0]
    return kueue.admissible(team.name, podsets, limit_range)


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(orgs(), jobs())
def test_never_admitted_equals_kueues_verdict(config: Config, job: dict[str, Any]) -> None:
    decision = decide(config, job)
    stored = apply_patch(job, decision.patch)
    assert isinstance(stored, dict)
    never = any(v.rule == "MPG-Q001" for v in decision.violations)
    assert never == (not oracle_verdict(config, stored)), [v.message for v in decision.violations]
