"""The Kueue objects mpigate renders for a config tree — as the data the templates write and as
Kueue's own quota model (:mod:`mpigate.kueue`) — so that what is rendered, what ``check`` warns
about and what admission judges are one thing.

Per team one ClusterQueue named after the team: a resource group ``cpu, memory, pods`` on the
team's region flavor (``region-<region>``) and one group per GPU resource on the team's GPU flavors
(sorted by name: the order Kueue tries them). cpu/memory/pods get ``borrowingLimit: 0`` in a
cohort (a cap, not a pool); GPUs carry the TeamQuota's borrowing and lending limits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Final

from mpigate import kueue

from .model import Config, Team
from .problems import Location, PathPart, Problem, Severity, format_path
from .units import format_duration, parse_quantity

__all__ = [
    "AUXILIARY_PODS_PER_JOB",
    "BACKSTOP_HEADROOM",
    "LIMIT_RANGE_DEFAULT_REQUESTS",
    "PREEMPTION",
    "QUEUEING_STRATEGY",
    "STORED_JOB_COUNTS",
    "QueueView",
    "kueue_amount",
    "kueue_configuration",
    "pod_quota",
    "preemption_summary",
    "queue_view",
    "queueing_problems",
    "region_flavor_name",
    "resource_groups",
]

# Pods of a TrainJob besides its nodes: the MPI launcher (unless it runs as a node) and Trainer's
# dataset and model initializers. Kueue counts every pod set, so the derived pod quota does too.
AUXILIARY_PODS_PER_JOB: Final = 3
# Unset cpu/memory quotas: a bound, since Kueue cannot admit a resource a queue does not cover.
UNBOUNDED_CPU: Final = "1M"
UNBOUNDED_MEMORY: Final = "1Ei"
# The rendered LimitRange's defaultRequest per container. Kueue adds it to the workload's
# containers that do not request the resource (before taking limits as missing requests), so it
# is part of what Kueue counts: pkg/workload/resources.go handlePodLimitRange, AdjustResources.
LIMIT_RANGE_DEFAULT_REQUESTS: Final[Mapping[str, str]] = MappingProxyType({"cpu": "500m", "memory": "1Gi"})
# The rendered ResourceQuota backstop holds this many times what Kueue can admit for the team (pods,
# GPUs): the admitted jobs' pods plus as many again of preempted or finished jobs' pods that still
# terminate when Kueue admits the next ones (a ResourceQuota counts them until they are gone).
BACKSTOP_HEADROOM: Final = 2
# The object counts of the backstop: every kind of job the webhook judges (TrainJobs; the MPI
# Operator's MPIJobs, admission/routes.py ROUTED), each at TeamQuota.maxStoredJobs. A quota's
# object count names a resource without its version, as the API server's quota admission counts it
# for any resource, custom ones included (k8s.io/apiserver pkg/quota/v1/generic/evaluator.go
# ObjectCountQuotaResourceNameFor; pkg/admission/plugin/resourcequota/controller.go
# (*quotaEvaluator).Evaluate creates the evaluator). One ResourceQuota line counts one resource, so
# each kind may keep maxStoredJobs objects; MPG-Q007 counts the running ones of both together.
STORED_JOB_COUNTS: Final = ("count/trainjobs.trainer.kubeflow.org", "count/mpijobs.kubeflow.org")
# Every rendered ClusterQueue's queueing and preemption (templates/cluster/clusterqueues.yaml.j2).
QUEUEING_STRATEGY: Final = "BestEffortFIFO"
PREEMPTION: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "reclaimWithinCohort": "Any",
        "borrowWithinCohort": MappingProxyType({"policy": "Never"}),
        "withinClusterQueue": "LowerPriority",
    }
)


def preemption_summary(team: str, fair_sharing: bool) -> str:
    """What Kueue may do for a queued job of ``team``, from the rendered :data:`PREEMPTION` (Kueue
    v0.19.2 pkg/scheduler/preemption: candidates in ``CandidatesOrdering`` order - other teams'
    borrowed jobs before the team's own, lower priority first, then the most recently admitted;
    the size of a job plays no part)."""
    own = (
        f"Kueue may preempt lower-priority jobs of {team}'s own queue for it "
        f"(withinClusterQueue: {PREEMPTION['withinClusterQueue']}) and takes back quota {team} lent to "
        f"its cohort (reclaimWithinCohort: {PREEMPTION['reclaimWithinCohort']})"
    )
    if fair_sharing:
        borrow = ", and with fair sharing it may preempt jobs of teams over their fair share to borrow"
    else:
        never = PREEMPTION["borrowWithinCohort"]["policy"]
        borrow = f", but never preempts to borrow (borrowWithinCohort: {never})"
    return (
        own
        + borrow
        + "; it preempts other teams' borrowed jobs before the team's own, lower priority first, "
        f"then the most recently admitted. With {QUEUEING_STRATEGY}, smaller jobs queued after this one "
        "may start first."
    )


def region_flavor_name(region: str) -> str:
    """The Kueue ResourceFlavor that carries a region's node labels for cpu, memory and pods."""
    return f"region-{region}"


