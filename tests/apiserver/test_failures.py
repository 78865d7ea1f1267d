"""Failure modes as the API server sees them, through the install base's webhook configurations:
the webhook down (failurePolicy), slower than timeoutSeconds, another mutating webhook after
mpigate's (reinvocationPolicy), mpigate's patches against the CRD (a property over the example
jobs), and the install base itself: a change that stops routing a kind, version or operation is
caught."""

from __future__ import annotations

import base64
import copy
import http.server
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.admission.conftest import write_cert
from tests.admission.test_examples import expectation
from tests.conftest import REPO

from .admission import WebhookAdmission
from .cluster import WEBHOOK_SERVICE, Cluster, call, trainjobs_path

TRAINJOBS = sorted((REPO / "examples" / "trainjobs").glob("*.yaml"))
ALLOWED = [p for p in TRAINJOBS if expectation(p).allowed and "as:" not in p.read_text()]
OVER_QUOTA = yaml.safe_load((REPO / "examples" / "trainjobs" / "deny-over-quota.yaml").read_text())
MINIMAL = yaml.safe_load((REPO / "examples" / "trainjobs" / "minimal.yaml").read_text())


def named(obj: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["name"] = name
    return out


@contextmanager
def webhook_at(cluster: Cluster, port: int) -> Iterator[None]:
    """The webhook Service's endpoint moved to ``port`` for the duration."""
    before = cluster.api.admission.resolve[WEBHOOK_SERVICE]
    cluster.api.admission.resolve[WEBHOOK_SERVICE] = ("127.0.0.1", port)
    try:
        yield
    finally:
        cluster.api.admission.resolve[WEBHOOK_SERVICE] = before


@contextmanager
def admission(cluster: Cluster, edit: Callable[[list[dict[str, Any]]], None]) -> Iterator[None]:
    """The cluster's webhook configurations changed by ``edit`` for the duration."""
    configurations = copy.deepcopy(cluster.base.configurations)
    edit(configurations)
    before = cluster.api.admission
    cluster.api.admission = WebhookAdmission(configurations, before.resolve)
    try:
        yield
    finally:
        cluster.api.call(cluster.api.admission.close())
        cluster.api.admission = before


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stored_job(cluster: Cluster, name: str) -> dict[str, Any]:
    """A job mpigate admitted (stored suspended) and Kueue then admitted: Kueue's controller lifts
    the suspension (written to storage here, as its own write would be)."""
    reply = call(cluster, "POST", trainjobs_path("nlp-team"), named(MINIMAL, name))
    assert reply.status == 201, reply.body
    assert reply.body["spec"]["suspend"] is True
    running = copy.deepcopy(reply.body)
    running["spec"]["suspend"] = False
    return cluster.api.put(running)


def test_webhook_down_fails_closed_for_submissions_and_open_for_releases(cluster: Cluster) -> None:
    job = stored_job(cluster, "down-release")
    port = closed_port()
    with webhook_at(cluster, port):
        reply = call(cluster, "POST", trainjobs_path("nlp-team"), named(MINIMAL, "down-create"))
        assert reply.status == 500
        assert reply.body["reason"] == "InternalError"
        assert reply.body["message"] == (
            "Internal error occurred: "
            'failed calling webhook "mutate.trainjobs.mpigate.io": failed to call webhook: '
            'Post "https://mpigate-webhook.mpigate-system.svc:443/mutate?timeout=5s": dial tcp '
            f"127.0.0.1:{port}: connect: connection refused"
        )
        assert cluster.api.get("trainer.kubeflow.org", "trainjobs", "nlp-team", "down-create") is None
        # a label change is judged by validate.team (failurePolicy Fail): refused
        relabelled = copy.deepcopy(job)
        relabelled["metadata"]["labels"]["stage"] = "eval"
        reply = call(cluster, "PUT", trainjobs_path("nlp-team", "down-release"), relabelled)
        assert (
            reply.status == 500
            and 'failed calling webhook "validate.team.mpigate.io"' in reply.body["message"]
        )
        # suspending while editing runtimePatches is not only a release: judged, refused
        sneaky = copy.deepcopy(job)
        sneaky["spec"]["suspend"] = True
        sneaky["spec"]["runtimePatches"] = [
            p for p in job["spec"]["runtimePatches"] if p["manager"] != "mpigate.io/admission"
        ]
        reply = call(cluster, "PUT", trainjobs_path("nlp-team", "down-release"), sneaky)
        assert (
            reply.status == 500
            and 'failed calling webhook "validate.team.mpigate.io"' in reply.body["message"]
        )
        # suspending and deleting release resources: validate.release (failurePolicy Ignore) fails open
        suspended = copy.deepcopy(job)
        suspended["spec"]["suspend"] = True
        reply = call(cluster, "PUT", trainjobs_path("nlp-team", "down-release"), suspended)
        assert reply.status == 200, reply.body
        reply = call(cluster, "DELETE", trainjobs_path("nlp-team", "down-release"))
        assert reply.status == 200, reply.body
        assert any(
            v == "validate.release.mpigate.io"
            and k.startswith("failed-open.validating.webhook.admission.k8s.io/")
            for k, v in cluster.api.outcomes[-1].annotations.items()
        )
    assert cluster.api.get("trainer.kubeflow.org", "trainjobs", "nlp-team", "down-release") is None


@contextmanager
def silent_tls_server(cluster: Cluster) -> Iterator[int]:
    """A webhook endpoint with mpigate's certificate that completes TLS and never answers."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cluster.base.tls_cert), str(cluster.base.tls_key))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                held.append(ctx.wrap_socket(conn, server_side=True))
            except (OSError, ssl.SSLError):
                conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=10)
        for conn in held:
            conn.close()
        listener.close()


def test_webhook_slower_than_timeout_seconds(cluster: Cluster) -> None:
    """The API server gives up after the webhook's timeoutSeconds (5 s for submissions, failing
    closed; 3 s for releases, failing open) — never earlier."""
    job = stored_job(cluster, "slow-release")
    with silent_tls_server(cluster) as port, webhook_at(cluster, port):
        start = time.monotonic()
        reply = call(cluster, "POST", trainjobs_path("nlp-team"), named(MINIMAL, "slow-create"))
        assert time.monotonic() - start >= 5.0
        assert reply.status == 500
        assert reply.body["message"] == (
            "Internal error occurred: "
            'failed calling webhook "mutate.trainjobs.mpigate.io": failed to call webhook: '
            'Post "https://mpigate-webhook.mpigate-system.svc:443/mutate?timeout=5s": '
            "context deadline exceeded"
        )
        start = time.monotonic()
        reply = call(cluster, "DELETE", trainjobs_path("nlp-team", "slow-release"))
        assert time.monotonic() - start >= 3.0
        assert reply.status == 200 and reply.body["metadata"]["uid"] == job["metadata"]["uid"]


@settings(max_examples=40)
@given(
    path=st.sampled_from(ALLOWED),
    nodes=st.integers(min_value=1, max_value=4),
    gpus=st.sampled_from([None, 1, 2, 4, 8]),
    drop_labels=st.sets(st.sampled_from(["kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"])),
    env=st.lists(
        st.sampled_from(["OMPI_MCA_plm_rsh_args", "NCCL_DEBUG", "HF_HOME"]), max_size=2, unique=True
    ),
)
def test_mpigate_patches_never_make_an_example_job_invalid(
    cluster: Cluster, path: Any, nodes: int, gpus: int | None, drop_labels: set[str], env: list[str]
) -> None:
    """For CRD-valid variations of the allowed example jobs, the API server never answers with its
    own error after mpigate's patch: the outcome is mpigate's (201 or 403), no field mpigate adds
    is pruned by the CRD's schema, and the stored object is valid against it."""
    obj = yaml.safe_load(path.read_text())
    obj["metadata"]["name"] = "prop"
    trainer = obj["spec"].setdefault("trainer", {})
    trainer["numNodes"] = nodes
    if gpus is not None:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": gpus}}
    for label in drop_labels:
        obj["metadata"].get("labels", {}).pop(label, None)
    if env:
        trainer["env"] = [e for e in trainer.get("env", []) if e["name"] not in env] + [
            {"name": n, "value": "1"} for n in env
        ]
    crd = next(c for c in cluster.api.crds if c.kind == "TrainJob")
    assert crd.validate("v1alpha1", copy.deepcopy(obj), None) == []  # the input is valid
    reply = call(cluster, "POST", trainjobs_path(obj["metadata"]["namespace"], dry_run=True), obj)
    outcome = cluster.api.outcomes[-1]
    assert reply.status in (201, 403), reply.body
    if reply.status == 403:
        assert reply.body["message"].startswith(
            'admission webhook "validate.team.mpigate.io" denied the request: '
        )
    else:
        assert outcome.pruned == []
        assert crd.validate("v1alpha1", copy.deepcopy(reply.body), None) == []
        assert ("mutate.trainjobs.mpigate.io", 0) in outcome.called


