"""The rendered personas against what real clients do: the kubeflow SDK's recorded API requests
(tests/fixtures/rbac/kubeflow-sdk-0.5.0.yaml, from scripts/record_sdk_calls.py) and kubectl's for
each persona's tasks, evaluated on the rendered ClusterRoles and bindings with the RBAC authorizer
model of ``rbac_eval`` (docs/rbac.md has the table)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from mpigate.config import Config
from mpigate.render import render
from tests.conftest import FIXTURES, TODAY
from tests.policy.helpers import example_org

from .rbac_eval import Authorizer, Identity

SDK_CALLS = FIXTURES / "rbac" / "kubeflow-sdk-0.5.0.yaml"


@dataclass(frozen=True)
class Request:
    """RBAC request attributes (k8s.io/apiserver authorizer.AttributesRecord)."""

    verb: str
    group: str
    resource: str
    namespace: str | None
    subresource: str = ""

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else " (cluster)"
        return f"{self.verb} {self.group or 'core'}/{self.path}{where}"

    @property
    def path(self) -> str:
        """``pods/log`` style, as the evaluator takes it."""
        return self.resource + (f"/{self.subresource}" if self.subresource else "")


def _r(verb: str, group: str, resource: str, ns: str | None = "NS", sub: str = "") -> Request:
    return Request(verb, group, resource, ns, sub)


# kubectl, read from k8s.io/kubectl: what each command asks the API server (discovery aside, which
# every authenticated user may read: system:discovery).
KUBECTL: dict[str, tuple[Request, ...]] = {
    "kubectl apply -f trainjob.yaml": (
        _r("get", "trainer.kubeflow.org", "trainjobs"),
        _r("create", "trainer.kubeflow.org", "trainjobs"),
        _r("patch", "trainer.kubeflow.org", "trainjobs"),
    ),
    "kubectl delete trainjob": (_r("delete", "trainer.kubeflow.org", "trainjobs"),),
    "kubectl get/describe trainjob": (
        _r("get", "trainer.kubeflow.org", "trainjobs"),
        _r("list", "trainer.kubeflow.org", "trainjobs"),
        _r("watch", "trainer.kubeflow.org", "trainjobs"),
        _r("list", "", "events"),
    ),
    "kubectl get clustertrainingruntimes,trainingruntimes": (
        _r("list", "trainer.kubeflow.org", "clustertrainingruntimes", None),
        _r("get", "trainer.kubeflow.org", "clustertrainingruntimes", None),
        _r("list", "trainer.kubeflow.org", "trainingruntimes"),
    ),
    "kubectl get jobsets,jobs,pods": (
        _r("list", "jobset.x-k8s.io", "jobsets"),
        _r("get", "jobset.x-k8s.io", "jobsets"),
        _r("list", "batch", "jobs"),
        _r("get", "batch", "jobs"),
        _r("list", "", "pods"),
        _r("get", "", "pods"),
    ),
    "kubectl logs -f": (_r("get", "", "pods"), _r("get", "", "pods", sub="log")),
    "kubectl events / get events.events.k8s.io": (
        _r("list", "", "events"),
        _r("list", "events.k8s.io", "events"),
        _r("watch", "events.k8s.io", "events"),
    ),
    "kubectl top pod": (_r("list", "metrics.k8s.io", "pods"), _r("get", "metrics.k8s.io", "pods")),
    "kubectl get workloads,localqueues": (
        _r("list", "kueue.x-k8s.io", "workloads"),
        _r("get", "kueue.x-k8s.io", "workloads"),
        _r("list", "kueue.x-k8s.io", "localqueues"),
        _r("get", "kueue.x-k8s.io", "localqueues"),
    ),
    "kubectl get --raw .../localqueues/<q>/pendingworkloads": (
        _r("get", "visibility.kueue.x-k8s.io", "localqueues", sub="pendingworkloads"),
    ),
    "kubectl get workloadpriorityclasses,resourceflavors": (
        _r("list", "kueue.x-k8s.io", "workloadpriorityclasses", None),
        _r("list", "kueue.x-k8s.io", "resourceflavors", None),
    ),
    "kubectl create secret / serviceaccount": (
        _r("create", "", "secrets"),
        _r("create", "", "serviceaccounts"),
    ),
    "kubectl describe resourcequota,limitrange": (
        _r("get", "", "resourcequotas"),
        _r("list", "", "resourcequotas"),
        _r("list", "", "limitranges"),
    ),
}

SDK_SUBMIT = ("train", "delete_job")
SDK_READ = (
    "list_runtimes",
    "get_runtime",
    "list_jobs",
    "get_job",
    "get_job_logs",
    "wait_for_job_status",
    "get_job_events",
)
KUBECTL_READ = (
    "kubectl get/describe trainjob",
    "kubectl get clustertrainingruntimes,trainingruntimes",
    "kubectl logs -f",
    "kubectl events / get events.events.k8s.io",
    "kubectl get workloads,localqueues",
    "kubectl get --raw .../localqueues/<q>/pendingworkloads",
)
KUBECTL_SUBMIT = ("kubectl apply -f trainjob.yaml", "kubectl delete trainjob")
KUBECTL_DEBUG = (
    "kubectl get jobsets,jobs,pods",
    "kubectl top pod",
    "kubectl get workloadpriorityclasses,resourceflavors",
)

# What each built-in persona is for (docs/rbac.md): its SDK methods and kubectl tasks.
TASKS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "viewer": (SDK_READ, KUBECTL_READ),
    "data-scientist": (SDK_READ + SDK_SUBMIT, KUBECTL_READ + KUBECTL_SUBMIT + KUBECTL_DEBUG),
    "mlops-engineer": (
        SDK_READ + SDK_SUBMIT,
        KUBECTL_READ + KUBECTL_SUBMIT + KUBECTL_DEBUG + ("kubectl create secret / serviceaccount",),
    ),
    "team-admin": (
        SDK_READ + SDK_SUBMIT,
        KUBECTL_READ + KUBECTL_SUBMIT + KUBECTL_DEBUG + ("kubectl describe resourcequota,limitrange",),
    ),
}
# SDK requests that may fail without harm: the control-plane version check only logs a warning
# (KubernetesBackend.verify_backend), and a 404 on the namespaced TrainingRuntime is expected.
TOLERATED = {Request("get", "", "configmaps", "kubeflow-system")}


@pytest.fixture(scope="module")
def org() -> tuple[Config, Authorizer]:
    config = example_org()
    return config, Authorizer(o.data for o in render(config, today=TODAY).objects)


def _members(config: Config, persona: str) -> list[tuple[str, Identity, str | None]]:
    """(team, identity, its only namespace for a service account) for one member of each kind the
    example org gives ``persona``."""
    out: list[tuple[str, Identity, str | None]] = []
    for team, access in sorted(config.access.items()):
        members = access.members.get(persona)
        if members is None:
            continue
        for user in members.users[:1]:
            out.append((team, Identity(user), None))
        for group in members.groups[:1]:
            out.append((team, Identity(f"someone-in-{group}", (group,)), None))
        for sa in members.service_accounts[:1]:
            for ns in config.teams[team].namespaces:
                out.append((team, Identity.service_account(ns, sa), ns))
    return out


def _sdk() -> Mapping[str, list[Mapping[str, Any]]]:
    methods = yaml.safe_load(SDK_CALLS.read_text(encoding="utf-8"))["methods"]
    assert isinstance(methods, dict)
    return methods


def _requests(persona: str, namespace: str) -> list[tuple[str, Request]]:
    """Every request the persona's tasks make in ``namespace``, with the task."""
    sdk_methods, kubectl_tasks = TASKS[persona]
    sdk = _sdk()
    out: list[tuple[str, Request]] = []
    for method in sdk_methods:
        variants = [m for m in sdk if m == method or m.startswith(method + "(")]
        assert variants, f"no recorded SDK calls for {method}"
        for variant in variants:
            for call in sdk[variant]:
                ns = call["namespace"]
                req = Request(
                    call["verb"],
                    call["group"],
                    call["resource"],
                    namespace if ns == "nlp-team" else ns,
                    call.get("subresource", ""),
                )
                if req not in TOLERATED:
                    out.append((f"SDK {variant}", req))
    for task in kubectl_tasks:
        for req in KUBECTL[task]:
            ns = namespace if req.namespace == "NS" else req.namespace
            out.append((task, Request(req.verb, req.group, req.resource, ns, req.subresource)))
    return out


