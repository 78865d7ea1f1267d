"""The data the templates see: plain dicts and lists computed from a :class:`~mpigate.config.Config`.

Everything a template needs that involves arithmetic or policy (quota sums, Kueue resource groups,
Pod Security levels, RBAC subjects) is computed here, in tested Python; templates only shape it into
Kubernetes objects. The context is deterministic: teams, flavors, personas and regions are sorted
by name, so rendering the same config twice gives the same output.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from mpigate.catalogue import all_rules
from mpigate.config import Config, thaw
from mpigate.config.admission import NAMESPACE_NAME_LABEL
from mpigate.config.model import EgressRule, Persona, Team
from mpigate.config.queueing import (
    AUXILIARY_PODS_PER_JOB,
    BACKSTOP_HEADROOM,
    LIMIT_RANGE_DEFAULT_REQUESTS,
    PREEMPTION,
    QUEUEING_STRATEGY,
    STORED_JOB_COUNTS,
    pod_quota,
    queue_view,
    region_flavor_name,
)

__all__ = [
    "AUXILIARY_PODS_PER_JOB",
    "CLUSTER_READABLE",
    "LABELS",
    "MANAGED_BY",
    "MPIGATE",
    "PSS_LEVELS",
    "build_context",
    "namespace_labels",
    "pod_security_levels",
    "region_flavor_name",
    "team_context",
]

PSS_LEVELS = ("privileged", "baseline", "restricted")

# the value of app.kubernetes.io/managed-by on everything mpigate renders
MANAGED_BY = "mpigate"
LABELS = {
    "team": "mpigate.io/team",
    "managed_by": "app.kubernetes.io/managed-by",
    "part_of": "app.kubernetes.io/part-of",
    "jobset_name": "jobset.sigs.k8s.io/jobset-name",
    "queue_name": "kueue.x-k8s.io/queue-name",
    "revision": "mpigate.io/revision",
    "kueue_batch_user": "rbac.kueue.x-k8s.io/batch-user",
    "kueue_batch_admin": "rbac.kueue.x-k8s.io/batch-admin",
}

# Where the install base (webhooks/) runs mpigate; the rendered config bundle goes there.
MPIGATE = {
    "namespace": "mpigate-system",
    "config_map": "mpigate-config",
    "service": "mpigate-webhook",
    "metrics_job": "mpigate-webhook",
}

# Cluster-scoped resources whose read access a persona may get cluster-wide (a RoleBinding cannot
# grant rights on cluster-scoped objects). Reading them reveals no team's data. Everything else that
# is cluster-scoped - ClusterQueues above all - is never granted to a persona.
CLUSTER_READABLE = frozenset(
    {
        ("trainer.kubeflow.org", "clustertrainingruntimes"),
        ("kueue.x-k8s.io", "workloadpriorityclasses"),
        ("kueue.x-k8s.io", "resourceflavors"),
        ("scheduling.k8s.io", "priorityclasses"),
    }
)
_READ_VERBS = ("get", "list", "watch")


def _quantity(value: float) -> int | str:
    """A fair-sharing weight as Kueue's int-or-string quantity."""
    if float(value).is_integer():
        return int(value)
    return repr(float(value))


def pod_security_levels(config: Config, team: Team, namespace: str, today: dt.date) -> dict[str, Any]:
    """Pod Security Admission labels for one team namespace.

    ``audit`` and ``warn`` always carry the org's level. ``enforce`` carries it too, unless mpigate
    itself lets a pod through that the level would reject: a PSS rule that the org enforces only
    as ``warn``/``audit``, or an active PolicyException of this team for this namespace. Then the
    API server would reject the pods that mpigate admitted (the TrainJob would hang with failing
    pod creation), so ``enforce`` drops to the strictest level that still admits them.
    """
    org_level = config.org.security.level
    ceiling = PSS_LEVELS.index(org_level)
    relaxed: dict[str, str] = {}
    for info in all_rules().values():
        if info.pss_level is None or PSS_LEVELS.index(info.pss_level) > ceiling:
            continue
        mode = config.org.enforcement.mode_for(info.id)
        if mode != "enforce":
            relaxed[info.id] = f"enforcement mode {mode}"
    for exc in config.exceptions_for(team.name):
        if not exc.active_on(today):
            continue
        if exc.namespaces is not None and namespace not in exc.namespaces:
            continue
        for rule_id in sorted(exc.rule_ids):
            entry = all_rules().get(rule_id)  # None: a custom or library rule
            if (
                entry is not None
                and entry.pss_level is not None
                and PSS_LEVELS.index(entry.pss_level) <= ceiling
            ):
                relaxed.setdefault(rule_id, f"PolicyException {exc.name}")
    enforce = ceiling
    for rule_id in relaxed:
        level = PSS_LEVELS.index(all_rules()[rule_id].pss_level or "privileged")
        # a relaxed baseline check needs "privileged"; a relaxed restricted check needs "baseline"
        enforce = min(enforce, level - 1)
    return {
        "enforce": PSS_LEVELS[enforce],
        "audit": org_level,
        "warn": org_level,
        "version": config.org.security.version,
        "relaxed": [{"rule": k, "why": v} for k, v in sorted(relaxed.items())],
    }


