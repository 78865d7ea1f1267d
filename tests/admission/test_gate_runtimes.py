"""Issue 16 item 4 through the real webhook over TLS, against a fake Kubernetes API (kmock): a
runtime approved as ``external`` is read for /mutate and /validate, CREATE and UPDATE alike; when
it cannot be read the job is denied (MPG-RT-003) unless the org says ``warn``; and an entry under
mpigate's manager name that mpigate did not write is judged as the tenant's patch."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import kmock as kmock_lib
import yaml

from mpigate.admission.client import apply_review_patch, make_review
from mpigate.admission.kube import KubeConfig
from mpigate.admission.server import WebhookServer
from mpigate.policy import UserInfo
from tests.conftest import REPO
from tests.policy.helpers import runtime_patch

from .conftest import StartWebhook

CTR = "trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
OWN = "mpigate.io/admission"
SCIENTIST = UserInfo("sam@acme.example", ("cv-team-scientists", "system:authenticated"))
KUEUE = UserInfo("system:serviceaccount:kueue-system:kueue-controller-manager", ("system:authenticated",))


def external_runtime() -> dict[str, Any]:
    """The reviewed MPI runtime, installed in the cluster as the org's external
    ``deepspeed-distributed`` (policies/org.yaml approves it, for cv-team, as external)."""
    data = yaml.safe_load((REPO / "policies" / "runtimes" / "mpi-openmpi-gpu.yaml").read_text())
    data["metadata"]["name"] = "deepspeed-distributed"
    assert isinstance(data, dict)
    return data


def job(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "ds", "namespace": "cv-team", "labels": {"mpigate.io/cost-center": "cc-2200"}},
        "spec": {
            "runtimeRef": {"name": "deepspeed-distributed"},
            "trainer": {
                "numNodes": 2,
                "image": "quay.io/acme/ds:1.0",
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
            },
            **spec,
        },
    }


async def post(
    http: aiohttp.ClientSession, server: WebhookServer, path: str, review: dict[str, Any]
) -> dict[str, Any]:
    async with http.post(server.url + path, json=review) as resp:
        assert resp.status == 200
        body = await resp.json()
    response: dict[str, Any] = body["response"]
    return response


async def create(
    http: aiohttp.ClientSession, server: WebhookServer, obj: dict[str, Any], user: UserInfo = SCIENTIST
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(mutate response, the object as the API server stores it, validate response)."""
    mutated = await post(http, server, "/mutate", make_review(obj, user=user))
    stored = apply_review_patch(obj, mutated)
    validated = await post(http, server, "/validate", make_review(stored, user=user))
    return mutated, stored, validated


async def serving(
    start_webhook: StartWebhook, kmock: kmock_lib.KubernetesEmulator, **kw: Any
) -> WebhookServer:
    return await start_webhook(
        config=kw.pop("config", REPO),
        evaluator=None,
        kube=KubeConfig(server=str(kmock.url).rstrip("/")),
        **kw,
    )


