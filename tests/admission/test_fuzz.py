"""Thousands of malformed AdmissionReviews over real TLS: the server stays up and answers
every one with 200/400/413/415 and valid JSON (an AdmissionReview echoing the uid when 200)."""

from __future__ import annotations

import copy
import http.client
import json
import shutil
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpigate.admission.client import make_review
from mpigate.admission.eventloop import LOOPS
from mpigate.admission.server import ServeOptions
from mpigate.admission.service import ServiceSettings

from .conftest import BASE_ORG, ThreadedWebhook, trainjob, write_cert

pytestmark = pytest.mark.slow
MAX_BODY = 256 * 1024
OK_STATUSES = {200, 400, 413, 415}


@pytest.fixture(scope="module", params=LOOPS)
def fuzz_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ThreadedWebhook, ssl.SSLContext]]:
    base = tmp_path_factory.mktemp("fuzz")
    ca = trustme.CA()
    cert, key = write_cert(ca, base / "tls")
    shutil.copytree(BASE_ORG, base / "org")
    options = ServeOptions(
        config=base / "org",
        tls_cert=cert,
        tls_key=key,
        host="127.0.0.1",
        port=0,
        max_body=MAX_BODY,
        settings=ServiceSettings(deadline=5.0),
        reload_interval=3600,
    )
    # the real engine: it must not fail on odd objects either; on each loop `serve --loop` offers
    webhook = ThreadedWebhook(options, loop=request.param)
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    yield webhook, ctx
    webhook.stop()


class Client:
    def __init__(self, port: int, ctx: ssl.SSLContext) -> None:
        self.port, self.ctx = port, ctx
        self.conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
        self.tried = 0
        self.sent = 0
        self.statuses: dict[int, int] = {}

    def post(self, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, Any]:
        self.tried += 1
        try:
            self.conn.request("POST", path, body=body, headers={"Content-Type": content_type})
            resp = self.conn.getresponse()
            raw = resp.read()
        except (ConnectionError, http.client.HTTPException):
            # The server may close a connection after a 413 it did not read to the end; that
            # is not a crash. Reconnect and require the next request to work.
            self.conn.close()
            self.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=30)
            self.statuses[-1] = self.statuses.get(-1, 0) + 1
            return -1, None
        self.sent += 1
        self.statuses[resp.status] = self.statuses.get(resp.status, 0) + 1
        assert resp.status in OK_STATUSES, (resp.status, raw[:500])
        data = json.loads(raw)  # every answer is JSON
        assert resp.getheader("X-Request-Id")
        return resp.status, data


@pytest.fixture(scope="module")
def client(fuzz_server: tuple[ThreadedWebhook, ssl.SSLContext]) -> Iterator[Client]:
    webhook, ctx = fuzz_server
    c = Client(webhook.server.port or 0, ctx)
    yield c
    print("fuzz answers by status:", dict(sorted(c.statuses.items())))
    # Which of the module's tests share this client depends on how pytest-xdist spreads them over
    # its workers (one module-scoped client per worker): at least one test's examples (600 or
    # 700), and most of what was sent answered (-1: a connection closed after a 413 unread)
    assert c.tried >= 600 and c.sent >= 0.75 * c.tried, f"{c.sent} of {c.tried} fuzz requests answered"
    status, body = c.post("/validate", json.dumps(make_review(trainjob(), uid="after")).encode())
    assert status == 200 and body["response"]["uid"] == "after"  # still up and judging
    assert body["response"]["auditAnnotations"]["decision"] in ("allowed", "allowed-with-warnings", "denied")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=25,
)

VALID = make_review(trainjob(), uid="fuzz-uid")


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(paths(v, (*prefix, i)))
    return out


VALID_PATHS = paths(VALID)


def check_review_answer(status: int, data: Any, sent: Any) -> None:
    if status != 200:
        assert data["kind"] == "Status" and data["code"] == status and data["message"]
        return
    assert data["apiVersion"] == "admission.k8s.io/v1" and data["kind"] == "AdmissionReview"
    assert data["response"]["uid"] == sent["request"]["uid"]
    assert isinstance(data["response"]["allowed"], bool)


FUZZ = settings(max_examples=700, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@FUZZ
@given(body=json_values)
def test_random_json(client: Client, body: Any) -> None:
    status, data = client.post("/validate", json.dumps(body).encode())
    assert status in (400, -1)
    assert data is None or (data["kind"] == "Status" and data["code"] == 400)


@FUZZ
@given(
    path=st.sampled_from(VALID_PATHS),
    value=json_values,
    delete=st.booleans(),
    stage=st.sampled_from(["/mutate", "/validate"]),
)
def test_valid_reviews_with_one_field_wrong(
    client: Client, path: tuple[Any, ...], value: Any, delete: bool, stage: str
) -> None:
    review = copy.deepcopy(VALID)
    target: Any = review
    for key in path[:-1]:
        target = target[key]
    if delete and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    status, data = client.post(stage, json.dumps(review).encode())
    if status == -1:
        return
    if (
        isinstance(review.get("request"), dict)
        and isinstance(review["request"].get("uid"), str)
        and status == 200
    ):
        check_review_answer(status, data, review)
    else:
        assert status == 400 or status == 200


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    kind=st.sampled_from(["bytes", "huge-string", "deep", "content-type"]),
    size=st.sampled_from([1, 1000, 100_000, MAX_BODY + 1, 1_000_000]),
    raw=st.binary(max_size=200),
    content_type=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40),
)
def test_bytes_huge_strings_and_wrong_types(
    client: Client, kind: str, size: int, raw: bytes, content_type: str
) -> None:
    if kind == "bytes":
        status, _ = client.post("/validate", raw)
        assert status in (400, -1)
    elif kind == "huge-string":
        review = copy.deepcopy(VALID)
        review["request"]["object"]["metadata"]["name"] = "x" * size
        body = json.dumps(review).encode()
        status, data = client.post("/validate", body)
        assert status in ((413, -1) if len(body) > MAX_BODY else (200,))
        if status == 200:
            check_review_answer(status, data, review)
    elif kind == "deep":
        depth = min(size, 50_000)
        status, _ = client.post("/mutate", b"[" * depth + b"]" * depth)
        assert status in ((413, -1) if 2 * depth > MAX_BODY else (400,))
    else:
        status, _ = client.post("/validate", json.dumps(VALID).encode(), content_type=content_type or "x/y")
        is_json = content_type.split(";")[0].strip().lower() == "application/json"
        assert status == (200 if is_json else 415)
