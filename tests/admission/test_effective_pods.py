"""Issue 16's effective-pod bypasses (items 1, 3, 8, 9's malformed part) and issue 21 item 8,
replayed as the API server would send them: through ``/mutate`` and ``/validate`` of a real
webhook over TLS, on a copy of the example org with two more approved runtimes.

Each case was allowed (or lost a field without a word) before the resolver followed Trainer."""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from click.testing import CliRunner

from mpigate.admission.client import ReplayResult, ReviewClient, replay
from mpigate.admission.server import ServeOptions
from mpigate.cli import cli
from tests.conftest import REPO, TODAY

from .conftest import ThreadedWebhook, write_cert

# Runtimes added to the org for these cases: mpi-openmpi-gpu with 8 GPUs in the runtime's own
# node containers, and the same with its containers named trainer instead of node.
EXTRA_RUNTIMES = ("mpi-gpu8", "mpi-trainer-named", "flux-test")


def _runtime(name: str) -> dict[str, Any]:
    base = yaml.safe_load((REPO / "policies" / "runtimes" / "mpi-openmpi-gpu.yaml").read_text())
    runtime = copy.deepcopy(base)
    runtime["metadata"]["name"] = name
    if name == "flux-test":  # Trainer's Flux plugin instead of its MPI plugin
        runtime["spec"]["mlPolicy"] = {"numNodes": 1, "flux": {}}
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
        container["resources"] = {"limits": {"nvidia.com/gpu": 8}}
        if name == "mpi-trainer-named":
            container["name"] = "trainer"
            container["resources"] = {"limits": {"nvidia.com/gpu": 2}}
    return runtime


def org_with_extra_runtimes(target: Path) -> Path:
    for folder in ("policies", "quotas", "rbac", "networkpolicies", "examples"):
        shutil.copytree(REPO / folder, target / folder)
    for name in EXTRA_RUNTIMES:
        (target / "policies" / "runtimes" / f"{name}.yaml").write_text(yaml.safe_dump(_runtime(name)))
    org = target / "policies" / "org.yaml"
    text = org.read_text()
    assert "    allowed:\n" in text
    org.write_text(
        text.replace("    allowed:\n", "    allowed:\n" + "".join(f"      - {n}\n" for n in EXTRA_RUNTIMES))
    )
    return target


@pytest.fixture(scope="module")
def org(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return org_with_extra_runtimes(tmp_path_factory.mktemp("effective-pods-org") / "org")


@pytest.fixture(scope="module")
def client(org: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReviewClient]:
    base = tmp_path_factory.mktemp("effective-pods")
    config = org
    ca = trustme.CA()
    cert, key = write_cert(ca, base / "tls")
    ca.cert_pem.write_to_path(str(base / "ca.crt"))
    options = ServeOptions(
        config=config, tls_cert=cert, tls_key=key, host="127.0.0.1", port=0, reload_interval=3600
    )
    moment = dt.datetime.combine(TODAY, dt.time(12, 0), dt.UTC)
    server = ThreadedWebhook(options, clock=lambda: moment)
    review = ReviewClient(server.server.url, ca_file=str(base / "ca.crt"))
    yield review
    review.close()
    server.stop()


def trainjob(runtime: str = "mpi-openmpi-gpu", name: str = "attempt", **spec: Any) -> dict[str, Any]:
    trainer = spec.pop("trainer", {"numNodes": 1, "image": "registry.acme.internal/nlp/llm-train:1.4.2"})
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "nlp-team", "labels": {"mpigate.io/cost-center": "cc-4711"}},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer, **spec},
    }


def denying(result: ReplayResult) -> dict[str, str]:
    """Rule → the denial lines of that rule, as kubectl prints them."""
    out: dict[str, str] = {}
    for rule, line in re.findall(r"^  \[(MPG-[A-Z0-9-]+)\] (.*)$", result.message, re.M):
        out[rule] = out.get(rule, "") + line + "\n"
    return out


def test_gpus_in_the_runtime_count_when_the_trainjob_sets_only_cpu(client: ReviewClient) -> None:
    """Item 8: the runtime's 8 GPUs stay (Trainer merges resourcesPerNode per key), so 3 nodes ask
    24 GPUs — more than nlp-team's 16 — instead of 'no GPUs'."""
    job = trainjob(
        "mpi-gpu8",
        trainer={
            "numNodes": 3,
            "image": "registry.acme.internal/nlp/llm-train:1.4.2",
            "resourcesPerNode": {"requests": {"cpu": "8"}},
        },
    )
    result = replay(client, job)
    assert result.allowed is False, result.warnings
    lines = denying(result)
    assert "asks 24 nvidia.com/gpu" in lines["MPG-Q001"]