def pod_quota(team: Team) -> int:
    """The team's ``pods`` quota: TeamQuota.pods, or maxConcurrentJobs × (maxNodesPerJob + 3)."""
    if team.pods is not None:
        return team.pods
    return team.max_concurrent_jobs * (team.max_nodes_per_job + AUXILIARY_PODS_PER_JOB)


def kueue_amount(resource: str, quantity: Fraction) -> int:
    """A quantity in Kueue's integer units, rounded up as ``resource.Quantity`` does:
    milli-CPU for ``cpu`` (``MilliValue``), whole units otherwise (``Value``)."""
    numerator = quantity.numerator * 1000 if resource == "cpu" else quantity.numerator
    return -(-numerator // quantity.denominator)  # integer arithmetic: no Fraction dispatch (hot path)


def resource_groups(config: Config, team: Team) -> list[dict[str, Any]]:
    """The ``spec.resourceGroups`` of the team's ClusterQueue, as rendered.

    cpu, memory and pods share one group on the team's region flavor, GPUs form a group per GPU
    resource on the team's flavors of it. Covering ``pods`` means every pod set - also a CPU-only
    launcher or initializer - is assigned the region flavor and so gets the region's node labels
    (residency). The team's cpu/memory/pod quota is a cap, not a pool to share: its borrowing limit
    is 0 when the queue is in a cohort (Kueue forbids borrowingLimit without a cohort).
    """
    cohort = team.cohort is not None
    base: list[dict[str, Any]] = [
        {"name": "cpu", "nominalQuota": team.cpu if team.cpu is not None else UNBOUNDED_CPU},
        {"name": "memory", "nominalQuota": team.memory if team.memory is not None else UNBOUNDED_MEMORY},
        {"name": "pods", "nominalQuota": pod_quota(team)},
    ]
    if cohort:
        for resource in base:
            resource["borrowingLimit"] = 0
    groups: list[dict[str, Any]] = [
        {
            "coveredResources": ["cpu", "memory", "pods"],
            "flavors": [{"name": region_flavor_name(team.region), "resources": base}],
        }
    ]
    by_resource: dict[str, list[dict[str, Any]]] = {}
    for flavor_name in sorted(team.gpus):
        quota = team.gpus[flavor_name]
        flavor = config.flavors[flavor_name]
        gpu: dict[str, Any] = {"name": flavor.gpu_resource, "nominalQuota": quota.nominal}
        if cohort:
            gpu["borrowingLimit"] = quota.borrowing_limit
            if quota.lending_limit is not None:
                gpu["lendingLimit"] = quota.lending_limit
        by_resource.setdefault(flavor.gpu_resource, []).append({"name": flavor_name, "resources": [gpu]})
    for gpu_resource, flavors in sorted(by_resource.items()):
        groups.append({"coveredResources": [gpu_resource], "flavors": flavors})
    return groups


def _amount(resource: str, value: Any) -> int:
    quantity = Fraction(value) if isinstance(value, int) else parse_quantity(value)
    return kueue_amount(resource, quantity)


def cluster_queue(name: str, cohort: str | None, groups: list[dict[str, Any]]) -> kueue.ClusterQueue:
    """Kueue's model of a ClusterQueue from its ``resourceGroups`` (as rendered)."""
    model_groups: list[kueue.ResourceGroup] = []
    quotas: dict[kueue.FlavorResource, kueue.Quota] = {}
    for group in groups:
        flavor_names: list[str] = []
        for flavor in group["flavors"]:
            flavor_names.append(flavor["name"])
            for res in flavor["resources"]:
                resource = res["name"]
                quotas[(flavor["name"], resource)] = kueue.Quota(
                    _amount(resource, res["nominalQuota"]),
                    _amount(resource, res["borrowingLimit"]) if "borrowingLimit" in res else None,
                    _amount(resource, res["lendingLimit"]) if "lendingLimit" in res else None,
                )
        model_groups.append(kueue.ResourceGroup(tuple(group["coveredResources"]), tuple(flavor_names)))
    return kueue.ClusterQueue(name, cohort, tuple(model_groups), MappingProxyType(quotas))


@dataclass(frozen=True, slots=True)
class QueueView:
    """The org's Kueue objects: flavors (region and GPU), every team's ClusterQueue in its cohort
    tree, and the LimitRange defaults Kueue adds to containers without requests."""

    flavors: Mapping[str, kueue.Flavor]
    tree: kueue.QuotaTree
    groups: Mapping[str, tuple[dict[str, Any], ...]]
    limit_range_defaults: Mapping[str, Fraction]

    def resource_groups(self, team: str) -> list[dict[str, Any]]:
        """A fresh copy of the team's rendered ``resourceGroups``."""
        import copy

        return copy.deepcopy(list(self.groups[team]))


_MEMO_KEY: Final = "config.queueing.view"


def queue_view(config: Config) -> QueueView:
    """The :class:`QueueView` of ``config``, built once per config (``Config.memo``)."""
    found = config.memo.get(_MEMO_KEY)
    if isinstance(found, QueueView):
        return found
    flavors: dict[str, kueue.Flavor] = {}
    for name, region in config.org.regions.items():
        flavor_name = region_flavor_name(name)
        flavors[flavor_name] = kueue.Flavor(flavor_name, MappingProxyType(dict(region.node_labels)))
    for name, flavor in config.flavors.items():
        labels = dict(config.org.regions[flavor.region].node_labels)
        labels.update(flavor.node_labels)
        flavors[name] = kueue.Flavor(name, MappingProxyType(labels))
    groups: dict[str, tuple[dict[str, Any], ...]] = {}
    queues: list[kueue.ClusterQueue] = []
    for team in config.teams.values():
        team_groups = resource_groups(config, team)
        groups[team.name] = tuple(team_groups)
        queues.append(cluster_queue(team.name, team.cohort, team_groups))
    cohorts = [kueue.Cohort(name) for name in config.cohorts]
    view = QueueView(
        MappingProxyType(flavors),
        kueue.QuotaTree(queues, cohorts),
        MappingProxyType(groups),
        MappingProxyType({k: parse_quantity(v) for k, v in LIMIT_RANGE_DEFAULT_REQUESTS.items()}),
    )
    config.memo[_MEMO_KEY] = view
    return view


# Kueue v0.19.2 pkg/config/validation.go accepts these strategy lists; this is also the order Kueue
# uses when the list is empty (pkg/scheduler/preemption/preemption.go parseStrategies).
FAIR_SHARING_STRATEGIES: Final = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")


def kueue_configuration(config: Config) -> dict[str, Any]:
    """The keys of Kueue's (cluster-wide) Configuration that the config tree relies on, for the
    cluster admin to merge into Kueue's own (``config.kueue.x-k8s.io/v1beta2``, Kueue v0.19.2
    apis/config/v1beta2/configuration_types.go): the TrainJob and MPIJob integrations,
    ``manageJobsWithoutQueueName`` in the team namespaces (the ``mpigate.io/team`` label),
    ``quotaCheckStrategy: BlockUndeclared`` (a workload asking a resource its ClusterQueue does not
    cover is never admitted, which MPG-Q001 mirrors), fair sharing when ``fairSharing`` is on (Kueue
    enables it when the key is present) and ``waitForPodsReady`` when set. The controller checks
    the live Configuration against the same settings (controller/reliances.py)."""
    settings = config.kueue
    out: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        # Jobs whose queue label goes missing stay Kueue's (suspended) in team namespaces.
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {
            "matchExpressions": [{"key": "mpigate.io/team", "operator": "Exists"}]
        },
        "integrations": {"frameworks": ["trainer.kubeflow.org/trainjob", "kubeflow.org/mpijob"]},
        "resources": {"quotaCheckStrategy": "BlockUndeclared"},
    }
    if settings.fair_sharing:
        out["fairSharing"] = {"preemptionStrategies": list(FAIR_SHARING_STRATEGIES)}
    ready = settings.wait_for_pods_ready
    if ready is not None:
        wait: dict[str, Any] = {
            "timeout": format_duration(ready.timeout_seconds),
            "blockAdmission": ready.block_admission,
        }
        if ready.recovery_timeout_seconds is not None:
            wait["recoveryTimeout"] = format_duration(ready.recovery_timeout_seconds)
        requeuing: dict[str, Any] = {}
        for key, value in (
            ("backoffLimitCount", ready.backoff_limit_count),
            ("backoffBaseSeconds", ready.backoff_base_seconds),
            ("backoffMaxSeconds", ready.backoff_max_seconds),
        ):
            if value is not None:
                requeuing[key] = value
        if requeuing:
            wait["requeuingStrategy"] = {"timestamp": "Eviction", **requeuing}
        out["waitForPodsReady"] = wait
    return out


