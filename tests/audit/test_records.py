"""Record builders: the AUDIT.md payload, and no secret value ever reaching the log."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpigate.audit import (
    REDACTED,
    AuditLog,
    HmacSigner,
    evidence_record,
    lifecycle_record,
    record_from_decision,
    redact,
)
from mpigate.policy.decision import (
    AdmissionInput,
    AppliedException,
    Decision,
    Demand,
    JobDemand,
    UserInfo,
    Violation,
)

from .conftest import HMAC_SECRET

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "audit" / "secret-trainjob.yaml"

SECRETS = [
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "0123456789abcdef0123456789abcdef01234567",
    "hunter2-db-pass",
    "tok-9f8e7d6c5b4a3f2e1d0c",
    "abcdefghijklmnopqrstuvwxyz012345",
    "hf_QwErTyUiOpAsDfGhJkLzXcVbNm1234",
    "patch-env-literal-77aa",
    "patched-list-secret-88bb",
    "patched-value-99cc",
]


def trainjob() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(FIXTURE.read_text())
    return data


def admission(obj: dict[str, Any]) -> AdmissionInput:
    return AdmissionInput(
        operation="CREATE",
        kind="TrainJob",
        namespace="nlp-team",
        name="leaky-credentials",
        obj=obj,
        user=UserInfo("maria", ("nlp-team-scientists",), uid="u-1"),
        uid="req-123",
    )


def leaky_decision() -> Decision:
    """A decision whose messages and patch carry the secret values (a careless engine)."""
    return Decision(
        allowed=False,
        operation="CREATE",
        kind="TrainJob",
        namespace="nlp-team",
        name="leaky-credentials",
        team="nlp-team",
        revision="abc123",
        violations=(
            Violation(
                "MPG-SEC-SECRETS",
                "enforce",
                "spec.trainer.env[0]",
                "env AWS_SECRET_ACCESS_KEY holds a literal value wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                fix="use valueFrom.secretKeyRef",
                controls=("SOC2-CC6.1",),
            ),
            Violation(
                "MPG-IMG-002",
                "warn",
                "metadata.annotations",
                "annotation example.com/api-token=tok-9f8e7d6c5b4a3f2e1d0c",
                controls=("SOC2-CC8.1",),
                waived_by="legacy-images",
            ),
        ),
        warnings=("token Bearer abcdefghijklmnopqrstuvwxyz012345 seen in annotations",),
        patch=(
            {
                "op": "add",
                "path": "/spec/trainer/env/-",
                "value": {"name": "OMPI_X", "value": "patch-env-literal-77aa"},
            },
            {
                "op": "replace",
                "path": "/spec/trainer/env",
                "value": [{"name": "L", "value": "patched-list-secret-88bb"}],
            },
            {"op": "replace", "path": "/spec/trainer/env/1/value", "value": "patched-value-99cc"},
            {"op": "add", "path": "/metadata/labels/mpigate.io~1team", "value": "nlp-team"},
        ),
        exceptions=(
            AppliedException(
                "legacy-images", ("MPG-IMG-002",), "ciso", "SEC-1", dt.date(2026, 12, 31), "migration"
            ),
        ),
        demand=Demand(
            pods=2,
            gpus={"nvidia.com/gpu": 16},
            cpu=None,
            memory=None,
            jobs=(JobDemand("node", 2, {"nvidia.com/gpu": 8}, None, None, 8),),
            region="eu",
        ),
        message=(
            "denied: env AWS_SECRET_ACCESS_KEY holds wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY; "
            "DB password hunter2-db-pass"
        ),
    )


def test_payload_follows_audit_md():
    entry = record_from_decision(leaky_decision(), admission(trainjob()), "validate", "webhook")
    assert entry["source"] == "webhook" and entry["stage"] == "validate"
    assert entry["request"] == {
        "uid": "req-123",
        "operation": "CREATE",
        "dryRun": False,
        "user": {"username": "maria", "groups": ["nlp-team-scientists"], "uid": "u-1"},
    }
    assert entry["object"] == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "namespace": "nlp-team",
        "name": "leaky-credentials",
    }
    assert entry["team"] == "nlp-team" and entry["decision"] == "denied" and entry["revision"] == "abc123"
    assert [v["id"] for v in entry["violations"]] == ["MPG-SEC-SECRETS", "MPG-IMG-002"]
    assert (
        entry["violations"][0]["controls"] == ["SOC2-CC6.1"]
        and entry["violations"][1]["waivedBy"] == "legacy-images"
    )
    assert entry["exceptions"][0]["ticket"] == "SEC-1"
    assert entry["demand"]["gpus"] == 16 and entry["demand"]["region"] == "eu"
    # names survive redaction, values do not
    assert entry["patch"][0] == {
        "op": "add",
        "path": "/spec/trainer/env/-",
        "value": {"name": "OMPI_X", "value": REDACTED},
    }
    assert entry["patch"][1]["value"] == [{"name": "L", "value": REDACTED}]
    assert entry["patch"][2]["value"] == REDACTED
    assert entry["patch"][3]["value"] == "nlp-team"
    assert "AWS_SECRET_ACCESS_KEY" in entry["violations"][0]["message"]


def test_no_secret_value_reaches_the_files(tmp_path):
    decision, request = leaky_decision(), admission(trainjob())
    with AuditLog.open(tmp_path / "audit", chain="s", signer=HmacSigner(HMAC_SECRET)) as log:
        log.append(record_from_decision(decision, request, "mutate", "webhook"))
        log.append(record_from_decision(decision, request, "validate", "webhook"))
    files = [p for p in (tmp_path / "audit").rglob("*") if p.is_file()]
    blob = b"".join(p.read_bytes() for p in files)
    assert b"leaky-credentials" in blob and b"AWS_SECRET_ACCESS_KEY" in blob
    for secret in SECRETS:
        assert secret.encode() not in blob, secret
    assert blob.count(REDACTED.encode()) >= 10


def test_redact_keeps_env_names_and_references():
    obj = trainjob()
    safe = redact(obj)
    env = safe["spec"]["trainer"]["env"]
    assert [e["name"] for e in env] == ["AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "DB_URL", "FROM_SECRET"]
    assert env[0]["value"] == REDACTED and env[3]["valueFrom"] == {
        "secretKeyRef": {"name": "wandb", "key": "api-key"}
    }
    assert safe["metadata"]["annotations"]["example.com/api-token"] == REDACTED
    assert "Bearer" not in safe["metadata"]["annotations"]["example.com/notes"]
    assert safe["metadata"]["labels"] == {"mpigate.io/cost-center": "cc-4711"}


def test_lifecycle_and_evidence_entries():
    life = lifecycle_record(
        "finished",
        namespace="nlp-team",
        name="llm-ft",
        team="nlp-team",
        gpus=32,
        gpu_seconds=115200.0,
        reason="Succeeded",
    )
    assert life["stage"] == "lifecycle" and life["source"] == "controller"
    assert life["lifecycle"]["gpuSeconds"] == 115200.0 and life["object"]["name"] == "llm-ft"
    evidence = evidence_record(
        "placement",
        namespace="nlp-team",
        name="llm-ft",
        team="nlp-team",
        pod="llm-ft-node-0-0",
        node="gpu-eu-17",
        region="eu",
    )
    assert evidence["stage"] == "evidence" and evidence["evidence"]["region"] == "eu"
    assert evidence["evidence"]["node"] == "gpu-eu-17"


def test_real_engine_decisions_leave_no_secret_in_the_files(tmp_path):
    """The engine's own decisions (mutate and validate) on secret-laden TrainJobs of the example org."""
    from mpigate.config import load
    from mpigate.policy import evaluate
    from tests.conftest import REPO, TODAY

    config = load(REPO, revision="test", today=TODAY)
    now = dt.datetime.combine(TODAY, dt.time(12), tzinfo=dt.UTC)
    example = yaml.safe_load((REPO / "examples" / "trainjobs" / "deny-plaintext-secret.yaml").read_text())
    jobs = [trainjob(), example]
    secrets = [*SECRETS[:6], *(e["value"] for e in example["spec"]["trainer"]["env"])]
    outcomes = []
    with AuditLog.open(tmp_path / "audit", chain="engine", signer=HmacSigner(HMAC_SECRET)) as log:
        for obj in jobs:
            request = admission(obj)
            decision = evaluate(config, request, None, now)
            outcomes.append((decision.outcome, decision.rule_ids))
            log.append(record_from_decision(decision, request, "mutate", "webhook"))
            log.append(record_from_decision(decision, request, "validate", "webhook"))
    assert all(outcome == "denied" for outcome, _ in outcomes), outcomes
    blob = b"".join(p.read_bytes() for p in (tmp_path / "audit").rglob("*") if p.is_file())
    for secret in secrets:
        assert secret.encode() not in blob, secret
    assert b"AWS_SECRET_ACCESS_KEY" in blob  # the finding still names the variable


