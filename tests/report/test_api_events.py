"""The API server's security-relevant events outside mpigate's judgement, from real public logs
(Falco's k8s_audit and PSP traces, audit2rbac's sample: tests/fixtures/report/public, with their
provenance) and from events built after the Kubernetes audit documentation."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mpigate.config import load
from mpigate.report import K8sAuditReader, config_context

from .conftest import FIXTURES

Report = dict[str, Any]
PUBLIC = FIXTURES / "public"
FALCO = PUBLIC / "falco-k8s_audit.jsonl"
PSP = PUBLIC / "falco-psp.jsonl"
AUDIT2RBAC = PUBLIC / "audit2rbac-demo.log"
REPO = Path(__file__).resolve().parents[2]
# The traces are from 2017-2020; Falco's pods are in "default", taken here as a team namespace.
PERIOD = {"since": "2017-01-01", "until": "2021-01-01"}


def context(level: str | None = None) -> dict[str, Any]:
    """The example org's config as --config gives it, with "default" a team namespace and, when
    given, another Pod Security level."""
    found = config_context(load(REPO))
    found["namespace_teams"] = {**found["namespace_teams"], "default": "nlp-team"}
    if level is not None:
        found["config_policy"] = {
            **found["config_policy"],
            "podSecurity": {"level": level, "version": "latest"},
        }
    return found


def category(report: Report, name: str) -> dict[str, Any]:
    return next(c for c in report["apiServerEvents"]["categories"] if c["category"] == name)


def examples(report: Report, name: str) -> dict[int, dict[str, Any]]:
    """A category's examples by source line (file name:line)."""
    return {e["source"].rsplit("/", 1)[-1]: e for e in category(report, name)["examples"]}


@pytest.fixture(scope="module")
def public(make_report: Callable[..., Report]) -> Report:
    return make_report(k8s=[FALCO, PSP, AUDIT2RBAC], **PERIOD, **context("baseline"))


def test_every_event_is_read_used_or_not_used_for_a_reason(public: Report) -> None:
    counts = public["apiServerEvents"]["counts"]
    # 121 lines: one is Falco's FAL-01-003 fixture ({"kind": 0}), not an event
    assert (counts["read"], counts["malformed"]) == (120, 1)
    not_used = {x["reason"]: x["events"] for x in counts["notUsed"]}
    assert counts["read"] == counts["used"] + sum(not_used.values())
    # configmaps, services, serviceaccounts, namespaces by an authenticated user; a node's pod read
    assert not_used == {
        "write of a resource without security relevance": 21,
        "read of a resource without security relevance (get, list, watch)": 1,
    }


def test_authorizer_refusals_come_from_the_response_status(public: Report) -> None:
    # audit2rbac's 11 refusals carry no authorization annotation (2017): 403 + the authorizer's text
    refused = category(public, "k8s-rbac-denied")
    assert (refused["requests"], refused["refused"], refused["finding"]) == (11, 11, 0)
    assert public["rbacDenials"]["total"] == 11
    rows: dict[tuple[str, str, str], int] = {}
    for x in public["rbacDenials"]["byActor"]:
        key = (x["actor"], x["verb"], x["resource"])
        rows[key] = rows.get(key, 0) + x["count"]
    assert rows[("bob", "list", "pods")] == 3  # twice in default, once in ns1
    assert rows[("system:serviceaccount:ns1:sa1", "list", "nodes")] == 1
    assert "cannot list secrets" in examples(public, "k8s-rbac-denied")["audit2rbac-demo.log:37"]["reason"]


def test_impersonation_is_counted_with_both_identities(public: Report) -> None:
    impersonated = category(public, "k8s-impersonation")
    # all 37 of audit2rbac's requests: system:admin acting as bob, alice or a service account
    assert (impersonated["requests"], impersonated["finding"], impersonated["refused"]) == (37, 26, 11)
    example = examples(public, "k8s-impersonation")["audit2rbac-demo.log:33"]
    assert (example["actor"], example["via"], example["reason"]) == (
        "bob",
        "system:admin",
        "system:admin acted as bob",
    )


def test_exec_and_attach_count_once_when_the_connection_is_upgraded(public: Report) -> None:
    execs = examples(public, "k8s-exec")
    assert set(execs) == {"falco-k8s_audit.jsonl:3", "falco-k8s_audit.jsonl:48"}
    assert execs["falco-k8s_audit.jsonl:48"]["resource"] == "pods/exec"
    assert execs["falco-k8s_audit.jsonl:3"]["reason"].startswith("attach into pod default/nginx-deployment")


