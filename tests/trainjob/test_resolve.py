"""Effective pod specs, pod counts, slots and origins of values, on the fixture runtimes."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
import yaml

from mpigate.trainjob import Key, format_path, get_path, parse_path, pod_resources, resolve, resolve_runtime
from tests.conftest import FIXTURES

RUNTIMES = {
    doc["metadata"]["name"]: doc
    for doc in yaml.safe_load_all((FIXTURES / "trainjob" / "runtimes.yaml").read_text(encoding="utf-8"))
}


def job(runtime: str, trainer: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "j", "namespace": "team-a"},
        "spec": {"runtimeRef": {"name": runtime}, **spec},
    }
    if trainer is not None:
        out["spec"]["trainer"] = trainer
    return out


def pods(runtime: str, trainer: dict[str, Any] | None = None) -> dict[str, int]:
    return {j.name: j.pods for j in resolve(job(runtime, trainer), RUNTIMES[runtime]).jobs}


@pytest.mark.parametrize(
    ("num_nodes", "expected"),
    [
        (None, {"node": 1, "launcher": 1}),
        (1, {"node": 1, "launcher": 1}),
        (2, {"node": 1, "launcher": 1}),
        (4, {"node": 3, "launcher": 1}),
    ],
)
def test_mpi_run_launcher_as_node_counts(num_nodes: int | None, expected: dict[str, int]) -> None:
    trainer = {} if num_nodes is None else {"numNodes": num_nodes}
    assert pods("mpi-rlan", trainer) == expected


@pytest.mark.parametrize(("num_nodes", "node_pods"), [(1, 1), (2, 2), (4, 4)])
def test_mpi_without_run_launcher_as_node_counts(num_nodes: int, node_pods: int) -> None:
    counts = pods("mpi-plain", {"numNodes": num_nodes})
    assert counts == {"dataset-initializer": 1, "model-initializer": 1, "launcher": 1, "node": node_pods}


def test_torch_uses_ml_policy_num_nodes_when_the_trainjob_omits_it() -> None:
    assert pods("torch-cpu", {}) == {"node": 2}
    assert pods("torch-cpu", {"numNodes": 4}) == {"node": 4}


def test_trainer_fields_reach_only_the_trainer_job_and_env_resources_the_node_job() -> None:
    trainer = {
        "numNodes": 4,
        "image": "registry.test/me/train:2.0",
        "command": ["mpirun", "python3"],
        "env": [{"name": "RUNTIME_ONLY", "value": "overridden"}, {"name": "EXTRA", "value": "x"}],
        "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
    }
    resolution = resolve(job("mpi-rlan", trainer), RUNTIMES["mpi-rlan"])
    launcher, node = resolution.job("launcher"), resolution.job("node")
    assert launcher is not None and node is not None
    launcher_c = launcher.spec["containers"][0]
    node_c = next(c for c in node.spec["containers"] if c["name"] == "node")
    assert launcher_c["image"] == "registry.test/me/train:2.0"
    assert launcher_c["command"] == ["mpirun", "python3"]
    # The node job keeps the runtime's sshd image and command ...
    assert node_c["image"] == "registry.test/mpi/runtime:1.0"
    assert node_c["command"] == ["/usr/sbin/sshd", "-De"]
    # ... but gets env (upserted by name, runtime order kept) and resources with runLauncherAsNode.
    assert [(e["name"], e["value"]) for e in node_c["env"]] == [
        ("RUNTIME_ONLY", "overridden"),
        ("EXTRA", "x"),
    ]
    assert node_c["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    sidecar = next(c for c in node.spec["containers"] if c["name"] == "sidecar")
    assert "env" not in sidecar and sidecar["resources"] == {"requests": {"cpu": "100m", "memory": "64Mi"}}
    assert resolution.slots == 8  # runtime says 1 and a pod asks for 8 GPUs: Trainer uses the GPU count


def test_without_run_launcher_as_node_the_trainer_job_is_node_and_the_launcher_keeps_its_image() -> None:
    trainer = {"numNodes": 2, "image": "registry.test/me/train:2.0", "env": [{"name": "A", "value": "1"}]}
    resolution = resolve(job("mpi-plain", trainer), RUNTIMES["mpi-plain"])
    node, launcher = resolution.job("node"), resolution.job("launcher")
    assert node is not None and launcher is not None
    assert node.spec["containers"][0]["image"] == "registry.test/me/train:2.0"
    assert launcher.spec["containers"][0]["image"] == "registry.test/mpi/launcher:1.0"
    assert "A" not in [e["name"] for e in launcher.spec["containers"][0].get("env", [])]
    assert resolution.slots == 8  # mlPolicy.mpi.numProcPerNode


def test_num_proc_per_node_overrides_the_runtime_and_a_string_is_a_problem() -> None:
    ok = resolve(
        job("mpi-rlan", {"numProcPerNode": 3, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}}}),
        RUNTIMES["mpi-rlan"],
    )
    assert ok.slots == 3
    bad = resolve(job("mpi-rlan", {"numProcPerNode": "auto"}), RUNTIMES["mpi-rlan"])
    assert [p.path for p in bad.problems] == ["spec.trainer.numProcPerNode"]
    assert "integer" in bad.problems[0].message


def test_initializers_get_storage_uri_env_and_secret_ref() -> None:
    spec = {
        "initializer": {
            "dataset": {
                "storageUri": "s3://bucket/data",
                "env": [{"name": "X", "value": "1"}],
                "secretRef": {"name": "s"},
            },
            "model": {"storageUri": "hf://org/model"},
        }
    }
    resolution = resolve(job("mpi-plain", {"numNodes": 1}, **spec), RUNTIMES["mpi-plain"])
    dataset = resolution.job("dataset-initializer")
    assert dataset is not None
    container = dataset.spec["containers"][0]
    assert container["env"] == [
        {"name": "STORAGE_URI", "value": "s3://bucket/data"},
        {"name": "X", "value": "1"},
    ]
    assert container["envFrom"] == [{"secretRef": {"name": "s"}}]
    assert dataset.origin(("spec", "containers", 0, "env", 0)) == "spec.initializer.dataset.storageUri"
    assert dataset.origin(("spec", "containers", 0, "env", 1)) == "spec.initializer.dataset.env[name=X]"
    assert dataset.origin(("spec", "containers", 0, "envFrom")) == "spec.initializer.dataset.secretRef"


def test_initializer_on_a_runtime_without_initializer_jobs_is_a_problem() -> None:
    resolution = resolve(
        job("mpi-rlan", {}, initializer={"dataset": {"storageUri": "s3://x"}}), RUNTIMES["mpi-rlan"]
    )
    assert [p.path for p in resolution.problems] == ["spec.initializer.dataset"]


def patch(
    manager: str, job_name: str, pod_spec: dict[str, Any], metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": pod_spec}
    if metadata:
        template["metadata"] = metadata
    return {
        "manager": manager,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {"replicatedJobs": [{"name": job_name, "template": {"spec": {"template": template}}}]}
            }
        },
    }


def test_runtime_patches_strategic_merge_in_list_order() -> None:
    patches = [
        patch(
            "a.example/one",
            "node",
            {
                "containers": [
                    {
                        "name": "sidecar",
                        "securityContext": {"runAsNonRoot": True},
                        "volumeMounts": [{"name": "data", "mountPath": "/dev/shm"}],
                    }
                ],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}],
                "tolerations": [{"key": "one", "operator": "Exists"}],
                "nodeSelector": {"a": "1"},
            },
        ),
        patch(
            "b.example/two",
            "node",
            {"nodeSelector": {"b": "2"}, "tolerations": [{"key": "two", "operator": "Exists"}]},
            metadata={"labels": {"team": "x"}},
        ),
    ]
    resolution = resolve(job("mpi-rlan", {}, runtimePatches=patches), RUNTIMES["mpi-rlan"])
    node = resolution.job("node")
    assert node is not None
    spec = node.spec
    # containers merge by name, keeping the runtime's order and fields
    assert [c["name"] for c in spec["containers"]] == ["node", "sidecar"]
    sidecar = spec["containers"][1]
    assert sidecar["image"] == "registry.test/mpi/metrics:1.0" and sidecar["securityContext"] == {
        "runAsNonRoot": True
    }
    # volumeMounts merge by mountPath (the patch's mount replaces the runtime's at /dev/shm)
    assert sidecar["volumeMounts"] == [{"name": "data", "mountPath": "/dev/shm"}]
    # volumes merge by name (the runtime's dshm stays, data is appended); maps merge; tolerations replace
    assert [v["name"] for v in spec["volumes"]][:2] == ["dshm", "data"]
    assert spec["nodeSelector"] == {"a": "1", "b": "2"}
    assert spec["tolerations"] == [{"key": "two", "operator": "Exists"}]
    assert node.metadata["labels"] == {"team": "x"}
    assert node.origin(("spec", "tolerations", 0)) == (
        "spec.runtimePatches[manager=b.example/two].trainingRuntimeSpec.template.spec.replicatedJobs[name=node]"
        ".template.spec.template.spec.tolerations[0]"
    )
    assert node.origin(("spec", "nodeSelector", "a")).startswith("spec.runtimePatches[manager=a.example/one]")
    assert node.origin(("spec", "containers", 0, "image")) == (
        "runtime mpi-rlan: spec.template.spec.replicatedJobs[name=node].template.spec.template.spec"
        ".containers[name=node].image"
    )


def test_missing_fields_point_where_they_belong_in_the_closest_runtime_or_patch() -> None:
    resolution = resolve(job("mpi-rlan", {"image": "registry.test/x:1"}), RUNTIMES["mpi-rlan"])
    launcher = resolution.job("launcher")
    assert launcher is not None
    where = launcher.origin(("spec", "containers", 0, "securityContext", "allowPrivilegeEscalation"))
    assert where == (
        "runtime mpi-rlan: spec.template.spec.replicatedJobs[name=launcher].template.spec.template.spec"
        ".containers[name=node].securityContext.allowPrivilegeEscalation"
    )
    assert launcher.origin(("spec", "containers", 0, "image")) == "spec.trainer.image"


def test_patches_trainer_rejects_are_reported_and_not_applied() -> None:
    patches = [
        patch("a.example/x", "worker", {"nodeSelector": {"a": "1"}}),
        patch("a.example/y", "node", {"containers": [{"name": "ghost", "securityContext": {}}]}),
        patch(
            "a.example/z",
            "launcher",
            {"containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}]},
        ),
        {"manager": 5},
        "not an object",
    ]
    resolution = resolve(job("mpi-rlan", {}, runtimePatches=patches), RUNTIMES["mpi-rlan"])
    messages = [p.message for p in resolution.problems]
    assert any("no replicated job 'worker'" in m for m in messages)
    assert any("no container 'ghost'" in m for m in messages)
    assert any("env patches on the node container" in m for m in messages)
    assert any("needs a manager" in m for m in messages)
    assert any(p.malformed and p.field == ("spec", "runtimePatches", 4) for p in resolution.problems)
    node = resolution.job("node")
    assert node is not None and [c["name"] for c in node.spec["containers"]] == ["node", "sidecar"]


def test_mpi_plugin_adds_ssh_keys_hostfile_and_reserved_env() -> None:
    resolution = resolve(job("mpi-rlan", {"numNodes": 2}), RUNTIMES["mpi-rlan"])
    launcher = resolution.job("launcher")
    assert launcher is not None
    names = [v["name"] for v in launcher.spec["volumes"]]
    assert names == ["mpi-ssh-auth", "mpi-hostfile"]
    mounts = {m["mountPath"] for m in launcher.spec["containers"][0]["volumeMounts"]}
    assert mounts == {"/home/mpiuser/.ssh", "/etc/mpi"}
    env = {e["name"]: e["value"] for e in launcher.spec["containers"][0]["env"]}
    assert env["OMPI_MCA_orte_set_default_slots"] == "1"
    assert launcher.origin(("spec", "volumes", 0)).startswith(
        "runtime mpi-rlan: spec.mlPolicy.mpi (Trainer sets"
    )


def test_pod_resources_follow_the_scheduler_rule() -> None:
    resolution = resolve(
        job(
            "mpi-rlan",
            {
                "resourcesPerNode": {
                    "requests": {"cpu": "1"},
                    "limits": {"memory": "4Gi", "nvidia.com/gpu": 2},
                }
            },
        ),
        RUNTIMES["mpi-rlan"],
    )
    launcher, node = resolution.job("launcher"), resolution.job("node")
    assert launcher is not None and node is not None
    # launcher: max(Σ containers = 1 cpu, init container = 2 cpu) ; memory max(4Gi, 1Gi)
    assert pod_resources(launcher).requests == {"cpu": 2, "memory": 4 * 2**30, "nvidia.com/gpu": 2}
    # node: node container + sidecar (requests default to limits)
    assert pod_resources(node).requests == {
        "cpu": Fraction(11, 10),
        "memory": 4 * 2**30 + 64 * 2**20,
        "nvidia.com/gpu": 2,
    }


def test_runtime_on_its_own_counts_from_the_template() -> None:
    resolution = resolve_runtime(RUNTIMES["mpi-plain"])
    assert {j.name: j.pods for j in resolution.jobs} == {
        "dataset-initializer": 1,
        "model-initializer": 1,
        "launcher": 1,
        "node": 1,
    }
    node = resolution.job("node")
    assert node is not None
    assert node.origin(("spec", "containers", 0, "image")) == (
        "spec.template.spec.replicatedJobs[name=node].template.spec.template.spec.containers[name=node].image"
    )


def test_wrong_types_become_problems_not_exceptions() -> None:
    hostile = job("mpi-rlan", "not-a-dict", runtimePatches={"a": 1}, initializer=[1])  # type: ignore[arg-type]
    resolution = resolve(hostile, RUNTIMES["mpi-rlan"])
    fields = {p.path for p in resolution.problems if p.malformed}
    assert fields == {"spec.trainer", "spec.runtimePatches", "spec.initializer"}
    assert {j.name: j.pods for j in resolution.jobs} == {"node": 1, "launcher": 1}


@pytest.mark.parametrize("name", [[1], {"a": 1}, 5, None])
def test_a_patch_container_without_a_string_name_is_a_problem_and_applies_nothing(name: Any) -> None:
    # An unhashable name (list, mapping) must not reach the by-name merge: it is a malformed item.
    patches = [patch("a.example/y", "node", {"containers": [{"name": name, "image": "evil:1"}]})]
    resolution = resolve(job("mpi-rlan", {}, runtimePatches=patches), RUNTIMES["mpi-rlan"])
    assert any("string name" in p.message for p in resolution.problems)
    node = resolution.job("node")
    assert node is not None
    assert "evil:1" not in [c.get("image") for c in node.spec["containers"]]


def test_path_parts_are_formatted_alike_whatever_their_length() -> None:
    # format_path memoizes the identifier test of short parts only: a tenant's long keys are
    # formatted the same way and never kept.
    from mpigate.trainjob import paths

    for key in ("a" * 63, "a" * 64, "a" * 5000, "a." * 40, "x\n", "_-9", "9a", 'q"'):
        want = f".{key}" if paths._IDENT.match(key) else '["' + key.replace('"', '\\"') + '"]'
        assert format_path(("spec", key)) == f"spec{want}"
        assert format_path(("spec", key)) == f"spec{want}"  # again, from the memo where it is one
    paths._plain_short.cache_clear()
    format_path(("spec", "b" * 64, "c" * 63, "b" * 5000))
    assert paths._plain_short.cache_info().currsize == 2  # "spec" and "c" * 63 only


def test_paths_format_and_parse() -> None:
    parts = ("spec", "runtimePatches", Key("manager", "a.example/x"), "limits", "nvidia.com/gpu", 0)
    assert format_path(parts) == 'spec.runtimePatches[manager=a.example/x].limits["nvidia.com/gpu"][0]'
    assert parse_path('metadata.annotations["container.apparmor.security.beta.kubernetes.io/node"]') == (
        "metadata",
        "annotations",
        "container.apparmor.security.beta.kubernetes.io/node",
    )
    assert parse_path("spec.containers[2].securityContext") == ("spec", "containers", 2, "securityContext")
    assert get_path({"c": [{"name": "n", "v": 1}]}, ("c", Key("name", "n"), "v")) == (True, 1)
    assert get_path({"c": []}, ("c", Key("name", "n"))) == (False, None)
