"""The per-job NetworkPolicy, as a pure function of the config and the job.

One NetworkPolicy ``mpigate-trainjob.<job>`` per TrainJob (``mpigate-mpijob.<job>`` per MPIJob) in a
team namespace, owned by the job (Kubernetes garbage-collects it with the job). It selects the job's
pods by the label every pod of the job carries (JobSet's ``jobset.sigs.k8s.io/jobset-name`` for a
TrainJob, the MPI launcher included; the MPI Operator's ``training.kubeflow.org/job-name`` with
``training.kubeflow.org/operator-name: mpi-operator`` for an MPIJob: :mod:`.kinds`) and allows, in
both directions, only traffic among those pods — all TCP for the ``isolated``
profile; sshd plus the pinned OpenMPI ranges of :meth:`NetworkProfile.port_ranges` for
``pinned-ports`` — plus DNS to the cluster's DNS pods and the team's allowed egress. The shape is
documented in docs/networking.md and docs/controller.md.

Every field is written in the form the API server stores (explicit ``protocol``, explicit
``policyTypes``), so that comparing the desired object with the stored one finds real drift only.

The controller touches only what it owns. The name cannot collide with an object ``mpigate
render`` writes: a per-job name holds a dot (``mpigate-trainjob.`` or ``mpigate-mpijob.`` + the job's
name), rendered names never do (tests/render checks every rendered name), and NetworkPolicy names
are DNS subdomains (Kubernetes ``pkg/apis/networking/validation`` ``ValidateNetworkPolicyName``:
``NameIsDNSSubdomain``) while TrainJob names are DNS-1035 labels (the Trainer CRD's CEL rule), so
``<job>`` itself never holds one; nor does an MPIJob's (the MPI Operator refuses a name that does
not make ``<job>-worker-<n>`` a DNS-1035 label: mpi-operator pkg/apis/kubeflow/validation
``validateMPIJobName``), and the two prefixes keep a TrainJob's and an MPIJob's policies apart. And
an object found under that name is the job's only when :func:`owned_by` says so (its controlling
ownerReference, or mpigate's ownership label together with the job's uid); anything else there is
a conflict that the reconciler reports and never rewrites.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from mpigate.config import Config
from mpigate.config.model import EgressRule, NetworkProfile, Team

from .kinds import JOBSET_NAME_LABEL, TRAINJOB, JobKind

__all__ = [
    "CLASSIFICATION_LABEL",
    "JOBSET_NAME_LABEL",
    "MANAGED_BY_LABEL",
    "MANAGED_BY_VALUE",
    "OWNER_UID_LABEL",
    "POLICY_PREFIX",
    "PROFILE_ANNOTATION",
    "PROFILE_REASON_ANNOTATION",
    "TRAINJOB_LABEL",
    "Drift",
    "ProfileChoice",
    "build_network_policy",
    "choose_profile",
    "drift",
    "egress_rules",
    "merge_patch",
    "owned_by",
    "owner_reference",
    "policy_name",
    "repair_patch",
]

CLASSIFICATION_LABEL: Final = "mpigate.io/data-classification"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "mpigate"
TRAINJOB_LABEL: Final = TRAINJOB.job_label
#: The uid of the TrainJob a managed object belongs to (with MANAGED_BY_LABEL: the ownership label);
#: an MPIJob's is ``mpigate.io/mpijob-uid`` (JobKind.uid_label).
OWNER_UID_LABEL: Final = TRAINJOB.uid_label
#: Per-job objects are named ``POLICY_PREFIX + <job>``: the dot keeps them apart from every rendered
#: name (see the module docstring); an MPIJob's start with ``mpigate-mpijob.``.
POLICY_PREFIX: Final = TRAINJOB.policy_prefix
TEAM_LABEL: Final = "mpigate.io/team"
PROFILE_ANNOTATION: Final = "mpigate.io/network-profile"
PROFILE_REASON_ANNOTATION: Final = "mpigate.io/network-profile-reason"

# How strict each profile mode is: a data classification may only tighten a team's posture.
# The cluster DNS pods (kube-dns and CoreDNS both carry k8s-app=kube-dns), as in the rendered
# namespace policies (templates/team/networkpolicies.yaml.j2).
_DNS_PEER: Final = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
_DNS_PORTS: Final = ({"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53})


@dataclass(frozen=True, slots=True)
class ProfileChoice:
    """The profile a job gets and why (``team nlp-team`` or ``data classification phi``)."""

    profile: NetworkProfile
    reason: str


def policy_name(job: str, kind: JobKind = TRAINJOB) -> str:
    """The NetworkPolicy's name for job ``job`` (``mpigate-trainjob.<job>``, ``mpigate-mpijob.<job>``)."""
    return kind.policy_name(job)