def _drop_operation(op: str) -> Callable[[list[dict[str, Any]]], None]:
    def edit(configs: list[dict[str, Any]]) -> None:
        for config in configs:
            for hook in config["webhooks"]:
                for rule in hook["rules"]:
                    rule["operations"] = [o for o in rule["operations"] if o != op] or ["CONNECT"]

    return edit


def _set_rules(key: str, value: list[str]) -> Callable[[list[dict[str, Any]]], None]:
    def edit(configs: list[dict[str, Any]]) -> None:
        for config in configs:
            for hook in config["webhooks"]:
                for rule in hook["rules"]:
                    if "trainjobs" in rule["resources"]:
                        rule[key] = value

    return edit


def _team_selector(configs: list[dict[str, Any]]) -> None:
    for config in configs:
        for hook in config["webhooks"]:
            if hook.get("namespaceSelector"):
                hook["namespaceSelector"] = {"matchLabels": {"mpigate.io/team": "platform"}}


def test_the_install_base_routes_the_over_quota_job_to_mpigate(cluster: Cluster) -> None:
    reply = call(cluster, "POST", trainjobs_path("nlp-team", dry_run=True), OVER_QUOTA)
    assert reply.status == 403 and "[MPG-Q001]" in reply.body["message"]


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(_drop_operation("CREATE"), id="no-CREATE"),
        pytest.param(_set_rules("resources", ["trainingruntimes"]), id="no-trainjobs"),
        pytest.param(_set_rules("apiVersions", ["v1beta1"]), id="other-version"),
        pytest.param(_set_rules("apiGroups", ["kubeflow.org"]), id="other-group"),
        pytest.param(_team_selector, id="namespace-selector"),
    ],
)
def test_a_routing_change_lets_the_over_quota_job_through(cluster: Cluster, edit: Any) -> None:
    """What the suite would catch: with the install base's routing changed, the job every test
    above expects mpigate to deny is admitted — so those tests fail on such a change."""
    with admission(cluster, edit):
        reply = call(cluster, "POST", trainjobs_path("nlp-team", dry_run=True), OVER_QUOTA)
    assert reply.status == 201, reply.body
    assert not any(name.endswith(".mpigate.io") for name, _ in cluster.api.outcomes[-1].called)