# Where a secret can sit in an object: an env var's literal value, a string under a credential-like
# key, or a token-looking string under any key or in any list.
_PLACES = st.sampled_from(["env", "secret-key", "token"])
_KEYS = st.sampled_from(["name", "image", "command", "args", "labels", "spec", "template", "x"])
_PLAIN = st.text(alphabet="abcdefgh-./ ", max_size=12)
_JSON = st.recursive(
    st.none() | st.integers() | _PLAIN,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)


def _plant(obj: Any, place: str, secret: str, path: list[str]) -> dict[str, Any]:
    """``obj`` wrapped so that ``secret`` sits at ``place`` under the nesting ``path``."""
    if place == "env":
        leaf: Any = {"env": [{"name": "X", "value": secret}], "other": obj}
    elif place == "secret-key":
        leaf = {"apiToken": secret, "other": obj}
    else:
        leaf = [obj, f"ghp_{secret}"]
    for key in reversed(path):
        leaf = {key: leaf}
    return {"spec": leaf}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _JSON,
    _PLACES,
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=24, max_size=40),
    st.lists(_KEYS, max_size=6),
    st.booleans(),
)
def test_a_secret_anywhere_in_the_object_never_reaches_the_record(
    filler: Any, place: str, secret: str, path: list[str], long_message: bool
) -> None:
    """Wherever the object carries it, a secret quoted back by the engine (in a message, a
    violation, a warning or a patch) is redacted — short texts (memoized checks) and long ones alike."""
    obj = _plant(filler, place, secret, path)
    quoted = f"ghp_{secret}" if place == "token" else secret
    padding = " lorem" * (100 if long_message else 1)
    decision = replace(
        leaky_decision(),
        message=f"denied: saw {quoted}{padding}",
        warnings=(f"value {quoted} looks odd{padding}",),
        violations=(Violation("MPG-SEC-SECRETS", "enforce", "spec", f"holds {quoted}{padding}"),),
        patch=({"op": "add", "path": "/metadata/labels/x", "value": quoted},),
    )
    entry = record_from_decision(decision, admission(obj), "validate", "webhook")
    text = json.dumps(entry)
    assert secret not in text
    assert entry["object"]["name"] == "leaky-credentials"  # identities are kept exactly


