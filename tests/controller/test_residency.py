"""Residency judgement (pure): node labels → mpigate region, team and data-classification regions."""

from __future__ import annotations

from mpigate.config import Config
from mpigate.controller.residency import node_region, placement

EU_A100 = {
    "topology.kubernetes.io/region": "eu-west-1",
    "topology.kubernetes.io/zone": "eu-west-1a",
    "nvidia.com/gpu.product": "A100-SXM4-80GB",
}
US_H100 = {"topology.kubernetes.io/region": "us-east-1", "nvidia.com/gpu.product": "H100-SXM5-80GB"}


def test_node_labels_map_to_org_regions(org: Config) -> None:
    assert node_region(org, EU_A100) == "eu"
    assert node_region(org, US_H100) == "us"
    assert node_region(org, {"topology.kubernetes.io/region": "ap-south-1"}) is None
    assert node_region(org, {}) is None


def test_pod_in_the_team_region_complies(org: Config) -> None:
    p = placement(org, org.teams["nlp-team"], {}, "llm-node-0", "gpu-eu-1", EU_A100)
    assert p.compliant
    assert (p.region, p.region_label, p.zone, p.flavor, p.expected) == (
        "eu",
        "eu-west-1",
        "eu-west-1a",
        "a100-eu",
        ("eu",),
    )


def test_pod_outside_the_team_region_does_not(org: Config) -> None:
    p = placement(org, org.teams["nlp-team"], {}, "llm-node-0", "gpu-us-7", US_H100)
    assert not p.compliant
    assert p.message() == (
        "pod llm-node-0 runs on node gpu-us-7 in region us (topology.kubernetes.io/region=us-east-1); "
        "allowed: eu (team nlp-team is in eu)"
    )
    assert p.details() == {
        "regionLabel": "us-east-1",
        "expectedRegions": ["eu"],
        "compliant": False,
        "why": "team nlp-team is in eu",
        "basis": "node",
    }


def test_unlabelled_node_cannot_prove_residency(org: Config) -> None:
    p = placement(org, org.teams["nlp-team"], {}, "p", "bare-node", {})
    assert not p.compliant
    assert "no mpigate region (no topology.kubernetes.io/region label)" in p.message()


def test_data_classification_restricts_regions(org: Config) -> None:
    phi = {"mpigate.io/data-classification": "phi"}  # phi: eu only
    cv = org.teams["cv-team"]  # in us
    p = placement(org, cv, phi, "p", "gpu-us-7", US_H100)
    assert not p.compliant
    assert p.expected == ()
    assert p.why == "team cv-team is in us; data classified phi stays in eu"
    assert placement(org, org.teams["nlp-team"], phi, "p", "gpu-eu-1", EU_A100).compliant


def test_a_node_that_is_gone_is_unknown_not_a_violation(org: Config) -> None:
    """Issue 20: a pod whose node no longer exists was reported as on a node "with no region label"
    (a false violation). Its region is unknown unless the pod's nodeSelector says where it ran."""
    gone = placement(org, org.teams["nlp-team"], {}, "p", "gpu-eu-9", None)
    assert (gone.compliant, gone.region, gone.basis) == (None, None, "unknown")
    assert gone.details()["compliant"] is None
    assert gone.message() == (
        "pod p ran on node gpu-eu-9, which no longer exists; its region is unknown "
        "(allowed: eu: team nlp-team is in eu)"
    )
    # admission pins pods to their region by nodeSelector: the scheduler guaranteed those labels
    pinned = {"topology.kubernetes.io/region": "eu-west-1", "kubernetes.io/os": "linux"}
    by_selector = placement(org, org.teams["nlp-team"], {}, "p", "gpu-eu-9", None, node_selector=pinned)
    assert (by_selector.compliant, by_selector.region, by_selector.basis) == (True, "eu", "nodeSelector")
    foreign = {"topology.kubernetes.io/region": "us-east-1"}
    wrong = placement(org, org.teams["nlp-team"], {}, "p", "gpu-us-9", None, node_selector=foreign)
    assert (wrong.compliant, wrong.region, wrong.basis) == (False, "us", "nodeSelector")
    # a selector that names no region proves nothing either
    other = placement(
        org, org.teams["nlp-team"], {}, "p", "n", None, node_selector={"kubernetes.io/os": "linux"}
    )
    assert (other.compliant, other.basis) == (None, "unknown")
    # an existing node without labels still cannot prove residency: a violation, as before
    assert placement(org, org.teams["nlp-team"], {}, "p", "bare-node", {}).compliant is False
