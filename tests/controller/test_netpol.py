"""The per-TrainJob NetworkPolicy builder (pure): shape per profile, schema, drift and repair."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import kubernetes_validate
import pytest
from tests.controller.conftest import example_job

from mpigate.config import Config
from mpigate.controller.netpol import (
    OWNER_UID_LABEL,
    build_network_policy,
    choose_profile,
    drift,
    merge_patch,
    owned_by,
    policy_name,
    repair_patch,
)

JOBSET = "jobset.sigs.k8s.io/jobset-name"
PROFILE = "mpigate.io/network-profile"


def validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, "1.33", strict=True)


def job_peer(name: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {JOBSET: name}}}


def test_pinned_ports_job_gets_ssh_and_the_pinned_ranges_only(org: Config) -> None:
    job = example_job("phi-pinned", uid="6f1c")  # nlp-team (isolated) + data classification phi
    policy = build_network_policy(org, job)
    assert policy is not None
    validate(policy)
    assert policy["metadata"]["name"] == "mpigate-trainjob.phi-finetune"
    assert policy["metadata"]["namespace"] == "nlp-team"
    assert policy["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "phi-finetune",
            "uid": "6f1c",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert policy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "mpigate"
    assert policy["metadata"]["annotations"]["mpigate.io/network-profile-reason"] == "data classification phi"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {JOBSET: "phi-finetune"}}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    pinned = [
        {"protocol": "TCP", "port": 2222},
        {"protocol": "TCP", "port": 40000, "endPort": 40099},
        {"protocol": "TCP", "port": 40200, "endPort": 40210},
    ]
    assert spec["ingress"] == [{"from": [job_peer("phi-finetune")], "ports": pinned}]
    assert spec["egress"][0] == {"to": [job_peer("phi-finetune")], "ports": pinned}
    # the ranges are the profile's own numbers
    profile = org.network_profiles["pinned-ports"]
    assert [(p["port"], p.get("endPort", p["port"])) for p in pinned] == list(profile.port_ranges())


def test_isolated_job_gets_all_tcp_among_its_pods_dns_and_team_egress(org: Config) -> None:
    job = example_job("cv-large")  # cv-team: isolated, egress lists registry + object-storage-us + own
    policy = build_network_policy(org, job)
    assert policy is not None
    validate(policy)
    name = job["metadata"]["name"]
    spec = policy["spec"]
    assert spec["ingress"] == [{"from": [job_peer(name)], "ports": [{"protocol": "TCP"}]}]
    assert spec["egress"] == [
        {"to": [job_peer(name)], "ports": [{"protocol": "TCP"}]},
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
        {"to": [{"ipBlock": {"cidr": "10.20.0.0/24"}}], "ports": [{"protocol": "TCP", "port": 443}]},
        {"to": [{"ipBlock": {"cidr": "10.40.0.0/16"}}], "ports": [{"protocol": "TCP", "port": 443}]},
        {"to": [{"ipBlock": {"cidr": "10.50.0.10/32"}}], "ports": [{"protocol": "TCP", "port": 3128}]},
        {"to": [{"ipBlock": {"cidr": "192.0.2.0/28"}}], "ports": [{"protocol": "TCP", "port": 443}]},
    ]
    assert policy["metadata"]["annotations"]["mpigate.io/network-profile"] == "isolated"


def test_team_profile_pinned_ports_without_classification(org: Config) -> None:
    job = example_job("cpu-smoke")  # namespace research → research-team, pinned-ports
    policy = build_network_policy(org, job)
    assert policy is not None
    assert policy["metadata"]["annotations"]["mpigate.io/network-profile-reason"] == "team research-team"
    assert {"protocol": "TCP", "port": 2222} in policy["spec"]["ingress"][0]["ports"]


def test_classification_never_loosens_a_stricter_team(org: Config) -> None:
    loose = dataclasses.replace(org.org.data_classifications["phi"], network_profile="isolated")
    classes = {**org.org.data_classifications, "phi": loose}
    config = dataclasses.replace(org, org=dataclasses.replace(org.org, data_classifications=classes))
    research = config.teams["research-team"]
    choice = choose_profile(config, research, {"mpigate.io/data-classification": "phi"})
    assert (choice.profile.name, choice.reason) == ("pinned-ports", "team research-team")
    nlp = config.teams["nlp-team"]
    assert choose_profile(config, nlp, {"mpigate.io/data-classification": "phi"}).profile.name == "isolated"


def test_job_outside_team_namespaces_gets_no_policy(org: Config) -> None:
    job = example_job("deny-unmanaged-namespace")
    assert build_network_policy(org, job) is None


def test_shared_structures_are_not_aliased(org: Config) -> None:
    policy = build_network_policy(org, example_job("phi-pinned"))
    assert policy is not None
    policy["spec"]["ingress"][0]["ports"].append({"protocol": "TCP", "port": 1})
    assert len(policy["spec"]["egress"][0]["ports"]) == 3
    again = build_network_policy(org, example_job("phi-pinned"))
    assert again is not None and len(again["spec"]["egress"][1]["ports"]) == 2


def stored(policy: dict[str, Any]) -> dict[str, Any]:
    """The policy as the API server returns it: with server fields and someone else's label."""
    out = copy.deepcopy(policy)
    out["metadata"].update(resourceVersion="41", uid="np-uid", creationTimestamp="2026-11-22T10:00:00Z")
    out["metadata"]["labels"]["owner.example/extra"] = "kept"
    return out