def test_the_sdk_fixture_was_recorded_from_the_sdk() -> None:
    """The fixture covers every TrainerClient method the personas use (re-record with
    scripts/record_sdk_calls.py when the SDK changes)."""
    recorded = _sdk()
    for sdk_methods, _ in TASKS.values():
        for method in sdk_methods:
            assert method in recorded
    # The namespaced runtime is read first, even by get_job: the viewer's 403 in issue 17.
    assert recorded["get_job"][1] == {
        "verb": "get",
        "group": "trainer.kubeflow.org",
        "resource": "trainingruntimes",
        "namespace": "nlp-team",
    }


@pytest.mark.parametrize("persona", sorted(TASKS))
def test_each_persona_can_do_its_tasks_with_the_sdk_and_kubectl(
    org: tuple[Config, Authorizer], persona: str
) -> None:
    config, rbac = org
    members = _members(config, persona)
    assert members, f"the example org has no {persona}"
    denied: list[str] = []
    for team, identity, only in members:
        for namespace in config.teams[team].namespaces:
            if only is not None and namespace != only:
                continue
            for task, req in _requests(persona, namespace):
                if not rbac.allowed(identity, req.verb, req.group, req.path, req.namespace):
                    denied.append(f"{identity.user} ({team}): {task}: {req}")
    assert denied == []


