"""Issue 18 item 6 with a witness: each decision's chain position travels in the AdmissionReview's
auditAnnotations, the API server's audit log keeps it, and `mpigate audit verify --k8s-audit` (and
the report) find removed newest records, deleted segments, deleted chains and rewrites with it.

The trail is written by two real webhook replicas over TLS (each its own chain, as in the install
base); the API server's audit log is built from their answers exactly as kube-apiserver records
admission annotations (``<webhook name>/<key>``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shutil
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from click.testing import CliRunner, Result

from mpigate.admission.client import make_review
from mpigate.admission.metrics import Metrics
from mpigate.admission.server import ServeOptions, WebhookServer
from mpigate.audit import AsyncAuditLog, AuditMetrics, KeyRing, WriterOptions, generate_key, load_signer
from mpigate.audit._canonical import canonical_bytes, record_hash
from mpigate.audit.layout import list_segments
from mpigate.audit.witness import parse_position, record_at
from mpigate.cli import cli
from mpigate.cli.serve_commands import AuditRecorder
from mpigate.report import K8sAuditReader, ReportOptions, build_report

from .conftest import BASE_ORG, trainjob, write_cert
from .stub_engine import DENY, stub_evaluate

WEBHOOKS = {"mutate": "mutate.trainjobs.mpigate.io", "validate": "validate.team.mpigate.io"}


def _event(review: dict[str, Any], answers: dict[str, dict[str, Any]], at: dt.datetime) -> dict[str, Any]:
    """The ResponseComplete event kube-apiserver writes for one TrainJob create."""
    request = review["request"]
    annotations = {"authorization.k8s.io/decision": "allow"}
    for stage, answer in answers.items():
        for key, value in answer["response"].get("auditAnnotations", {}).items():
            annotations[f"{WEBHOOKS[stage]}/{key}"] = value
    allowed = answers["validate"]["response"]["allowed"]
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": request["uid"],
        "stage": "ResponseComplete",
        "verb": "create",
        "user": request["userInfo"],
        "objectRef": {
            "resource": "trainjobs",
            "namespace": request["namespace"],
            "name": request["name"],
            "apiGroup": "trainer.kubeflow.org",
            "apiVersion": "v1alpha1",
        },
        "responseStatus": {"code": 201 if allowed else 403},
        "requestReceivedTimestamp": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "annotations": annotations,
    }


async def _run_replicas(
    root: Path, key: Path, certs: tuple[Path, Path], ca: trustme.CA
) -> list[dict[str, Any]]:
    signer = load_signer("ed25519", key)
    servers = []
    for replica in range(2):
        log = await AsyncAuditLog.open(
            root / "audit",
            chain=f"mpigate-webhook-{replica}",
            source="webhook",
            signer=signer,
            options=WriterOptions(rotate_max_bytes=6000, checkpoint_every=5),
            metrics=AuditMetrics(Metrics().registry),
        )
        options = ServeOptions(
            config=BASE_ORG,
            tls_cert=certs[0],
            tls_key=certs[1],
            host="127.0.0.1",
            port=0,
            reload_interval=3600,
        )
        server = WebhookServer(
            options, recorder=AuditRecorder(log), evaluator=stub_evaluate, mutator=stub_evaluate
        )
        await server.start()
        servers.append(server)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    events = []
    moment = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http:
            for i in range(24):
                job = trainjob(**({DENY: "over quota"} if i % 3 == 0 else {}))
                job["metadata"]["name"] = f"job-{i}"
                review = make_review(job, uid=f"uid-{i}")
                answers = {}
                for stage in ("mutate", "validate"):
                    server = servers[(i + (stage == "validate")) % 2]  # the replicas share the load
                    async with http.post(f"{server.url}/{stage}", json=review) as response:
                        assert response.status == 200, await response.text()
                        answers[stage] = await response.json()
                moment += dt.timedelta(seconds=7)
                events.append(_event(review, answers, moment))
    finally:
        for server in servers:
            await server.stop()  # closes each chain with its shutdown checkpoint
    # the API server's log goes on after the webhooks stopped (any later event shows how far it runs)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
    events.append(
        {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "stage": "ResponseComplete",
            "verb": "get",
            "user": {"username": "kubelet"},
            "objectRef": {"resource": "pods", "namespace": "nlp-team", "apiVersion": "v1"},
            "requestReceivedTimestamp": later.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
    )
    return events


@pytest.fixture(scope="module")
def trail(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("witness")
    private, public = generate_key("ed25519")
    assert public is not None
    (root / "audit.key").write_bytes(private)
    (root / "audit.pub").write_bytes(public)
    ca = trustme.CA()
    certs = write_cert(ca, root / "tls")
    events = asyncio.run(_run_replicas(root, root / "audit.key", certs, ca))
    (root / "kube-audit.log").write_text("".join(json.dumps(e) + "\n" for e in events))
    return root


@pytest.fixture
def copy(trail: Path, tmp_path: Path) -> Path:
    for name in ("audit", "audit.pub", "kube-audit.log"):
        source = trail / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / name)
    return tmp_path


def _verify(root: Path, *extra: str, key: bool = True, witness: bool = True) -> Result:
    args = ["audit", "verify", str(root / "audit")]
    if key:
        args += ["--public-key", str(root / "audit.pub")]
    if witness:
        args += ["--k8s-audit", str(root / "kube-audit.log")]
    return CliRunner().invoke(cli, [*args, *extra])


def _events(root: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (root / "kube-audit.log").read_text().splitlines()]


def test_each_answer_names_its_durable_record(trail: Path) -> None:
    seen = 0
    for event in _events(trail)[:-1]:
        for webhook in WEBHOOKS.values():
            value = event["annotations"][f"{webhook}/record"]
            position = parse_position(value)
            assert position is not None, value
            found = record_at(trail / "audit" / position.chain, position.seq)
            assert found is not None and found.hash == position.hash
            seen += 1
    assert seen == 48
    chains = {
        parse_position(e["annotations"]["validate.team.mpigate.io/record"]).chain for e in _events(trail)[:-1]
    }  # type: ignore[union-attr]
    assert chains == {"mpigate-webhook-0", "mpigate-webhook-1"}


def test_the_report_reader_gives_the_positions(trail: Path) -> None:
    reader = K8sAuditReader(trail / "kube-audit.log")
    events = list(reader)
    assert all(len(e.positions) == 2 for e in events)  # the mutating and the validating webhook's
    assert reader.witness.positions == 48 and set(reader.witness.newest) == {
        "mpigate-webhook-0",
        "mpigate-webhook-1",
    }
    assert events[0].mpigate["record"] == str(events[0].positions[1])  # the validating one's


def test_an_intact_trail_is_verified_with_the_witness(copy: Path) -> None:
    result = _verify(copy)
    assert result.exit_code == 0, result.output
    assert "witness: 48 chain position(s) of 2 chain(s)" in result.output
    assert "2 chain(s)" in result.output and "all verified" in result.output
    assert "note:" not in result.output  # the set of chains is witnessed


def test_removed_newest_records_are_found_by_the_witness(copy: Path) -> None:
    newest = list_segments(copy / "audit" / "mpigate-webhook-0")[-1]
    lines = newest.read_bytes().splitlines(keepends=True)
    newest.write_bytes(b"".join(lines[:-3]))  # the shutdown checkpoint and two decisions
    result = _verify(copy)
    assert result.exit_code == 1, result.output
    assert "error witnessed-missing" in result.output and "kube-audit.log:" in result.output
    assert "of its newest records were removed" in result.output
    # without the witness the same cut is only "unverifiable"
    blind = _verify(copy, witness=False)
    assert (
        blind.exit_code == 1
        and "witnessed-missing" not in blind.output
        and "unverifiable since" in blind.output
    )


def test_a_removed_newest_segment_and_its_rotate_line_are_found(copy: Path) -> None:
    chain = copy / "audit" / "mpigate-webhook-1"
    segments = list_segments(chain)
    assert len(segments) >= 3
    segments[-1].unlink()
    lines = segments[-2].read_bytes().splitlines(keepends=True)
    assert json.loads(lines[-1])["checkpoint"]["reason"] == "rotate"
    segments[-2].write_bytes(b"".join(lines[:-1]))
    result = _verify(copy)
    assert result.exit_code == 1 and "error witnessed-missing" in result.output, result.output


def test_a_deleted_chain_directory_is_found(copy: Path) -> None:
    shutil.rmtree(copy / "audit" / "mpigate-webhook-1")
    result = _verify(copy)
    assert result.exit_code == 1, result.output
    assert "error missing-chain" in result.output and "mpigate-webhook-1" in result.output
    report = build_report(
        [copy / "audit"],
        [copy / "kube-audit.log"],
        keys=KeyRing.load(public_key_files=[copy / "audit.pub"]),
        options=ReportOptions(frameworks=("soc2",)),
    )
    integrity = report["integrity"]
    assert integrity["ok"] is False and integrity["status"]["state"] == "broken"
    assert integrity["firstProblem"]["kind"] == "missing-chain"
    assert {c["chain"] for c in report["inputs"]["chains"]} == {"mpigate-webhook-0", "mpigate-webhook-1"}


def test_a_rewrite_without_the_key_is_found_by_the_witness_alone(copy: Path) -> None:
    """No key: the signatures are not checked, yet the witnessed hashes expose the rehashed chain."""
    chain = copy / "audit" / "mpigate-webhook-0"
    head: str | None = None
    for segment in list_segments(chain):
        out = []
        for raw in segment.read_bytes().splitlines():
            record = json.loads(raw)
            if record.get("decision") == "denied":
                record["decision"] = "allowed"
            if head is not None:
                record["prev"] = head
                if record["stage"] == "checkpoint":
                    record["checkpoint"]["head"] = head
            record["hash"] = record_hash(record)
            head = record["hash"]
            out.append(canonical_bytes(record) + b"\n")
        segment.write_bytes(b"".join(out))
    unwitnessed = _verify(copy, key=False, witness=False)
    assert "error" not in unwitnessed.output  # consistent: only a key or a witness can tell
    result = _verify(copy, key=False)
    assert result.exit_code == 1, result.output
    assert "error witness-mismatch" in result.output and "the chain was rewritten" in result.output


def test_the_report_verifies_with_the_witness(copy: Path) -> None:
    report = build_report(
        [copy / "audit"],
        [copy / "kube-audit.log"],
        keys=KeyRing.load(public_key_files=[copy / "audit.pub"]),
        options=ReportOptions(frameworks=("soc2",)),
    )
    status = report["integrity"]["status"]
    assert status["ok"] is True and status["witnessed"] is True and status["chainSetNote"] is None
    assert {c["state"] for c in status["chains"]} == {"verified"}
    assert all(c["witnessedSeq"] for c in report["inputs"]["chains"])


def test_an_earlier_copy_of_a_chain_is_not_held_against_the_witness(copy: Path) -> None:
    """An archive taken earlier holds the same chain shorter: the witness speaks about the live one."""
    archive = copy / "archive" / "mpigate-webhook-0"
    shutil.copytree(copy / "audit" / "mpigate-webhook-0", archive)
    newest = list_segments(archive)[-1]
    newest.write_bytes(b"".join(newest.read_bytes().splitlines(keepends=True)[:-3]))
    args = ["audit", "verify", str(copy / "audit"), str(copy / "archive")]
    args += ["--public-key", str(copy / "audit.pub"), "--k8s-audit", str(copy / "kube-audit.log")]
    result = CliRunner().invoke(cli, args)
    assert "witnessed-missing" not in result.output and "error" not in result.output, result.output
    assert "2 verified, 1 unverifiable" in result.output  # the copy's end is not sealed


def test_an_emptied_audit_directory_is_found_by_the_witness(copy: Path) -> None:
    for chain in list((copy / "audit").iterdir()):
        shutil.rmtree(chain)
    result = _verify(copy)
    assert result.exit_code == 1, result.output
    assert result.output.count("error missing-chain") == 2


def test_a_witness_without_positions_says_so(copy: Path) -> None:
    events = [e for e in _events(copy) if "annotations" not in e]
    (copy / "kube-audit.log").write_text("".join(json.dumps(e) + "\n" for e in events))
    result = _verify(copy)
    assert "holds no mpigate record positions" in result.output
    assert "note: the set of chains is not witnessed" in result.output  # it vouched for nothing
