"""Turn validated, defaulted documents into the immutable :class:`Config`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from mpigate.catalogue import expand_rule_pattern

from .crossfile import Entry
from .crossfile.admissionpolicies import admission_rules
from .crossfile.customrules import resolved_spec
from .crossfile.library import enabled_library, library_spec
from .frozen import freeze
from .model import (
    REPORT_APIS,
    AuditAction,
    AuditSettings,
    BackgroundAudit,
    Config,
    CustomRule,
    DataClassification,
    EgressRule,
    Enforcement,
    Flavor,
    GPUQuota,
    ImagePolicy,
    KueueSettings,
    LabelChangeGrant,
    LifecyclePolicy,
    Members,
    Mode,
    NetworkProfile,
    OrgPolicy,
    Persona,
    PolicyException,
    PolicyTestSuite,
    PriorityClass,
    Region,
    Runtime,
    RuntimeApproval,
    SecurityPolicy,
    Team,
    TeamAccess,
    TeamNetwork,
    UpdatePolicy,
    WaitForPodsReady,
)
from .mpienv import as_implementation
from .problems import Location, Problem
from .units import parse_duration, parse_quantity

__all__ = ["build_config"]


def _ro(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


def _loc(entry: Entry) -> Location:
    return Location(entry.doc.file, entry.doc.line, 1)


def _org(entry: Entry) -> OrgPolicy:
    spec = entry.data["spec"]
    sec = spec["security"]
    img = spec["images"]
    life = spec["lifecycle"]
    audit = spec["audit"]
    approvals = []
    for allowed in spec["runtimes"]["allowed"]:
        if isinstance(allowed, str):
            approvals.append(RuntimeApproval(allowed, "ClusterTrainingRuntime", False, None))
        else:
            teams = allowed.get("teams")
            approvals.append(
                RuntimeApproval(
                    allowed["name"],
                    allowed["kind"],
                    allowed["external"],
                    tuple(teams) if teams is not None else None,
                    as_implementation(allowed.get("mpiImplementation")),
                )
            )
    return OrgPolicy(
        name=entry.data["metadata"]["name"],
        unmanaged_namespaces=spec["managedNamespaces"]["unmanaged"],
        security=SecurityPolicy(
            level=sec["podSecurity"]["level"],
            version=sec["podSecurity"]["version"],
            inject_defaults=sec["injectDefaults"],
            forbid_plaintext_secrets=sec["forbidPlaintextSecrets"],
        ),
        images=ImagePolicy(
            allowed_registries=tuple(img["allowedRegistries"]),
            forbid_latest=img["forbidLatest"],
            require_digest=img["requireDigest"],
            mirrors=_ro(img["mirrors"]),
        ),
        runtimes=tuple(approvals),
        mpi_implementations=tuple(spec["runtimes"]["mpiImplementations"]),
        regions=_ro(
            {
                name: Region(name, _ro(r["nodeLabels"]), tuple(r["dataLocations"]), r.get("description", ""))
                for name, r in spec["regions"].items()
            }
        ),
        data_classifications=_ro(
            {
                name: DataClassification(
                    name=name,
                    regions=tuple(d["regions"]) if d.get("regions") is not None else None,
                    network_profile=d.get("networkProfile"),
                    require_digest=d.get("requireDigest"),
                    controls=tuple(d["controls"]),
                    description=d.get("description", ""),
                )
                for name, d in spec["dataClassifications"].items()
            }
        ),
        priority_classes=_ro(
            {
                name: PriorityClass(name, p["value"], p.get("description", ""))
                for name, p in spec["priorityClasses"].items()
            }
        ),
        lifecycle=LifecyclePolicy(
            max_runtime_seconds=parse_duration(life["maxRuntime"]) if "maxRuntime" in life else None,
            default_runtime_seconds=parse_duration(life["defaultRuntime"])
            if "defaultRuntime" in life
            else None,
            required_labels=tuple(life["requiredLabels"]),
        ),
        audit=AuditSettings(
            sink=audit["sink"],
            directory=audit["directory"],
            checkpoint_every=audit["checkpointEvery"],
            checkpoint_interval_seconds=parse_duration(audit["checkpointInterval"]),
            rotate_max_bytes=audit["rotate"]["maxBytes"],
            rotate_max_age_seconds=parse_duration(audit["rotate"]["maxAge"]),
            signing_method=audit["signing"]["method"],
            signing_key_file=audit["signing"]["keyFile"],
            otlp_endpoint=audit["otlp"]["endpoint"],
            otlp_headers=_ro(audit["otlp"]["headers"]),
            otlp_ca_file=audit["otlp"]["caFile"],
            retention_max_age_seconds=parse_duration(audit["retention"]["maxAge"])
            if audit["retention"]["maxAge"] is not None
            else None,
        ),
        enforcement=Enforcement.build(
            cast(Mode, spec["enforcement"]["default"]),
            {k: cast(Mode, v) for k, v in spec["enforcement"]["overrides"].items()},
        ),
        source=_loc(entry),
        background_audit=_background_audit(spec["backgroundAudit"]),
        updates=UpdatePolicy(
            tuple(
                LabelChangeGrant(
                    frozenset(g["labels"]),
                    frozenset(g["personas"]),
                    frozenset(g["users"]),
                    frozenset(g["groups"]),
                )
                for g in spec["updates"]["labelChanges"]
            )
        ),
    )


def _team(entry: Entry) -> Team:
    name = entry.data["metadata"]["name"]
    spec = entry.data["spec"]
    cpu = spec.get("cpu")
    memory = spec.get("memory")
    return Team(
        name=name,
        namespaces=tuple(spec["namespaces"]),
        region=spec["region"],
        cohort=spec.get("cohort"),
        gpus=_ro(
            {
                flavor: GPUQuota(flavor, q["nominal"], q["borrowingLimit"], q.get("lendingLimit"))
                for flavor, q in spec["gpus"].items()
            }
        ),
        cpu=str(cpu) if cpu is not None else None,
        memory=str(memory) if memory is not None else None,
        cpu_value=parse_quantity(cpu) if cpu is not None else None,
        memory_value=parse_quantity(memory) if memory is not None else None,
        pods=spec.get("pods"),
        max_concurrent_jobs=spec["maxConcurrentJobs"],
        max_stored_jobs=spec.get("maxStoredJobs", 4 * spec["maxConcurrentJobs"]),
        max_nodes_per_job=spec["maxNodesPerJob"],
        queues=tuple(spec.get("queues") or (name,)),
        priority_classes=tuple(spec["priorityClasses"]),
        fair_share_weight=float(spec["fairShareWeight"]),
        contact=spec["contact"],
        required_labels=tuple(spec["requiredLabels"]),
        data_classifications=tuple(spec["dataClassifications"]) if "dataClassifications" in spec else None,
        runtimes=tuple(spec["runtimes"]) if "runtimes" in spec else None,
        source=_loc(entry),
        description=spec.get("description", ""),
    )


def _egress(rule: Mapping[str, Any]) -> EgressRule:
    return EgressRule(
        cidr=rule["cidr"],
        except_=tuple(rule.get("except", ())),
        ports=tuple(rule.get("ports", ())),
        protocol=rule["protocol"],
        description=rule.get("description", ""),
        serves=tuple(rule.get("serves", ())),
    )


def build_config(
    by_kind: Mapping[str, list[Entry]],
    *,
    root: str,
    revision: str,
    files: tuple[str, ...],
    warnings: tuple[Problem, ...],
    objects: Sequence[Entry] = (),
) -> Config:
    """Build the model. Callers guarantee the tree has no errors (see ``check_tree``)."""
    org = _org(by_kind["OrgPolicy"][0])
    flavors_spec = by_kind["GPUFlavors"][0].data["spec"]
    flavors = {
        name: Flavor(
            name=name,
            region=f["region"],
            gpu_resource=f["gpu"],
            gpus_per_node=f["gpusPerNode"],
            capacity=f.get("capacity"),
            node_labels=_ro(f["nodeLabels"]),
            tolerations=tuple(freeze(t) for t in f["tolerations"]),
            description=f.get("description", ""),
        )
        for name, f in flavors_spec["flavors"].items()
    }
    teams = {t.name: t for t in (_team(e) for e in by_kind.get("TeamQuota", []))}
    team_by_namespace = {ns: t.name for t in teams.values() for ns in t.namespaces}

    personas_spec = by_kind["Personas"][0].data["spec"]["personas"]
    personas = {
        name: Persona(
            name,
            p["description"],
            p["kueue"],
            tuple(freeze(r) for r in p["rules"]),
            tuple(p["serviceAccountsFrom"]) if "serviceAccountsFrom" in p else None,
        )
        for name, p in personas_spec.items()
    }
    access = {}
    for entry in by_kind.get("TeamAccess", []):
        spec = entry.data["spec"]
        access[spec["team"]] = TeamAccess(
            name=entry.data["metadata"]["name"],
            team=spec["team"],
            members=_ro(
                {
                    persona: Members(tuple(m["users"]), tuple(m["groups"]), tuple(m["serviceAccounts"]))
                    for persona, m in spec["members"].items()
                }
            ),
            source=_loc(entry),
            secrets=tuple(spec["secrets"]),
        )

    profiles_spec = by_kind["NetworkProfiles"][0].data["spec"]
    profiles = {
        name: NetworkProfile(
            name=name,
            mode=p["mode"],
            ssh_port=p["sshPort"],
            btl_port_min=p["openmpi"]["btlPortMin"],
            btl_port_range=p["openmpi"]["btlPortRange"],
            oob_port_min=p["openmpi"]["oobPortMin"],
            oob_port_max=p["openmpi"]["oobPortMax"],
            description=p.get("description", ""),
        )
        for name, p in profiles_spec["profiles"].items()
    }
    egress_lists = {name: tuple(_egress(r) for r in rules) for name, rules in profiles_spec["egress"].items()}
    networks = {}
    for entry in by_kind.get("TeamNetwork", []):
        spec = entry.data["spec"]
        networks[spec["team"]] = TeamNetwork(
            team=spec["team"],
            profile=spec.get("profile") or profiles_spec["default"],
            egress_lists=tuple(spec["egressLists"]),
            egress=tuple(_egress(r) for r in spec["egress"]),
            source=_loc(entry),
        )

    exceptions = []
    for entry in by_kind.get("PolicyException", []):
        spec = entry.data["spec"]
        match = spec["match"]
        ids: set[str] = set()
        for pattern in spec["rules"]:
            ids.update(expand_rule_pattern(pattern))
        exceptions.append(
            PolicyException(
                name=entry.data["metadata"]["name"],
                team=spec["team"],
                rules=tuple(spec["rules"]),
                rule_ids=frozenset(ids),
                trainjob_names=tuple(match["trainJobNames"]) if "trainJobNames" in match else None,
                namespaces=tuple(match["namespaces"]) if "namespaces" in match else None,
                labels=_ro(match.get("labels", {})),
                justification=spec["justification"],
                approver=spec["approver"],
                ticket=spec["ticket"],
                expires=dt.date.fromisoformat(spec["expires"]),
                source=_loc(entry),
                requested_by=(
                    frozenset(match["requestedBy"].get("users", ())),
                    frozenset(match["requestedBy"].get("groups", ())),
                    frozenset(match["requestedBy"].get("personas", ())),
                )
                if "requestedBy" in match
                else None,
            )
        )
    by_team: dict[str, list[PolicyException]] = {}
    for exc in exceptions:
        by_team.setdefault(exc.team, []).append(exc)

    base = Path(root) if Path(root).is_dir() else Path(root).parent
    tests = []
    for entry in by_kind.get("PolicyTest", []):
        spec = entry.data["spec"]
        tests.append(
            PolicyTestSuite(
                name=entry.data["metadata"]["name"],
                file=entry.doc.file,
                absolute_file=str((base / entry.doc.file).resolve()),
                now=spec.get("now"),
                cases=tuple(freeze(case) for case in spec["cases"]),
                case_locations=tuple(
                    entry.doc.locate(("spec", "cases", i)) for i in range(len(spec["cases"]))
                ),
                source=_loc(entry),
            )
        )

    runtimes = {}
    for kind in ("ClusterTrainingRuntime", "TrainingRuntime"):
        for entry in by_kind.get(kind, []):
            meta = entry.data["metadata"]
            ns = meta.get("namespace") if kind == "TrainingRuntime" else None
            runtimes[(kind, ns, meta["name"])] = Runtime(
                kind, meta["name"], ns, freeze(entry.data), _loc(entry)
            )

    org_entry = by_kind["OrgPolicy"][0]
    library = []
    for index, rule, _enabled in enabled_library(org_entry):
        spec = library_spec(rule, _enabled)
        at = org_entry.doc.locate(("spec", "rules", "library", index))
        library.append(
            CustomRule(
                id=rule.id,
                name=rule.name,
                title=rule.title,
                action=spec["action"],
                controls=tuple(spec["controls"]),
                spec=freeze(spec),
                source=Location(org_entry.doc.file, at.line, at.column),
            )
        )
    custom_rules = (
        tuple(
            CustomRule(
                id=entry.data["spec"]["id"],
                name=entry.data["metadata"]["name"],
                title=entry.data["spec"]["title"],
                action=entry.data["spec"]["action"],
                controls=tuple(entry.data["spec"]["controls"]),
                spec=freeze(resolved_spec(entry.data["spec"])),
                source=_loc(entry),
            )
            for entry in by_kind.get("CustomRule", [])
        )
        + tuple(library)
        + admission_rules(
            [
                *by_kind.get("ValidatingAdmissionPolicy", []),
                *by_kind.get("ValidatingAdmissionPolicyBinding", []),
            ],
            objects,
            _loc,
        )
    )

    return Config(
        root=root,
        revision=revision,
        org=org,
        flavors=_ro(flavors),
        cohorts=tuple(flavors_spec["cohorts"]),
        kueue=_kueue(flavors_spec["kueue"]),
        teams=_ro(teams),
        personas=_ro(personas),
        access=_ro(access),
        network_profiles=_ro(profiles),
        default_network_profile=profiles_spec["default"],
        egress_lists=_ro(egress_lists),
        team_networks=_ro(networks),
        exceptions=tuple(exceptions),
        tests=tuple(tests),
        runtimes=MappingProxyType(runtimes),
        files=files,
        warnings=warnings,
        custom_rules=custom_rules,
        _team_by_namespace=_ro(team_by_namespace),
        _exceptions_by_team=_ro({k: tuple(v) for k, v in by_team.items()}),
    )


def _background_audit(raw: Mapping[str, Any]) -> BackgroundAudit:
    reports = raw["reports"]
    apis = REPORT_APIS if reports == "both" else () if reports == "none" else (reports,)
    return BackgroundAudit(
        enabled=raw["enabled"],
        interval_seconds=parse_duration(raw["interval"]),
        report_apis=apis,
        max_results_per_report=raw["maxResultsPerReport"],
        actions=_ro({k: cast(AuditAction, v) for k, v in raw["actions"].items()}),
    )


def _kueue(spec: Mapping[str, Any]) -> KueueSettings:
    ready = spec.get("waitForPodsReady")
    wait = None
    if ready is not None:
        recovery = ready.get("recoveryTimeout")
        wait = WaitForPodsReady(
            timeout_seconds=parse_duration(ready["timeout"]),
            block_admission=ready["blockAdmission"],
            recovery_timeout_seconds=parse_duration(recovery) if recovery is not None else None,
            backoff_limit_count=ready.get("backoffLimitCount"),
            backoff_base_seconds=ready.get("backoffBaseSeconds"),
            backoff_max_seconds=ready.get("backoffMaxSeconds"),
        )
    return KueueSettings(
        fair_sharing=spec["fairSharing"], wait_for_pods_ready=wait, controller=spec["controller"]
    )
