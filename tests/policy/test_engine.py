"""The engine rule by rule on the example org: outcomes, paths, numbers, fixes, modes, exceptions."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import pytest

from mpigate.config import Config
from mpigate.config.model import Enforcement
from mpigate.policy import AdmissionInput, LiveContext, judge, mutations
from mpigate.policy.findings import WARNING_LIMIT
from mpigate.policy.rules.security import credential_reason
from tests.policy.helpers import NOW, decide, example_org, ids, read, runtime_patch, trainjob


@pytest.fixture(scope="module")
def org() -> Config:
    return example_org()


def test_q001_message_has_the_numbers_and_the_fix(org: Config) -> None:
    decision = decide(org, read("trainjobs/deny-over-quota.yaml"))
    assert not decision.allowed
    (v,) = decision.violations
    assert (v.rule, v.mode, v.path) == ("MPG-Q001", "enforce", "spec.trainer")
    assert v.message == (
        "asks 32 nvidia.com/gpu (4 nodes × 8 GPUs) but Kueue can admit at most 16 for nlp-team "
        "(a100-eu: nominal 16, no borrowing); it would never admit the job."
    )
    assert (
        v.fix == "Set spec.trainer.numNodes to 2 or fewer, or ask #nlp-admins to raise quotas/nlp-team.yaml."
    )
    assert v.controls == ("SOC2-A1.1",)  # capacity; not access control (issue 19)
    assert decision.message == (
        f"mpigate denied TrainJob nlp-team/llm-pretrain-huge:\n  [MPG-Q001] spec.trainer: {v.message} {v.fix}"
    )
    assert decision.demand is not None and decision.demand.gpus == {"nvidia.com/gpu": 32}


def test_every_violation_is_reported_not_only_the_first(org: Config) -> None:
    job = trainjob(activeDeadlineSeconds=10**6)
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "cv-team"}
    job["spec"]["trainer"]["numNodes"] = 5
    decision = decide(org, job)
    assert ids(decision, denying=True) == {"MPG-Q001", "MPG-Q002", "MPG-Q005", "MPG-LIFE-001", "MPG-LIFE-002"}
    assert decision.message.count("\n  [MPG-") == 5


def test_q002_q003_shapes(org: Config) -> None:
    decision = decide(org, read("trainjobs/deny-gpus-per-pod.yaml"))
    q003 = [v for v in decision.violations if v.rule == "MPG-Q003"]
    assert {v.path for v in q003} == {'spec.trainer.resourcesPerNode.limits["nvidia.com/gpu"]'}
    assert any("requests (8) differ from limits (16)" in v.message for v in q003)
    assert any(
        "16 nvidia.com/gpu per pod, but the largest node of nlp-team's flavors (a100-eu) has 8" in v.message
        for v in q003
    )
    only_requests = trainjob()
    only_requests["spec"]["trainer"]["resourcesPerNode"] = {"requests": {"nvidia.com/gpu": 2}}
    v = next(v for v in decide(org, only_requests).violations if v.rule == "MPG-Q003")
    assert (
        v.path == 'spec.trainer.resourcesPerNode.requests["nvidia.com/gpu"]'
        and "without a limit" in v.message
    )
    fractional = trainjob()
    fractional["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": "500m"}}
    assert any("whole number" in v.message for v in decide(org, fractional).violations)


def test_q004_is_advisory(org: Config) -> None:
    job = trainjob()
    job["spec"]["trainer"]["numProcPerNode"] = 4
    decision = decide(org, job)
    assert decision.allowed
    v = next(v for v in decision.violations if v.rule == "MPG-Q004")
    assert (v.mode, v.path) == ("warn", "spec.trainer.numProcPerNode")
    assert v.message == "4 MPI slots per worker but 8 GPUs per pod: 4 GPUs per pod stay idle."
    assert "[MPG-Q004] 4 MPI slots per worker but 8 GPUs per pod" in decision.warnings


def test_q005_q006_queue_and_priority(org: Config) -> None:
    decision = decide(org, read("trainjobs/deny-other-team-queue.yaml"))
    by_rule = {v.rule: v for v in decision.violations}
    assert set(by_rule) == {"MPG-Q005", "MPG-Q006"}
    assert by_rule["MPG-Q005"].path == 'metadata.labels["kueue.x-k8s.io/queue-name"]'
    assert "cv-team is cv-team's queue" in by_rule["MPG-Q005"].message
    assert (
        by_rule["MPG-Q006"].message
        == "priority class low is not allowed for nlp-team; allowed: standard, urgent."
    )


def test_q007_uses_the_live_count_on_create_only(org: Config) -> None:
    job = trainjob()
    assert "MPG-Q007" in ids(decide(org, job, live=LiveContext(active_jobs=5)), denying=True)
    assert "MPG-Q007" not in ids(decide(org, job, live=LiveContext(active_jobs=4)))
    assert "MPG-Q007" not in ids(decide(org, job))  # no live context: nothing
    stored = decide(org, job).patch
    assert stored  # mutated on create; an UPDATE of the stored job is not counted again
    assert "MPG-Q007" not in ids(
        decide(org, job, operation="UPDATE", old=job, live=LiveContext(active_jobs=9))
    )


def test_q008_says_how_long_the_job_waits(org: Config) -> None:
    job = trainjob()
    job["spec"]["trainer"]["numNodes"] = 1
    live = LiveContext(gpus_in_use={"a100-eu": 15})
    decision = decide(org, job, live=live)
    assert decision.allowed
    v = next(v for v in decision.violations if v.rule == "MPG-Q008")
    assert v.mode == "warn"
    assert v.message == (
        "nlp-team needs 15 more free GPUs of flavor a100-eu: the job asks 16 and 1 is free for it now "
        "(its own quota and what cohort research-pool can lend); borrowing, preemption and queue order "
        "can change this."
    )
    # Preemption as Kueue does it: the example org turns fair sharing on.
    assert "withinClusterQueue: LowerPriority" in v.fix and "over their fair share" in v.fix
    classical = dataclasses.replace(org, kueue=dataclasses.replace(org.kueue, fair_sharing=False))
    v = next(v for v in decide(classical, job, live=live).violations if v.rule == "MPG-Q008")
    assert "borrowWithinCohort: Never" in v.fix and "fair share" not in v.fix
    fits = decide(org, job, live=LiveContext(gpus_in_use={"a100-eu": 0}))
    assert "MPG-Q008" not in ids(fits)
    assert all(len(w) <= WARNING_LIMIT for w in decision.warnings)


def test_res_001_classification_region(org: Config) -> None:
    job = trainjob(namespace="cv-team")
    job["spec"]["trainer"]["image"] = "quay.io/acme/vit:3.2.0"
    job["metadata"]["labels"]["mpigate.io/data-classification"] = "phi"
    decision = decide(org, job)
    v = next(v for v in decision.violations if v.rule == "MPG-RES-001")
    assert v.message == "data classified phi must stay in eu, but cv-team runs in us."
    assert "HIPAA-164.312(e)(1)" in v.controls  # the classification's controls are evidenced too
    assert ids(decision, denying=True) == {"MPG-RES-001", "MPG-LIFE-002"}  # cv-team may not process phi


def test_res_002_and_003(org: Config) -> None:
    decision = decide(org, read("trainjobs/deny-other-region-nodes.yaml"))
    (v,) = decision.violations
    assert v.rule == "MPG-RES-002"
    assert v.path.startswith("spec.runtimePatches[manager=acme.example/nlp-tools]")
    assert v.path.endswith('nodeSelector["topology.kubernetes.io/region"]')
    assert "targets region us" in v.message
    flavor = trainjob(
        runtimePatches=[
            runtime_patch(
                "x.example/t",
                "node",
                {
                    "nodeSelector": {"nvidia.com/gpu.product": "H100-SXM5-80GB"},
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "topology.kubernetes.io/region",
                                                "operator": "In",
                                                "values": ["us-east-1"],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                },
            )
        ]
    )
    messages = [v.message for v in decide(org, flavor).violations if v.rule == "MPG-RES-002"]
    assert any("flavor h100-us in region us" in m for m in messages)
    assert any("node affinity topology.kubernetes.io/region In us-east-1" in m for m in messages)
    data = decide(org, read("trainjobs/deny-wrong-region-data.yaml"))
    assert {v.path for v in data.violations} == {
        "spec.initializer.dataset.storageUri",
        "spec.trainer.env[name=EVAL_DATA]",
    }
    secret_uri = trainjob()
    secret_uri["spec"]["trainer"]["env"] = [
        {"name": "DATA", "value": "s3://AKIAXX:hunter2secret@acme-us-x/y"}
    ]
    text = json.dumps(decide(org, secret_uri).to_dict())
    assert "hunter2secret" not in text and "s3://***@acme-us-x/y" in text


def test_rt_001_runtime_approval(org: Config) -> None:
    (v,) = decide(org, read("trainjobs/deny-unapproved-runtime.yaml")).violations
    assert (v.rule, v.path) == ("MPG-RT-001", "spec.runtimeRef.name")
    assert v.message == "ClusterTrainingRuntime torch-distributed is not an approved runtime."
    other_team = trainjob(runtimeRef={"name": "deepspeed-distributed"})
    assert "approved only for cv-team, not nlp-team" in decide(org, other_team).violations[0].message
    research = trainjob(namespace="research", runtimeRef={"name": "mpi-openmpi-data"})
    assert any(
        "research-team may only use mpi-openmpi-gpu" in v.message for v in decide(org, research).violations
    )


def test_external_runtime_without_manifest_is_denied_unless_the_org_says_warn(org: Config) -> None:
    job = trainjob(namespace="cv-team", runtimeRef={"name": "deepspeed-distributed"})
    job["spec"]["trainer"]["image"] = "quay.io/acme/ds"
    decision = decide(org, job)
    assert "MPG-RT-003" in ids(decision, denying=True)
    (v,) = [v for v in decision.violations if v.rule == "MPG-RT-003"]
    assert v.path == "spec.runtimeRef.name" and "deepspeed-distributed is approved as external" in v.message
    assert "no cluster was asked" in v.message and "--runtime FILE" in v.fix
    # the reason the live lookup gave is named
    live = LiveContext(runtime_reason="ClusterTrainingRuntime deepspeed-distributed not read within 200 ms")
    assert "not read within 200 ms" in decide(org, job, live=live).message
    warn = dataclasses.replace(
        org,
        org=dataclasses.replace(
            org.org,
            enforcement=Enforcement.build("enforce", {**org.org.enforcement.overrides, "MPG-RT-003": "warn"}),
        ),
    )
    decision = decide(warn, job)
    assert decision.allowed
    assert any(
        w.startswith("[MPG-RT-003] runtime deepspeed-distributed could not be read")
        for w in decision.warnings
    )
    assert decision.demand is not None and decision.demand.gpus == {
        "nvidia.com/gpu": 16
    }  # 2 × 8, a lower bound
    # the report's image inventory (PCI DSS 6.3.2) has the trainer image as admitted
    assert [j.images for j in decision.demand.jobs] == [("quay.io/acme/ds",)]
    # the trainer image is still judged (untagged: MPG-IMG-002, a warning in the example org)
    assert ids(decision) == {"MPG-RT-003", "MPG-IMG-002"}


def test_external_runtime_from_the_live_context_is_resolved(org: Config, upstream: Any) -> None:
    import yaml

    manifest = yaml.safe_load((upstream / "trainer" / "runtimes" / "deepspeed_distributed.yaml").read_text())
    live = LiveContext(runtimes={("ClusterTrainingRuntime", None, "deepspeed-distributed"): manifest})
    job = trainjob(namespace="cv-team", runtimeRef={"name": "deepspeed-distributed"})
    job["spec"]["trainer"]["image"] = "quay.io/acme/ds:1.0"
    decision = decide(org, job, live=live)
    assert decision.demand is not None
    assert [(j.name, j.pods) for j in decision.demand.jobs] == [("node", 1), ("launcher", 1)]
    # Trainer's own runtime image comes from ghcr.io (mirrored, but not patchable) and has no tag
    assert "MPG-IMG-001" in ids(decision, denying=True)
    # ... and mpigate injected the restricted defaults the runtime lacks, so Pod Security passes
    assert not [r for r in ids(decision) if r.startswith("MPG-SEC-")]


def test_rt_002_and_runtime_objects(org: Config) -> None:
    decision = decide(org, read("runtimes/deny-root-runtime.yaml"))
    rt = [v for v in decision.violations if v.rule == "MPG-RT-002"]
    assert len(rt) == 1 and "runs as UID 1000, but sshAuthMountPath is /root/.ssh" in rt[0].message
    assert (
        rt[0].path == "spec.template.spec.replicatedJobs[name=launcher].template.spec.template.spec"
        ".securityContext.runAsUser"
    )
    assert decide(org, read("runtimes/mpi-openmpi-team.yaml")).allowed  # unapproved runtimes may exist
    reviewed = read(org.root + "/policies/runtimes/mpi-openmpi-gpu.yaml")
    assert decide(org, reviewed).allowed
    # as stored by the API server, with the CRD defaults filled in, it is still the reviewed runtime
    stored = json.loads(json.dumps(reviewed))
    for job in stored["spec"]["template"]["spec"]["replicatedJobs"]:
        job.update(groupName="default", replicas=1)
    stored["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]["ports"][0]["protocol"] = "TCP"
    assert decide(org, stored).allowed
    tampered = json.loads(json.dumps(reviewed))
    tampered["spec"]["mlPolicy"]["mpi"]["sshAuthMountPath"] = "/root/.ssh"
    drift = decide(org, tampered)
    assert {"MPG-RT-001", "MPG-RT-002"} <= ids(drift, denying=True)
    # Trainer adding a finalizer to a non-compliant runtime is an UPDATE that introduces nothing
    root = read("runtimes/deny-root-runtime.yaml")
    with_finalizer = json.loads(json.dumps(root))
    with_finalizer["metadata"]["finalizers"] = ["trainer.kubeflow.org/resource-in-use"]
    assert decide(org, with_finalizer, operation="UPDATE", old=root).allowed


def test_sec_pss_on_effective_pods_points_at_the_patch(org: Config) -> None:
    decision = decide(org, read("trainjobs/deny-privileged-patch.yaml"))
    assert ids(decision, denying=True) == {
        "MPG-SEC-PRIVILEGED",
        "MPG-SEC-ALLOWPRIVILEGEESCALATION",
        "MPG-SEC-CAPABILITIES-RESTRICTED",
        "MPG-SEC-RESTRICTEDVOLUMES",
        "MPG-SEC-RUNASNONROOT",
        "MPG-SEC-RUNASUSER",
        "MPG-RT-002",
    }
    v = next(v for v in decision.violations if v.rule == "MPG-SEC-RUNASNONROOT")
    assert v.path == (
        "spec.runtimePatches[manager=acme.example/debug].trainingRuntimeSpec.template.spec.replicatedJobs"
        "[name=launcher].template.spec.template.spec.securityContext.runAsNonRoot"
    )
    assert 'violates PodSecurity "restricted:latest" in replicated job launcher (1 pod)' in v.message
    baseline = dataclasses.replace(
        org,
        org=dataclasses.replace(org.org, security=dataclasses.replace(org.org.security, level="baseline")),
    )
    at_baseline = ids(decide(baseline, read("trainjobs/deny-privileged-patch.yaml")), denying=True)
    assert at_baseline == {
        "MPG-SEC-PRIVILEGED",
        "MPG-SEC-CAPABILITIES-BASELINE",
        "MPG-SEC-HOSTPATHVOLUMES",
        "MPG-RT-002",
    }


def test_sec_secrets_never_echoes_values(org: Config) -> None:
    decision = decide(org, read("trainjobs/deny-plaintext-secret.yaml"))
    assert {v.path for v in decision.violations} == {
        "spec.trainer.env[name=AWS_SECRET_ACCESS_KEY]",
        "spec.trainer.env[name=WANDB_API_KEY]",
    }
    text = json.dumps(decision.to_dict())
    assert "wJalrXUtnFEMI" not in text and "0123456789abcdef0123456789abcdef01234567" not in text


@pytest.mark.parametrize(
    ("name", "value", "flagged"),
    [
        ("TOKENIZERS_PARALLELISM", "false", False),
        ("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", True),
        ("DB_PASSWORD", "correct-horse", True),
        ("DB_PASSWORD", "$(FROM_SECRET)", False),
        ("SOMETHING", "AKIAIOSFODNN7EXAMPLE", True),
        ("NCCL_DEBUG", "WARN", False),
        ("BLOB", "q8ZrT1vXw3Ks9LmN2pQ7aB4cD6eF0gH5jR", True),
        ("MODEL_DIR", "/workspace/models/llama-3.1-8b-instruct-finetuned", False),
        ("API_KEY", "short", False),
    ],
)
def test_credential_detection(name: str, value: str, flagged: bool) -> None:
    reason = credential_reason(name, value)
    assert (reason is not None) is flagged
    if reason:
        assert value not in reason


def test_sa_001(org: Config) -> None:
    (v,) = decide(org, read("trainjobs/deny-foreign-service-account.yaml")).violations
    assert v.rule == "MPG-SA-001" and v.message.startswith(
        "service account cv-pipeline is not one of nlp-team's"
    )
    own = trainjob(
        runtimePatches=[runtime_patch("p.example/x", "launcher", {"serviceAccountName": "nlp-pipeline"})]
    )
    # nlp-pipeline is bound to mlops-engineer: its own pipeline may run as it, a data scientist may not
    assert "MPG-SA-001" not in ids(decide(org, own, user="system:serviceaccount:nlp-team:nlp-pipeline"))
    (v,) = [v for v in decide(org, own).violations if v.rule == "MPG-SA-001"]
    assert "bound to nlp-team's mlops-engineer persona; maria@acme.example (data-scientist)" in v.message


def test_img_rules(org: Config) -> None:
    (v,) = decide(org, read("trainjobs/deny-foreign-registry.yaml")).violations
    assert (
        v.rule == "MPG-IMG-001"
        and "registry.acme.internal.evil.com, which is not an allowed registry" in v.message
    )
    decision = decide(org, read("trainjobs/warn-latest-tag.yaml"))
    assert decision.allowed and decision.outcome == "allowed-with-warnings"
    assert decision.warnings == (
        "[MPG-IMG-002] image registry.acme.internal/nlp/llm-train has no tag (which means :latest)",
    )
    phi = read("trainjobs/phi-pinned.yaml")
    phi["spec"]["trainer"]["image"] = "registry.acme.internal/nlp/llm-train:1.4.2"
    v = next(v for v in decide(org, phi).violations if v.rule == "MPG-IMG-002")
    assert "requires images by digest" in v.message and "data classified phi" in v.message


def test_net_rules(org: Config) -> None:
    spoof = trainjob(
        runtimePatches=[runtime_patch("p.example/x", "node", {}, {"labels": {"mpigate.io/team": "cv-team"}})]
    )
    v = next(v for v in decide(org, spoof).violations if v.rule == "MPG-NET-001")
    assert "mpigate.io/team=cv-team" in v.message and v.path.endswith('metadata.labels["mpigate.io/team"]')
    (v,) = decide(org, read("trainjobs/deny-pinned-port-override.yaml")).violations
    assert (v.rule, v.path) == ("MPG-NET-002", "spec.trainer.env[name=OMPI_MCA_btl_tcp_port_min_v4]")


def test_lifecycle_rules(org: Config) -> None:
    decision = decide(org, read("trainjobs/deny-lifecycle.yaml"))
    by_rule = {v.rule: v for v in decision.violations}
    assert by_rule["MPG-LIFE-001"].message == "432000s (120h) exceeds the org's maxRuntime 72h (259200s)."
    assert by_rule["MPG-LIFE-002"].path == 'metadata.labels["mpigate.io/cost-center"]'
    research = trainjob(namespace="research", runtimeRef={"name": "mpi-openmpi-gpu"})
    research["spec"]["trainer"]["numNodes"] = 1
    research["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": 4}}
    missing = decide(org, research)
    assert any(
        v.message == "label mpigate.io/data-classification is required by research-team but missing."
        for v in missing.violations
    )
    research["metadata"]["labels"]["mpigate.io/data-classification"] = "phi"
    assert any(
        "research-team may not process data classified phi" in v.message
        for v in decide(org, research).violations
    )


def test_team_001_and_unmanaged_allow(org: Config) -> None:
    (v,) = decide(org, read("trainjobs/deny-unmanaged-namespace.yaml")).violations
    assert (v.rule, v.path) == ("MPG-TEAM-001", "metadata.namespace")
    allow = dataclasses.replace(org, org=dataclasses.replace(org.org, unmanaged_namespaces="allow"))
    job = trainjob(namespace="sandbox")
    decision = decide(allow, job)
    assert decision.allowed and decision.team is None and decision.violations == ()
    # no team: no queue, region or team label; no security defaults needed; the deadline is org-wide
    assert [p["path"] for p in decision.patch] == ["/spec/activeDeadlineSeconds"]
    job["spec"]["trainer"]["image"] = "registry.example.com/x/y:1"
    assert ids(decide(allow, job), denying=True) == {"MPG-IMG-001"}  # org-wide rules still apply


def test_exceptions_waive_until_they_expire(org: Config) -> None:
    legacy = read("trainjobs/legacy-vendor-image.yaml")
    omar = "omar@acme.example"  # cv-team's mlops-engineer: the exception's match.requestedBy
    decision = decide(org, legacy, user=omar)
    assert decision.allowed
    (v,) = decision.violations
    assert (v.rule, v.waived_by, v.denies) == ("MPG-IMG-001", "cv-team-legacy-image", False)
    (e,) = decision.exceptions
    assert (e.name, e.approver, e.ticket, e.expires) == (
        "cv-team-legacy-image",
        "ciso@acme.example",
        "SEC-1234",
        dt.date(2027, 3, 31),
    )
    assert decision.warnings[0].startswith("[MPG-IMG-001] waived by cv-team-legacy-image until 2027-03-31")
    on_the_day = decide(org, legacy, now=dt.datetime(2027, 3, 31, 23, 59, tzinfo=dt.UTC), user=omar)
    assert on_the_day.allowed
    expired = decide(org, legacy, now=dt.datetime(2027, 4, 1, 0, 1, tzinfo=dt.UTC), user=omar)
    assert not expired.allowed and not expired.exceptions
    renamed = json.loads(json.dumps(legacy))
    renamed["metadata"]["name"] = "detector"
    assert not decide(org, renamed, user=omar).allowed
    # the name is the tenant's to choose: anyone else naming a job legacy-* gets no waiver
    assert not decide(org, legacy, user="sam@acme.example").exceptions


def test_modes_come_from_enforcement(org: Config) -> None:
    audit = dataclasses.replace(
        org, org=dataclasses.replace(org.org, enforcement=Enforcement.build("enforce", {"MPG-Q*": "audit"}))
    )
    decision = decide(audit, read("trainjobs/deny-over-quota.yaml"))
    assert decision.allowed and decision.warnings == ()
    assert [(v.rule, v.mode) for v in decision.violations] == [("MPG-Q001", "audit")]
    warn = dataclasses.replace(
        org, org=dataclasses.replace(org.org, enforcement=Enforcement.build("warn", {}))
    )
    decision = decide(warn, read("trainjobs/deny-lifecycle.yaml"))
    assert decision.allowed and len(decision.warnings) == 2


def test_update_reports_only_what_the_update_introduces(org: Config) -> None:
    created = decide(org, read("trainjobs/minimal.yaml"))
    from mpigate.policy import apply_patch

    stored = apply_patch(read("trainjobs/minimal.yaml"), created.patch)
    # Kueue: suspend + its own runtime patch + a label; all fine.
    kueue = json.loads(json.dumps(stored))
    kueue["spec"]["suspend"] = True
    kueue["spec"]["runtimePatches"].append(
        runtime_patch(
            "kueue.x-k8s.io/manager", "node", {"nodeSelector": {"nvidia.com/gpu.product": "A100-SXM4-80GB"}}
        )
    )
    assert decide(org, kueue, operation="UPDATE", old=stored).allowed
    # a pre-existing violation (the quota was lowered since creation) does not block a label
    # change by someone the org lets change it (team admins, policies/org.yaml) ...
    big = json.loads(json.dumps(stored))
    big["spec"]["trainer"]["numNodes"] = 4
    big["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = 8
    relabelled = json.loads(json.dumps(big))
    relabelled["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent"
    update = decide(org, relabelled, operation="UPDATE", old=big, user="lena@acme.example")
    assert update.allowed and update.patch == ()
    # ... but a data scientist may not re-prioritise, and a bigger job is a new finding
    assert ids(decide(org, relabelled, operation="UPDATE", old=big), denying=True) == {"MPG-LIFE-003"}
    bigger = json.loads(json.dumps(big))
    bigger["spec"]["trainer"]["numNodes"] = 5
    assert "MPG-Q001" in ids(decide(org, bigger, operation="UPDATE", old=big), denying=True)
    # changing mpigate's entry, or moving to another team's queue, is MPG-LIFE-003
    tampered = json.loads(json.dumps(stored))
    tampered["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"].pop()
    # (dropping the launcher's entry also un-pins its pods: MPG-RES-001 and MPG-NET-001 are new too)
    tampered_ids = ids(decide(org, tampered, operation="UPDATE", old=stored), denying=True)
    assert tampered_ids == {"MPG-LIFE-003", "MPG-RES-001", "MPG-NET-001"}
    moved = json.loads(json.dumps(stored))
    moved["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "cv-team"
    assert "MPG-LIFE-003" in ids(decide(org, moved, operation="UPDATE", old=stored), denying=True)
    # a suspended job whose patches gain a privileged container is denied
    worse = json.loads(json.dumps(kueue))
    worse["spec"]["runtimePatches"].append(
        runtime_patch(
            "acme.example/debug",
            "node",
            {"containers": [{"name": "node", "securityContext": {"privileged": True}}]},
        )
    )
    assert "MPG-SEC-PRIVILEGED" in ids(decide(org, worse, operation="UPDATE", old=kueue), denying=True)


def test_delete_is_allowed_and_audited(org: Config) -> None:
    job = read("trainjobs/minimal.yaml")
    decision = decide(org, None, operation="DELETE", old=job)
    assert decision.allowed
    (v,) = decision.violations
    assert (v.rule, v.mode) == ("MPG-LIFE-004", "audit")
    assert v.message == "DELETE of TrainJob nlp-team/minimal by maria@acme.example."
    assert decision.outcome == "allowed" and decision.team == "nlp-team"


def test_malformed_fields_get_clean_violations(org: Config) -> None:
    job = trainjob(activeDeadlineSeconds="1h")
    job["metadata"]["labels"] = ["not", "a", "map"]
    job["spec"]["trainer"]["numNodes"] = "4"
    job["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": "lots"}}
    decision = decide(org, job)
    found = {(v.rule, v.path) for v in decision.violations}
    assert ("MPG-Q002", "spec.trainer.numNodes") in found
    assert ("MPG-Q003", 'spec.trainer.resourcesPerNode.limits["nvidia.com/gpu"]') in found
    assert ("MPG-LIFE-001", "spec.activeDeadlineSeconds") in found
    assert ("MPG-LIFE-002", "metadata.labels") in found
    assert "internal error" not in decision.message


def test_every_example_decision_serialises_and_warnings_fit(org: Config) -> None:
    from tests.policy.helpers import EXAMPLES

    for path in sorted(EXAMPLES.glob("*/*.yaml")):
        decision = decide(org, read(path))
        json.dumps(decision.to_dict())
        assert all(len(w) <= WARNING_LIMIT for w in decision.warnings), path
        assert decision.revision == "test"


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [
        ("trainer.kubeflow.org/v1beta1", "TrainJob"),  # judged as v1alpha1 by explain before
        ("trainer.kubeflow.org/v1", "ClusterTrainingRuntime"),
        ("kubeflow.org/v1", "MPIJob"),  # the old training operator's
        ("v1", "ConfigMap"),  # whatever a widened webhook configuration sends
        (None, "TrainJob"),
    ],
)
def test_what_the_engine_does_not_understand_is_denied_naming_the_api_version(
    org: Config, api_version: str | None, kind: str
) -> None:
    obj: dict[str, Any] = {"kind": kind, "metadata": {"name": "x", "namespace": "nlp-team"}, "spec": {}}
    if api_version is not None:
        obj["apiVersion"] = api_version
    decision = decide(org, obj)
    assert not decision.allowed and decision.rule_ids == ("MPG-API-001",) and decision.patch == ()
    (violation,) = decision.violations
    shown = api_version or "(no apiVersion)"
    assert violation.path == "apiVersion" and f"{kind} {shown}" in violation.message
    assert f"[MPG-API-001] apiVersion: mpigate does not understand {kind} {shown}" in decision.message
    assert decision.team == "nlp-team"
    # the mutating webhook gives no verdict and no patch; the validating one (the same routes) denies
    request = AdmissionInput("CREATE", kind, "nlp-team", "x", obj)
    assert mutations(org, request).allowed and mutations(org, request).patch == ()
    assert judge(org, request, now=NOW).violations == decision.violations
    # deleting one is allowed and recorded
    deleted = decide(org, None, operation="DELETE", old=obj)
    assert deleted.allowed and deleted.rule_ids == ("MPG-LIFE-004",)


def test_an_org_can_admit_what_mpigate_does_not_understand_with_a_warning(org: Config) -> None:
    """MPG-API-001 is a rule like the others: `spec.enforcement.overrides` sets its mode."""
    warn = dataclasses.replace(
        org,
        org=dataclasses.replace(org.org, enforcement=Enforcement.build("enforce", {"MPG-API-001": "warn"})),
    )
    obj = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "MPIJob",
        "metadata": {"name": "x", "namespace": "nlp-team"},
    }
    decision = decide(warn, obj)
    assert decision.allowed and decision.rule_ids == ("MPG-API-001",)
    assert decision.warnings[0].startswith("[MPG-API-001] MPIJob kubeflow.org/v1 is not understood")


def test_demand_lists_the_images_of_each_job_as_admitted(org: Config) -> None:
    decision = decide(org, read("trainjobs/llm-finetune.yaml"))
    assert decision.allowed and decision.demand is not None
    images = {j.name: j.images for j in decision.demand.jobs}
    # every container of every job's effective pod, after mpigate's mirror rewrite
    assert images and all(images.values())
    assert all("@sha256:" in i or ":" in i.rsplit("/", 1)[-1] for found in images.values() for i in found)
    assert decision.demand.to_dict()["jobs"][0]["images"] == list(decision.demand.jobs[0].images)
