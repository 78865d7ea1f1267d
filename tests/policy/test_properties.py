"""Hypothesis properties of the engine: it never raises on hostile objects, its patch applies and
yields the mutated object, and mutating twice adds nothing."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mpigate.config import Config
from mpigate.policy import Decision, apply_patch
from mpigate.policy.findings import WARNING_LIMIT
from mpigate.trainjob.mpijob import resolve_mpijob
from tests.policy.helpers import decide, example_org, read, runtime_patch

ORG: Config = example_org()

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-5, 10**4)
    | st.floats(allow_nan=False, width=32)
    | st.text(max_size=12)
)
field_names = st.sampled_from(
    [
        "spec",
        "trainer",
        "numNodes",
        "image",
        "env",
        "name",
        "value",
        "runtimePatches",
        "manager",
        "labels",
        "metadata",
        "containers",
        "securityContext",
        "resourcesPerNode",
        "limits",
        "nvidia.com/gpu",
        "initializer",
        "storageUri",
        "runtimeRef",
        "template",
        "replicatedJobs",
        "activeDeadlineSeconds",
        "mpiReplicaSpecs",
        "Launcher",
        "Worker",
        "replicas",
        "slotsPerWorker",
        "runPolicy",
        "x",
    ]
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(field_names | st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=30,
)


def _check(decision: Decision, obj: Any) -> None:
    assert isinstance(decision, Decision)
    assert "internal error" not in decision.message
    # no rule family fell back to its fail-closed guard: every malformed field got a real check
    assert not [v for v in decision.violations if v.path == "(object)"], decision.violations
    assert all(len(w) <= WARNING_LIMIT for w in decision.warnings)
    if decision.patch:
        apply_patch(obj, decision.patch)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(field_names, json_values, max_size=5))
def test_never_raises_on_arbitrary_objects(obj: dict[str, Any]) -> None:
    # a version the engine understands, so that every rule family reads the hostile object
    for api_version, kind in (
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
        ("kubeflow.org/v2beta1", "MPIJob"),
    ):
        job = {**obj, "apiVersion": api_version, "kind": kind}
        for operation in ("CREATE", "UPDATE"):
            _check(decide(ORG, job, operation=operation, old=job, namespace="nlp-team"), job)


BASE = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "fuzz", "namespace": "nlp-team", "labels": {"mpigate.io/cost-center": "cc"}},
    "spec": {
        "runtimeRef": {"name": "mpi-openmpi-data"},
        "initializer": {"dataset": {"storageUri": "s3://acme-eu-x"}},
        "trainer": {
            "numNodes": 2,
            "image": "registry.acme.internal/a:1",
            "env": [{"name": "A", "value": "1"}],
            "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}},
        },
        "runtimePatches": [
            runtime_patch("x.example/p", "node", {"containers": [{"name": "node", "securityContext": {}}]})
        ],
    },
}
PATHS = [
    ("spec",),
    ("spec", "trainer"),
    ("spec", "trainer", "numNodes"),
    ("spec", "trainer", "env"),
    ("spec", "trainer", "env", 0),
    ("spec", "trainer", "resourcesPerNode"),
    ("spec", "trainer", "image"),
    ("spec", "runtimePatches"),
    ("spec", "runtimePatches", 0),
    ("spec", "runtimePatches", 0, "trainingRuntimeSpec"),
    ("spec", "initializer"),
    ("spec", "initializer", "dataset"),
    ("spec", "runtimeRef"),
    ("metadata",),
    ("metadata", "labels"),
    ("spec", "activeDeadlineSeconds"),
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), json_values)
def test_never_raises_when_any_field_has_the_wrong_type(path: tuple[Any, ...], value: Any) -> None:
    obj = copy.deepcopy(BASE)
    node: Any = obj
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    _check(decide(ORG, obj), obj)
    _check(decide(ORG, obj, operation="UPDATE", old=BASE), obj)


security_values = st.dictionaries(
    st.sampled_from(
        [
            "runAsNonRoot",
            "allowPrivilegeEscalation",
            "privileged",
            "runAsUser",
            "capabilities",
            "seccompProfile",
            "readOnlyRootFilesystem",
        ]
    ),
    st.booleans()
    | st.integers(0, 2000)
    | st.just({"drop": ["NET_RAW"]})
    | st.just({"type": "RuntimeDefault"})
    | st.just({"add": ["NET_BIND_SERVICE"]}),
    max_size=4,
)


@st.composite
def trainjobs(draw: st.DrawFn) -> dict[str, Any]:
    namespace = draw(st.sampled_from(["nlp-team", "cv-team", "research", "sandbox"]))
    labels = {"mpigate.io/cost-center": "cc"}
    if draw(st.booleans()):
        labels["kueue.x-k8s.io/queue-name"] = draw(st.sampled_from(["nlp-team", "cv-team", "other"]))
    if draw(st.booleans()):
        labels["mpigate.io/data-classification"] = draw(st.sampled_from(["public", "phi", "internal"]))
    trainer: dict[str, Any] = {
        "numNodes": draw(st.integers(1, 6)),
        "image": draw(
            st.sampled_from(["registry.acme.internal/a:1", "docker.io/library/python:3.12", "quay.io/acme/x"])
        ),
    }
    gpus = draw(st.integers(0, 8))
    if gpus:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": gpus}}
    if draw(st.booleans()):
        trainer["env"] = [
            {"name": "OMPI_MCA_btl_tcp_port_min_v4", "value": "40000"},
            {"name": "B", "value": "x"},
        ]
    spec: dict[str, Any] = {
        "runtimeRef": {"name": draw(st.sampled_from(["mpi-openmpi-gpu", "mpi-openmpi-data"]))},
        "trainer": trainer,
    }
    if draw(st.booleans()):
        spec["activeDeadlineSeconds"] = draw(st.integers(60, 10**6))
    patches = []
    for manager in draw(
        st.lists(
            st.sampled_from(["kueue.x-k8s.io/manager", "acme.example/a", "mpigate.io/admission"]),
            unique=True,
            max_size=3,
        )
    ):
        job = draw(st.sampled_from(["node", "launcher"]))
        pod: dict[str, Any] = {}
        if draw(st.booleans()):
            pod["securityContext"] = draw(security_values)
        if draw(st.booleans()):
            pod["containers"] = [{"name": "node", "securityContext": draw(security_values)}]
        if draw(st.booleans()):
            pod["nodeSelector"] = {"pool": "a"}
        patches.append(runtime_patch(manager, job, pod))
    if patches:
        spec["runtimePatches"] = patches
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "gen", "namespace": namespace, "labels": labels},
        "spec": spec,
    }


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trainjobs())
def test_patch_applies_to_the_mutated_object_and_mutation_is_idempotent(job: dict[str, Any]) -> None:
    first = decide(ORG, job)
    _check(first, job)
    once = apply_patch(job, first.patch)
    second = decide(ORG, once)
    assert second.patch == ()
    # the verdict on the mutated object is the verdict the mutating webhook's caller saw
    assert (second.allowed, second.rule_ids) == (first.allowed, first.rule_ids)
    # other managers' entries are untouched, in order
    others = [p for p in job["spec"].get("runtimePatches", []) if p["manager"] != "mpigate.io/admission"]
    assert [
        p for p in once["spec"].get("runtimePatches", []) if p["manager"] != "mpigate.io/admission"
    ] == others


MPIJOB_BASE = read("mpijobs/mpi-allreduce.yaml")
MPIJOB_PATHS = [
    ("spec",),
    ("spec", "slotsPerWorker"),
    ("spec", "runPolicy"),
    ("spec", "runPolicy", "activeDeadlineSeconds"),
    ("spec", "mpiImplementation"),
    ("spec", "sshAuthMountPath"),
    ("spec", "runLauncherAsWorker"),
    ("spec", "mpiReplicaSpecs"),
    ("spec", "mpiReplicaSpecs", "Launcher"),
    ("spec", "mpiReplicaSpecs", "Worker", "replicas"),
    ("spec", "mpiReplicaSpecs", "Worker", "template"),
    ("spec", "mpiReplicaSpecs", "Worker", "template", "metadata"),
    ("spec", "mpiReplicaSpecs", "Worker", "template", "spec"),
    ("spec", "mpiReplicaSpecs", "Worker", "template", "spec", "containers"),
    ("spec", "mpiReplicaSpecs", "Worker", "template", "spec", "containers", 0),
    ("spec", "mpiReplicaSpecs", "Worker", "template", "spec", "containers", 0, "resources"),
    ("spec", "mpiReplicaSpecs", "Launcher", "template", "spec", "containers", 0, "env"),
    ("metadata", "labels"),
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MPIJOB_PATHS), json_values)
# found by a landing run: a container named by a list reached mpijob._merge_defaults' dict lookup
@example(("spec", "mpiReplicaSpecs", "Worker", "template", "spec"), {"containers": [{"name": []}]})
def test_an_mpijob_field_of_the_wrong_type_never_raises_and_what_the_operator_refuses_is_denied(
    path: tuple[Any, ...], value: Any
) -> None:
    """Malformed is refused, never absent: a value the MPI Operator would not run is a denial."""
    obj = copy.deepcopy(MPIJOB_BASE)
    node: Any = obj
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    decision = decide(ORG, obj)
    _check(decision, obj)
    _check(decide(ORG, obj, operation="UPDATE", old=MPIJOB_BASE), obj)
    if [p for p in resolve_mpijob(obj).problems if not p.advisory]:
        assert not decision.allowed, decision
