"""AdmissionReview v1 decoding and encoding (pure)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpigate.admission.client import make_review
from mpigate.admission.review import (
    MAX_WARNING_CHARS,
    BadReview,
    ReviewRequest,
    audit_annotations,
    decision_response,
    decode_review,
    encode_json,
    fit_warnings,
    parse_json,
)
from mpigate.policy.decision import Decision, UserInfo, Violation

from .conftest import trainjob


def review(**changes: Any) -> dict[str, Any]:
    data = make_review(trainjob(), uid="u-1", user=UserInfo("maria", ("nlp",)))
    data["request"].update(changes)
    return data


def test_decodes_a_create_review_into_an_admission_input() -> None:
    decoded = decode_review(review())
    assert isinstance(decoded, ReviewRequest)
    inp = decoded.input
    assert (inp.operation, inp.kind, inp.namespace, inp.name, inp.uid) == (
        "CREATE",
        "TrainJob",
        "alpha",
        "smoke",
        "u-1",
    )
    assert inp.user == UserInfo("maria", ("nlp",))
    assert inp.obj is not None and inp.obj["spec"]["trainer"]["numNodes"] == 1
    assert inp.old_obj is None and inp.dry_run is False


def test_delete_has_no_object_and_cluster_runtimes_no_namespace() -> None:
    old = trainjob()
    data = make_review(None, operation="DELETE", old=old, uid="u-2")
    decoded = decode_review(data)
    assert isinstance(decoded, ReviewRequest)
    assert decoded.input.obj is None and decoded.input.old_obj is not None and decoded.input.name == "smoke"
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "rt"},
        "spec": {},
    }
    decoded = decode_review(make_review(runtime, uid="u-3"))
    assert isinstance(decoded, ReviewRequest)
    assert decoded.input.namespace is None and decoded.resource.resource == "clustertrainingruntimes"


@pytest.mark.parametrize(
    ("group", "version", "resource", "kind", "namespace"),
    [
        ("trainer.kubeflow.org", "v1beta1", "trainjobs", "TrainJob", "alpha"),
        ("kubeflow.org", "v1", "mpijobs", "MPIJob", "alpha"),
        ("", "v1", "pods", "Pod", "alpha"),
        ("trainer.kubeflow.org", "v1", "clustertrainingruntimes", "ClusterTrainingRuntime", ""),
    ],
)
def test_an_object_mpigate_does_not_understand_is_decoded_for_the_engine_to_answer(
    group: str, version: str, resource: str, kind: str, namespace: str
) -> None:
    """Not a 400 that no OrgPolicy could configure: the engine answers it (MPG-API-001), as explain
    and review do."""
    data = review()
    api_version = f"{group}/{version}" if group else version
    data["request"].update(
        kind={"group": group, "version": version, "kind": kind},
        resource={"group": group, "version": version, "resource": resource},
        namespace=namespace,
    )
    data["request"]["object"].update(apiVersion=api_version, kind=kind)
    decoded = decode_review(data)
    assert isinstance(decoded, ReviewRequest)
    assert decoded.input.kind == kind and decoded.resource.api_version == api_version
    assert decoded.input.obj is not None and decoded.input.obj["apiVersion"] == api_version
    assert decoded.input.namespace == (namespace or None)
    # the object must still be the one the request says it is
    data["request"]["object"].update(kind="Secret")
    bad = decode_review(data)
    assert isinstance(bad, BadReview) and bad.path == "request.object"


def test_generate_name_is_used_when_the_name_is_not_assigned_yet() -> None:
    obj = trainjob()
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = "sweep-"
    decoded = decode_review(make_review(obj, uid="u"))
    assert isinstance(decoded, ReviewRequest) and decoded.input.name == "sweep-"


@pytest.mark.parametrize(
    ("mutate", "path", "fragment", "uid_known"),
    [
        (
            lambda d: d.update(apiVersion="admission.k8s.io/v1beta1"),
            "",
            "admissionReviewVersions: [v1]",
            False,
        ),
        (lambda d: d.update(kind="Pod"), "", "expected apiVersion admission.k8s.io/v1", False),
        (lambda d: d.update(request=[]), "request", "must be an object, got array", False),
        (lambda d: d["request"].pop("uid"), "request.uid", "non-empty string, got null", False),
        (lambda d: d["request"].update(uid=7), "request.uid", "got number", False),
        (lambda d: d["request"].update(uid="x" * 300), "request.uid", "is not a UID", False),
        (lambda d: d["request"].update(subResource="status"), "request.resource", "trainjobs/status", True),
        (lambda d: d["request"]["kind"].update(kind="Pod"), "request.kind.kind", 'got "Pod"', True),
        (lambda d: d["request"].update(operation="PATCH"), "request.operation", 'got "PATCH"', True),
        (lambda d: d["request"].update(object=None), "request.object", "is required", True),
        (lambda d: d["request"]["object"].update(kind="Pod"), "request.object", 'got kind "Pod"', True),
        (
            lambda d: d["request"]["object"].update(metadata="x"),
            "request.object.metadata",
            "must be object, got string",
            True,
        ),
        (
            lambda d: d["request"]["object"]["metadata"].update(labels={"a": 1}),
            'request.object.metadata.labels["a"]',
            "must be a string, got number",
            True,
        ),
        (
            lambda d: d["request"].update(userInfo={"groups": "admins"}),
            "request.userInfo.groups",
            "must be array",
            True,
        ),
        (
            lambda d: d["request"].update(userInfo={"groups": [1]}),
            "request.userInfo.groups[0]",
            "must be a string",
            True,
        ),
        (lambda d: d["request"].update(dryRun="yes"), "request.dryRun", "must be boolean", True),
        (
            lambda d: d["request"].update(namespace=""),
            "request.namespace",
            "is required for the namespaced kind",
            True,
        ),
        (lambda d: d["request"].update(operation="UPDATE"), "request.oldObject", "is required", True),
    ],
)
def test_malformed_reviews_say_what_and_where(mutate: Any, path: str, fragment: str, uid_known: bool) -> None:
    data = review()
    mutate(data)
    bad = decode_review(data)
    assert isinstance(bad, BadReview)
    assert bad.path == path
    assert fragment in bad.message
    assert (bad.uid is not None) is uid_known


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{", "not valid JSON: Expecting property name"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"a": NaN}', "NaN is not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"1" * 5000, "not valid JSON"),
    ],
)
def test_parse_json_rejects_what_the_api_server_never_sends(body: bytes, fragment: str) -> None:
    bad = parse_json(body)
    assert isinstance(bad, BadReview) and fragment in bad.message


def decision(**kw: Any) -> Decision:
    base: dict[str, Any] = {
        "allowed": True,
        "operation": "CREATE",
        "kind": "TrainJob",
        "namespace": "alpha",
        "name": "smoke",
        "team": "alpha",
        "revision": "abc123",
    }
    base.update(kw)
    return Decision(**base)


def test_mutate_response_carries_a_base64_jsonpatch_only_when_non_empty() -> None:
    ops = ({"op": "add", "path": "/metadata/labels/x", "value": "é"},)
    out = decision_response("u", decision(patch=ops), "mutate")
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == "u" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [dict(ops[0])]
    assert response["auditAnnotations"] == {"patch": "1 operations", "revision": "abc123"}
    empty = decision_response("u", decision(), "mutate")["response"]
    assert "patch" not in empty and "patchType" not in empty


@pytest.mark.parametrize(
    "value",
    [2**70, -(2**64), "\ud800 lone surrogate", {"nested": ["\udfff", 2**100]}, "é ✓", 1.5, None],
    ids=["big-int", "big-negative", "lone-surrogate", "nested", "unicode", "float", "null"],
)
def test_every_decodable_value_encodes_again_in_a_patch(value: Any) -> None:
    # values parse_json accepts but orjson does not encode (beyond 64 bits, lone surrogates) take
    # the standard library's path; the patch must still decode to exactly the operation
    decoded = parse_json(json.dumps({"v": value}).encode())
    assert decoded == {"v": value}
    ops = ({"op": "add", "path": "/spec/x", "value": decoded["v"]},)
    response = decision_response("u", decision(patch=ops), "mutate")["response"]
    assert json.loads(base64.b64decode(response["patch"])) == [dict(ops[0])]
    assert parse_json(encode_json({"v": value})) == {"v": value}


def test_mutate_never_denies_or_warns_validation_does() -> None:
    violation = Violation("MPG-Q001", "enforce", "spec.trainer", "too many GPUs")
    denied = decision(allowed=False, violations=(violation,), warnings=("w",), message="mpigate denied it")
    mutate = decision_response("u", denied, "mutate")["response"]
    assert mutate["allowed"] is True and "warnings" not in mutate and "status" not in mutate
    validate = decision_response("u", denied, "validate", dry_run=True)["response"]
    assert validate["allowed"] is False
    assert validate["status"] == {
        "metadata": {},
        "status": "Failure",
        "code": 403,
        "reason": "Forbidden",
        "message": "mpigate denied it",
    }
    assert validate["warnings"] == ["w"]
    assert validate["auditAnnotations"] == {
        "decision": "denied",
        "rules": "MPG-Q001",
        "revision": "abc123",
        "dry-run": "true",
    }


def test_annotation_keys_are_valid_for_the_api_server_prefix() -> None:
    many = tuple(Violation(f"MPG-SEC-RULE{i:03d}", "warn", "p", "m") for i in range(200))
    notes = audit_annotations(decision(violations=many, warnings=("w",)), "validate")
    assert all("/" not in key for key in notes)
    assert len(notes["rules"]) <= 1024 and notes["rules"].endswith("more")
    shown = notes["rules"].split(",")
    assert shown[0] == "MPG-SEC-RULE000"
    assert int(shown[-1].split()[0].lstrip("+")) + len(shown) - 1 == 200


def test_long_warnings_are_split_into_lines_of_at_most_120_characters() -> None:
    text = "[MPG-Q008] nlp-team uses 15/16 GPUs; " + "this job asks 8 and will wait for 7 to free " * 6
    lines = fit_warnings([text, "short\nwith newline"])
    assert all(len(line) <= MAX_WARNING_CHARS for line in lines)
    assert lines[0].startswith("[MPG-Q008] nlp-team uses 15/16 GPUs;")
    assert all(line.startswith("… ") for line in lines[1:-1])
    rebuilt = " ".join(line.removeprefix("… ") for line in lines[:-1])
    assert rebuilt.split() == text.split()
    assert lines[-1] == "short with newline"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=600), max_size=60))
def test_warnings_always_fit_the_api_server_limits(texts: list[str]) -> None:
    lines = fit_warnings(texts)
    assert all(0 < len(line) <= MAX_WARNING_CHARS for line in lines)
    assert sum(len(line) for line in lines) <= 4096
    assert all(ch.isprintable() or ch == " " for line in lines for ch in line if ord(ch) < 0x80)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    path=st.lists(
        st.sampled_from(
            [
                "request",
                "object",
                "metadata",
                "kind",
                "resource",
                "userInfo",
                "uid",
                "operation",
                "spec",
                "labels",
                "name",
            ]
        ),
        min_size=1,
        max_size=4,
    ),
    value=json_values,
)
def test_decode_never_raises_on_any_value_anywhere(path: list[str], value: Any) -> None:
    data = copy.deepcopy(review())
    target: Any = data
    for key in path[:-1]:
        if not isinstance(target, dict):
            break
        target = target.setdefault(key, {})
    if isinstance(target, dict):
        target[path[-1]] = value
    result = decode_review(data)
    assert isinstance(result, ReviewRequest | BadReview)