def namespace_labels(config: Config, namespace: str, today: dt.date) -> dict[str, str]:
    """The labels of ``namespace`` in the cluster: those ``mpigate render`` gives a team namespace
    (templates/team/namespaces.yaml.j2: the team and the Pod Security levels) and the
    ``kubernetes.io/metadata.name`` label the API server sets on every namespace — what a
    ValidatingAdmissionPolicy's namespaceSelector sees. A namespace of no team has only its name."""
    labels = {NAMESPACE_NAME_LABEL: namespace}
    team = config.team_for_namespace(namespace)
    if team is None:
        return labels
    levels = pod_security_levels(config, team, namespace, today)
    labels[LABELS["managed_by"]] = MANAGED_BY
    labels[LABELS["team"]] = team.name
    for mode in ("enforce", "audit", "warn"):
        labels[f"pod-security.kubernetes.io/{mode}"] = levels[mode]
        labels[f"pod-security.kubernetes.io/{mode}-version"] = levels["version"]
    return labels


def _egress(rules: Iterable[EgressRule], source: str) -> list[dict[str, Any]]:
    return [
        {
            "cidr": r.cidr,
            "except": list(r.except_),
            "ports": list(r.ports),
            "protocol": r.protocol,
            "description": r.description,
            "source": source,
        }
        for r in rules
    ]


def _cluster_read_rules(persona: Persona) -> list[dict[str, Any]]:
    """The part of a persona's rules on cluster-scoped resources that may be granted cluster-wide:
    read verbs on :data:`CLUSTER_READABLE` resources, one rule per API group."""
    by_group: dict[str, set[str]] = {}
    verbs: dict[str, set[str]] = {}
    for rule in persona.rules:
        rule_verbs = set(rule.get("verbs", ()))
        granted = {v for v in _READ_VERBS if v in rule_verbs or "*" in rule_verbs}
        if not granted:
            continue
        for group in rule.get("apiGroups", ()):
            for resource in rule.get("resources", ()):
                if (group, resource) in CLUSTER_READABLE:
                    by_group.setdefault(group, set()).add(resource)
                    verbs.setdefault(group, set()).update(granted)
    return [
        {
            "apiGroups": [group],
            "resources": sorted(resources),
            "verbs": [v for v in _READ_VERBS if v in verbs[group]],
        }
        for group, resources in sorted(by_group.items())
    ]


def _persona_context(persona: Persona) -> dict[str, Any]:
    return {
        "name": persona.name,
        "description": persona.description,
        "kueue": persona.kueue,
        "rules": thaw(persona.rules),
        "cluster_role": f"mpigate:persona:{persona.name}",
        "cluster_read_role": f"mpigate:persona:{persona.name}:cluster-read",
        "cluster_read_rules": _cluster_read_rules(persona),
    }