def test_spec_trainer_that_reaches_no_container_is_a_warning(client: ReviewClient) -> None:
    """Issue 21 item 8: with a runtime whose containers are named trainer, Trainer applies neither
    spec.trainer.image nor resourcesPerNode; the answer says so for each field."""
    job = trainjob(
        "mpi-trainer-named",
        trainer={
            "numNodes": 2,
            "image": "registry.acme.internal/nlp/llm-train:1.4.2",
            "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
        },
    )
    result = replay(client, job)
    assert result.allowed is True, result.message
    warned = " ".join(result.warnings)
    assert "spec.trainer.image reaches no container" in warned
    assert "spec.trainer.resourcesPerNode reaches no container" in warned


def data_job(**initializer: Any) -> dict[str, Any]:
    return trainjob("mpi-openmpi-data", initializer=initializer)


@pytest.mark.parametrize(
    ("initializer", "path", "shown"),
    [
        # Item 1: Trainer upserts the initializer env after STORAGE_URI from storageUri, so the env wins.
        (
            {
                "model": {
                    "storageUri": "hf://meta-llama/Llama-3.1-8B",
                    "env": [{"name": "STORAGE_URI", "value": "s3://acme-us-models/llama"}],
                }
            },
            "spec.initializer.model.env[name=STORAGE_URI]",
            "s3://acme-us-models/llama",
        ),
        (
            {
                "dataset": {
                    "storageUri": "s3://acme-eu-datasets/tickets",
                    "env": [{"name": "STORAGE_URI", "value": "s3://acme-us-datasets/tickets"}],
                }
            },
            "spec.initializer.dataset.env[name=STORAGE_URI]",
            "s3://acme-us-datasets/tickets",
        ),
        # The S3 providers' endpoint, the HuggingFace hub and the cache provider's metadata decide
        # where the data comes from as much as the URI does.
        (
            {
                "dataset": {
                    "storageUri": "s3://acme-eu-datasets/tickets",
                    "env": [{"name": "ENDPOINT", "value": "https://s3.us-east-1.amazonaws.com"}],
                }
            },
            "spec.initializer.dataset.env[name=ENDPOINT]",
            "https://s3.us-east-1.amazonaws.com",
        ),
        (
            {
                "model": {
                    "storageUri": "hf://meta-llama/Llama-3.1-8B",
                    "env": [{"name": "HF_ENDPOINT", "value": "https://hf-mirror.example.com"}],
                }
            },
            "spec.initializer.model.env[name=HF_ENDPOINT]",
            "https://hf-mirror.example.com",
        ),
        (
            {
                "dataset": {
                    "storageUri": "cache://sales/orders",
                    "env": [{"name": "METADATA_LOC", "value": "s3://acme-us-lake/orders/metadata.json"}],
                }
            },
            "spec.initializer.dataset.storageUri",
            "cache://sales/orders",
        ),
    ],
)
def test_initializer_data_locations_are_judged_where_the_initializer_reads_them(
    client: ReviewClient, initializer: dict[str, Any], path: str, shown: str
) -> None:
    result = replay(client, data_job(**initializer))
    assert result.allowed is False, result.warnings
    lines = denying(result)["MPG-RES-003"]
    assert f"{path}: " in lines and shown in lines


def test_a_data_location_the_gate_cannot_read_is_refused(client: ReviewClient) -> None:
    """A literal next to valueFrom is dropped by Trainer (apply.EnvVar), and a Secret's value is
    invisible at admission: the initializer would read a location nobody checked."""
    job = data_job(
        model={
            "storageUri": "hf://meta-llama/Llama-3.1-8B",
            "env": [
                {
                    "name": "STORAGE_URI",
                    "value": "hf://meta-llama/Llama-3.1-8B",
                    "valueFrom": {"secretKeyRef": {"name": "where", "key": "uri"}},
                }
            ],
        }
    )
    result = replay(client, job)
    assert result.allowed is False
    lines = denying(result)["MPG-RES-003"]
    assert "spec.initializer.model.env[name=STORAGE_URI]" in lines and "Secret where" in lines


def test_a_storage_uri_only_in_the_secret_is_refused_and_other_secret_values_are_named(
    client: ReviewClient,
) -> None:
    refused = replay(client, data_job(dataset={"secretRef": {"name": "s3-credentials"}}))
    assert refused.allowed is False
    assert "Secret s3-credentials" in denying(refused)["MPG-RES-003"]
    allowed = replay(
        client,
        data_job(
            dataset={"storageUri": "s3://acme-eu-datasets/tickets", "secretRef": {"name": "s3-credentials"}}
        ),
    )
    assert allowed.allowed is True, allowed.message
    warned = " ".join(allowed.warnings)
    assert "s3-credentials" in warned and "ENDPOINT" in warned


