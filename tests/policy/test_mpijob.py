"""MPIJobs through the engine: the same rules as TrainJobs on the Launcher and Worker pods, their own
fields in the messages, mutation, UPDATE, malformed input."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mpigate.config import Config
from mpigate.policy import AdmissionInput, apply_patch, evaluate, judge, mutations
from tests.policy.helpers import NOW, decide, example_org, read


@pytest.fixture(scope="module")
def org() -> Config:
    return example_org()


def request(
    obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None
) -> AdmissionInput:
    return AdmissionInput(operation, "MPIJob", "nlp-team", obj["metadata"]["name"], obj, old)  # type: ignore[arg-type]


def test_a_well_formed_mpijob_is_admitted_mutated_and_the_mutation_is_stable(org: Config) -> None:
    obj = read("mpijobs/mpi-allreduce.yaml")
    before = copy.deepcopy(obj)
    decision = evaluate(org, request(obj), now=NOW)
    assert decision.allowed, decision.message
    assert obj == before
    assert decision.team == "nlp-team" and decision.kind == "MPIJob"
    assert decision.demand is not None and decision.demand.gpus == {"nvidia.com/gpu": 8}
    assert [(j.name, j.pods) for j in decision.demand.jobs] == [("launcher", 1), ("worker", 2)]
    mutated = apply_patch(obj, decision.patch)
    worker = mutated["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    assert worker["metadata"]["labels"]["mpigate.io/team"] == "nlp-team"
    assert worker["spec"]["nodeSelector"] == {"topology.kubernetes.io/region": "eu-west-1"}
    assert worker["spec"]["securityContext"]["runAsNonRoot"] is True
    assert worker["spec"]["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert mutated["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "nlp-team"
    # suspended like a TrainJob: Kueue's MPIJob defaulter runs before mpigate's and suspends only
    # jobs that already carry the queue label; Kueue un-suspends it on admission
    assert mutated["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "activeDeadlineSeconds": 86400,
        "suspend": True,
    }
    # the mutating webhook gives the same patch; mutating the result again changes nothing
    assert mutations(org, request(obj), now=NOW).patch == decision.patch
    assert evaluate(org, request(mutated), now=NOW).patch == ()
    # the validating webhook's verdict on the mutated object is evaluate's on the manifest
    judged = judge(org, request(mutated), now=NOW)
    assert (judged.allowed, judged.violations, judged.demand) == (True, decision.violations, decision.demand)
    # without the mutation the same pods are unpinned and unlabelled, and the job would start before
    # Kueue admits it: judge does not assume it
    unmutated = judge(org, request(obj), now=NOW)
    assert {"MPG-NET-001", "MPG-RES-001", "MPG-Q005"} <= set(unmutated.rule_ids)
    assert ("MPG-Q005", "spec.runPolicy.suspend") in {(v.rule, v.path) for v in unmutated.violations}


def test_findings_name_the_mpijobs_own_fields(org: Config) -> None:
    decision = decide(org, read("mpijobs/deny-mpijob-over-quota.yaml"))
    (v,) = [v for v in decision.violations if v.rule == "MPG-Q001"]
    assert v.path == "spec.mpiReplicaSpecs"
    assert v.message.startswith(
        "asks 32 nvidia.com/gpu (4 nodes × 8 GPUs) but Kueue can admit at most 16 for nlp-team"
    )
    assert v.fix.startswith("Set spec.mpiReplicaSpecs.Worker.replicas to 2 or fewer")
    privileged = decide(org, read("mpijobs/deny-mpijob-privileged-worker.yaml"))
    paths = {v.rule: v.path for v in privileged.violations}
    assert paths["MPG-SEC-PRIVILEGED"] == (
        "spec.mpiReplicaSpecs.Worker.template.spec.containers[name=worker].securityContext.privileged"
    )
    assert paths["MPG-SEC-HOSTNAMESPACES"] == "spec.mpiReplicaSpecs.Worker.template.spec.hostNetwork"


def test_lifecycle_reads_the_run_policy_deadline(org: Config) -> None:
    obj = read("mpijobs/mpi-allreduce.yaml")
    obj["spec"]["runPolicy"]["activeDeadlineSeconds"] = 10**9
    (v,) = [v for v in decide(org, obj).violations if v.rule == "MPG-LIFE-001"]
    assert v.path == "spec.runPolicy.activeDeadlineSeconds" and v.fix.startswith(
        "Set spec.runPolicy.activeDeadlineSeconds to"
    )


def test_root_ssh_keys_with_a_non_root_pod_is_mpi_sanity(org: Config) -> None:
    obj = read("mpijobs/mpi-allreduce.yaml")
    del obj["spec"]["sshAuthMountPath"]  # the operator's default /root/.ssh
    found = [v for v in decide(org, obj).violations if v.rule == "MPG-RT-002"]
    assert {v.message.split(" pods'")[0] for v in found} == {"the launcher", "the worker"}
    assert all("sshAuthMountPath is /root/.ssh" in v.message and v.mode == "enforce" for v in found)


def test_another_teams_label_or_region_in_a_template_is_denied_not_overwritten(org: Config) -> None:
    obj = read("mpijobs/mpi-allreduce.yaml")
    obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["metadata"] = {
        "labels": {"mpigate.io/team": "cv-team"}
    }
    decision = decide(org, obj)
    assert not decision.allowed and "MPG-NET-001" in decision.rule_ids
    assert all("mpigate.io~1team" not in op["path"] or "Worker" in op["path"] for op in decision.patch)


def test_an_update_that_adds_a_privileged_worker_is_denied_a_label_update_is_not(org: Config) -> None:
    created = read("mpijobs/mpi-allreduce.yaml")
    stored = apply_patch(created, evaluate(org, request(created), now=NOW).patch)
    relabelled = copy.deepcopy(stored)
    relabelled["metadata"]["labels"]["team.example/note"] = "x"
    assert evaluate(org, request(relabelled, "UPDATE", stored), now=NOW).allowed
    worse = copy.deepcopy(stored)
    worse["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["securityContext"] = {
        "privileged": True
    }
    decision = evaluate(org, request(worse, "UPDATE", stored), now=NOW)
    assert not decision.allowed and "MPG-SEC-PRIVILEGED" in decision.rule_ids
    assert decision.patch == ()


@pytest.mark.parametrize(
    "spec",
    [None, 42, "x", [None], {"mpiReplicaSpecs": 7}, {"mpiReplicaSpecs": {"Worker": {"replicas": True}}}],
)
def test_malformed_mpijobs_are_refused_never_absent(org: Config, spec: Any) -> None:
    obj = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "m", "namespace": "nlp-team"},
    }
    if spec is not None:
        obj["spec"] = spec
    decision = evaluate(org, request(obj), now=NOW)
    assert not decision.allowed
    assert mutations(org, request(obj), now=NOW).allowed  # no verdict at mutation, never a crash


def test_a_template_field_of_the_wrong_type_is_refused_not_read_as_absent(org: Config) -> None:
    """hostNetwork "true" would read as false to Pod Security: it is a denial naming the field."""
    obj = read("mpijobs/mpi-allreduce.yaml")
    obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["hostNetwork"] = "true"
    decision = decide(org, obj)
    assert not decision.allowed
    (v,) = [
        v for v in decision.violations if v.path == "spec.mpiReplicaSpecs.Worker.template.spec.hostNetwork"
    ]
    assert v.mode == "enforce" and v.message == 'Expected a boolean, got string "true".'
