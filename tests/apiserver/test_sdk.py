"""The kubeflow SDK for real: ``TrainerClient`` (kubeflow 0.5.0) with its Kubernetes client loaded
from the kubeconfig, against the API server emulator and the install base — jobs built by
CustomTrainer and CustomTrainerContainer, with RuntimePatches, admitted and mutated (what
``get_job`` reads back is what mpigate made of it) or denied with the fix in the error the SDK user
gets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .cluster import Cluster

trainer = pytest.importorskip(
    "kubeflow.trainer", reason="the kubeflow SDK is not installed (pip install '.[clients]')"
)
options = pytest.importorskip("kubeflow.trainer.options.kubernetes")
kube_client = pytest.importorskip("kubernetes.client")

RUNTIME = "mpi-openmpi-gpu"
IMAGE = "registry.acme.internal/nlp/llm-train:1.4.2"


@pytest.fixture(scope="module")
def sdk(cluster: Cluster) -> Any:
    config = trainer.KubernetesBackendConfig(
        namespace="nlp-team", config_file=str(cluster.kubeconfig), context="jane"
    )
    return trainer.TrainerClient(backend_config=config)


def stored(cluster: Cluster, name: str) -> dict[str, Any]:
    obj = cluster.api.get("trainer.kubeflow.org", "trainjobs", "nlp-team", name)
    assert obj is not None, f"{name} was not stored"
    return obj


def denial(exc: pytest.ExceptionInfo[RuntimeError]) -> dict[str, Any]:
    """What the SDK user has in hand: train() raises RuntimeError('Failed to create TrainJob: …')
    from the Kubernetes client's ApiException, whose body is the API server's Status."""
    cause = exc.value.__cause__
    assert isinstance(cause, kube_client.ApiException), repr(cause)
    body: dict[str, Any] = json.loads(cause.body)
    assert cause.status == body["code"]
    return body


def train_job(n: int) -> str:
    return f"sdk-job-{n}"


def test_custom_trainer_container_is_admitted_mutated_and_read_back(sdk: Any, cluster: Cluster) -> None:
    name = sdk.train(
        runtime=RUNTIME,
        trainer=trainer.CustomTrainerContainer(
            image=IMAGE, num_nodes=2, resources_per_node={"nvidia.com/gpu": 4}
        ),
        options=[options.Labels({"mpigate.io/cost-center": "cc-4711"}), options.Name("sdk-container")]
        if hasattr(options, "Name")
        else [options.Labels({"mpigate.io/cost-center": "cc-4711"})],
    )
    obj = stored(cluster, name)
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "nlp-team"
    assert obj["spec"]["activeDeadlineSeconds"] == 86400
    managers = [p["manager"] for p in obj["spec"]["runtimePatches"]]
    assert "mpigate.io/admission" in managers
    job = sdk.get_job(name)
    assert job.name == name and job.runtime.name == RUNTIME
    assert job.num_nodes == 2
    # the SDK lists what was stored
    assert name in [j.name for j in sdk.list_jobs()]


def test_custom_trainer_function_with_a_runtime_patch_is_admitted(sdk: Any, cluster: Cluster) -> None:
    def train_fn() -> None:
        print("hello from rank 0")

    patch = _pod_patch(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    name = sdk.train(
        runtime=RUNTIME,
        trainer=trainer.CustomTrainer(
            func=train_fn, image=IMAGE, num_nodes=1, resources_per_node={"nvidia.com/gpu": 4}
        ),
        options=[options.Labels({"mpigate.io/cost-center": "cc-4711"}), patch],
    )
    obj = stored(cluster, name)
    managers = [p["manager"] for p in obj["spec"]["runtimePatches"]]
    assert managers[0] == "trainer.kubeflow.org/kubeflow-sdk" and "mpigate.io/admission" in managers
    node = obj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert node["template"]["spec"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert sdk.get_job(name).name == name


def test_over_quota_is_denied_with_the_fix(sdk: Any, cluster: Cluster) -> None:
    before = len(cluster.api.storage)
    with pytest.raises(RuntimeError, match=r"^Failed to create TrainJob: nlp-team/") as exc:
        sdk.train(
            runtime=RUNTIME,
            trainer=trainer.CustomTrainerContainer(
                image=IMAGE, num_nodes=4, resources_per_node={"nvidia.com/gpu": 8}
            ),
            options=[options.Labels({"mpigate.io/cost-center": "cc-4711"})],
        )
    body = denial(exc)
    assert body["code"] == 403 and body["reason"] == "Forbidden"
    assert body["message"].startswith(
        'admission webhook "validate.team.mpigate.io" denied the request: mpigate denied TrainJob nlp-team/'
    )
    assert "[MPG-Q001] spec.trainer: asks 32 nvidia.com/gpu (4 nodes × 8 GPUs)" in body["message"]
    assert (
        "Set spec.trainer.numNodes to 2 or fewer, or ask #nlp-admins to raise quotas/nlp-team.yaml."
        in body["message"]
    )
    assert len(cluster.api.storage) == before


def _pod_patch(**pod: Any) -> Any:
    return options.RuntimePatch(
        training_runtime_spec=options.TrainingRuntimeSpecPatch(
            template=options.JobSetTemplatePatch(
                spec=options.JobSetSpecPatch(
                    replicated_jobs=[
                        options.ReplicatedJobPatch(
                            name="node",
                            template=options.JobTemplatePatch(
                                spec=options.JobSpecPatch(
                                    template=options.PodTemplatePatch(spec=options.PodSpecPatch(**pod))
                                )
                            ),
                        )
                    ]
                )
            )
        )
    )


@pytest.mark.parametrize(
    ("patch", "rule", "fix"),
    [
        pytest.param(
            {"security_context": {"runAsNonRoot": False, "runAsUser": 0}},
            "MPG-SEC-RUNASUSER",
            "Do not run as UID 0: remove runAsUser: 0 or set a non-zero UID.",
            id="pod-security",
        ),
        pytest.param(
            {"node_selector": {"topology.kubernetes.io/region": "us-east-1"}},
            "MPG-RES-002",
            "Remove it; mpigate pins the pods to the team's region itself.",
            id="residency",
        ),
    ],
)
def test_runtime_patch_denials_carry_their_fix(sdk: Any, patch: dict[str, Any], rule: str, fix: str) -> None:
    with pytest.raises(RuntimeError) as exc:
        sdk.train(
            runtime=RUNTIME,
            trainer=trainer.CustomTrainerContainer(
                image=IMAGE, num_nodes=1, resources_per_node={"nvidia.com/gpu": 4}
            ),
            options=[options.Labels({"mpigate.io/cost-center": "cc-4711"}), _pod_patch(**patch)],
        )
    body = denial(exc)
    assert body["code"] == 403
    line = next(line for line in body["message"].splitlines() if line.startswith(f"  [{rule}] "))
    assert "spec.runtimePatches[manager=trainer.kubeflow.org/kubeflow-sdk]" in line
    assert line.endswith(fix), line
