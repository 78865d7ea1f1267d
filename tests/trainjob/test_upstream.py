"""Every TrainJob and runtime of the upstream Trainer data resolves, with the demand worked out by hand.

Pod counts follow Trainer: MPI with runLauncherAsNode → 1 launcher + max(N-1, 1) nodes; MPI without
it → N nodes + 1 launcher; torch/flux → N pods of the trainer job; initializers 1 pod each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mpigate.policy.demand import WELL_KNOWN_GPUS, build_demand
from mpigate.trainjob import resolve, resolve_runtime

pytestmark = pytest.mark.upstream

# file → (pods per replicated job, GPUs, CPU requests, memory requests, MPI slots), by hand:
EXPECTED: dict[str, tuple[dict[str, int], int, str | None, str | None, int | None]] = {
    # torch-distributed, numNodes 3, no resources
    "01-multi-node.yaml": ({"node": 3}, 0, None, None, None),
    # torch, 2 nodes × (2 CPU, 4Gi requested)
    "02-runtime-patches.yaml": ({"node": 2}, 0, "4", "8Gi", None),
    # torch, 3 × (2 CPU, 4Gi)
    "03-kueue-integration.yaml": ({"node": 3}, 0, "6", "12Gi", None),
    # torch-distributed-volcano (same file), 4 × (1 CPU, 2Gi)
    "04-volcano-integration.yaml": ({"node": 4}, 0, "4", "8Gi", None),
    # TrainingRuntime torch-with-dataset-init: 1 dataset-initializer pod (no resources) + 2 × (2 CPU, 4Gi)
    "05-multi-step.yaml": ({"dataset-initializer": 1, "node": 2}, 0, "4", "8Gi", None),
    "docs__operator-guides__migration__block1__TrainJob-pytorch-simple.yaml": (
        {"node": 2},
        0,
        None,
        None,
        None,
    ),
    # numNodes omitted: mlPolicy.numNodes 1
    "docs__operator-guides__runtime__block1__TrainJob-example-train-job.yaml": (
        {"node": 1},
        0,
        None,
        None,
        None,
    ),
    "docs__user-guides__megatron__block1__TrainJob-megatron-tp.yaml": ({"node": 1}, 0, None, None, None),
    "docs__user-guides__trainjob-lifecycle__block0__TrainJob-my-trainjob.yaml": (
        {"node": 1},
        0,
        None,
        None,
        None,
    ),
    "docs__user-guides__trainjob-lifecycle__block1__TrainJob-my-trainjob.yaml": (
        {"node": 1},
        0,
        None,
        None,
        None,
    ),
    # flux-distributed: the trainer job gets numNodes pods
    "flux-interactive.yaml": ({"node": 4}, 0, None, None, None),
    "lammps-train-gpus.yaml": ({"node": 2}, 2, None, None, None),
    "lammps-train-job.yaml": ({"node": 2}, 0, None, None, None),
    # deepspeed-distributed, runLauncherAsNode, numNodes 2 → launcher 1 + node 1, 4 GPUs each;
    # runtime slots 1 and 4 GPUs per pod → 4 slots
    "notebook__deepspeed__text-summarization__T5-Fine-Tuning__TrainJob.sdk-rendered.yaml": (
        {"node": 1, "launcher": 1},
        8,
        None,
        None,
        4,
    ),
    # mlx-distributed, numNodes 3 → 1 + 2, 1 GPU each (slots stay 1)
    "notebook__mlx__image-classification__mnist__TrainJob.sdk-rendered.yaml": (
        {"node": 2, "launcher": 1},
        3,
        None,
        None,
        1,
    ),
    # mlx-distributed, numNodes 4 → 1 + 3, 1 GPU each
    "notebook__mlx__language-modeling__fine-tune-llama__TrainJob.sdk-rendered.yaml": (
        {"node": 3, "launcher": 1},
        4,
        None,
        None,
        1,
    ),
    # deepspeed-distributed, numNodes 2, no resources
    "test__e2e__e2e_test.go__TrainJob-e2e-test-deepspeed.yaml": (
        {"node": 1, "launcher": 1},
        0,
        None,
        None,
        1,
    ),
    # OpenMPI integration test: runLauncherAsNode false → node 2 (trainer job, 1 CPU/4Gi each) + launcher 1 +
    # both initializers; slots 8 as the expected hostfile says ("alpha-node-0-0.alpha slots=8")
    "test__integration__controller__trainjob_controller_test.go__OpenMPI-alpha.yaml": (
        {"dataset-initializer": 1, "model-initializer": 1, "launcher": 1, "node": 2},
        0,
        "2",
        "8Gi",
        8,
    ),
}

# TrainJobs whose runtime is not part of the upstream data.
MISSING_RUNTIME = {
    "docs__operator-guides__job-scheduling__kai__block1__TrainJob-pytorch-kai-job.yaml": (
        "pytorch-kai-runtime"
    ),
    "docs__operator-guides__runtime-patches__block0__TrainJob-pytorch-distributed.yaml": (
        "pytorch-distributed-gpu"
    ),
    "docs__operator-guides__runtime__block3__TrainJob-example-train-job.yaml": "pytorch-team-runtime",
}


def _documents(
    upstream: Path,
) -> tuple[dict[tuple[str, str], dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    runtimes: dict[tuple[str, str], dict[str, Any]] = {}
    jobs: list[tuple[str, dict[str, Any]]] = []
    trainer = upstream / "trainer"
    for path in sorted([*trainer.glob("runtimes/*.yaml"), *trainer.glob("examples/*.yaml")]):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(doc, dict):
                continue
            if doc.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime"):
                runtimes[(doc["kind"], doc["metadata"]["name"])] = doc
            elif doc.get("kind") == "TrainJob":
                jobs.append((path.name, doc))
    return runtimes, jobs


def test_every_upstream_runtime_resolves_on_its_own(upstream: Path) -> None:
    runtimes, _ = _documents(upstream)
    assert len(runtimes) >= 8
    for (_kind, name), manifest in runtimes.items():
        resolution = resolve_runtime(manifest)
        assert resolution.jobs, name
        assert not [p for p in resolution.problems if p.malformed], name


def test_the_table_covers_every_upstream_trainjob(upstream: Path) -> None:
    _, jobs = _documents(upstream)
    assert {name for name, _ in jobs} == set(EXPECTED) | set(MISSING_RUNTIME)


@pytest.mark.parametrize("file", sorted([*EXPECTED, *MISSING_RUNTIME]))
def test_upstream_trainjob_demand(upstream: Path, file: str) -> None:
    runtimes, jobs = _documents(upstream)
    if file in MISSING_RUNTIME:
        pytest.skip(f"{file}: its runtime {MISSING_RUNTIME[file]} is not in the upstream data")
    trainjob = next(doc for name, doc in jobs if name == file)
    ref = trainjob["spec"]["runtimeRef"]
    runtime = runtimes[(ref.get("kind", "ClusterTrainingRuntime"), ref["name"])]
    resolution = resolve(trainjob, runtime)
    assert not resolution.problems, [p.message for p in resolution.problems]
    demand = build_demand(resolution, WELL_KNOWN_GPUS, None)
    pods, gpus, cpu, memory, slots = EXPECTED[file]
    assert {j.name: j.pods for j in demand.jobs} == pods
    assert demand.pods == sum(pods.values())
    assert demand.total_gpus == gpus
    assert (demand.cpu, demand.memory) == (cpu, memory)
    assert resolution.slots == slots