@contextmanager
def labelling_webhook(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Another organisation's mutating webhook (a test double): adds the label
    ``acme.example/tools: "on"`` when it is missing. Yields its URL and caBundle."""
    ca = trustme.CA()
    cert, key = write_cert(ca, tmp_path / "labeler", "127.0.0.1")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            request = review["request"]
            labels = (request["object"].get("metadata") or {}).get("labels") or {}
            response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
            if "acme.example/tools" not in labels:
                ops = [{"op": "add", "path": "/metadata/labels/acme.example~1tools", "value": "on"}]
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
            body = json.dumps(
                {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        bundle = base64.b64encode(ca.cert_pem.bytes()).decode()
        yield f"https://127.0.0.1:{server.server_address[1]}/mutate", bundle
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _with_labeler(name: str, url: str, bundle: str) -> Callable[[list[dict[str, Any]]], None]:
    def edit(configs: list[dict[str, Any]]) -> None:
        configs.append({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "label.acme.example",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "clientConfig": {"url": url, "caBundle": bundle},
                "rules": [{"apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["*"],
                           "operations": ["CREATE"], "resources": ["trainjobs"]}],
            }],
        })  # fmt: skip

    return edit


@pytest.mark.parametrize(
    ("configuration", "calls"),
    [
        # after mpigate's configuration (sorted by name): its change reinvokes mpigate
        # (reinvocationPolicy: IfNeeded), which must leave the object as it is
        pytest.param(
            "zz-labeler",
            [
                ("mutate.trainjobs.mpigate.io", 0),
                ("label.acme.example", 0),
                ("mutate.trainjobs.mpigate.io", 1),
            ],
            id="after-mpigate",
        ),
        # before it: mpigate sees the label already, nothing changes after it, no second round
        pytest.param(
            "aa-labeler", [("label.acme.example", 0), ("mutate.trainjobs.mpigate.io", 0)], id="before-mpigate"
        ),
    ],
)
def test_another_mutating_webhook_and_reinvocation(
    cluster: Cluster, tmp_path: Path, configuration: str, calls: list[tuple[str, int]]
) -> None:
    name = f"reinvoked-{configuration}"
    with (
        labelling_webhook(tmp_path) as (url, bundle),
        admission(cluster, _with_labeler(configuration, url, bundle)),
    ):
        reply = call(cluster, "POST", trainjobs_path("nlp-team"), named(MINIMAL, name))
    assert reply.status == 201, reply.body
    outcome = cluster.api.outcomes[-1]
    assert [c for c in outcome.called if c[0].startswith(("mutate.", "label."))] == calls
    stored = reply.body
    assert stored["metadata"]["labels"]["acme.example/tools"] == "on"
    assert stored["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "nlp-team"
    managers = [p["manager"] for p in stored["spec"]["runtimePatches"]]
    assert managers.count("mpigate.io/admission") == 1
    assert outcome.pruned == []
    assert call(cluster, "DELETE", trainjobs_path("nlp-team", name)).status == 200
