"""Every rendered object and everything in webhooks/ validates against its schema."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest

from mpigate.render import Rendering, read_objects
from tests.conftest import REPO

from .k8s_schemas import load_crds, validate_object


def _findings(objects, crds):
    out = []
    methods: Counter[str] = Counter()
    for where, obj in objects:
        findings, method = validate_object(obj, crds)
        methods[method] += 1
        out.extend(f"{where}: {obj['kind']} {obj['metadata'].get('name')}: {f}" for f in findings)
    return out, methods


def test_rendered_core_objects_validate_against_kubernetes_schemas(example_rendering: Rendering) -> None:
    objects = [(o.file, o.data) for o in example_rendering.objects]
    problems, methods = _findings(objects, None)
    assert problems == []
    # Namespaces, quotas, RBAC, NetworkPolicies, ConfigMaps ... went through the real schemas
    kueue = sum(1 for o in example_rendering.objects if o.key.api_version.startswith("kueue.x-k8s.io/"))
    monitoring = 4  # 3 team PrometheusRules + mpigate's
    assert methods == {
        "kubernetes": len(objects) - kueue - monitoring,
        "skipped": kueue,
        "structural": monitoring,
    }


@pytest.mark.upstream
def test_rendered_kueue_objects_validate_against_upstream_crds(
    example_rendering: Rendering, upstream: Path
) -> None:
    crds = load_crds(str(upstream / "kueue" / "crds"))
    kueue = [
        (o.file, o.data) for o in example_rendering.objects if o.key.api_version.startswith("kueue.x-k8s.io/")
    ]
    problems, methods = _findings(kueue, crds)
    assert problems == []
    assert methods["crd"] == len(kueue) == 3 + 4 + 1 + 3 + 4  # CQs, flavors, cohort, WPCs, LocalQueues


def test_install_base_validates() -> None:
    objects = read_objects(REPO / "webhooks")
    problems, methods = _findings(objects, None)
    assert problems == []
    assert methods == {"kubernetes": 24, "structural": 4}  # with the ledger and audit Roles and bindings


@pytest.mark.upstream
def test_crd_validation_catches_what_the_api_server_would_reject(
    example_rendering: Rendering, upstream: Path
) -> None:
    """The converted CRD schemas and their CEL rules do reject bad objects."""
    crds = load_crds(str(upstream / "kueue" / "crds"))
    queue = next(o.data for o in example_rendering.objects if o.key.kind == "ClusterQueue")

    typo = copy.deepcopy(queue)
    typo["spec"]["cohort"] = typo["spec"].pop("cohortName")  # v1beta1 spelling
    assert any("'cohort' was unexpected" in f.message for f in validate_object(typo, crds)[0])

    short = copy.deepcopy(queue)
    short["spec"]["resourceGroups"][0]["flavors"][0]["resources"].pop()  # CEL: one quota per covered resource
    messages = [f.message for f in validate_object(short, crds)[0]]
    assert "flavors must have the same number of resources as the coveredResources" in messages

    lonely = copy.deepcopy(queue)
    del lonely["spec"]["cohortName"]  # CEL: borrowingLimit needs a cohort
    messages = [f.message for f in validate_object(lonely, crds)[0]]
    assert "borrowingLimit must be nil when cohort is empty" in messages

    local = next(o.data for o in example_rendering.objects if o.key.kind == "LocalQueue")
    cluster_scoped = copy.deepcopy(local)
    del cluster_scoped["metadata"]["namespace"]
    assert [f.message for f in validate_object(cluster_scoped, crds)[0]] == [
        "LocalQueue is namespaced: set metadata.namespace"
    ]


def test_core_validation_rejects_unknown_fields_and_bad_labels(example_rendering: Rendering) -> None:
    quota = copy.deepcopy(next(o.data for o in example_rendering.objects if o.key.kind == "ResourceQuota"))
    assert validate_object(quota, None) == ([], "kubernetes")
    for bad in ("count/mpi jobs.kubeflow.org", "mpijobs", "count/", "count/" + "x" * 64):
        wrong = copy.deepcopy(quota)
        wrong["spec"]["hard"][bad] = "1"
        found = [f.message for f in validate_object(wrong, None)[0]]
        assert found == [f"invalid quota resource name {bad!r}"], bad
    quota["spec"]["hardd"] = quota["spec"].pop("hard")
    assert validate_object(quota, None)[0]
    namespace = copy.deepcopy(next(o.data for o in example_rendering.objects if o.key.kind == "Namespace"))
    namespace["metadata"]["labels"]["mpigate.io/team"] = "not a label value"
    assert [f.message for f in validate_object(namespace, None)[0]] == [
        "invalid label value 'not a label value' for mpigate.io/team"
    ]
    rule = copy.deepcopy(next(o.data for o in example_rendering.objects if o.key.kind == "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "15 minutes"
    assert validate_object(rule, None)[0]
