"""The webhook over real TLS: answers, errors, health, metrics, request ids and logs."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mpigate.admission.client import make_review
from mpigate.admission.logjson import JsonFormatter
from mpigate.admission.recorder import MemoryRecorder
from mpigate.admission.server import ServeOptions, WebhookServer

from .conftest import StartWebhook, trainjob
from .stub_engine import DENY, RAISE, WARN


async def post(
    http: aiohttp.ClientSession, server: WebhookServer, path: str, body: Any, **kw: Any
) -> tuple[int, dict[str, Any], aiohttp.ClientResponse]:
    data = json.dumps(body).encode() if isinstance(body, dict | list) else body
    headers = kw.pop("headers", {"Content-Type": "application/json"})
    async with http.post(server.url + path, data=data, headers=headers, **kw) as resp:
        return resp.status, await resp.json(content_type=None), resp


async def test_create_is_mutated_then_validated(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    recorder = MemoryRecorder()
    server = await start_webhook(recorder=recorder)
    job = trainjob()
    status, body, resp = await post(http, server, "/mutate", make_review(job, uid="uid-1"))
    assert status == 200 and resp.headers["X-Request-Id"]
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == "uid-1" and response["allowed"] is True
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/metadata/labels/mpigate.io~1team", "value": "alpha"}
    ]
    assert response["auditAnnotations"]["revision"] == server.store.current.revision  # type: ignore[union-attr]
    status, body, _ = await post(http, server, "/validate", make_review(job, uid="uid-2", dry_run=True))
    assert status == 200
    assert body["response"] == {
        "uid": "uid-2",
        "allowed": True,
        "auditAnnotations": {
            "decision": "allowed",
            "rules": "",
            "revision": server.store.current.revision,  # type: ignore[union-attr]
            "dry-run": "true",
        },
    }
    assert [(r.stage, r.request.uid, r.request.dry_run) for r in recorder.records] == [
        ("mutate", "uid-1", False),
        ("validate", "uid-2", True),
    ]


async def test_denial_is_403_forbidden_with_warnings(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    server = await start_webhook()
    job = trainjob(**{DENY: "quota", WARN: "image tag latest"})
    _, body, _ = await post(http, server, "/validate", make_review(job, uid="u"))
    response = body["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "Forbidden"
    assert response["status"]["message"] == (
        "mpigate denied TrainJob alpha/smoke:\n  [MPG-Q001] spec.trainer: denied because quota"
    )
    assert response["warnings"] == ["[MPG-IMG-002] image tag latest"]
    assert response["auditAnnotations"]["decision"] == "denied"
    assert response["auditAnnotations"]["rules"] == "MPG-IMG-002,MPG-Q001"


async def test_mutate_on_update_and_delete_allows_without_patch(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    recorder = MemoryRecorder()
    server = await start_webhook(recorder=recorder)
    job = trainjob()
    for review in (
        make_review(job, operation="UPDATE", old=job, uid="u1"),
        make_review(None, operation="DELETE", old=job, uid="u2"),
    ):
        status, body, _ = await post(http, server, "/mutate", review)
        assert status == 200
        assert body["response"] == {"uid": review["request"]["uid"], "allowed": True}
    assert recorder.records == ()
    # DELETE is judged (and recorded) by /validate.
    _, body, _ = await post(
        http, server, "/validate", make_review(None, operation="DELETE", old=job, uid="u3")
    )
    assert body["response"]["allowed"] is True
    assert [r.request.operation for r in recorder.records] == ["DELETE"]


@pytest.mark.parametrize(
    ("data", "headers", "status", "fragment"),
    [
        (b"{}", {"Content-Type": "text/plain"}, 415, "content type must be application/json, got text/plain"),
        (b"{}", {}, 415, "content type must be application/json"),
        (b"{not json", {"Content-Type": "application/json"}, 400, "body is not valid JSON"),
        (b"[]", {"Content-Type": "application/json"}, 400, "expected an AdmissionReview object, got array"),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}
            ).encode(),
            {"Content-Type": "application/json; charset=utf-8"},
            400,
            "request.uid: must be a non-empty string",
        ),
    ],
)
async def test_bad_requests_get_a_clear_json_error(
    start_webhook: StartWebhook,
    http: aiohttp.ClientSession,
    data: bytes,
    headers: dict[str, str],
    status: int,
    fragment: str,
) -> None:
    server = await start_webhook()
    got, body, resp = await post(http, server, "/validate", data, headers=headers)
    assert got == status
    assert body["kind"] == "Status" and body["code"] == status
    assert fragment in body["message"]
    assert f"(request id {resp.headers['X-Request-Id']})" in body["message"]


async def test_body_over_the_limit_is_413(start_webhook: StartWebhook, http: aiohttp.ClientSession) -> None:
    server = await start_webhook(max_body=64 * 1024)
    review = make_review(trainjob(), uid="u")
    review["request"]["object"]["metadata"]["annotations"] = {"big": "x" * 70_000}
    status, body, _ = await post(http, server, "/validate", review)
    assert status == 413 and "exceeds 65536 bytes" in body["message"]

    async def chunks() -> Any:  # no Content-Length: the limit applies while reading
        yield json.dumps(review).encode()

    status, body, _ = await post(http, server, "/validate", chunks())  # type: ignore[arg-type]
    assert status == 413


async def test_known_uid_with_bad_content_is_a_denying_review(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    server = await start_webhook()
    review = make_review(trainjob(), uid="u-9")
    review["request"]["object"] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    status, body, _ = await post(http, server, "/validate", review)
    assert status == 200
    response = body["response"]
    assert response["uid"] == "u-9" and response["allowed"] is False
    assert response["status"]["code"] == 400 and response["status"]["reason"] == "BadRequest"
    assert (
        "request.object: expected a TrainJob (trainer.kubeflow.org/v1alpha1)" in response["status"]["message"]
    )


async def test_engine_failure_is_500_without_traceback(
    start_webhook: StartWebhook, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start_webhook()
    with caplog.at_level(logging.ERROR, "mpigate"):
        status, body, resp = await post(
            http, server, "/validate", make_review(trainjob(**{RAISE: "1"}), uid="u")
        )
    assert status == 500
    assert body["message"] == (
        f"mpigate failed to evaluate the request (internal error) (request id {resp.headers['X-Request-Id']})"
    )
    assert "Traceback" not in json.dumps(body)
    logged = [r for r in caplog.records if r.getMessage() == "policy evaluation failed"]
    assert logged and logged[0].exc_info is not None
    assert logged[0].fields["request_id"] == resp.headers["X-Request-Id"]  # type: ignore[attr-defined]


async def test_health_ready_and_unknown_paths(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    server = await start_webhook()
    async with http.get(server.url + "/healthz") as resp:
        assert resp.status == 200 and (await resp.json())["status"] == "ok"
    async with http.get(server.url + "/readyz") as resp:
        assert resp.status == 200
        assert (await resp.json()) == {"status": "ready", "revision": server.store.current.revision}  # type: ignore[union-attr]
    async with http.get(server.url + "/nope") as resp:
        assert resp.status == 404 and (await resp.json())["kind"] == "Status"
    async with http.get(server.url + "/validate") as resp:
        assert resp.status == 405 and resp.headers["X-Request-Id"]


async def test_without_a_valid_config_the_server_is_not_ready_and_answers_503(
    start_webhook: StartWebhook, http: aiohttp.ClientSession, org: Path
) -> None:
    (org / "quotas" / "alpha.yaml").write_text(
        "apiVersion: mpigate.io/v1alpha1\nkind: TeamQuota\nmetadata: {}\n"
    )
    server = await start_webhook()
    async with http.get(server.url + "/readyz") as resp:
        body = await resp.json()
        assert resp.status == 503 and body["status"] == "no config" and "error" in body["error"]
    status, body, _ = await post(http, server, "/validate", make_review(trainjob(), uid="u"))
    assert status == 503 and body["reason"] == "ServiceUnavailable"
    assert "mpigate has no valid config to judge with" in body["message"]


async def test_metrics_count_requests_rules_and_bad_requests(
    start_webhook: StartWebhook, http: aiohttp.ClientSession
) -> None:
    server = await start_webhook()
    await post(http, server, "/validate", make_review(trainjob(**{DENY: "x"}), uid="a"))
    await post(http, server, "/validate", make_review(trainjob(), uid="b"))
    await post(http, server, "/mutate", make_review(trainjob(), uid="c"))
    await post(http, server, "/validate", b"nope")
    async with http.get(server.url + "/metrics") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    lines = set(text.splitlines())
    revision = server.store.current.revision  # type: ignore[union-attr]
    expected = {
        'mpigate_admission_requests_total{decision="denied",endpoint="validate",'
        'kind="TrainJob",operation="CREATE"} 1.0',
        'mpigate_admission_requests_total{decision="allowed",endpoint="validate",'
        'kind="TrainJob",operation="CREATE"} 1.0',
        'mpigate_admission_requests_total{decision="mutated",endpoint="mutate",'
        'kind="TrainJob",operation="CREATE"} 1.0',
        'mpigate_rule_hits_total{mode="enforce",rule="MPG-Q001"} 1.0',
        'mpigate_bad_requests_total{endpoint="validate",reason="json"} 1.0',
        f'mpigate_config_info{{revision="{revision}"}} 1.0',
        'mpigate_admission_duration_seconds_bucket{endpoint="validate",le="10.0"} 3.0',
        "mpigate_config_reloads_total 1.0",
    }
    assert expected <= lines, expected - lines


def tls12_client(ca_ctx: ssl.SSLContext, ciphers: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(ciphers)
    return ctx


async def test_tls_is_1_2_or_newer_with_forward_secret_aead_ciphers_and_no_plaintext(
    start_webhook: StartWebhook, client_ssl: ssl.SSLContext
) -> None:
    server = await start_webhook()
    assert server.ssl_context is not None
    assert server.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_2
    _, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_ssl)
    assert writer.get_extra_info("ssl_object").version() == "TLSv1.3"
    writer.close()
    good = tls12_client(client_ssl, "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256")
    _, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=good)
    tls = writer.get_extra_info("ssl_object")
    assert tls.version() == "TLSv1.2" and "GCM" in tls.cipher()[0] and "ECDHE" in tls.cipher()[0]
    writer.close()
    # CBC with SHA-1 MACs (which a permissive server would accept from this client): refused.
    weak = tls12_client(client_ssl, "ECDHE-ECDSA-AES128-SHA:ECDHE-RSA-AES128-SHA")
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        await asyncio.open_connection("127.0.0.1", server.port, ssl=weak)
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            async with plain.get(f"http://127.0.0.1:{server.port}/healthz") as resp:
                await resp.read()


async def test_each_review_is_logged_as_one_json_line_with_its_request_id(
    start_webhook: StartWebhook, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start_webhook()
    with caplog.at_level(logging.INFO, "mpigate.admission"):
        _, _, resp = await post(
            http,
            server,
            "/validate",
            make_review(trainjob(**{DENY: "x"}), uid="u-log"),
            headers={"Content-Type": "application/json", "X-Request-Id": "req-42"},
        )
    assert resp.headers["X-Request-Id"] == "req-42"
    records = [r for r in caplog.records if getattr(r, "fields", {}).get("event") == "review"]
    assert len(records) == 1
    line = json.loads(JsonFormatter().format(records[0]))
    assert line["request_id"] == "req-42" and line["uid"] == "u-log"
    assert line["decision"] == "denied" and line["rules"] == ["MPG-Q001"] and line["status"] == 200
    assert line["namespace"] == "alpha" and line["name"] == "smoke" and line["level"] == "info"
    assert line["duration_ms"] > 0


async def test_plain_http_only_with_insecure_dev_on_loopback(org: Path) -> None:
    with pytest.raises(ValueError, match=r"binds only to 127\.0\.0\.1"):
        WebhookServer(ServeOptions(config=org, insecure_dev=True, host="0.0.0.0"))
    with pytest.raises(ValueError, match="TLS certificate and key are required"):
        WebhookServer(ServeOptions(config=org, host="127.0.0.1"))
    server = WebhookServer(
        ServeOptions(config=org, insecure_dev=True, host="127.0.0.1", port=0), evaluator=None
    )
    await server.start()
    try:
        assert server.url.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as plain, plain.get(server.url + "/readyz") as resp:
            assert resp.status == 200
    finally:
        await server.stop()


async def test_the_config_served_is_recorded_at_start_and_at_every_reload(
    start_webhook: StartWebhook, org: Path
) -> None:
    # a compliance report needs what each revision in force enforced (issue 19)
    recorder = MemoryRecorder()
    server = await start_webhook(recorder=recorder)
    first = server.store.current.revision  # type: ignore[union-attr]
    assert recorder.configs == [first]
    org_file = org / "policies" / "org.yaml"
    org_file.write_text(org_file.read_text(encoding="utf-8") + "\n# reviewed\n", encoding="utf-8")
    await server.check_reload()
    second = server.store.current.revision  # type: ignore[union-attr]
    assert second != first
    assert recorder.configs == [first, second]
    await server.check_reload()  # nothing changed: nothing recorded
    assert recorder.configs == [first, second]
