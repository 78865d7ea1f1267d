"""Which requests the install base sends to mpigate, as the API server decides it (rules, scope,
namespaceSelector, matchConditions), and what mpigate receives: the AdmissionReview of the API
server (user, dryRun, operation, old object)."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from tests.conftest import REPO

from .cluster import Cluster, call, trainjobs_path

OVER_QUOTA = yaml.safe_load((REPO / "examples" / "trainjobs" / "deny-over-quota.yaml").read_text())
ROOT_RUNTIME = yaml.safe_load((REPO / "examples" / "runtimes" / "deny-root-runtime.yaml").read_text())
CLUSTER_RUNTIMES = "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"


def named(obj: dict[str, Any], name: str, namespace: str | None = None) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["name"] = name
    if namespace is not None:
        out["metadata"]["namespace"] = namespace
    return out


def mpigate_calls(cluster: Cluster) -> list[str]:
    return [name for name, _ in cluster.api.outcomes[-1].called if name.endswith(".mpigate.io")]


def test_mpigate_receives_the_api_servers_review(cluster: Cluster) -> None:
    reply = call(cluster, "POST", trainjobs_path("nlp-team", dry_run=True), named(OVER_QUOTA, "review-seen"))
    assert reply.status == 403
    assert mpigate_calls(cluster) == ["mutate.trainjobs.mpigate.io", "validate.team.mpigate.io"]
    seen = [r for r in cluster.recorder.records if r.request.name == "review-seen"]
    assert [r.stage for r in seen] == ["mutate", "validate"]
    for record in seen:
        assert record.request.user.username == "jane@acme.example"
        assert "nlp-team-devs" in record.request.user.groups
        assert record.request.dry_run is True and record.request.operation == "CREATE"


def test_job_controllers_and_nodes_are_not_sent(cluster: Cluster) -> None:
    """matchConditions: Kueue's and Trainer's controllers and nodes go around mpigate."""
    for user, group in [
        ("system:serviceaccount:kueue-system:kueue-controller-manager", None),
        ("system:node:gpu-node-1", "system:nodes"),
    ]:
        headers = {"Impersonate-User": user, **({"Impersonate-Group": group} if group else {})}
        reply = call(
            cluster,
            "POST",
            trainjobs_path("nlp-team", dry_run=True),
            named(OVER_QUOTA, "by-controller"),
            token="admin",
            headers=headers,
        )
        assert reply.status == 201, (user, reply.body)
        assert mpigate_calls(cluster) == []
    # a pipeline's service account in a team namespace stays in
    headers = {"Impersonate-User": "system:serviceaccount:nlp-team:nlp-pipeline"}
    reply = call(
        cluster,
        "POST",
        trainjobs_path("nlp-team", dry_run=True),
        named(OVER_QUOTA, "by-pipeline"),
        token="admin",
        headers=headers,
    )
    assert reply.status == 403 and mpigate_calls(cluster) == [
        "mutate.trainjobs.mpigate.io",
        "validate.team.mpigate.io",
    ]


def test_system_namespaces_are_not_sent_and_other_namespaces_are_judged_unmanaged(cluster: Cluster) -> None:
    reply = call(
        cluster,
        "POST",
        trainjobs_path("kubeflow-system", dry_run=True),
        named(OVER_QUOTA, "in-system", "kubeflow-system"),
    )
    assert reply.status == 201 and mpigate_calls(cluster) == []
    reply = call(
        cluster, "POST", trainjobs_path("sandbox", dry_run=True), named(OVER_QUOTA, "stray", "sandbox")
    )
    assert reply.status == 403 and mpigate_calls(cluster) == ["validate.unmanaged.mpigate.io"]
    assert "[MPG-TEAM-001]" in reply.body["message"]


def test_cluster_scoped_runtimes_ignore_the_namespace_selector(cluster: Cluster) -> None:
    """namespace/matcher.go: a cluster-scoped object is never excluded by a namespaceSelector —
    validate.cluster judges a ClusterTrainingRuntime; its DELETE goes to validate.release."""
    reply = call(cluster, "POST", CLUSTER_RUNTIMES + "?dryRun=All", ROOT_RUNTIME, token="admin")
    assert reply.status == 403 and mpigate_calls(cluster) == ["validate.cluster.mpigate.io"]
    reply = call(cluster, "DELETE", CLUSTER_RUNTIMES + "/mpi-openmpi-gpu?dryRun=All", token="admin")
    assert reply.status == 200 and mpigate_calls(cluster) == ["validate.release.mpigate.io"]
    record = next(r for r in reversed(cluster.recorder.records) if r.request.name == "mpi-openmpi-gpu")
    assert (
        record.request.operation == "DELETE"
        and record.request.old_obj is not None
        and record.request.obj is None
    )
    assert (
        cluster.api.get("trainer.kubeflow.org", "clustertrainingruntimes", "", "mpi-openmpi-gpu") is not None
    )


def test_a_list_selects_by_name_and_namespace_and_refuses_other_fields(cluster: Cluster) -> None:
    """What kubectl delete lists to wait for an object to be gone (kubectl 1.20 waits on a list by
    metadata.name): custom resources select by metadata.name and metadata.namespace only."""
    keys = [("trainer.kubeflow.org", "trainjobs", "nlp-team", n) for n in ("fields-a", "fields-b")]
    for key in keys:
        cluster.api.put(named(OVER_QUOTA, key[3], "nlp-team"))  # stored as they are: only listed here

    def names(selector: str, path: str = trainjobs_path("nlp-team")) -> list[str]:
        reply = call(cluster, "GET", f"{path}?fieldSelector={selector}")
        assert reply.status == 200, reply.body
        found = [i["metadata"]["name"] for i in reply.body["items"]]
        return [n for n in found if n.startswith("fields-")]

    assert names("metadata.name=fields-a") == ["fields-a"]
    assert names("metadata.name!=fields-a") == ["fields-b"]
    assert names("metadata.namespace=nlp-team,metadata.name==fields-b") == ["fields-b"]
    assert names("metadata.namespace=cv-team") == []
    assert names("metadata.name=fields-a", "/apis/trainer.kubeflow.org/v1alpha1/trainjobs") == ["fields-a"]
    refused = call(cluster, "GET", f"{trainjobs_path('nlp-team')}?fieldSelector=spec.suspend=true")
    assert (refused.status, refused.body["reason"], refused.body["message"]) == (
        400,
        "BadRequest",
        "field label not supported: spec.suspend",
    )
    for key in keys:
        cluster.api.storage.pop(key)