def test_rbac_writes_that_need_attention(public: Report) -> None:
    writes = category(public, "k8s-rbac-write")
    assert (writes["requests"], writes["finding"]) == (11, 9)
    found = examples(public, "k8s-rbac-write")
    assert "binds cluster-admin" in found["falco-k8s_audit.jsonl:2"]["reason"]
    assert "wildcard resources" in found["falco-k8s_audit.jsonl:5"]["reason"]
    assert "wildcard verbs" in found["falco-k8s_audit.jsonl:6"]["reason"]
    assert found["falco-k8s_audit.jsonl:39"]["reason"] == (
        "delete of the API server's own clusterrole system:kube-aggregator"
    )
    assert found["falco-k8s_audit.jsonl:51"]["verb"] == "patch"  # system:node-problem-detector


def test_secret_access_by_people_and_in_kube_system(public: Report) -> None:
    secrets = category(public, "k8s-secret")
    # a person creates a bootstrap token in kube-system, creates and deletes one in default; the
    # controller manager's token secret is its job; alice's list was refused
    assert (secrets["finding"], secrets["recorded"], secrets["refused"]) == (3, 1, 1)
    found = examples(public, "k8s-secret")
    assert found["falco-k8s_audit.jsonl:19"]["reason"] == (
        "create of secret kube-system/bootstrap-token-ne7bxu by a person"
    )


def test_anonymous_writes(public: Report) -> None:
    anonymous = examples(public, "k8s-anonymous")
    assert anonymous["falco-k8s_audit.jsonl:1"]["reason"] == "unauthenticated create of namespaces"
    assert anonymous["falco-k8s_audit.jsonl:1"]["actor"] == "system:anonymous"


def test_pods_are_judged_with_the_webhook_engine_at_the_level_in_force(
    make_report: Callable[..., Report], public: Report
) -> None:
    workloads = category(public, "k8s-workload")
    # baseline: of the 32 PSP pods, the added capabilities (2), host IPC/network/PID (4), hostPath,
    # privileged and the unmasked /proc fail; of Falco's 8 pods and 1 Deployment (extensions/v1beta1)
    # the privileged and host-network ones; kube-system and kube-public are no team's namespaces
    assert (workloads["requests"], workloads["notEvaluated"]) == (43, 2)
    by_line = examples(make_report(k8s=[PSP], **PERIOD, **context("baseline")), "k8s-workload")
    assert by_line["falco-psp.jsonl:12"]["reason"].startswith(
        'violates PodSecurity "baseline:latest": privileged'
    )
    assert "host namespaces" in by_line["falco-psp.jsonl:7"]["reason"]
    assert "hostPath volumes" in by_line["falco-psp.jsonl:10"]["reason"]
    assert by_line["falco-psp.jsonl:22"]["outcome"] == "passed"  # runAsUser 0 is restricted's
    restricted = make_report(k8s=[PSP], **PERIOD, **context("restricted"))
    assert category(restricted, "k8s-workload")["finding"] == 32  # nginx as it comes fails restricted
    assert examples(restricted, "k8s-workload")["falco-psp.jsonl:22"]["outcome"] == "finding"
    psp = make_report(k8s=[PSP], **PERIOD, **context("baseline"))
    assert category(psp, "k8s-workload")["finding"] == 9
    levels = psp["apiServerEvents"]["podSecurityLevels"]
    assert [(x["level"], x["requests"]) for x in levels] == [("baseline", 32)]


def test_each_category_moves_its_controls_to_attention(public: Report) -> None:
    controls = {c["fullId"]: c for f in public["controls"] for c in f["controls"]}
    cc61 = " ".join(controls["SOC2-CC6.1"]["reasons"])
    for expected in ("writes by unauthenticated", "impersonation", "exec, attach", "access to secrets"):
        assert expected in cc61, expected
    assert any("pods and workloads" in r for r in controls["SOC2-CC6.8"]["reasons"])
    assert any("rbac roles and bindings" in r for r in controls["PCI-DSS-7.2.2"]["reasons"])
    assert any("unauthenticated" in r for r in controls["HIPAA-164.312(d)"]["reasons"])
    for control in (
        "SOC2-CC6.1",
        "SOC2-CC6.3",
        "SOC2-CC6.8",
        "SOC2-CC7.2",
        "PCI-DSS-2.2.1",
        "HIPAA-164.312(a)(1)",
    ):
        assert controls[control]["status"] == "attention", control