def team_context(config: Config, team: Team, today: dt.date) -> dict[str, Any]:
    """Everything the per-team templates render from."""
    view = queue_view(config)
    pods = pod_quota(team)
    # What Kueue can ever admit for the team, per GPU resource: Σ potentialAvailable over its
    # flavors of that resource (the cohort's lending, not nominal + borrowingLimit).
    gpu_ceilings: dict[str, int] = {}
    gpus = []
    for flavor_name in sorted(team.gpus):
        quota = team.gpus[flavor_name]
        resource = config.flavors[flavor_name].gpu_resource
        ceiling = view.tree.potential_available(team.name, (flavor_name, resource))
        gpu_ceilings[resource] = gpu_ceilings.get(resource, 0) + ceiling
        gpus.append(
            {
                "flavor": flavor_name,
                "resource": resource,
                "nominal": quota.nominal,
                "borrowing_limit": quota.borrowing_limit,
                "lending_limit": quota.lending_limit,
                "ceiling": ceiling,
            }
        )
    # The backstop counts what Kueue counts the same way (pods; GPUs, whose requests equal their
    # limits), with room for the pods of preempted or finished jobs that are still terminating when
    # Kueue admits the next: a ResourceQuota equal to Kueue's quota would refuse the pods of a job
    # Kueue admitted. cpu and memory are left to Kueue (it counts a container that states only
    # limits at the LimitRange's default request, below what the pod will request).
    hard: dict[str, Any] = {name: str(team.max_stored_jobs) for name in STORED_JOB_COUNTS}
    hard["pods"] = str(pods * BACKSTOP_HEADROOM)
    for resource, ceiling in sorted(gpu_ceilings.items()):
        hard[f"requests.{resource}"] = str(ceiling * BACKSTOP_HEADROOM)

    access = config.access.get(team.name)
    bindings = []
    if access is not None:
        for persona_name in sorted(access.members):
            members = access.members[persona_name]
            persona = config.personas[persona_name]
            if not (members.users or members.groups or members.service_accounts):
                continue
            bindings.append(
                {
                    "persona": persona_name,
                    "cluster_role": f"mpigate:persona:{persona_name}",
                    "cluster_read_role": f"mpigate:persona:{persona_name}:cluster-read",
                    "cluster_read": bool(_cluster_read_rules(persona)),
                    "users": sorted(members.users),
                    "groups": sorted(members.groups),
                    "service_accounts": sorted(members.service_accounts),
                }
            )

    network = config.network_for(team.name)
    profile = config.network_profiles[network.profile]
    egress = []
    for list_name in network.egress_lists:
        egress.extend(_egress(config.egress_lists[list_name], f"egress list {list_name}"))
    egress.extend(_egress(network.egress, "TeamNetwork"))

    region = config.org.regions[team.region]
    return {
        "name": team.name,
        "description": team.description,
        "contact": team.contact,
        "namespaces": [
            {"name": ns, "pod_security": pod_security_levels(config, team, ns, today)}
            for ns in team.namespaces
        ],
        "namespace_names": list(team.namespaces),
        "primary_namespace": team.namespaces[0],
        "region": {"name": region.name, "node_labels": dict(sorted(region.node_labels.items()))},
        "cohort": team.cohort,
        "queues": list(team.queues),
        "default_queue": team.default_queue,
        "priority_classes": list(team.priority_classes),
        "default_priority_class": team.default_priority_class,
        "max_concurrent_jobs": team.max_concurrent_jobs,
        "max_nodes_per_job": team.max_nodes_per_job,
        "pods_per_job": team.max_nodes_per_job + AUXILIARY_PODS_PER_JOB,
        "pods": pods,
        "cpu": team.cpu,
        "memory": team.memory,
        "gpus": gpus,
        "gpu_ceilings": gpu_ceilings,
        "fair_share_weight": _quantity(team.fair_share_weight),
        "cluster_queue": {
            "name": team.name,
            "namespace_selector": {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "In",
                        "values": sorted(team.namespaces),
                    }
                ]
            },
            "resource_groups": view.resource_groups(team.name),
            "queueing_strategy": QUEUEING_STRATEGY,
            "preemption": thaw(PREEMPTION),
        },
        "resource_quota": {"hard": hard},
        "limit_range_default_requests": dict(LIMIT_RANGE_DEFAULT_REQUESTS),
        "bindings": bindings,
        "service_accounts": sorted(config.service_accounts_of(team.name)),
        "network": {
            "profile": profile.name,
            "mode": profile.mode,
            "egress": egress,
        },
    }


def _gpu_flavor_context(config: Config, name: str) -> dict[str, Any]:
    flavor = config.flavors[name]
    region = config.org.regions[flavor.region]
    labels = dict(region.node_labels)
    labels.update(flavor.node_labels)
    return {
        "name": name,
        "kind": "gpu",
        "region": flavor.region,
        "gpu_resource": flavor.gpu_resource,
        "gpus_per_node": flavor.gpus_per_node,
        "capacity": flavor.capacity,
        "description": flavor.description,
        "node_labels": dict(sorted(labels.items())),
        "tolerations": thaw(flavor.tolerations),
    }


def build_context(config: Config, *, today: dt.date, bundle: Mapping[str, Any]) -> dict[str, Any]:
    """The global template context (per-team templates also get ``team``)."""
    org = config.org
    regions = [
        {
            "name": name,
            "description": org.regions[name].description,
            "node_labels": dict(sorted(org.regions[name].node_labels.items())),
            "flavor": region_flavor_name(name),
        }
        for name in sorted(org.regions)
    ]
    teams = [team_context(config, config.teams[name], today) for name in sorted(config.teams)]
    return {
        "revision": config.revision,
        "today": today.isoformat(),
        "labels": dict(LABELS),
        "mpigate": dict(MPIGATE),
        "org": {
            "name": org.name,
            "unmanaged_namespaces": org.unmanaged_namespaces,
            "security": {"level": org.security.level, "version": org.security.version},
        },
        "regions": regions,
        "flavors": [_gpu_flavor_context(config, name) for name in sorted(config.flavors)],
        "gpu_resources": sorted({f.gpu_resource for f in config.flavors.values()}),
        "cohorts": sorted(config.cohorts),
        "priority_classes": [
            {"name": pc.name, "value": pc.value, "description": pc.description}
            for pc in sorted(org.priority_classes.values(), key=lambda p: p.name)
        ],
        "personas": [_persona_context(config.personas[name]) for name in sorted(config.personas)],
        "teams": teams,
        "bundle": dict(bundle),
    }
