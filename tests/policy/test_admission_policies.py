"""The cluster's ValidatingAdmissionPolicies kept in the tree, applied at submission: to the
TrainJob and to each effective pod, with the binding's validationActions, matchResources and
parameters, and `mpigate check` on them (issue 22 item 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mpigate.config import check_tree, load
from mpigate.config.admission import admission_rule_id, selector_matches
from tests.conftest import TODAY
from tests.policy.helpers import decide, org_tree, runtime_patch, smoke_job

# The shape Gatekeeper's library gives k8spsphostnetworkingports as a ValidatingAdmissionPolicy:
# params from a ConfigMap, pods selected by resource rules.
HOST_PORTS = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: host-ports
  annotations: {mpigate.io/controls: "CC6.1"}
spec:
  failurePolicy: Fail
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: [v1]
        operations: [CREATE, UPDATE]
        resources: [pods]
  matchConditions:
    - name: not-exempt
      expression: "!('acme.example/exempt' in object.metadata.?labels.orValue({}))"
  variables:
    - name: ports
      expression: >-
        object.spec.containers.map(c, c.?ports.orValue([])).flatten()
        .filter(p, has(p.hostPort)).map(p, p.hostPort)
  validations:
    - expression: >-
        variables.ports.all(p, p >= int(params.data.min) && p <= int(params.data.max))
      messageExpression: "'hostPort outside ' + params.data.min + '-' + params.data.max"
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: host-ports-all}
spec:
  policyName: host-ports
  validationActions: [Deny]
  paramRef: {name: host-port-range, namespace: mpigate-params, parameterNotFoundAction: Deny}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: host-port-range, namespace: mpigate-params}
data: {min: "40000", max: "41000"}
"""

OWNER_ON_TRAINJOBS = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: owner}
spec:
  matchConstraints:
    resourceRules:
      - apiGroups: [trainer.kubeflow.org]
        apiVersions: ["*"]
        operations: [CREATE]
        resources: [trainjobs]
  validations:
    - expression: "'acme.example/owner' in object.metadata.?labels.orValue({})"
      message: every TrainJob names its owner
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: owner-binding}
spec:
  policyName: owner
  validationActions: [ACTIONS]
