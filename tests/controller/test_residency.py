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
