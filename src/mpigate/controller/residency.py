"""Residency evidence: where each pod of a TrainJob ran, judged against where its data may be.

A node's region is the OrgPolicy region whose ``nodeLabels`` all match the node's labels (for the
example org: ``topology.kubernetes.io/region: eu-west-1`` → ``eu``). A pod complies when that
region is the team's region and, for a job with a data classification that lists regions, one of
those. A node that maps to no region cannot prove residency and does not comply.

A node that is gone by the time the controller looks (it was down, or the node was removed) is not
a node without labels: its labels are unknown. The pod's own ``nodeSelector`` then tells what the
scheduler guaranteed the node carried (admission pins every pod to its team's region that way);
when that names no region either, the placement is recorded as unknown — never as a violation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from mpigate.config import Config
from mpigate.config.model import Team

from .netpol import CLASSIFICATION_LABEL

__all__ = ["REGION_LABEL", "ZONE_LABEL", "Placement", "expected_regions", "node_region", "placement"]

REGION_LABEL: Final = "topology.kubernetes.io/region"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"


def node_region(config: Config, node_labels: Mapping[str, str]) -> str | None:
    """The OrgPolicy region whose node labels the node carries (first by name), or None."""
    for name in sorted(config.org.regions):
        wanted = config.org.regions[name].node_labels
        if wanted and all(node_labels.get(k) == v for k, v in wanted.items()):
            return name
    return None


def node_flavor(config: Config, node_labels: Mapping[str, str], region: str | None) -> str | None:
    """The GPU flavor (of ``region``) whose node labels the node carries, or None."""
    for name in sorted(config.flavors):
        flavor = config.flavors[name]
        if region is not None and flavor.region != region:
            continue
        if flavor.node_labels and all(node_labels.get(k) == v for k, v in flavor.node_labels.items()):
            return name
    return None


def expected_regions(
    config: Config, team: Team, job_labels: Mapping[str, Any]
) -> tuple[tuple[str, ...], str]:
    """The regions the job's pods may run in, and why (for messages)."""
    label = job_labels.get(CLASSIFICATION_LABEL)
    classification = config.org.data_classifications.get(label) if isinstance(label, str) else None
    if classification is not None and classification.regions is not None:
        allowed = tuple(r for r in classification.regions if r == team.region)
        why = f"team {team.name} is in {team.region}; data classified {classification.name} stays in " + (
            ", ".join(classification.regions) or "no region"
        )
        return allowed, why
    return (team.region,), f"team {team.name} is in {team.region}"


@dataclass(frozen=True, slots=True)
class Placement:
    """One pod's placement and whether it complies."""

    pod: str
    node: str
    region: str | None
    region_label: str | None
    zone: str | None
    flavor: str | None
    expected: tuple[str, ...]
    why: str
    #: Where the region comes from: ``node`` (its labels, read now), ``nodeSelector`` (the node is
    #: gone; the pod's nodeSelector says what the node carried) or ``unknown`` (neither).
    basis: str = "node"

    @property
    def compliant(self) -> bool | None:
        """True/False; None when the node is gone and nothing tells where it was."""
        if self.basis == "unknown":
            return None
        return self.region is not None and self.region in self.expected

    def message(self) -> str:
        if self.basis == "unknown":
            return (
                f"pod {self.pod} ran on node {self.node}, which no longer exists; its region is unknown "
                f"(allowed: {', '.join(self.expected) or 'none'}: {self.why})"
            )
        if self.basis == "nodeSelector":
            return (
                f"pod {self.pod} ran on node {self.node} (gone now) in region {self.region or 'unknown'} "
                f"by its nodeSelector; allowed: {', '.join(self.expected) or 'none'} ({self.why})"
            )
        where = f"region {self.region}" if self.region else "no mpigate region"
        label = (
            f" ({REGION_LABEL}={self.region_label})" if self.region_label else f" (no {REGION_LABEL} label)"
        )
        return (
            f"pod {self.pod} runs on node {self.node} in {where}{label}; "
            f"allowed: {', '.join(self.expected) or 'none'} ({self.why})"
        )

    def details(self) -> dict[str, Any]:
        return {
            "regionLabel": self.region_label,
            "expectedRegions": list(self.expected),
            "compliant": self.compliant,
            "why": self.why,
            "basis": self.basis,
        }


def placement(
    config: Config,
    team: Team,
    job_labels: Mapping[str, Any],
    pod_name: str,
    node_name: str,
    node_labels: Mapping[str, str] | None,
    *,
    node_selector: Mapping[str, Any] | None = None,
) -> Placement:
    """Judge one pod on one node (``node_labels`` None: the node is gone; ``node_selector``: the
    pod's, which the scheduler matched against the node's labels)."""
    basis = "node"
    if node_labels is None:
        selector = node_selector if isinstance(node_selector, Mapping) else {}
        node_labels = {str(k): v for k, v in selector.items() if isinstance(v, str)}
        basis = "nodeSelector" if node_region(config, node_labels) is not None else "unknown"
    region = node_region(config, node_labels)
    expected, why = expected_regions(config, team, job_labels)
    return Placement(
        pod=pod_name,
        node=node_name,
        region=region,
        region_label=node_labels.get(REGION_LABEL),
        zone=node_labels.get(ZONE_LABEL),
        flavor=node_flavor(config, node_labels, region),
        expected=expected,
        why=why,
        basis=basis,
    )