"""


def _host_port_patch(metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """A runtime patch giving the node container a hostPort (and the pods ``metadata``)."""
    container = {"name": "node", "ports": [{"containerPort": 8080, "hostPort": 8080}]}
    return runtime_patch("acme.example/ports", "node", {"containers": [container]}, metadata)


def _tree(tmp_path: Path, text: str, folder: str = "policies/admission") -> Path:
    return org_tree(tmp_path / "org", {f"{folder}/vap.yaml": text})


def _job(patch: bool = False, **labels: str) -> dict[str, Any]:
    return smoke_job(*([_host_port_patch()] if patch else []), **labels)


RULE = admission_rule_id("host-ports", "host-ports-all")


def _found(decision: Any, rule: str = RULE) -> list[Any]:
    return [v for v in decision.violations if v.rule == rule]


def test_a_pod_policy_denies_the_trainjob_at_submission(tmp_path: Path) -> None:
    config = load(_tree(tmp_path, HOST_PORTS), today=TODAY)
    assert decide(config, _job()).allowed
    decision = decide(config, _job(patch=True))
    assert not decision.allowed
    (violation,) = _found(decision)  # once: the container that sets it, not every volume of the pod
    assert RULE == "VAP-HOST-PORTS--HOST-PORTS-ALL"
    assert violation.message == (
        "ValidatingAdmissionPolicy 'host-ports' with binding 'host-ports-all': hostPort outside 40000-41000"
    )
    assert violation.mode == "enforce"
    assert violation.controls == ("CC6.1",)
    # reported at the runtime patch's container that set the port
    assert "runtimePatches[manager=acme.example/ports]" in violation.path


def test_the_param_object_decides(tmp_path: Path) -> None:
    config = load(_tree(tmp_path, HOST_PORTS.replace('min: "40000"', 'min: "8000"')), today=TODAY)
    assert not _found(decide(config, _job(patch=True)))


def test_match_conditions_exempt(tmp_path: Path) -> None:
    config = load(_tree(tmp_path, HOST_PORTS), today=TODAY)
    assert _found(decide(config, _job(patch=True)))
    exempt = smoke_job(_host_port_patch({"labels": {"acme.example/exempt": "yes"}}))
    assert not _found(decide(config, exempt))


@pytest.mark.parametrize(
    ("selector", "applies"),
    [
        ("namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: research}}", True),
        ("namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: other}}", False),
        # the labels render gives the team's namespaces (issue 22 item 3: not only the name)
        ("namespaceSelector: {matchLabels: {mpigate.io/team: research-team}}", True),
        ("namespaceSelector: {matchLabels: {mpigate.io/team: nlp-team}}", False),
        ("namespaceSelector: {matchLabels: {pod-security.kubernetes.io/enforce: restricted}}", True),
        (
            "namespaceSelector: {matchExpressions: [{key: pod-security.kubernetes.io/enforce, "
            "operator: NotIn, values: [restricted]}]}",
            False,
        ),
        ("objectSelector: {matchExpressions: [{key: acme.example/exempt, operator: DoesNotExist}]}", True),
        ("objectSelector: {matchLabels: {tier: gold}}", False),
    ],
)
def test_the_bindings_match_resources_select(tmp_path: Path, selector: str, applies: bool) -> None:
    text = HOST_PORTS.replace(
        "  validationActions: [Deny]\n", f"  validationActions: [Deny]\n  matchResources:\n    {selector}\n"
    )
    job = _job(patch=True)
    config = load(_tree(tmp_path, text), today=TODAY)
    assert job["metadata"]["namespace"] == "research"
    assert bool(_found(decide(config, job))) is applies


@pytest.mark.parametrize(
    ("actions", "allowed", "mode"),
    [
        ("Deny", False, "enforce"),
        ("Warn", True, "warn"),
        ("Audit", True, "audit"),
        ("Warn, Audit", True, "warn"),
    ],
)
def test_validation_actions(tmp_path: Path, actions: str, allowed: bool, mode: str) -> None:
    config = load(_tree(tmp_path, OWNER_ON_TRAINJOBS.replace("ACTIONS", actions)), today=TODAY)
    rule = admission_rule_id("owner", "owner-binding")
    decision = decide(config, _job())
    assert decision.allowed is allowed
    (violation,) = [v for v in decision.violations if v.rule == rule]
    assert violation.mode == mode
    assert violation.message.endswith("every TrainJob names its owner")
    assert any(rule in w for w in decision.warnings) is (mode == "warn")
    assert decide(config, _job(**{"acme.example/owner": "maria"})).allowed


def test_missing_params_deny_or_allow(tmp_path: Path) -> None:
    missing = HOST_PORTS.replace("paramRef: {name: host-port-range", "paramRef: {name: nope")
    result = check_tree(_tree(tmp_path, missing), today=TODAY)
    assert any(p.code == "vap.params-missing" for p in result.warnings)
    decision = decide(load(_tree(tmp_path / "a", missing), today=TODAY), _job())
    (violation,) = _found(decision)
    assert "no params found" in violation.message
    assert not decision.allowed
    allow = missing.replace("parameterNotFoundAction: Deny", "parameterNotFoundAction: Allow")
    assert not _found(decide(load(_tree(tmp_path / "b", allow), today=TODAY), _job(patch=True)))


def test_namespaced_params_follow_the_request_namespace(tmp_path: Path) -> None:
    text = HOST_PORTS.replace(", namespace: mpigate-params, parameterNotFoundAction: Deny", "").replace(
        "namespace: mpigate-params}", "namespace: research}"
    )
    config = load(_tree(tmp_path, text), today=TODAY)
    assert "hostPort outside" in _found(decide(config, _job(patch=True)))[0].message
    elsewhere = text.replace("namespace: research}", "namespace: nlp-team}")
    decision = decide(load(_tree(tmp_path / "x", elsewhere), today=TODAY), _job())
    assert "no params found" in _found(decision)[0].message


def test_check_locates_compile_errors_and_refuses_bad_bindings(tmp_path: Path) -> None:
    broken = HOST_PORTS.replace("p <= int(params.data.max))", "p <= int(params.data.max) +)")
    result = check_tree(_tree(tmp_path, broken), today=TODAY)
    (problem,) = [p for p in result.errors if p.code == "cel.compile"]
    text = (tmp_path / "org" / "policies" / "admission" / "vap.yaml").read_text().splitlines()
    assert "+)" in text[problem.location.line - 1]
    assert text[problem.location.line - 1][problem.location.column - 1] == ")"
    bad = HOST_PORTS.replace("policyName: host-ports", "policyName: host-port").replace(
        "validationActions: [Deny]", "validationActions: [Deny, Warn]"
    )
    codes = {p.code for p in check_tree(_tree(tmp_path / "b", bad), today=TODAY).errors}
    assert "ref.vap" in codes
    both = HOST_PORTS.replace("validationActions: [Deny]", "validationActions: [Deny, Warn]")
    assert "vap.actions" in {p.code for p in check_tree(_tree(tmp_path / "c", both), today=TODAY).errors}
    authorizer = HOST_PORTS.replace(
        "variables.ports.all(",
        "authorizer.group('').resource('pods').check('create').allowed() && variables.ports.all(",
    )
    assert "cel.compile" in {
        p.code for p in check_tree(_tree(tmp_path / "d", authorizer), today=TODAY).errors
    }


def test_params_are_kept_by_the_policies_owners(tmp_path: Path) -> None:
    policy, binding, config_map = HOST_PORTS.split("---\n")
    root = _tree(tmp_path, policy + "---\n" + binding)
    (root / "quotas" / "ports.yaml").write_text(config_map, encoding="utf-8")
    errors = check_tree(root, today=TODAY).errors
    assert any(p.code == "ownership.folder" and p.location.file == "quotas/ports.yaml" for p in errors), (
        errors
    )


def test_a_policy_outside_the_policies_folder_is_refused(tmp_path: Path) -> None:
    errors = check_tree(_tree(tmp_path, HOST_PORTS, folder="quotas/admission"), today=TODAY).errors
    assert any(p.code == "ownership.folder" and "ValidatingAdmissionPolicy" in p.message for p in errors)


def test_an_override_may_name_a_policys_bindings_by_prefix(tmp_path: Path) -> None:
    root = _tree(tmp_path, HOST_PORTS)
    org = root / "policies" / "org.yaml"
    data = yaml.safe_load(org.read_text())
    data["spec"].setdefault("enforcement", {}).setdefault("overrides", {})["VAP-HOST-PORTS"] = "warn"
    org.write_text(yaml.safe_dump(data))
    decision = decide(load(root, today=TODAY), _job(patch=True))
    assert _found(decision)[0].mode == "warn"
    assert any(w.startswith(f"[{RULE}]") for w in decision.warnings), decision.warnings


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        (None, {}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ],
)
def test_label_selectors(selector: Any, labels: dict[str, str], expected: bool) -> None:
    assert selector_matches(selector, labels) is expected


def test_the_webhooks_config_bundle_keeps_policies_bindings_and_params(tmp_path: Path) -> None:
    from mpigate.render.bundle import collect_bundle

    root = _tree(tmp_path, HOST_PORTS)
    (root / "policies" / "admission" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n"
    )
    config = load(root, today=TODAY)
    bundle = collect_bundle(config)
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for key, text in bundle.files.items():
        (mounted / key).write_text(text, encoding="utf-8")
    assert "kind: Secret" not in bundle.files["policies__admission__vap.yaml"] + bundle.files.get(
        "policies__admission__notes.yaml", ""
    )
    again = load(mounted, today=TODAY)
    assert [r.id for r in again.custom_rules] == [RULE]
    assert not decide(again, _job(patch=True)).allowed
    assert _found(decide(again, _job(patch=True)))


AUDITED = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: images}
spec:
  failurePolicy: FAILURE
  matchConstraints:
    resourceRules:
      - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  auditAnnotations:
    - key: image
      valueExpression: |-
        VALUE
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: images-all}
spec:
  policyName: images
  validationActions: [Deny]
"""


