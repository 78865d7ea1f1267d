#!/usr/bin/env python3
"""Record which Kubernetes API requests the kubeflow SDK's TrainerClient makes, per method.

Runs the real SDK (``pip install kubeflow==0.5.0`` into a scratch venv and run this script with
that venv's python) against a fake API server on loopback that answers every request the SDK makes
with a plausible object and records it as the RBAC request attributes the API server would check:
verb, API group, resource, subresource, namespace. The result is the fixture
``tests/fixtures/rbac/kubeflow-sdk-<version>.yaml``, which ``tests/render/test_rbac_clients.py``
evaluates against the rendered personas.

    /tmp/sdk/bin/python scripts/record_sdk_calls.py > tests/fixtures/rbac/kubeflow-sdk-0.5.0.yaml
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

NAMESPACE = "nlp-team"
RUNTIME = "mpi-openmpi-gpu"
JOB = "sdk-job"
POD = f"{JOB}-launcher-0-0-abcde"  # with mpirun, the launcher is step node-0
TRAINER = "/apis/trainer.kubeflow.org/v1alpha1"
CREATED = "2026-11-22T12:00:00Z"

RUNTIME_OBJECT: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": RUNTIME, "labels": {"trainer.kubeflow.org/framework": "openmpi"}},
    "spec": {
        "mlPolicy": {"numNodes": 1, "mpi": {"numProcPerNode": 1, "mpiImplementation": "OpenMPI"}},
        "template": {
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {
                            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                            "spec": {
                                "template": {
                                    "spec": {"containers": [{"name": "node", "image": "registry.example/mpi:1"}]}
                                }
                            },
                        },
                    }
                ]
            }
        },
    },
}

TRAINJOB: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": JOB, "namespace": NAMESPACE, "creationTimestamp": CREATED},
    "spec": {"runtimeRef": {"name": RUNTIME, "kind": "ClusterTrainingRuntime"}, "trainer": {"numNodes": 1}},
    "status": {"conditions": [{"type": "Complete", "status": "True", "reason": "Done", "message": "",
                               "lastTransitionTime": CREATED}]},
}

POD_OBJECT: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": POD,
        "namespace": NAMESPACE,
        "creationTimestamp": CREATED,
        "labels": {
            "jobset.sigs.k8s.io/jobset-name": JOB,
            "jobset.sigs.k8s.io/replicatedjob-name": "launcher",
            "batch.kubernetes.io/job-completion-index": "0",
        },
    },
    "spec": {"containers": [{"name": "node", "image": "registry.example/mpi:1"}]},
    "status": {"phase": "Succeeded"},
}

EVENT: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Event",
    "metadata": {"name": f"{JOB}.1", "namespace": NAMESPACE},
    "involvedObject": {"kind": "TrainJob", "name": JOB, "namespace": NAMESPACE},
    "reason": "Created",
    "message": "created",
    "firstTimestamp": CREATED,
}


def attributes(method: str, target: str) -> dict[str, Any]:
    """The request as RBAC sees it (k8s.io/apiserver pkg/endpoints/request RequestInfoFactory)."""
    url = urlsplit(target)
    parts = [p for p in url.path.split("/") if p]
    query = parse_qs(url.query)
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    namespace = None
    if rest and rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    if method == "GET":
        verb = ("watch" if query.get("watch") == ["true"] else "list") if name is None else "get"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "delete")
        if method == "DELETE" and name is None:
            verb = "deletecollection"
    out: dict[str, Any] = {"verb": verb, "group": group, "resource": resource}
    if subresource:
        out["subresource"] = subresource
    out["namespace"] = namespace
    return out


class Api(BaseHTTPRequestHandler):
    calls: list[dict[str, Any]] = []

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _answer(self, status: int, body: Any, text: bool = False) -> None:
        data = body.encode() if text else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        Api.calls.append(attributes(self.command, self.path))
        path = urlsplit(self.path).path
        ns = f"/namespaces/{NAMESPACE}"
        if path.endswith("/configmaps/kubeflow-trainer-public"):
            return self._answer(200, {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "x"},
                                      "data": {"kubeflow_trainer_version": "2.3.0"}})
        if path == f"{TRAINER}/clustertrainingruntimes":
            return self._answer(200, {"kind": "ClusterTrainingRuntimeList", "apiVersion": "trainer.kubeflow.org/v1alpha1",
                                      "metadata": {}, "items": [RUNTIME_OBJECT]})
        if path == f"{TRAINER}/clustertrainingruntimes/{RUNTIME}":
            return self._answer(200, RUNTIME_OBJECT)
        if path == f"{TRAINER}{ns}/trainingruntimes":
            return self._answer(200, {"kind": "TrainingRuntimeList", "apiVersion": "trainer.kubeflow.org/v1alpha1",
                                      "metadata": {}, "items": []})
        if path.startswith(f"{TRAINER}{ns}/trainingruntimes/"):
            return self._answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                                      "reason": "NotFound", "message": "not found"})
        if path == f"{TRAINER}{ns}/trainjobs":
            if self.command == "POST":
                return self._answer(201, TRAINJOB)
            return self._answer(200, {"kind": "TrainJobList", "apiVersion": "trainer.kubeflow.org/v1alpha1",
                                      "metadata": {}, "items": [TRAINJOB]})
        if path.startswith(f"{TRAINER}{ns}/trainjobs/"):
            if self.command == "DELETE":
                return self._answer(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
            return self._answer(200, TRAINJOB)
        if path == f"/api/v1{ns}/pods":
            return self._answer(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [POD_OBJECT]})
        if path == f"/api/v1{ns}/pods/{POD}/log":
            return self._answer(200, "step 1\nstep 2\n", text=True)
        if path == f"/api/v1{ns}/events":
            return self._answer(200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": [EVENT]})
        return self._answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                                  "reason": "NotFound", "message": f"fake API: {self.command} {path}"})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


def main() -> None:
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient
    from kubeflow.trainer.types import types
    from kubernetes import client

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"

    recorded: dict[str, list[dict[str, Any]]] = {}

    def record(name: str, call: Any) -> None:
        Api.calls = []
        call()
        unique: list[dict[str, Any]] = []
        for c in Api.calls:
            if c not in unique:
                unique.append(c)
        recorded[name] = unique

    holder: dict[str, Any] = {}

    def init() -> None:
        holder["c"] = TrainerClient(
            backend_config=KubernetesBackendConfig(namespace=NAMESPACE, client_configuration=configuration)
        )

    record("TrainerClient()", init)
    tc = holder["c"]
    record("list_runtimes", tc.list_runtimes)
    record("get_runtime", lambda: tc.get_runtime(RUNTIME))
    record(
        "train",
        lambda: tc.train(
            runtime=RUNTIME,
            trainer=types.CustomTrainerContainer(image="registry.example/train:1", num_nodes=2),
        ),
    )
    record("list_jobs", tc.list_jobs)
    record("get_job", lambda: tc.get_job(JOB))
    record("get_job_logs", lambda: list(tc.get_job_logs(JOB)))
    record("get_job_logs(follow=True)", lambda: list(tc.get_job_logs(JOB, follow=True)))
    record("wait_for_job_status", lambda: tc.wait_for_job_status(JOB, timeout=4, polling_interval=1))
    record("get_job_events", lambda: tc.get_job_events(JOB))
    record("delete_job", lambda: tc.delete_job(JOB))
    server.shutdown()
    header = (
        f"# Kubernetes API requests of the kubeflow SDK {version('kubeflow')} (TrainerClient, Kubernetes backend),\n"
        "# per method, as RBAC request attributes. Recorded by scripts/record_sdk_calls.py against a fake\n"
        "# API server; do not edit by hand.\n"
    )
    sys.stdout.write(header + yaml.safe_dump({"sdk": f"kubeflow {version('kubeflow')}", "methods": recorded},
                                             sort_keys=False))


if __name__ == "__main__":
    main()