def test_the_memos_hold_no_secret_and_nothing_long() -> None:
    """The pattern checks' memo keeps only short strings that hold no token (what the record itself
    writes out): never a token-like string, an env value or a long text."""
    from mpigate.audit import records

    records._PLAIN.clear()
    entry = record_from_decision(leaky_decision(), admission(trainjob()), "validate", "webhook")
    assert entry["decision"] == "denied"
    assert records._PLAIN, "the object's plain strings are memoized"
    for secret in SECRETS:
        assert not any(secret in text for text in records._PLAIN), secret
    token = "ghp_" + "a" * 30
    long_plain = "x " * 500
    assert redact({"notes": long_plain + token})["notes"] == long_plain + REDACTED
    assert redact({"notes": long_plain})["notes"] == long_plain
    assert long_plain not in records._PLAIN and long_plain + token not in records._PLAIN
    assert redact({"notes": "short and plain"})["notes"] == "short and plain"
    assert "short and plain" in records._PLAIN
    # memoized or not, a string is judged the same
    assert redact({"notes": "short and plain"})["notes"] == "short and plain"
    assert redact({"notes": token})["notes"] == REDACTED and token not in records._PLAIN


def test_config_record_states_what_the_revision_enforces() -> None:
    from pathlib import Path

    from mpigate.audit import config_record
    from mpigate.catalogue import all_rules
    from mpigate.config import load

    config = load(Path(__file__).resolve().parents[2], revision="abc123")
    entry = config_record(config)
    assert (entry["stage"], entry["source"], entry["revision"], entry["team"]) == (
        "evidence",
        "webhook",
        "abc123",
        None,
    )
    details = entry["evidence"]["details"]
    assert entry["evidence"]["kind"] == "config"
    assert details["podSecurity"] == {
        "level": config.org.security.level,
        "version": config.org.security.version,
    }
    modes = details["enforcement"]["modes"]
    assert set(modes) == set(all_rules())  # every rule, resolved as the engine resolves it
    assert all(modes[r] == config.org.enforcement.mode_for(r) for r in modes)
    assert modes["MPG-Q004"] == "warn"  # advisory: enforce acts as warn
