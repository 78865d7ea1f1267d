"""``mpigate certs``, ``mpigate review`` and ``mpigate serve`` as a real process (SIGTERM drains
in-flight reviews; decisions land in the audit trail)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock as kmock_lib
import pytest
import trustme
import yaml
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from mpigate.admission.client import make_review
from mpigate.admission.server import ServeOptions
from mpigate.audit import generate_key
from mpigate.cli import cli
from tests.conftest import REPO

from .conftest import ThreadedWebhook, as_mutated, wait_for, write_cert

SVC_NAMES = [
    "mpigate-webhook",
    "mpigate-webhook.mpigate-system",
    "mpigate-webhook.mpigate-system.svc",
    "mpigate-webhook.mpigate-system.svc.cluster.local",
]


def example_org_options(cert: Path, key: Path) -> ServeOptions:
    """The example org served on a free loopback port with this certificate."""
    return ServeOptions(
        config=REPO, tls_cert=cert, tls_key=key, host="127.0.0.1", port=0, reload_interval=3600
    )


def test_certs_issues_a_ca_and_a_serving_certificate_for_the_service(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    result = CliRunner().invoke(cli, ["certs", "--out", str(out), "--days", "30"])
    assert result.exit_code == 0, result.output
    ca_pem = (out / "ca.crt").read_bytes()
    assert result.stdout.strip() == base64.b64encode(ca_pem).decode()
    assert oct((out / "tls.key").stat().st_mode & 0o777) == "0o600"
    assert oct((out / "ca.key").stat().st_mode & 0o777) == "0o600"
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == SVC_NAMES
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 29 <= days <= 30

    # Re-running rotates the serving certificate and keeps the CA (the caBundle stays valid).
    again = CliRunner().invoke(cli, ["certs", "--out", str(out), "-o", "json"])
    data = json.loads(again.stdout)
    assert data["caReused"] is True and (out / "ca.crt").read_bytes() == ca_pem
    rotated = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    assert rotated.serial_number != cert.serial_number
    rotated.verify_directly_issued_by(ca)
    fresh = CliRunner().invoke(cli, ["certs", "--out", str(out), "--new-ca", "-o", "json"])
    assert json.loads(fresh.stdout)["caReused"] is False and (out / "ca.crt").read_bytes() != ca_pem


async def test_a_server_with_generated_certs_is_trusted_by_service_name(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert CliRunner().invoke(cli, ["certs", "--out", str(out)]).exit_code == 0
    from mpigate.admission.server import WebhookServer

    server = WebhookServer(example_org_options(out / "tls.crt", out / "tls.key"))
    await server.start()
    try:
        ctx = ssl.create_default_context(cafile=str(out / "ca.crt"))
        # The API server dials <svc>.<ns>.svc; the certificate must be valid for that name.
        _, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=ctx, server_hostname="mpigate-webhook.mpigate-system.svc"
        )
        writer.close()
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection("127.0.0.1", server.port, ssl=ctx, server_hostname="other.svc")
    finally:
        await server.stop()


@pytest.fixture(scope="module")
def example_webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    base = tmp_path_factory.mktemp("review")
    ca = trustme.CA()
    cert, key = write_cert(ca, base / "tls")
    ca.cert_pem.write_to_path(str(base / "ca.crt"))
    server = ThreadedWebhook(example_org_options(cert, key))
    yield server.server.url, base / "ca.crt"
    server.stop()


def test_review_prints_kubectl_style_outcomes(example_webhook: tuple[str, Path]) -> None:
    url, ca = example_webhook
    trainjobs = REPO / "examples" / "trainjobs"
    args = ["review", str(trainjobs / "minimal.yaml"), str(trainjobs / "deny-over-quota.yaml")]
    result = CliRunner().invoke(cli, [*args, "--server", url, "--ca", str(ca)])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("trainjob.trainer.kubeflow.org/")
    assert lines[0].endswith(" created (mpigate: " + lines[0].split("(mpigate: ")[1])
    assert "mutation" in lines[0]
    denial = next(line for line in lines if line.startswith("Error from server (Forbidden)"))
    assert denial == (
        "Error from server (Forbidden): error when creating "
        f'"{trainjobs / "deny-over-quota.yaml"}": admission webhook "validate.team.mpigate.io" denied the '
        "request: mpigate denied TrainJob nlp-team/llm-pretrain-huge:"
    )
    assert "2 objects: 1 admitted, 1 denied" in result.stderr
    ok = CliRunner().invoke(
        cli, ["review", str(trainjobs / "minimal.yaml"), "--server", url, "--ca", str(ca)]
    )
    assert ok.exit_code == 0
    as_json = CliRunner().invoke(
        cli,
        ["review", str(trainjobs / "warn-latest-tag.yaml"), "--server", url, "--ca", str(ca), "-o", "json"],
    )
    data = json.loads(as_json.stdout)
    assert data[0]["allowed"] is True and data[0]["auditAnnotations"]["decision"] == "allowed-with-warnings"
    assert any(w.startswith("[MPG-IMG-002]") for w in data[0]["warnings"])


@pytest.mark.parametrize(
    "path",
    [
        REPO / "examples" / "trainjobs" / "deny-unknown-version.yaml",
        REPO / "examples" / "mpijobs" / "deny-mpijob-v1.yaml",
    ],
    ids=lambda p: p.stem,
)
def test_explain_review_and_the_webhook_deny_what_mpigate_does_not_understand_alike(
    example_webhook: tuple[str, Path], path: Path
) -> None:
    """Issue 16 item 9: MPIJobs were skipped with exit 0, other TrainJob versions judged as v1alpha1
    by explain and skipped by review. Now all three answer MPG-API-001, naming the apiVersion."""
    url, ca = example_webhook
    obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    named = f"mpigate does not understand {obj['kind']} {obj['apiVersion']}"
    explained = CliRunner().invoke(cli, ["explain", "--config", str(REPO), str(path), "-o", "json"])
    assert explained.exit_code == 1, explained.output
    (explanation,) = json.loads(explained.stdout)
    reviewed = CliRunner().invoke(cli, ["review", str(path), "--server", url, "--ca", str(ca), "-o", "json"])
    assert reviewed.exit_code == 1, reviewed.output
    (review_result,) = json.loads(reviewed.stdout)
    assert explanation["decision"]["allowed"] is False and review_result["allowed"] is False
    assert explanation["decision"]["message"] == review_result["message"]
    assert f"[MPG-API-001] apiVersion: {named}" in review_result["message"]
    assert review_result["auditAnnotations"]["rules"] == "MPG-API-001"


def test_review_reports_a_file_with_bad_yaml_as_explain_does_and_goes_on(
    example_webhook: tuple[str, Path], tmp_path: Path
) -> None:
    url, ca = example_webhook
    minimal = REPO / "examples" / "trainjobs" / "minimal.yaml"
    tabbed = tmp_path / "tabbed.yaml"
    tabbed.write_text(minimal.read_text(encoding="utf-8").replace("\n  name: ", "\n\tname: "), "utf-8")
    explained = CliRunner().invoke(cli, ["explain", "--config", str(REPO), str(tabbed)])
    assert explained.exit_code == 2
    location = f"{tabbed}:5:1: (document): invalid YAML: found character that cannot start any token"
    assert location in explained.stderr

    result = CliRunner().invoke(cli, ["review", str(tabbed), str(minimal), "--server", url, "--ca", str(ca)])
    assert result.exit_code == 2
    assert location in result.stderr
    assert "Traceback" not in result.output and "<unicode string>" not in result.output
    # the batch went on: the valid file behind the broken one was sent and admitted
    assert result.stdout.startswith("trainjob.trainer.kubeflow.org/minimal created")
    assert "1 objects: 1 admitted, 0 denied; 1 input not sent (see the errors above)" in result.stderr

    as_json = CliRunner().invoke(
        cli, ["review", str(tabbed), str(minimal), "--server", url, "--ca", str(ca), "-o", "json"]
    )
    assert as_json.exit_code == 2 and location in as_json.stderr
    assert [d["name"] for d in json.loads(as_json.stdout)] == ["minimal"]


def test_review_reports_empty_inputs_and_goes_on(example_webhook: tuple[str, Path], tmp_path: Path) -> None:
    url, ca = example_webhook
    minimal = REPO / "examples" / "trainjobs" / "minimal.yaml"
    empty = tmp_path / "empty.yaml"
    empty.write_text("# only a comment\n---\n", encoding="utf-8")
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "README.txt").write_text("not a manifest\n", encoding="utf-8")
    result = CliRunner().invoke(
        cli, ["review", str(empty), str(nothing), str(minimal), "--server", url, "--ca", str(ca)]
    )
    assert result.exit_code == 2
    assert f"{empty}:1:1: (document): holds no TrainJob or training runtime" in result.stderr
    assert (
        f"{nothing}: (directory): no *.yaml, *.yml or *.json files in it; nothing to judge" in result.stderr
    )
    assert result.stdout.startswith("trainjob.trainer.kubeflow.org/minimal created")
    assert "1 objects: 1 admitted, 0 denied; 2 inputs not sent (see the errors above)" in result.stderr

    # A directory stands for the manifests below it, as `kubectl apply -R -f DIR` reads them.
    job = yaml.safe_load(minimal.read_text(encoding="utf-8"))
    manifests = tmp_path / "manifests" / "nested"
    manifests.mkdir(parents=True)
    for suffix in ("yml", "json"):
        job["metadata"]["name"] = f"from-{suffix}"
        (manifests / f"job.{suffix}").write_text(json.dumps(job), encoding="utf-8")
    batch = CliRunner().invoke(cli, ["review", str(tmp_path / "manifests"), "--server", url, "--ca", str(ca)])
    assert batch.exit_code == 0, batch.output
    created = sorted(line.split()[0] for line in batch.stdout.splitlines() if " created" in line)
    assert created == ["trainjob.trainer.kubeflow.org/from-json", "trainjob.trainer.kubeflow.org/from-yml"]


def test_review_exits_2_when_the_webhook_cannot_be_reached(tmp_path: Path) -> None:
    job = REPO / "examples" / "trainjobs" / "minimal.yaml"
    result = CliRunner().invoke(cli, ["review", str(job), "--server", "https://127.0.0.1:9", "--insecure"])
    assert result.exit_code == 2
    assert "cannot reach the webhook" in result.stdout


def test_review_explains_a_certificate_it_cannot_trust(tmp_path: Path) -> None:
    service_only = tmp_path / "svc"
    assert CliRunner().invoke(cli, ["certs", "--out", str(service_only)]).exit_code == 0
    local = tmp_path / "local"
    issued = CliRunner().invoke(cli, ["certs", "--out", str(local), "--extra-name", "127.0.0.1"])
    assert issued.exit_code == 0, issued.output
    job = str(REPO / "examples" / "trainjobs" / "minimal.yaml")
    for certs, ca, expected in (
        (service_only, ["--ca", str(service_only / "ca.crt")], "`mpigate certs ... --extra-name 127.0.0.1`"),
        (local, [], "pass --ca with the CA that issued it"),
        (local, ["--ca", str(local / "ca.crt")], None),
    ):
        server = ThreadedWebhook(example_org_options(certs / "tls.crt", certs / "tls.key"))
        try:
            result = CliRunner().invoke(cli, ["review", job, "--server", server.server.url, *ca])
        finally:
            server.stop()
        if expected is None:
            assert result.exit_code == 0, result.output
        else:
            assert result.exit_code == 2, result.output
            assert "TLS verification of the webhook failed" in result.stdout
            assert expected in result.stdout


def test_serve_refuses_to_start_without_tls(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", "--config", str(REPO)])
    assert result.exit_code == 2
    assert "--tls-cert and --tls-key are required (or --insecure-dev for local work)" in result.output


def test_serve_says_how_to_make_the_missing_audit_key(tmp_path: Path) -> None:
    org_key = Path("/etc/mpigate/audit-key/key")  # the example org's spec.audit.signing.keyFile
    if org_key.exists():
        pytest.skip(f"{org_key} exists on this machine")
    certs = tmp_path / "certs"
    write_cert(trustme.CA(), certs)
    args = ["serve", "--config", str(REPO), "--tls-cert", str(certs / "tls.crt")]
    args += ["--tls-key", str(certs / "tls.key"), "--port", "0", "--audit-dir", str(tmp_path / "audit")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert f"spec.audit.signing.keyFile of the OrgPolicy): cannot read key file {org_key}" in result.output
    assert "`mpigate audit keygen --method ed25519 KEYFILE` and pass `--audit-key KEYFILE`" in result.output


async def read_until(
    stream: asyncio.StreamReader, event: str, seen: list[dict[str, Any]], timeout: float = 60
) -> dict[str, Any]:
    async def scan() -> dict[str, Any]:
        while True:
            line = await stream.readline()
            if not line:
                raise AssertionError(f"server exited before {event!r}: {seen[-5:]}")
            try:
                record = json.loads(line)
            except ValueError:
                continue
            seen.append(record)
            if record.get("event") == event:
                return record

    return await asyncio.wait_for(scan(), timeout)


GOLDEN = REPO / "tests" / "fixtures" / "render" / "golden"
KUEUE = "kueue.x-k8s.io/v1beta2"


def seed_example_cluster(kmock: kmock_lib.KubernetesEmulator) -> dict[str, Any]:
    """The example org's Kueue objects as ``mpigate render`` writes them (its golden output), a
    TrainJob and an MPIJob, so that every live read of a review of an nlp-team job succeeds.
    Returns nlp-team's ClusterQueue."""
    queues = list(yaml.safe_load_all((GOLDEN / "cluster" / "clusterqueues.yaml").read_text()))
    for cq in queues:
        kmock.objects[f"{KUEUE}/clusterqueues", None, cq["metadata"]["name"]] = cq
    for lq in yaml.safe_load_all((GOLDEN / "teams" / "nlp-team" / "queues.yaml").read_text()):
        if lq and lq["kind"] == "LocalQueue":
            kmock.objects[f"{KUEUE}/localqueues", "nlp-team", lq["metadata"]["name"]] = lq
    for api, kind in (("trainer.kubeflow.org/v1alpha1", "TrainJob"), ("kubeflow.org/v2beta1", "MPIJob")):
        kmock.objects[f"{api}/{kind.lower()}s", "cv-team", "other"] = {
            "apiVersion": api,
            "kind": kind,
            "metadata": {"name": "other", "namespace": "cv-team"},
        }
    return next(cq for cq in queues if cq["metadata"]["name"] == "nlp-team")