def owned_by(obj: Mapping[str, Any], trainjob: Mapping[str, Any], kind: JobKind = TRAINJOB) -> bool:
    """Whether ``obj`` belongs to the job ``trainjob`` (this very job: the same uid).

    Either its controlling ownerReference names the job's uid, or it carries mpigate's ownership
    label (``app.kubernetes.io/managed-by: mpigate``) together with the kind's uid label
    (``mpigate.io/trainjob-uid``, ``mpigate.io/mpijob-uid``) set to that uid. A name match alone
    proves nothing: a rendered object, another tool's or a previous job of the same name (until the
    garbage collector removes it) is not the job's.
    """
    uid = _mapping(trainjob.get("metadata")).get("uid")
    if not isinstance(uid, str) or not uid:
        return False
    meta = _mapping(obj.get("metadata"))
    if any(r.get("uid") == uid for r in _controller_refs(meta)):
        return True
    labels = _mapping(meta.get("labels"))
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE and labels.get(kind.uid_label) == uid


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def choose_profile(config: Config, team: Team, labels: Mapping[str, Any]) -> ProfileChoice:
    """The team's profile, or the data classification's when that one is stricter.

    A classification such as ``phi`` can demand ``pinned-ports`` for a team whose default is
    ``isolated``; it can never loosen a team that is ``pinned-ports`` already. The decision is
    :meth:`Config.job_network_profile`, shared with the webhook that injects the port env.
    """
    label = labels.get(CLASSIFICATION_LABEL)
    profile, reason = config.job_network_profile(team.name, label if isinstance(label, str) else None)
    return ProfileChoice(profile, reason)


def egress_rules(config: Config, team: str) -> list[dict[str, Any]]:
    """The team's allowed egress (its egress lists, then its own entries), one rule per entry."""
    network = config.network_for(team)
    rules: list[EgressRule] = []
    for list_name in network.egress_lists:
        rules.extend(config.egress_lists.get(list_name, ()))
    rules.extend(network.egress)
    return [_egress_rule(rule) for rule in rules]


def _egress_rule(rule: EgressRule) -> dict[str, Any]:
    block: dict[str, Any] = {"cidr": rule.cidr}
    if rule.except_:
        block["except"] = list(rule.except_)
    out: dict[str, Any] = {"to": [{"ipBlock": block}]}
    if rule.ports:
        out["ports"] = [{"protocol": rule.protocol, "port": port} for port in rule.ports]
    return out


def _job_ports(profile: NetworkProfile) -> list[dict[str, Any]]:
    if profile.mode != "pinned-ports":
        return [{"protocol": "TCP"}]  # every TCP port, no UDP/SCTP
    ports: list[dict[str, Any]] = []
    for low, high in profile.port_ranges():
        port: dict[str, Any] = {"protocol": "TCP", "port": low}
        if high > low:
            port["endPort"] = high
        ports.append(port)
    return ports