Locate = Callable[[str, str, Sequence[PathPart]], Location]
"""Where a path of a document is: (kind, metadata.name or "" for singletons, JSON path)."""


def queueing_problems(config: Config, locate: Locate) -> list[Problem]:
    """Warnings about quota settings Kueue would not honour, judged with Kueue's own arithmetic on
    the queues as rendered: a borrowingLimit the cohort can never lend in full, a fair-sharing weight
    without fair sharing, and personas aggregated into Kueue's cluster-wide roles."""
    out: list[Problem] = []

    def warn(kind: str, name: str, path: Sequence[PathPart], message: str, code: str, hint: str) -> None:
        out.append(
            Problem(locate(kind, name, path), format_path(path), message, code, Severity.WARNING, hint)
        )

    view = queue_view(config)
    for team in sorted(config.teams.values(), key=lambda t: t.name):
        for flavor_name in sorted(team.gpus):
            quota = team.gpus[flavor_name]
            if team.cohort is None or quota.borrowing_limit <= 0:
                continue
            fr = (flavor_name, config.flavors[flavor_name].gpu_resource)
            most = view.tree.potential_available(team.name, fr)
            lendable = most - quota.nominal
            if lendable >= quota.borrowing_limit:
                continue
            others = (
                f"the other teams of cohort {team.cohort} can lend at most {lendable} GPUs of {flavor_name}"
                if lendable > 0
                else f"no other team of cohort {team.cohort} has {flavor_name} quota to lend"
            )
            warn(
                "TeamQuota",
                team.name,
                ("spec", "gpus", flavor_name, "borrowingLimit"),
                f"borrowingLimit {quota.borrowing_limit} can never be used in full: {others}, so Kueue "
                f"admits at most {most} GPUs of {flavor_name} for {team.name} (potentialAvailable)",
                "value.borrowing-unusable",
                f"lower borrowingLimit to {max(lendable, 0)}, or give another team of {team.cohort} "
                f"{flavor_name} quota to lend",
            )
        if team.fair_share_weight != 1 and not config.kueue.fair_sharing:
            warn(
                "TeamQuota",
                team.name,
                ("spec", "fairShareWeight"),
                f"fairShareWeight {team.fair_share_weight:g} has no effect: Kueue's fair sharing is not "
                "enabled (GPUFlavors.spec.kueue.fairSharing)",
                "value.fair-sharing-off",
                "enable fair sharing in Kueue's Configuration and set GPUFlavors spec.kueue.fairSharing: "
                "true, or remove fairShareWeight",
            )
    for persona in sorted(config.personas.values(), key=lambda p: p.name):
        if persona.kueue != "none":
            role = "kueue-batch-user-role" if persona.kueue == "batch-user" else "kueue-batch-admin-role"
            warn(
                "Personas",
                "",
                ("spec", "personas", persona.name, "kueue"),
                f"aggregates persona {persona.name}'s rules into Kueue's ClusterRole {role}: whoever that "
                "role is bound to, in any namespace or cluster-wide, gets them too",
                "value.kueue-aggregation",
                "remove kueue: the personas carry the Kueue rights their tasks need (docs/rbac.md)",
            )
    return out