@pytest.mark.slow
async def test_sigterm_finishes_the_review_in_flight_and_records_it(
    kmock: kmock_lib.KubernetesEmulator, tmp_path: Path
) -> None:
    # Kueue holds the review's ClusterQueue GET until the server has started draining: SIGTERM
    # arrives in the middle of the review, whatever the machine's speed. Every other read of the
    # review succeeds (a real cluster's objects), so the review has to wait for this one: a read that
    # failed (the cohort LIST answered 404 when kmock served no ClusterQueues) ends the Kueue lookup
    # at once, and the review answered before SIGTERM on a busy machine.
    nlp_team = seed_example_cluster(kmock)
    held = {**nlp_team, "status": {"flavorsReservation": [
        {"name": "a100-eu", "resources": [{"name": "nvidia.com/gpu", "total": "5"}]},
    ]}}  # fmt: skip
    kueue_answers = asyncio.Event()

    async def hold() -> None:  # returns nothing: kmock streams a reaction's value into the body
        await kueue_answers.wait()

    kmock["get", f"/apis/{KUEUE}/clusterqueues/nlp-team"] << hold << held
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
                "clusters": [{"name": "fake", "cluster": {"server": str(kmock.url).rstrip("/")}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    ca = trustme.CA()
    cert, key = write_cert(ca, tmp_path / "tls")
    (tmp_path / "audit.key").write_bytes(generate_key("ed25519")[0])  # the example org signs with ed25519
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mpigate", "serve", "--config", str(REPO),
        "--tls-cert", str(cert), "--tls-key", str(key), "--host", "127.0.0.1", "--port", "0",
        "--kubeconfig", str(kubeconfig), "--live-timeout", "60s", "--deadline", "90s",
        "--audit-dir", str(tmp_path / "audit"), "--audit-key", str(tmp_path / "audit.key"),
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
        env={**os.environ, "KUBECONFIG": ""},
    )  # fmt: skip
    assert proc.stderr is not None
    seen: list[dict[str, Any]] = []
    try:
        listening = await read_until(proc.stderr, "listening", seen)
        url = listening["url"]
        client_ctx = ssl.create_default_context()
        ca.configure_trust(client_ctx)
        job = as_mutated(
            yaml.safe_load((REPO / "examples" / "trainjobs" / "llm-finetune.yaml").read_text()), REPO
        )
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx)) as http:

            async def review() -> tuple[int, dict[str, Any]]:
                async with http.post(url + "/validate", json=make_review(job, uid="in-flight")) as resp:
                    return resp.status, await resp.json()

            # Both job caches have listed (their WATCH follows the LIST): MPG-Q007's count is live.
            await wait_for(lambda: len([r for r in kmock if r.params.get("watch") == "true"]) >= 2)
            pending = asyncio.create_task(review())
            await wait_for(lambda: len(kmock["get", f"/apis/{KUEUE}/clusterqueues/nlp-team"]) > 0)
            proc.send_signal(signal.SIGTERM)
            await read_until(proc.stderr, "draining", seen)
            assert not pending.done()
            kueue_answers.set()
            status, body = await pending
        assert status == 200
        assert body["response"]["uid"] == "in-flight" and body["response"]["allowed"] is True
        # The answer comes from the held read (its 5 reserved A100s leave 11 of nlp-team's 16 free
        # for a 16-GPU job), and no lookup was unavailable.
        assert body["response"]["warnings"] == [
            "[MPG-Q008] nlp-team needs 5 more free GPUs of flavor a100-eu; borrowing, preemption and"
            " queue order can change this"
        ]
        await read_until(proc.stderr, "stopped", seen)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    reviews = [r for r in seen if r.get("event") == "review"]
    assert [(r["uid"], r["decision"], r["status"]) for r in reviews] == [
        ("in-flight", "allowed-with-warnings", 200)
    ]
    verify = CliRunner().invoke(
        cli, ["audit", "verify", str(tmp_path / "audit"), "--key", str(tmp_path / "audit.key")]
    )
    assert verify.exit_code == 0, verify.output
    assert "all verified" in verify.output
    records = [
        json.loads(line)
        for segment in sorted((tmp_path / "audit").rglob("*.jsonl"))
        for line in segment.read_text().splitlines()
    ]
    decisions = [r for r in records if r.get("stage") == "validate"]
    assert [(d["request"]["uid"], d["decision"], d["object"]["name"]) for d in decisions] == [
        ("in-flight", "allowed-with-warnings", "llm-finetune")
    ]
    # The record holds the figures of the read SIGTERM arrived during.
    (q008,) = [v for v in decisions[0]["violations"] if v["id"] == "MPG-Q008"]
    assert "the job asks 16 and 11 are free for it now" in q008["message"]


def test_serve_on_uvloop_without_uvloop_refuses_to_start_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    result = CliRunner().invoke(
        cli, ["serve", "--config", str(REPO), "--insecure-dev", "--port", "0", "--loop", "uvloop"]
    )
    assert result.exit_code == 2, result.output
    assert "--loop" in result.output and "uvloop is not installed" in result.output
    assert "Traceback" not in result.output
