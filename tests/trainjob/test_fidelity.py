"""Where the effective pods must match Trainer exactly (issue 16 item 8, issue 21 item 8): resources
merged per key, spec.trainer only on containers named ``node`` (with a warning when it reaches
none), every job labelled trainer, env as Trainer's ``apply.EnvVar`` copies it, slots as the MPI
plugin counts them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mpigate.policy.demand import WELL_KNOWN_GPUS, build_demand
from mpigate.trainjob import Resolution, resolve, resolve_runtime
from tests.conftest import FIXTURES

from .test_resolve import job

RUNTIMES = {
    doc["metadata"]["name"]: doc
    for doc in yaml.safe_load_all(
        (FIXTURES / "trainjob" / "fidelity-runtimes.yaml").read_text(encoding="utf-8")
    )
}


def run(runtime: str, trainer: dict[str, Any] | None = None, **spec: Any) -> Resolution:
    return resolve(job(runtime, trainer, **spec), RUNTIMES[runtime])


def node_container(resolution: Resolution, job_name: str, name: str = "node") -> dict[str, Any]:
    found = resolution.job(job_name)
    assert found is not None
    return next(c for c in found.spec["containers"] if c["name"] == name)


def test_resources_per_node_merge_per_key_into_the_runtimes_resources() -> None:
    """Trainer merges resourcesPerNode into the node container's resources per resource key
    (MergeResourceRequirements): a TrainJob that sets only cpu keeps the runtime's 8 GPUs."""
    resolution = run("mpi-gpu8", {"numNodes": 3, "resourcesPerNode": {"requests": {"cpu": "4"}}})
    for name in ("launcher", "node"):
        assert node_container(resolution, name)["resources"] == {
            "limits": {"nvidia.com/gpu": 8, "memory": "64Gi"},
            "requests": {"cpu": "4"},
        }
    demand = build_demand(resolution, WELL_KNOWN_GPUS, None)
    assert {j.name: j.gpus_per_pod for j in demand.jobs} == {
        "node": {"nvidia.com/gpu": 8},
        "launcher": {"nvidia.com/gpu": 8},
    }
    assert demand.gpus == {"nvidia.com/gpu": 24}  # 1 launcher + 2 nodes, 8 each


def test_resources_per_node_override_the_same_key_and_add_new_ones() -> None:
    resolution = run(
        "mpi-gpu8",
        {"resourcesPerNode": {"limits": {"nvidia.com/gpu": 4, "example.com/nic": 1}}},
    )
    assert node_container(resolution, "launcher")["resources"] == {
        "limits": {"nvidia.com/gpu": 4, "memory": "64Gi", "example.com/nic": 1},
        "requests": {"cpu": "16"},
    }


def test_resources_per_node_need_an_ml_policy_but_the_image_does_not() -> None:
    """newRuntimeInfo merges resourcesPerNode into a trainer job only when the runtime has an
    mlPolicy; the JobSet builder sets the image whatever the policy."""
    resolution = run(
        "no-policy",
        {"image": "registry.test/me:2", "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}},
    )
    container = node_container(resolution, "node")
    assert container["image"] == "registry.test/me:2"
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    notes = [p for p in resolution.problems if p.advisory]
    assert [p.path for p in notes] == ["spec.trainer.resourcesPerNode"]
    assert "no mlPolicy" in notes[0].message


def test_every_job_labelled_trainer_gets_spec_trainer() -> None:
    resolution = run("two-trainers", {"image": "registry.test/me:2", "env": [{"name": "A", "value": "1"}]})
    for name in ("node", "evaluator"):
        container = node_container(resolution, name)
        assert container["image"] == "registry.test/me:2"
        assert container["env"] == [{"name": "A", "value": "1"}]


def test_spec_trainer_on_a_runtime_without_a_node_container_reaches_nothing_and_says_so() -> None:
    """Issue 21 item 8: Trainer sets spec.trainer only on containers named node. With a runtime
    whose container is named trainer, the image and resources do not apply (the pods run the
    runtime's) — and each field that reaches no container is a warning naming it."""
    trainer = {
        "numNodes": 2,
        "image": "registry.test/me:2",
        "command": ["python"],
        "env": [{"name": "A", "value": "1"}],
        "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
    }
    resolution = run("mpi-trainer-named", trainer)
    container = node_container(resolution, "launcher", "trainer")
    assert container["image"] == "registry.test/mpi/runtime:1.0"
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    notes = {p.path: p.message for p in resolution.problems if p.advisory}
    assert set(notes) == {
        "spec.trainer.image",
        "spec.trainer.command",
        "spec.trainer.env",
        "spec.trainer.resourcesPerNode",
    }
    assert "no container named node" in notes["spec.trainer.image"]
    assert "launcher (containers: trainer)" in notes["spec.trainer.image"]
    assert not [p for p in resolution.problems if not p.advisory]
    # The demand is what runs: the runtime's 2 GPUs per pod, not the TrainJob's 8.
    demand = build_demand(resolution, WELL_KNOWN_GPUS, None)
    assert demand.gpus == {"nvidia.com/gpu": 4}


def test_a_runtime_whose_trainer_job_has_no_node_container_is_flagged_on_its_own() -> None:
    notes = [p for p in resolve_runtime(RUNTIMES["mpi-trainer-named"]).problems if p.advisory]
    assert len(notes) == 1
    assert "launcher" in notes[0].message and "no container named node" in notes[0].message


def test_env_is_copied_as_trainers_apply_envvar_copies_it() -> None:
    """apply.EnvVar keeps either valueFrom (its fieldRef, resourceFieldRef, configMapKeyRef and
    secretKeyRef) or the value, never both: a literal next to valueFrom is not what the pod gets."""
    env = [
        {"name": "A", "value": "literal", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "B", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "C", "valueFrom": {"fileKeyRef": {"volumeName": "v", "path": "p", "key": "k"}}},
        {"name": "D", "value": "plain"},
    ]
    resolution = run("mpi-gpu8", {"env": env})
    assert node_container(resolution, "launcher")["env"][-4:] == [
        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "C", "valueFrom": {}},
        {"name": "D", "value": "plain"},
    ]