@pytest.mark.parametrize(
    ("persona", "req"),
    [
        ("viewer", Request("create", "trainer.kubeflow.org", "trainjobs", "nlp-team")),
        ("viewer", Request("delete", "trainer.kubeflow.org", "trainjobs", "nlp-team")),
        ("data-scientist", Request("get", "", "secrets", "nlp-team")),
        ("data-scientist", Request("create", "", "pods", "nlp-team", "exec")),
        ("data-scientist", Request("create", "batch", "jobs", "nlp-team")),
        ("data-scientist", Request("create", "jobset.x-k8s.io", "jobsets", "nlp-team")),
        ("data-scientist", Request("update", "kueue.x-k8s.io", "workloads", "nlp-team")),
        ("data-scientist", Request("list", "kueue.x-k8s.io", "clusterqueues", None)),
        (
            "data-scientist",
            Request("get", "visibility.kueue.x-k8s.io", "clusterqueues", None, "pendingworkloads"),
        ),
        ("data-scientist", Request("list", "trainer.kubeflow.org", "trainjobs", "cv-team")),
        ("data-scientist", Request("list", "metrics.k8s.io", "nodes", None)),
        ("mlops-engineer", Request("get", "", "secrets", "nlp-team")),
        ("team-admin", Request("update", "", "resourcequotas", "nlp-team")),
    ],
)
def test_personas_get_nothing_beyond_their_tasks(
    org: tuple[Config, Authorizer], persona: str, req: Request
) -> None:
    config, rbac = org
    _, identity, only = next(m for m in _members(config, persona) if m[0] == "nlp-team")
    assert only in (None, "nlp-team")
    assert not rbac.allowed(identity, req.verb, req.group, req.path, req.namespace), str(req)


def test_no_persona_is_aggregated_into_kueues_roles(org: tuple[Config, Authorizer]) -> None:
    config, _ = org
    rendering = render(config, today=TODAY)
    for obj in rendering.objects:
        if obj.data["kind"] == "ClusterRole":
            labels = obj.data["metadata"].get("labels") or {}
            assert not [k for k in labels if k.startswith("rbac.kueue.x-k8s.io/")], obj.data["metadata"][
                "name"
            ]
            assert not [k for k in labels if k.startswith("rbac.authorization.k8s.io/aggregate-to")]