def owner_reference(trainjob: Mapping[str, Any], kind: JobKind = TRAINJOB) -> dict[str, Any]:
    """The job as controlling owner (garbage collection deletes the policy with the job)."""
    meta = trainjob.get("metadata") or {}
    return {
        "apiVersion": trainjob.get("apiVersion") or kind.api_version,
        "kind": kind.kind,
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_network_policy(
    config: Config, trainjob: Mapping[str, Any], team: Team | None = None, *, kind: JobKind = TRAINJOB
) -> dict[str, Any] | None:
    """The NetworkPolicy for the job ``trainjob`` (of ``kind``), or None when its namespace belongs
    to no team.

    ``team`` overrides the namespace lookup (the controller has resolved it already).
    """
    meta = trainjob.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        return None
    team = team or config.team_for_namespace(namespace)
    if team is None:
        return None
    raw_labels = meta.get("labels")
    labels: Mapping[str, Any] = raw_labels if isinstance(raw_labels, Mapping) else {}
    choice = choose_profile(config, team, labels)

    def job_pods() -> dict[str, Any]:
        return {"podSelector": {"matchLabels": kind.pod_selector(name)}}

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": kind.policy_name(name),
            "namespace": namespace,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY_VALUE,
                "app.kubernetes.io/part-of": "mpigate",
                kind.job_label: name,
                TEAM_LABEL: team.name,
                **({kind.uid_label: uid} if isinstance(uid := meta.get("uid"), str) and uid else {}),
            },
            "annotations": {
                PROFILE_ANNOTATION: choice.profile.name,
                PROFILE_REASON_ANNOTATION: choice.reason,
            },
            "ownerReferences": [owner_reference(trainjob, kind)],
        },
        "spec": {
            "podSelector": {"matchLabels": kind.pod_selector(name)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [job_pods()], "ports": _job_ports(choice.profile)}],
            "egress": [
                {"to": [job_pods()], "ports": _job_ports(choice.profile)},
                {"to": [copy.deepcopy(_DNS_PEER)], "ports": copy.deepcopy(list(_DNS_PORTS))},
                *egress_rules(config, team.name),
            ],
        },
    }


@dataclass(frozen=True, slots=True)
class Drift:
    """What differs between the desired policy and the stored one (empty: nothing)."""

    fields: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.fields)

    def __str__(self) -> str:
        return ", ".join(self.fields) if self.fields else "nothing"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _controller_refs(meta: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return []
    return [r for r in refs if isinstance(r, Mapping) and r.get("controller")]


def drift(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> Drift:
    """Which parts mpigate owns differ: ``spec``, ``labels``, ``annotations``, ``owner``.

    Labels and annotations others add are left alone; only mpigate's keys are compared.
    """
    found: list[str] = []
    if _canonical(actual.get("spec")) != _canonical(desired.get("spec")):
        found.append("spec")
    want_meta: Mapping[str, Any] = desired.get("metadata") or {}
    have_meta: Mapping[str, Any] = actual.get("metadata") or {}
    for key in ("labels", "annotations"):
        want = want_meta.get(key) or {}
        have = have_meta.get(key) or {}
        if any(have.get(k) != v for k, v in want.items()):
            found.append(key)
    want_owner = [
        {k: r.get(k) for k in ("kind", "name", "uid", "controller")} for r in _controller_refs(want_meta)
    ]
    have_owner = [
        {k: r.get(k) for k in ("kind", "name", "uid", "controller")} for r in _controller_refs(have_meta)
    ]
    if want_owner != have_owner:
        found.append("owner")
    return Drift(tuple(found))


def merge_patch(actual: Any, desired: Any) -> Any:
    """An RFC 7386 JSON merge patch that turns ``actual`` into ``desired``.

    Keys that ``actual`` has and ``desired`` lacks become ``null``; lists are replaced whole.
    """
    if not isinstance(desired, Mapping) or not isinstance(actual, Mapping):
        return desired
    patch: dict[str, Any] = {}
    for key in actual:
        if key not in desired:
            patch[key] = None
    for key, value in desired.items():
        if key not in actual:
            patch[key] = value
        elif _canonical(actual[key]) != _canonical(value):
            patch[key] = merge_patch(actual[key], value)
    return patch


def repair_patch(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that puts mpigate's parts of ``actual`` back to ``desired``.

    It carries ``metadata.resourceVersion`` so that the API server rejects it (409) when the object
    changed in between; other owners' references, labels and annotations are kept.
    """
    want_meta: Mapping[str, Any] = desired.get("metadata") or {}
    have_meta: Mapping[str, Any] = actual.get("metadata") or {}
    others = [
        r
        for r in (have_meta.get("ownerReferences") or [])
        if isinstance(r, Mapping) and not r.get("controller")
    ]
    meta: dict[str, Any] = {
        "labels": dict(want_meta.get("labels") or {}),
        "annotations": dict(want_meta.get("annotations") or {}),
        "ownerReferences": [*want_meta.get("ownerReferences", []), *others],
    }
    if have_meta.get("resourceVersion"):
        meta["resourceVersion"] = have_meta["resourceVersion"]
    return {"metadata": meta, "spec": merge_patch(actual.get("spec") or {}, desired.get("spec") or {})}