@pytest.mark.parametrize(
    ("trainer", "slots"),
    [
        # the first job named node or labelled trainer (here the node job) sets the GPUs per node,
        # and a resource whose name contains "gpu" counts (GetNumGPUPerNode)
        ({}, 4),
        # a TrainJob's resourcesPerNode alone decides, even without a GPU (its cpu → 1 slot) ...
        ({"resourcesPerNode": {"requests": {"cpu": "2"}}}, 1),
        # ... and requests come before limits
        ({"resourcesPerNode": {"requests": {"nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": 3}}}, 2),
        ({"resourcesPerNode": {"limits": {"nvidia.com/gpu": "1500m"}}}, 2),  # Quantity.Value rounds up
    ],
)
def test_slots_follow_the_mpi_plugin(trainer: dict[str, Any], slots: int) -> None:
    assert run("mpi-node-first", trainer).slots == slots


def test_reserved_mpi_env_in_spec_trainer_is_rejected_as_trainer_does() -> None:
    resolution = run("mpi-gpu8", {"env": [{"name": "OMPI_MCA_orte_default_hostfile", "value": "/x"}]})
    problems = [p for p in resolution.problems if not p.advisory]
    assert [p.path for p in problems] == ["spec.trainer.env"]
    assert "reserved" in problems[0].message and "OMPI_MCA_orte_default_hostfile" in problems[0].message


def test_an_initializer_env_storage_uri_wins_and_is_named_as_such() -> None:
    """Trainer upserts STORAGE_URI from storageUri, then the TrainJob's env: the env's entry is what
    the initializer reads, and its origin is the env field, not storageUri."""
    plain = next(
        doc
        for doc in yaml.safe_load_all((FIXTURES / "trainjob" / "runtimes.yaml").read_text(encoding="utf-8"))
        if doc["metadata"]["name"] == "mpi-plain"
    )
    spec = {
        "initializer": {
            "dataset": {
                "storageUri": "s3://eu/data",
                "env": [{"name": "STORAGE_URI", "value": "s3://us/data"}, {"name": "X", "value": "1"}],
            }
        }
    }
    resolution = resolve(job("mpi-plain", {"numNodes": 1}, **spec), plain)
    dataset = resolution.job("dataset-initializer")
    assert dataset is not None
    assert dataset.spec["containers"][0]["env"] == [
        {"name": "STORAGE_URI", "value": "s3://us/data"},
        {"name": "X", "value": "1"},
    ]
    assert (
        dataset.origin(("spec", "containers", 0, "env", 0))
        == "spec.initializer.dataset.env[name=STORAGE_URI]"
    )


def test_the_flux_plugin_adds_its_installer_whose_image_a_trainjob_can_choose() -> None:
    """Trainer's Flux plugin runs an init container whose image is FLUX_VIEW_IMAGE: Trainer's
    default, the runtime trainer container's env, or the TrainJob's env (which wins)."""
    runtime = RUNTIMES["flux-plain"]
    plain = resolve_runtime(runtime).job("node")
    assert plain is not None
    installer = plain.spec["initContainers"][-1]
    assert installer["name"] == "flux-installer"
    assert installer["image"] == "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy"
    assert plain.origin(("spec", "initContainers", 0, "image")) == (
        "spec.mlPolicy.flux (Trainer sets spec.initContainers[name=flux-installer].image)"
    )
    assert {v["name"] for v in plain.spec["volumes"]} >= {"flux-install", "spack-install", "flux-curve"}
    chosen = run(
        "flux-plain",
        {"args": ["in.lj"], "env": [{"name": "FLUX_VIEW_IMAGE", "value": "docker.io/me/view:1"}]},
    )
    node = chosen.job("node")
    assert node is not None
    assert node.spec["initContainers"][-1]["image"] == "docker.io/me/view:1"
    assert node.origin(("spec", "initContainers", 0, "image")) == "spec.trainer.env[name=FLUX_VIEW_IMAGE]"
    # the trainer's command (the runtime's, with the TrainJob's args) runs through Flux's entrypoint
    assert node.spec["containers"][0]["command"] == [
        "/bin/bash",
        "/etc/flux-config/entrypoint.sh",
        "lmp -in in.lj",
    ]


def test_a_patch_container_without_a_name_is_refused_not_dropped() -> None:
    """A keyed list item without its key (a container, env entry or volume without a name) merges
    nowhere: it is a problem naming the item, never silently left out."""
    patch = {
        "manager": "a.example/x",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "launcher",
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "containers": [{"securityContext": {"privileged": True}}],
                                            "volumes": [{"hostPath": {"path": "/"}}],
                                        }
                                    }
                                }
                            },
                        }
                    ]
                }
            }
        },
    }
    resolution = run("mpi-gpu8", {}, runtimePatches=[patch])
    malformed = {p.path for p in resolution.problems if p.malformed}
    base = (
        "spec.runtimePatches[manager=a.example/x].trainingRuntimeSpec.template.spec.replicatedJobs[name=launcher]"
        ".template.spec.template.spec"
    )
    assert malformed == {f"{base}.containers[0].name", f"{base}.volumes[0].name"}