def test_drift_ignores_server_fields_and_foreign_labels(org: Config) -> None:
    desired = build_network_policy(org, example_job("phi-pinned"))
    assert desired is not None
    assert not drift(desired, stored(desired))
    assert str(drift(desired, stored(desired))) == "nothing"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda p: p["spec"]["ingress"][0]["ports"].append({"protocol": "TCP", "port": 8080}), ("spec",)),
        (lambda p: p["spec"]["podSelector"].update(matchExpressions=[]), ("spec",)),
        (lambda p: p["metadata"]["labels"].pop("app.kubernetes.io/managed-by"), ("labels",)),
        (lambda p: p["metadata"]["annotations"].update({PROFILE: "x"}), ("annotations",)),
        (lambda p: p["metadata"].pop("ownerReferences"), ("owner",)),
        (lambda p: p["spec"].pop("egress"), ("spec",)),
    ],
)
def test_drift_names_what_was_edited_and_the_repair_patch_restores_it(
    org: Config, edit: Any, expected: tuple[str, ...]
) -> None:
    desired = build_network_policy(org, example_job("phi-pinned"))
    assert desired is not None
    actual = stored(desired)
    edit(actual)
    assert drift(desired, actual).fields == expected
    patch = repair_patch(desired, actual)
    assert patch["metadata"]["resourceVersion"] == "41"
    repaired = apply_merge_patch(actual, patch)
    assert not drift(desired, repaired)
    assert repaired["metadata"]["labels"]["owner.example/extra"] == "kept"
    validate(repaired)


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, for checking the patches."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


def test_merge_patch_nulls_removed_keys_and_replaces_lists() -> None:
    actual = {"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2]}
    desired = {"b": {"c": 2}, "l": [1], "n": "x"}
    assert merge_patch(actual, desired) == {"a": None, "b": {"d": None}, "l": [1], "n": "x"}
    assert apply_merge_patch(actual, merge_patch(actual, desired)) == desired


def test_policy_labels_carry_the_ownership_label_and_the_jobs_uid(org: Config) -> None:
    policy = build_network_policy(org, example_job("phi-pinned", uid="6f1c"))
    assert policy is not None
    labels = policy["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "mpigate"
    assert labels[OWNER_UID_LABEL] == "6f1c"


def test_owned_by_needs_the_jobs_uid_not_only_the_name(org: Config) -> None:
    job = example_job("phi-pinned", uid="6f1c")
    desired = build_network_policy(org, job)
    assert desired is not None
    assert owned_by(stored(desired), job)
    # the controlling ownerReference alone (someone removed the labels) still proves it
    unlabelled = stored(desired)
    unlabelled["metadata"]["labels"] = {}
    assert owned_by(unlabelled, job)
    # the ownership label with the uid alone (someone removed the ownerReference) proves it too
    orphaned = stored(desired)
    orphaned["metadata"].pop("ownerReferences")
    assert owned_by(orphaned, job)
    # a rendered policy of the same name, a previous job of the same name, a forged label without
    # the uid: not the job's
    rendered = {
        "metadata": {
            "name": desired["metadata"]["name"],
            "labels": {"app.kubernetes.io/managed-by": "mpigate"},
        }
    }
    assert not owned_by(rendered, job)
    assert not owned_by(stored(desired), example_job("phi-pinned", uid="another-uid"))
    forged = stored(desired)
    forged["metadata"].pop("ownerReferences")
    forged["metadata"]["labels"][OWNER_UID_LABEL] = "another-uid"
    assert not owned_by(forged, job)
    # a job without a uid (not read from the API) owns nothing
    assert not owned_by(stored(desired), {"metadata": {"name": "phi-finetune"}})


def test_per_job_names_cannot_be_names_that_render_writes() -> None:
    """A TrainJob name is a DNS-1035 label (no dot); the per-job name always holds one."""
    for job in ("default-deny-jobset", "allow-dns-team-label", "team-quota", "x"):
        name = policy_name(job)
        assert name == f"mpigate-trainjob.{job}" and "." in name