def _audited(tmp_path: Path, value: str, failure: str = "Fail") -> Any:
    text = AUDITED.replace("VALUE", value).replace("FAILURE", failure)
    root = _tree(tmp_path, text)
    result = check_tree(root, today=TODAY)
    assert result.ok, result.errors
    return decide(load(root, today=TODAY), _job())


def test_audit_annotations_are_written_into_the_decision_and_its_audit_record(tmp_path: Path) -> None:
    """dispatcher.go: each pod's value under "<policy>/<key>", distinct values joined with ", "."""
    from mpigate.audit.records import record_from_decision
    from mpigate.policy import AdmissionInput, UserInfo

    decision = _audited(tmp_path, "object.spec.containers[0].image")
    annotations = dict(decision.audit_annotations)
    images = set(annotations["images/image"].split(", "))
    assert "registry.acme.internal/research/mpi-bench:2.0.1" in images and len(images) == 2, images
    assert decision.allowed and decision.to_dict()["auditAnnotations"] == annotations
    job = _job()
    request = AdmissionInput("CREATE", "TrainJob", "research", "cpu-smoke", job, user=UserInfo("maria"))
    assert record_from_decision(decision, request)["auditAnnotations"] == annotations


@pytest.mark.parametrize(
    ("value", "failure", "allowed", "annotated"),
    [
        ("null", "Fail", True, False),  # null and "" publish nothing
        ("'  '", "Fail", True, False),
        ("1", "Fail", False, False),  # neither string nor null: an error that denies
        ("object.spec.missing", "Fail", False, False),  # an error: failurePolicy Fail denies
        ("object.spec.missing", "Ignore", True, False),  # Ignore leaves the annotation out
    ],
)
def test_audit_annotation_values_and_errors(
    tmp_path: Path, value: str, failure: str, allowed: bool, annotated: bool
) -> None:
    decision = _audited(tmp_path, value, failure)
    assert decision.allowed is allowed
    assert bool(decision.audit_annotations) is annotated
    assert "auditAnnotations" not in decision.to_dict()


def test_a_policy_with_only_audit_annotations_is_accepted(tmp_path: Path) -> None:
    result = check_tree(
        _tree(tmp_path, AUDITED.replace("VALUE", "'x'").replace("FAILURE", "Fail")), today=TODAY
    )
    assert result.ok, result.errors
    assert not [p for p in result.warnings if "auditAnnotations" in p.message]
