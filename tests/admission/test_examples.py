"""Every example TrainJob and runtime through the real engine behind the real server: /mutate,
apply the JSONPatch as the API server does, then /validate; decisions, rules, patches and
annotations as each example's ``# expect:`` header says."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
import yaml

from mpigate.admission.client import ReviewClient, make_review, replay
from mpigate.admission.recorder import MemoryRecorder
from mpigate.admission.server import ServeOptions
from mpigate.policy import UserInfo
from tests.conftest import REPO, TODAY

from .conftest import ThreadedWebhook, write_cert

EXAMPLES = sorted((REPO / "examples").glob("*/*.yaml"))
RULE = re.compile(r"MPG-[A-Z0-9]+(?:-[A-Z0-9]+)*")


@dataclass(frozen=True)
class Expectation:
    allowed: bool
    denies: frozenset[str]
    warns: frozenset[str]
    text: str


def expectation(path: Path) -> Expectation:
    """``# expect: denied MPG-A, MPG-B; warning MPG-C`` or ``# expect: allowed with a warning MPG-C``."""
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("# ").rstrip())
    text = " ".join(header)
    said = text.split("expect:", 1)[1].strip()
    verdict, _, warned = said.partition("; warning")
    if said.startswith("allowed"):
        return Expectation(True, frozenset(), frozenset(RULE.findall(said)), said)
    return Expectation(False, frozenset(RULE.findall(verdict)), frozenset(RULE.findall(warned)), said)


@pytest.fixture(scope="module")
def webhook(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ThreadedWebhook, MemoryRecorder, Path]]:
    base = tmp_path_factory.mktemp("examples")
    ca = trustme.CA()
    cert, key = write_cert(ca, base / "tls")
    ca.cert_pem.write_to_path(str(base / "ca.crt"))
    recorder = MemoryRecorder()
    options = ServeOptions(
        config=REPO, tls_cert=cert, tls_key=key, host="127.0.0.1", port=0, reload_interval=3600
    )
    moment = dt.datetime.combine(TODAY, dt.time(12, 0), dt.UTC)
    server = ThreadedWebhook(options, recorder=recorder, clock=lambda: moment)
    yield server, recorder, base / "ca.crt"
    server.stop()


@pytest.fixture(scope="module")
def client(webhook: tuple[ThreadedWebhook, MemoryRecorder, Path]) -> Iterator[ReviewClient]:
    server, _, ca = webhook
    c = ReviewClient(server.server.url, ca_file=str(ca))
    yield c
    c.close()


def test_there_are_examples_of_each_outcome() -> None:
    outcomes = {expectation(p).allowed for p in EXAMPLES}
    assert outcomes == {True, False} and len(EXAMPLES) >= 20


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_example(
    path: Path, client: ReviewClient, webhook: tuple[ThreadedWebhook, MemoryRecorder, Path]
) -> None:
    server, recorder, _ = webhook
    expected = expectation(path)
    obj = yaml.safe_load(path.read_text())
    as_user = next(
        (
            line.split(":", 1)[1].split()[0]
            for line in path.read_text().splitlines()
            if line.startswith("# as:")
        ),
        None,
    )
    result = replay(client, obj, user=UserInfo(as_user, ("system:authenticated",)) if as_user else None)
    assert not result.error
    assert result.validate is not None and result.mutate is not None
    notes = result.validate["auditAnnotations"]
    revision = server.server.store.current.revision  # type: ignore[union-attr]
    assert notes["revision"] == revision and result.mutate["auditAnnotations"]["revision"] == revision
    hit = set(notes["rules"].split(",")) - {""}
    assert result.allowed is expected.allowed, result.message or result.warnings
    if not expected.allowed:
        assert notes["decision"] == "denied"
        assert result.validate["status"]["code"] == 403 and result.validate["status"]["reason"] == "Forbidden"
        denying = set(re.findall(r"^  \[(MPG-[A-Z0-9-]+)\]", result.message, re.M))
        assert denying == expected.denies, result.message
        assert denying <= hit
        assert result.message.startswith(f"mpigate denied {obj['kind']} ")
    else:
        assert notes["decision"] == ("allowed-with-warnings" if result.warnings else "allowed")
    assert expected.warns <= hit
    for rule in expected.warns:
        assert any(w.startswith(f"[{rule}]") for w in result.warnings), result.warnings
    assert all(len(w) <= 120 for w in result.warnings)
    if "exception" in expected.text:
        name = re.search(r"exception ([a-z0-9-]+)", expected.text)
        assert name and notes["exceptions"] == name[1]
    if "mutations" in expected.text or "adds" in expected.text or "injects" in expected.text:
        assert result.patch_ops, "expected mpigate to mutate the object"
    if result.patch_ops and obj["kind"] == "TrainJob" and result.allowed:
        patched = result.patched or {}
        managers = [p.get("manager") for p in patched["spec"].get("runtimePatches", [])]
        assert "mpigate.io/admission" in managers
        # Idempotent (reinvocationPolicy: IfNeeded): mutating the result again changes nothing.
        again = client.post("/mutate", make_review(patched, uid="again"))[1]["response"]
        assert again["allowed"] is True and "patch" not in again
    # Both stages were recorded before being answered.
    stages = [
        (r.stage, r.request.name) for r in recorder.records if r.request.name == obj["metadata"]["name"]
    ]
    assert ("validate", obj["metadata"]["name"]) in stages


def test_denial_text_as_kubectl_prints_it(client: ReviewClient) -> None:
    obj = yaml.safe_load((REPO / "examples" / "trainjobs" / "deny-over-quota.yaml").read_text())
    result = replay(client, obj)
    assert result.message == (
        "mpigate denied TrainJob nlp-team/llm-pretrain-huge:\n"
        "  [MPG-Q001] spec.trainer: asks 32 nvidia.com/gpu (4 nodes × 8 GPUs) but Kueue can admit at most "
        "16 for nlp-team (a100-eu: nominal 16, no borrowing); it would never admit the job. Set "
        "spec.trainer.numNodes to 2 or fewer, or ask #nlp-admins to raise quotas/nlp-team.yaml."
    )


def test_validate_judges_the_object_as_received(client: ReviewClient) -> None:
    """/validate judges what will be stored: an object that skipped mpigate's mutation (a later
    webhook undid it) is denied with a fix, the same object after /mutate is admitted."""
    obj = yaml.safe_load((REPO / "examples" / "trainjobs" / "phi-pinned.yaml").read_text())
    status, answer = client.post("/validate", make_review(obj, uid="unmutated"))
    assert status == 200
    response = answer["response"]
    assert response["allowed"] is False
    rules = set(response["auditAnnotations"]["rules"].split(","))
    assert {"MPG-NET-001", "MPG-NET-002", "MPG-RES-001"} <= rules
    assert "Let mpigate add its runtime patch (create the TrainJob again)" in response["status"]["message"]
    result = replay(client, obj)
    assert result.allowed is True and result.patch_ops
