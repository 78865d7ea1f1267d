"""Kueue's admission arithmetic, as a pure model: which workloads a ClusterQueue can ever admit, and
what stands between a workload and admission right now.

mpigate's quota rules, ``mpigate check`` and ``mpigate render`` all read quotas through this one
model (built for a config tree by :func:`mpigate.config.queueing.queue_view`), so that the ceiling
mpigate enforces is the one Kueue computes. Target: Kueue v0.19.2 (the latest release;
docs/quota.md says what is modelled and what is not).

* :mod:`.quota` — ``SubtreeQuota``, ``localQuota``, ``potentialAvailable`` and ``available`` over
  a tree of Cohorts and ClusterQueues (pkg/cache/scheduler/resource_node.go);
* :mod:`.assign` — the flavor assigner: pod sets in order, one flavor per resource group,
  node-label matching, ``fitsResourceQuota`` (pkg/scheduler/flavorassigner/flavorassigner.go).

Quantities are Kueue's integers: milli-CPU for ``cpu``, whole units otherwise.
"""

from __future__ import annotations

from .assign import (
    Assignment,
    Attempt,
    Failure,
    Flavor,
    PodSet,
    Requirement,
    Shortfall,
    assign,
    flavor_matches,
)
from .quota import (
    ClusterQueue,
    Cohort,
    CohortCycleError,
    FlavorResource,
    Quota,
    QuotaTree,
    ResourceGroup,
    Usage,
)

__all__ = [
    "Assignment",
    "Attempt",
    "ClusterQueue",
    "Cohort",
    "CohortCycleError",
    "Failure",
    "Flavor",
    "FlavorResource",
    "PodSet",
    "Quota",
    "QuotaTree",
    "Requirement",
    "ResourceGroup",
    "Shortfall",
    "Usage",
    "assign",
    "flavor_matches",
]