def test_compliant_initializer_env_is_admitted(client: ReviewClient) -> None:
    job = data_job(
        dataset={
            "storageUri": "s3://acme-eu-datasets/tickets",
            "env": [
                {"name": "ENDPOINT", "value": ""},
                {"name": "STORAGE_URI", "value": "s3://acme-eu-datasets/v2"},
            ],
        },
        model={"storageUri": "hf://meta-llama/Llama-3.1-8B"},
    )
    result = replay(client, job)
    assert result.allowed is True, result.message


def image_volume_patch(reference: str, job: str = "launcher") -> dict[str, Any]:
    return {
        "manager": "acme.example/weights",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": job,
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "volumes": [
                                                {"name": "weights", "image": {"reference": reference}}
                                            ]
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


def test_oci_image_volumes_from_a_runtime_patch_are_judged_like_containers(client: ReviewClient) -> None:
    """Item 3: an image volume added through runtimePatches runs an image as much as a container."""
    job = trainjob(runtimePatches=[image_volume_patch("docker.io/evil/weights:latest")])
    result = replay(client, job)
    assert result.allowed is False
    path = (
        "spec.runtimePatches[manager=acme.example/weights].trainingRuntimeSpec.template.spec"
        ".replicatedJobs[name=launcher].template.spec.template.spec.volumes[name=weights].image.reference"
    )
    assert (
        f"{path}: image docker.io/evil/weights:latest is pulled from docker.io"
        in denying(result)["MPG-IMG-001"]
    )
    # MPG-IMG-002 is in warn mode in the example org: the :latest tag is still reported.
    assert any(w.startswith("[MPG-IMG-002]") and "latest" in w for w in result.warnings), result.warnings
    ok = replay(
        client,
        trainjob(runtimePatches=[image_volume_patch("registry.acme.internal/nlp/weights:2026.11")]),
    )
    assert ok.allowed is True, ok.message


def test_the_cache_initializers_image_is_judged(client: ReviewClient) -> None:
    """The cache dataset initializer starts pods with the image named in CACHE_IMAGE."""
    job = data_job(
        dataset={
            "storageUri": "s3://acme-eu-datasets/tickets",
            "env": [{"name": "CACHE_IMAGE", "value": "ghcr.io/someone/cache:1.0"}],
        }
    )
    result = replay(client, job)
    assert result.allowed is False
    assert (
        "spec.initializer.dataset.env[name=CACHE_IMAGE]: image ghcr.io/someone/cache:1.0"
        in (denying(result)["MPG-IMG-001"])
    )


def test_a_runtime_with_an_image_volume_from_another_registry_is_refused(client: ReviewClient) -> None:
    runtime = _runtime("mpi-with-volume")
    spec = runtime["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]
    spec["volumes"].append({"name": "weights", "image": {"reference": "quay.io/other/weights:1"}})
    result = replay(client, runtime)
    assert result.allowed is False
    assert (
        "volumes[name=weights].image.reference: image quay.io/other/weights:1"
        in denying(result)["MPG-IMG-001"]
    )


def privileged_patch() -> dict[str, Any]:
    """A privileged launcher in the other region: what a malformed patch beside it must not hide."""
    pod = {
        "containers": [{"name": "node", "securityContext": {"privileged": True}}],
        "nodeSelector": {"topology.kubernetes.io/region": "us-east-1"},
    }
    return {
        "manager": "b.example/escalate",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": "launcher", "template": {"spec": {"template": {"spec": pod}}}}
                    ]
                }
            }
        },
    }


def malformed_patch(where: str, bad: Any) -> dict[str, Any]:
    if where == "jobset spec":
        return {"manager": "a.example/broken", "trainingRuntimeSpec": {"template": {"spec": bad}}}
    pod: Any = bad
    if where == "capabilities":
        pod = {"containers": [{"name": "node", "securityContext": {"capabilities": bad}}]}
    rjob = {"name": "launcher", "template": {"spec": {"template": {"spec": pod}}}}
    return {
        "manager": "a.example/broken",
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [rjob]}}},
    }


MALFORMED_AT = {
    "jobset spec": "spec.runtimePatches[manager=a.example/broken].trainingRuntimeSpec.template.spec",
    "pod spec": "spec.runtimePatches[manager=a.example/broken].trainingRuntimeSpec.template.spec"
    ".replicatedJobs[name=launcher].template.spec.template.spec",
    "capabilities": "spec.runtimePatches[manager=a.example/broken].trainingRuntimeSpec.template.spec"
    ".replicatedJobs[name=launcher].template.spec.template.spec.containers[name=node].securityContext"
    ".capabilities",
}


