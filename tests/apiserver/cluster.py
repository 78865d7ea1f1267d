"""A cluster for client tests: the install base as an operator installs it (``mpigate init
--install-base``, ``mpigate certs`` for the caBundle, ``mpigate render`` for the team namespaces),
the real mpigate webhook server on loopback with that certificate, and the API server emulator in
front of it with a kubeconfig that trusts it."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
import yaml
from click.testing import CliRunner

from mpigate.admission.recorder import MemoryRecorder
from mpigate.admission.server import ServeOptions
from mpigate.cli import cli
from tests.admission.conftest import ThreadedWebhook, write_cert
from tests.conftest import REPO, TODAY

from .admission import UserInfo, WebhookAdmission
from .crd import load_crds
from .server import ApiServer

# The data scientists and admins the kubeconfig users stand for (tokens are the user names).
USERS = {
    "jane": UserInfo("jane@acme.example", ("nlp-team-devs", "system:authenticated")),
    "omar": UserInfo("omar@acme.example", ("cv-team-devs", "system:authenticated")),
    "admin": UserInfo("platform-admin@acme.example", ("platform-admins", "system:authenticated")),
}
WEBHOOK_SERVICE = ("mpigate-system", "mpigate-webhook", 443)


def cli_run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def kustomize_documents(directory: Path) -> list[dict[str, Any]]:
    """The objects of a kustomization: its ``resources`` (files, or directories with their own
    kustomization), in order — what ``kubectl apply -k`` sends, without transformers (the install
    base's only transformer is the image tag, which touches no webhook configuration)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            docs.extend(kustomize_documents(path))
        else:
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
    return docs


@dataclass
class InstallBase:
    """What an operator has after installing mpigate: the webhook configurations (with the
    caBundle set), the serving certificate, and the rendered tree."""

    directory: Path
    configurations: list[dict[str, Any]]
    tls_cert: Path
    tls_key: Path
    rendered: Path


def install_base(work: Path, *, edit: Callable[[list[dict[str, Any]]], None] | None = None) -> InstallBase:
    """``mpigate init --install-base`` + ``mpigate certs`` (caBundle, as docs/operations.md says for
    clusters without cert-manager) + ``mpigate render`` of the example org. ``edit`` changes the
    loaded configurations (a test showing that a routing change is caught)."""
    cli_run("init", str(work / "org"), "--install-base")
    bundle = cli_run(
        "certs",
        "--service",
        WEBHOOK_SERVICE[1],
        "--namespace",
        WEBHOOK_SERVICE[0],
        "--out",
        str(work / "certs"),
    ).strip()
    base64.b64decode(bundle, validate=True)
    docs = kustomize_documents(work / "org" / "webhooks")
    configurations = [
        d for d in docs if d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    ]
    assert configurations, "the install base has no webhook configurations"
    for config in configurations:
        for hook in config["webhooks"]:
            hook["clientConfig"]["caBundle"] = bundle
    if edit is not None:
        edit(configurations)
    cli_run("render", str(REPO), "-o", str(work / "deploy"), "--today", TODAY.isoformat())
    return InstallBase(
        work / "org", configurations, work / "certs" / "tls.crt", work / "certs" / "tls.key", work / "deploy"
    )


@dataclass
class Cluster:
    api: ApiServer
    webhook: ThreadedWebhook | None
    recorder: MemoryRecorder
    base: InstallBase
    kubeconfig: Path
    ca_file: Path
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        self.api.stop()
        if self.webhook is not None:
            self.webhook.stop()
        for close in self.closers:
            close()


def start_webhook(base: InstallBase, recorder: MemoryRecorder) -> ThreadedWebhook:
    """The real mpigate webhook server (in process, as tests/admission runs it) with the serving
    certificate ``mpigate certs`` issued, judging with the example org on the fixtures' day."""
    options = ServeOptions(
        config=REPO,
        tls_cert=base.tls_cert,
        tls_key=base.tls_key,
        host="127.0.0.1",
        port=0,
        reload_interval=3600,
    )
    moment = dt.datetime.combine(TODAY, dt.time(12, 0), dt.UTC)
    return ThreadedWebhook(options, recorder=recorder, clock=lambda: moment)


def start_cluster(
    work: Path,
    upstream: Path,
    *,
    webhook_port: int | None = None,
    edit: Callable[[list[dict[str, Any]]], None] | None = None,
) -> Cluster:
    """Install base, webhook (unless ``webhook_port`` names where a webhook stands instead), API
    server with the Trainer CRDs, namespaces and runtimes, and a kubeconfig per user."""
    base = install_base(work, edit=edit)
    recorder = MemoryRecorder()
    webhook = None
    if webhook_port is None:
        webhook = start_webhook(base, recorder)
        webhook_port = int(webhook.server.url.rsplit(":", 1)[1].rstrip("/"))
    admission = WebhookAdmission(base.configurations, {WEBHOOK_SERVICE: ("127.0.0.1", webhook_port)})
    ca = trustme.CA()
    cert, key = write_cert(ca, work / "apiserver", "127.0.0.1")
    ca_file = work / "apiserver" / "ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    api = ApiServer(load_crds(upstream / "trainer" / "crds"), admission, cert, key, users=dict(USERS))
    # what GitOps applied before anyone submits: the rendered namespaces, the org's runtimes
    for path in sorted(base.rendered.glob("teams/*/namespaces.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Namespace":
                api.put(doc)
    for name in ("research", "sandbox", "kubeflow-system"):
        if api.namespace_labels(name) is None:
            api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    for path in sorted((REPO / "policies" / "runtimes").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") == "ClusterTrainingRuntime":
            crd = next(c for c in api.crds if c.kind == "ClusterTrainingRuntime")
            errors = crd.validate("v1alpha1", doc, None)
            assert not errors, f"{path.name}: {errors}"
            api.put(doc)
    url = api.start()
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(kubeconfig_for(url, ca_file)))
    return Cluster(api, webhook, recorder, base, kubeconfig, ca_file)


def kubeconfig_for(url: str, ca_file: Path) -> dict[str, Any]:
    ca_data = base64.b64encode(ca_file.read_bytes()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url, "certificate-authority-data": ca_data}}],
        "users": [{"name": token, "user": {"token": token}} for token in USERS],
        "contexts": [
            {"name": token, "context": {"cluster": "emulator", "user": token, "namespace": "nlp-team"}}
            for token in USERS
        ],
        "current-context": "jane",
    }


def cluster_fixture(work: Path, upstream: Path) -> Iterator[Cluster]:
    cluster = start_cluster(work, upstream)
    try:
        yield cluster
    finally:
        cluster.close()


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    warnings: list[str]


def call(
    cluster: Cluster,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str = "jane",
    content_type: str = "application/json",
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """One HTTPS request to the emulator as a client library makes it (bearer token, the
    emulator's CA trusted, ``headers`` such as Impersonate-User); the ``Warning`` headers' texts
    unquoted."""
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(cluster.api.url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", content_type)
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=120) as resp:
            status, raw, headers = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        status, raw, headers = exc.code, exc.read(), exc.headers
    warnings = [
        re.sub(r"\\(.)", r"\1", h.encode("latin-1").decode("utf-8")[len('299 - "') : -1])
        for h in headers.get_all("Warning") or []
    ]
    return Reply(status, json.loads(raw) if raw else {}, warnings)


def trainjobs_path(namespace: str, name: str = "", *, dry_run: bool = False) -> str:
    path = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs"
    if name:
        path += f"/{name}"
    return path + ("?dryRun=All" if dry_run else "")