def test_logs_outside_the_period_are_flagged_and_their_events_not_counted(
    make_report: Callable[..., Report],
) -> None:
    # the scenario's records are from November 2026; the traces from 2017-2020
    report = make_report(k8s=[FALCO, AUDIT2RBAC], **context())
    logs = {Path(log["file"]).name: log for log in report["completeness"]["apiServer"]["logs"]}
    assert logs["falco-k8s_audit.jsonl"]["outsidePeriod"] and logs["audit2rbac-demo.log"]["outsidePeriod"]
    assert report["apiServerEvents"]["findings"] == 0
    outside = {
        (x["category"], x["reason"]): x["events"] for x in report["apiServerEvents"]["counts"]["notEvaluated"]
    }
    assert outside[("k8s-impersonation", "outside the period")] == 37
    # a log with no event in the period is no source for it: its controls are not evaluated
    cc63 = next(c for f in report["controls"] for c in f["controls"] if c["fullId"] == "SOC2-CC6.3")
    assert any("hold no event in the period" in x for x in cc63["notEvaluated"])
    # next to a log that covers the period, they are flagged for attention
    both = make_report(k8s=[FIXTURES / "k8s-audit.jsonl", AUDIT2RBAC], **context())
    shared = both["crossCuttingReasons"]["apiServerLog"]
    assert "1 API-server log(s) lie outside the period: audit2rbac-demo.log" in shared


# ---------------------------------------------------------------------- events after the docs


def event(verb: str, resource: str, namespace: str | None = "nlp-team", **fields: Any) -> dict[str, Any]:
    """An audit.k8s.io/v1 Event as the log backend writes it (k8s.io/apiserver
    pkg/apis/audit/v1/types.go Event), at RequestResponse level unless fields say otherwise."""
    ref: dict[str, Any] = {"resource": resource, "apiVersion": "v1"}
    if namespace:
        ref["namespace"] = namespace
    ref.update(fields.pop("ref", {}))
    out = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "RequestResponse",
        "auditID": fields.pop("audit_id", "0b1c2d3e-0000-4000-8000-000000000001"),
        "stage": fields.pop("stage", "ResponseComplete"),
        "requestURI": f"/api/v1/namespaces/{namespace}/{resource}",
        "verb": verb,
        "user": fields.pop("user", {"username": "maria", "groups": ["system:authenticated"]}),
        "sourceIPs": ["10.0.0.7"],
        "userAgent": "kubectl/v1.33.1",
        "objectRef": ref,
        "responseStatus": fields.pop("status", {"metadata": {}, "code": 201}),
        "requestReceivedTimestamp": fields.pop("time", "2026-11-21T10:00:00.000000Z"),
        "stageTimestamp": "2026-11-21T10:00:00.100000Z",
        "annotations": fields.pop("annotations", {"authorization.k8s.io/decision": "allow"}),
    }
    out.update(fields)
    return out


def pod(privileged: bool = False) -> dict[str, Any]:
    security = {"privileged": True} if privileged else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": security}]},
    }