@pytest.mark.parametrize("bad", [42, True, "x", [None]], ids=["42", "true", "string", "list-of-null"])
@pytest.mark.parametrize("where", sorted(MALFORMED_AT))
def test_a_malformed_patch_is_refused_and_hides_nothing_beside_it(
    client: ReviewClient, where: str, bad: Any
) -> None:
    """Item 9: a wrong type is a denial naming the field, and the part is left out of the merge, so
    the privileged, other-region patch next to it is still judged (a pod spec of 42 used to wipe
    the launcher's containers, so the privileged one was dropped as unknown)."""
    job = trainjob(runtimePatches=[malformed_patch(where, bad), privileged_patch()])
    result = replay(client, job)
    assert result.allowed is False
    lines = denying(result)
    assert f"{MALFORMED_AT[where]}: Expected " in lines["MPG-RT-001"], lines["MPG-RT-001"]
    assert "spec.runtimePatches[manager=b.example/escalate]" in lines["MPG-SEC-PRIVILEGED"]
    assert "topology.kubernetes.io/region=us-east-1" in lines["MPG-RES-002"]


@pytest.mark.parametrize("nodes", [0, -1, -(2**63), 2**31])
def test_num_nodes_out_of_range_is_refused(client: ReviewClient, nodes: int) -> None:
    job = trainjob(trainer={"numNodes": nodes, "image": "registry.acme.internal/nlp/llm-train:1.4.2"})
    result = replay(client, job)
    assert result.allowed is False
    assert (
        f"spec.trainer.numNodes: Must be between 1 and 2147483647, got {nodes}" in denying(result)["MPG-Q002"]
    )


@pytest.mark.parametrize("nproc", [0, -3, "auto", 1.5])
def test_num_proc_per_node_out_of_range_is_refused(client: ReviewClient, nproc: Any) -> None:
    """MPG-Q004 (slots) is advisory and never denies, so a malformed numProcPerNode is MPG-RT-001."""
    trainer = {"numNodes": 1, "numProcPerNode": nproc, "image": "registry.acme.internal/nlp/llm-train:1.4.2"}
    result = replay(client, trainjob(trainer=trainer))
    assert result.allowed is False
    assert "spec.trainer.numProcPerNode: " in denying(result)["MPG-RT-001"]


def test_the_flux_installer_image_a_tenant_chooses_is_judged(client: ReviewClient) -> None:
    """Trainer's Flux plugin starts an init container with the image in spec.trainer.env
    FLUX_VIEW_IMAGE: an image reference in an env value, judged where the TrainJob sets it."""
    trainer = {
        "numNodes": 1,
        "image": "registry.acme.internal/nlp/llm-train:1.4.2",
        "env": [{"name": "FLUX_VIEW_IMAGE", "value": "docker.io/someone/flux-view:jammy"}],
    }
    result = replay(client, trainjob("flux-test", trainer=trainer))
    assert result.allowed is False
    assert (
        "spec.trainer.env[name=FLUX_VIEW_IMAGE]: image docker.io/someone/flux-view:jammy"
        in (denying(result)["MPG-IMG-001"])
    )


# One case of each bypass, for the comparison with explain.
CASES = {
    "gpus merged per key": lambda: trainjob(
        "mpi-gpu8",
        trainer={
            "numNodes": 3,
            "image": "registry.acme.internal/nlp/llm-train:1.4.2",
            "resourcesPerNode": {"requests": {"cpu": "8"}},
        },
    ),
    "initializer env over storageUri": lambda: data_job(
        model={
            "storageUri": "hf://meta-llama/Llama-3.1-8B",
            "env": [{"name": "STORAGE_URI", "value": "s3://acme-us-models/llama"}],
        }
    ),
    "image volume": lambda: trainjob(runtimePatches=[image_volume_patch("docker.io/evil/weights:latest")]),
    "malformed patch": lambda: trainjob(runtimePatches=[malformed_patch("pod spec", 42), privileged_patch()]),
    "zero nodes": lambda: trainjob(
        trainer={"numNodes": 0, "image": "registry.acme.internal/nlp/llm-train:1.4.2"}
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_explain_gives_the_webhooks_answer(
    client: ReviewClient, org: Path, tmp_path: Path, case: str
) -> None:
    """The same bypasses through ``mpigate explain``: the same denial, rule by rule and path by path."""
    obj = CASES[case]()
    webhook = replay(client, obj)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(obj), encoding="utf-8")
    result = CliRunner().invoke(
        cli,
        ["explain", "--config", str(org), "--now", f"{TODAY.isoformat()}T12:00:00Z", "-o", "json", str(path)],
    )
    assert result.exit_code == 1, result.output
    decision = json.loads(result.output)[0]["decision"]
    assert decision["allowed"] is False and webhook.allowed is False
    assert decision["message"] == webhook.message
