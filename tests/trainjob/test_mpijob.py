"""The effective pods of an MPIJob as the MPI Operator builds them (trainjob/mpijob.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from mpigate.trainjob import pod_resources
from mpigate.trainjob.mpijob import resolve_mpijob
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "mpijobs" / "mpi-allreduce.yaml"


def example() -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_launcher_and_workers_as_the_operator_creates_them() -> None:
    obj = example()
    before = copy.deepcopy(obj)
    resolution = resolve_mpijob(obj)
    assert obj == before  # nothing written into the request
    assert resolution.problems == ()
    assert [(j.name, j.pods) for j in resolution.jobs] == [("launcher", 1), ("worker", 2)]
    assert resolution.num_nodes == 2 and resolution.slots == 4
    assert resolution.num_nodes_path == "spec.mpiReplicaSpecs.Worker.replicas"
    ml = resolution.ml_policy
    assert ml is not None and ml.mpi and ml.mpi_implementation == "OpenMPI"
    assert ml.ssh_auth_mount_path == "/home/mpiuser/.ssh"
    launcher, worker = resolution.jobs
    # newLauncherPodTemplate: role env, OpenMPI env and slots, GPUs hidden from a launcher that is
    # not a worker, hostfile ConfigMap, SSH keys (setupSSHOnPod), restartPolicy OnFailure (default)
    lc = launcher.spec["containers"][0]
    assert env_of(lc) == {
        "K_MPI_JOB_ROLE": "launcher",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        "OMPI_MCA_orte_set_default_slots": "4",
        "NVIDIA_VISIBLE_DEVICES": None,
        "NVIDIA_DRIVER_CAPABILITIES": None,
    }
    assert {m["name"]: m["mountPath"] for m in lc["volumeMounts"]} == {
        "ssh-auth": "/home/mpiuser/.ssh",
        "mpi-job-config": "/etc/mpi",
    }
    volumes = {v["name"]: v for v in launcher.spec["volumes"]}
    assert volumes["ssh-auth"]["secret"] == {"secretName": "mpi-allreduce-ssh"}  # 0600 only for /root/.ssh
    assert volumes["mpi-job-config"]["configMap"]["name"] == "mpi-allreduce-config"
    assert launcher.spec["restartPolicy"] == "OnFailure" and worker.spec["restartPolicy"] == "Never"
    assert launcher.metadata["labels"]["training.kubeflow.org/job-role"] == "launcher"
    # newWorker: the author's command stays (sshd is only the default), role env, SSH keys
    wc = worker.spec["containers"][0]
    assert wc["command"][0] == "/usr/sbin/sshd" and env_of(wc) == {"K_MPI_JOB_ROLE": "worker"}
    assert pod_resources(worker).requests["nvidia.com/gpu"] == 4


def test_origins_name_the_mpijobs_fields() -> None:
    resolution = resolve_mpijob(example())
    worker = resolution.jobs[1]
    assert (
        worker.origin(("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"))
        == "spec.mpiReplicaSpecs.Worker.template.spec.containers[name=worker].resources"
        '.limits["nvidia.com/gpu"]'
    )
    env = next(i for i, e in enumerate(worker.spec["containers"][0]["env"]) if e["name"] == "K_MPI_JOB_ROLE")
    assert "the MPI Operator sets" in worker.origin(("spec", "containers", 0, "env", env))


def test_defaults_and_worker_command() -> None:
    obj = example()
    del obj["spec"]["slotsPerWorker"], obj["spec"]["sshAuthMountPath"], obj["spec"]["mpiImplementation"]
    worker = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    del worker["command"]
    obj["spec"]["runLauncherAsWorker"] = True
    resolution = resolve_mpijob(obj)
    assert resolution.slots == 1 and resolution.num_nodes == 3  # the launcher is a worker too
    launcher, worker_job = resolution.jobs
    assert worker_job.spec["containers"][0]["command"] == ["/usr/sbin/sshd", "-De"]
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(launcher.spec["containers"][0])
    ssh = {v["name"]: v for v in launcher.spec["volumes"]}["ssh-auth"]
    assert ssh["secret"]["defaultMode"] == 0o600 and launcher.spec["containers"][0]["volumeMounts"][0] == {
        "name": "ssh-auth",
        "mountPath": "/root/.ssh",
    }


@pytest.mark.parametrize(
    ("edit", "path", "fragment"),
    [
        (
            lambda s: s["mpiReplicaSpecs"]["Worker"].update(replicas="2"),
            "spec.mpiReplicaSpecs.Worker.replicas",
            "expected an integer",
        ),
        (
            lambda s: s["mpiReplicaSpecs"]["Worker"].update(replicas=0),
            "spec.mpiReplicaSpecs.Worker.replicas",
            "must be between 1 and",
        ),
        (
            lambda s: s["mpiReplicaSpecs"]["Worker"].update(replicas=-(2**63)),
            "spec.mpiReplicaSpecs.Worker.replicas",
            "must be between 1 and",
        ),
        (
            lambda s: s["mpiReplicaSpecs"]["Worker"].pop("replicas"),
            "spec.mpiReplicaSpecs.Worker.replicas",
            "is required",
        ),
        (
            lambda s: s["mpiReplicaSpecs"]["Launcher"].update(replicas=2),
            "spec.mpiReplicaSpecs.Launcher.replicas",
            "must be 1",
        ),
        (
            lambda s: s["mpiReplicaSpecs"].pop("Launcher"),
            "spec.mpiReplicaSpecs.Launcher",
            "without a Launcher",
        ),
        (
            lambda s: s["mpiReplicaSpecs"]["Worker"].update(template=42),
            "spec.mpiReplicaSpecs.Worker.template",
            "expected an object",
        ),
        (
            lambda s: s["mpiReplicaSpecs"]["Worker"]["template"].update(spec=[None]),
            "spec.mpiReplicaSpecs.Worker.template.spec",
            "expected an object",
        ),
        (
            lambda s: s["mpiReplicaSpecs"]["Worker"]["template"]["spec"].update(containers=[]),
            "spec.mpiReplicaSpecs.Worker.template.spec.containers",
            "first container",
        ),
        (
            lambda s: s["mpiReplicaSpecs"]["Worker"].update(restartPolicy="Always"),
            "spec.mpiReplicaSpecs.Worker.restartPolicy",
            "Never or OnFailure",
        ),
        (lambda s: s.update(mpiImplementation="LAM"), "spec.mpiImplementation", "OpenMPI, Intel, MPICH"),
        (lambda s: s.update(slotsPerWorker=-1), "spec.slotsPerWorker", "0 or more"),
        (lambda s: s.update(slotsPerWorker=True), "spec.slotsPerWorker", "expected an integer"),
        (lambda s: s.update(mpiReplicaSpecs=None), "spec.mpiReplicaSpecs", "is required"),
        (lambda s: s.update(mpiReplicaSpecs="x"), "spec.mpiReplicaSpecs", "expected an object"),
        (lambda s: s.update(runPolicy=7), "spec.runPolicy", "expected an object"),
    ],
)
def test_what_the_operator_refuses_is_a_problem_naming_the_field(edit: Any, path: str, fragment: str) -> None:
    obj = example()
    edit(obj["spec"])
    problems = [p for p in resolve_mpijob(obj).problems if not p.advisory]
    assert any(p.path == path and fragment in p.message for p in problems), problems


def test_a_replica_type_the_operator_does_not_run_is_a_note() -> None:
    obj = example()
    obj["spec"]["mpiReplicaSpecs"]["Evil"] = {"replicas": 1, "template": {"spec": {"hostNetwork": True}}}
    (problem,) = resolve_mpijob(obj).problems
    assert problem.advisory and problem.path == "spec.mpiReplicaSpecs.Evil"
    assert [j.name for j in resolve_mpijob(obj).jobs] == ["launcher", "worker"]


@pytest.mark.parametrize(
    "value", [None, 42, "x", [], {"spec": 5}, {"spec": {"mpiReplicaSpecs": {"Launcher": []}}}]
)
def test_never_raises_on_garbage(value: Any) -> None:
    resolution = resolve_mpijob(
        {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "spec": value}
        if not isinstance(value, dict)
        else {"kind": "MPIJob", **value}
    )
    assert resolution.problems