def write_log(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def test_events_after_the_documentation(make_report: Callable[..., Report], tmp_path: Path) -> None:
    forbid = {"authorization.k8s.io/decision": "forbid", "authorization.k8s.io/reason": ""}
    webhook_denied = {"metadata": {}, "code": 403, "message": 'admission webhook "x" denied the request'}
    log = write_log(
        tmp_path / "audit.log",
        [
            # a privileged pod created directly in a team namespace, and the same at Metadata level
            event("create", "pods", requestObject=pod(privileged=True)),
            event("create", "pods", level="Metadata"),
            # a patch holds the patch, not the pod
            event("patch", "pods", requestObject={"metadata": {"labels": {"a": "b"}}}),
            # an ephemeral container added with privileged
            event("update", "pods", ref={"subresource": "ephemeralcontainers"}, requestObject=pod(True)),
            # a JobSet (as Trainer creates them) with a privileged template
            event(
                "create",
                "jobsets",
                ref={"apiGroup": "jobset.x-k8s.io"},
                requestObject={"spec": {"replicatedJobs": [{"template": {"spec": {"template": pod(True)}}}]}},
            ),
            # exec: ResponseStarted counts, its ResponseComplete (101) does not; a refused exec counts
            event(
                "create",
                "pods",
                stage="ResponseStarted",
                ref={"subresource": "exec", "name": "p"},
                status={"code": 101},
            ),
            event("create", "pods", ref={"subresource": "exec", "name": "p"}, status={"code": 101}),
            event(
                "create",
                "pods",
                ref={"subresource": "exec", "name": "q"},
                annotations=forbid,
                status={"metadata": {}, "code": 403},
            ),
            # RequestReceived of the first request: not a second request
            event("create", "pods", stage="RequestReceived", requestObject=pod(True)),
            # refused by an admission webhook: not an authorizer refusal
            event("create", "pods", requestObject=pod(True), status=webhook_denied),
            # outside the period
            event("create", "pods", requestObject=pod(True), time="2025-01-01T00:00:00.000000Z"),
        ],
    )
    report = make_report(k8s=[log], since="2026-11-20", until="2026-11-23", **context())
    workloads = category(report, "k8s-workload")
    assert (workloads["finding"], workloads["notEvaluated"], workloads["refused"]) == (3, 2, 1)
    by_reason = {
        (x["category"], x["reason"]): x["events"] for x in report["apiServerEvents"]["counts"]["notEvaluated"]
    }
    assert by_reason[("k8s-workload", "no requestObject (the audit policy logs this at Metadata level)")] == 1
    assert by_reason[("k8s-workload", "a patch (the log holds the patch, not the object)")] == 1
    assert by_reason[("k8s-workload", "outside the period")] == 1
    jobset = next(e for e in category(report, "k8s-workload")["examples"] if e["resource"] == "jobsets")
    assert "spec.replicatedJobs[0].template.spec.template: privileged" in jobset["reason"]
    execs = category(report, "k8s-exec")
    assert (execs["requests"], execs["finding"], execs["refused"]) == (2, 1, 1)
    assert category(report, "k8s-rbac-denied")["requests"] == 1  # the refused exec, not the webhook's 403
    stats = report["inputs"]["k8sAudit"][0]
    assert stats["otherStages"] == 2  # the RequestReceived and the exec's ResponseComplete
    first = category(report, "k8s-workload")["examples"][0]
    assert (first["sourceIP"], first["userAgent"], first["auditID"]) == (
        "10.0.0.7",
        "kubectl/v1.33.1",
        "0b1c2d3e-0000-4000-8000-000000000001",
    )


def test_reader_keeps_request_objects_only_for_what_it_judges(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "a.log",
        [
            event("create", "pods", requestObject=pod()),
            event("create", "configmaps", requestObject={"data": {"k": "v"}}),
            event(
                "delete",
                "clusterroles",
                namespace=None,
                ref={"apiGroup": "rbac.authorization.k8s.io", "name": "system:x"},
                requestObject={"kind": "DeleteOptions"},
            ),
        ],
    )
    reader = K8sAuditReader(log)
    events = list(reader)
    assert [e.categories for e in events] == [("k8s-workload",), ("k8s-rbac-write",)]
    assert events[0].obj is not None and events[1].obj is None  # a delete's body is DeleteOptions
    assert reader.stats.skipped == {"write of a resource without security relevance": 1}
    assert reader.stats.sha256 == __import__("hashlib").sha256(log.read_bytes()).hexdigest()


def test_a_level_no_pod_security_release_knows_is_not_evaluated(
    make_report: Callable[..., Report], tmp_path: Path
) -> None:
    found = context()
    found["config_policy"] = {
        **found["config_policy"],
        "podSecurity": {"level": "paranoid", "version": "v0.9"},
    }
    # before the chains' first config record, --config's level applies
    early = "2026-11-20T08:00:00.000000Z"
    log = write_log(
        tmp_path / "a.log", [event("create", "pods", requestObject=pod(privileged=True), time=early)]
    )
    report = make_report(k8s=[log], since="2026-11-20", until="2026-11-23", **found)
    [reason] = [x["reason"] for x in report["apiServerEvents"]["counts"]["notEvaluated"] if x["category"]]
    assert reason.startswith("the Pod Security level in force cannot be used: invalid Pod Security level")


def test_mpijob_writes_are_mpigate_s_to_judge(make_report: Callable[..., Report], tmp_path: Path) -> None:
    # issue 16 routes kubeflow.org MPIJobs through the webhooks: a write without a decision bypassed them
    log = write_log(
        tmp_path / "a.log",
        [event("create", "mpijobs", ref={"apiGroup": "kubeflow.org", "name": "mpi-1"}, requestObject={})],
    )
    report = make_report(k8s=[log], since="2026-11-20", until="2026-11-23", **context())
    api = report["activity"]["apiServer"]
    assert (api["writes"], api["unjudgedWrites"]) == (1, 1)
    assert api["unjudgedExamples"][0]["kind"] == "MPIJob"