async def test_an_external_runtime_is_resolved_for_mutate_and_validate(
    kmock: kmock_lib.KubernetesEmulator, start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    kmock.objects[CTR, None, "deepspeed-distributed"] = external_runtime()
    server = await serving(start_webhook, kmock)
    mutated, stored, validated = await create(http, server, job())
    # /mutate read the runtime too, so mpigate's patch (team label, region) covers its jobs ...
    managers = [p["manager"] for p in stored["spec"]["runtimePatches"]]
    assert managers == [OWN], mutated
    entry = stored["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    assert {j["name"] for j in entry["replicatedJobs"]} == {"node", "launcher"}
    # ... and /validate, judging the same effective pods, admits it (it denied every such job).
    assert validated["allowed"] is True, validated.get("status")
    # UPDATE resolves the runtime the same way: Kueue suspending the job is fine.
    suspended = copy.deepcopy(stored)
    suspended["spec"]["suspend"] = True
    update = await post(
        http, server, "/validate", make_review(suspended, operation="UPDATE", old=stored, user=KUEUE)
    )
    assert update["allowed"] is True, update.get("status")
    # ... and a privileged patch added while suspended is judged on the runtime's pods.
    worse = copy.deepcopy(suspended)
    worse["spec"]["runtimePatches"].append(
        runtime_patch(
            "acme.example/debug",
            "node",
            {"containers": [{"name": "node", "securityContext": {"privileged": True}}]},
        )
    )
    update = await post(
        http, server, "/validate", make_review(worse, operation="UPDATE", old=suspended, user=SCIENTIST)
    )
    assert update["allowed"] is False
    assert "[MPG-SEC-PRIVILEGED]" in update["status"]["message"]


async def test_an_unreadable_external_runtime_is_denied_with_the_reason(
    kmock: kmock_lib.KubernetesEmulator, start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    server = await serving(start_webhook, kmock)  # the runtime is not in the cluster: 404
    _, _, validated = await create(http, server, job())
    assert validated["allowed"] is False
    message = validated["status"]["message"]
    assert (
        "[MPG-RT-003] spec.runtimeRef.name: ClusterTrainingRuntime deepspeed-distributed is approved as "
        in (message)
    )
    assert "could not be read (ClusterTrainingRuntime deepspeed-distributed not read: GET " in message
    assert "MPG-RT-003: warn" in message  # the fix names the setting


async def test_without_live_lookups_an_external_runtime_is_denied(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    server = await start_webhook(config=REPO, evaluator=None)  # serve --no-live
    _, _, validated = await create(http, server, job())
    assert validated["allowed"] is False
    assert "no cluster was asked" in validated["status"]["message"]


async def test_the_org_can_admit_unresolved_runtimes_with_a_warning(
    start_webhook: StartWebhook, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    tree = tmp_path / "warn-org"
    for folder in ("policies", "quotas", "rbac", "networkpolicies", "examples"):
        shutil.copytree(REPO / folder, tree / folder)
    org = tree / "policies" / "org.yaml"
    org.write_text(
        org.read_text().replace("      MPG-IMG-002: warn", "      MPG-IMG-002: warn\n      MPG-RT-003: warn")
    )
    server = await start_webhook(config=tree, evaluator=None)
    _, _, validated = await create(http, server, job())
    assert validated["allowed"] is True, validated.get("status")
    assert any(
        w.startswith("[MPG-RT-003] runtime deepspeed-distributed could not be read")
        for w in validated["warnings"]
    )


async def test_a_tenants_entry_under_mpigates_manager_is_not_trusted(
    kmock: kmock_lib.KubernetesEmulator, start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    """The service-account, residency and network checks skip mpigate's own entry; a copy a tenant
    wrote under its name is judged as the tenant's patch (here it names cv-team's pipeline account,
    which a data scientist may not use, and pins nothing)."""
    kmock.objects[CTR, None, "deepspeed-distributed"] = external_runtime()
    server = await serving(start_webhook, kmock)
    forged_entry = {
        "manager": OWN,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": name,
                            "template": {
                                "spec": {
                                    "template": {
                                        "metadata": {"labels": {"mpigate.io/team": "cv-team"}},
                                        "spec": {
                                            "serviceAccountName": "cv-pipeline",
                                            "nodeSelector": {"topology.kubernetes.io/region": "us-east-1"},
                                        },
                                    }
                                }
                            },
                        }
                        for name in ("node", "launcher")
                    ]
                }
            }
        },
    }
    forged = job(runtimePatches=[forged_entry])
    forged["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "cv-team"
    forged["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "standard"
    forged["spec"]["activeDeadlineSeconds"] = 3600
    # sent to /validate as stored (say, a later webhook put it back after mpigate's mutation)
    answer = await post(http, server, "/validate", make_review(forged, user=SCIENTIST))
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert (
        "[MPG-LIFE-003] spec.runtimePatches[manager=mpigate.io/admission]: an entry under mpigate's own"
        in message
    )
    assert "[MPG-SA-001]" in message and "cv-pipeline" in message
    # through /mutate, mpigate replaces the tenant's copy with its own entry: the account is gone
    _, stored, validated = await create(http, server, forged)
    assert "cv-pipeline" not in json.dumps(stored)
    assert validated["allowed"] is True, validated.get("status")
