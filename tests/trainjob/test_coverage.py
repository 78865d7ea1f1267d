"""Trainer-faithful resolution, checked field by field against the upstream CRDs (issue 16).

Every leaf of the TrainJob, TrainingRuntime and ClusterTrainingRuntime schemas either reaches the
effective pods (two different values of it give different resolved pods) or is listed, with the
reason, in docs/effective-pods.md; every TrainJob leaf that reaches the pods is listed there with
the rules that examine it or as deliberately allowed. A new CRD field on neither list fails here,
and so does a stale entry. The types mpigate checks (``trainjob/shapes.py``) must be the CRD's.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpigate.catalogue import all_rules
from mpigate.trainjob import shapes
from tests.conftest import FIXTURES, REPO

from .crdwalk import crd_spec, dotted, leaves, reaches

pytestmark = pytest.mark.upstream

DOC = REPO / "docs" / "effective-pods.md"
POD = "spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[].template.spec.template"
JOB = "spec.template.spec.replicatedJobs[]"
RUNTIME = yaml.safe_load((FIXTURES / "trainjob" / "probe-runtime.yaml").read_text(encoding="utf-8"))
TRAINJOB: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "probe", "namespace": "team-a"},
    # numNodes left to the runtime, so that a replicated job's parallelism counts
    "spec": {
        "runtimeRef": {"name": "probe"},
        # env, so that the runtime's runLauncherAsNode (which routes it to the node job) shows
        "trainer": {"image": "registry.test/me:1.0", "env": [{"name": "PROBE", "value": "1"}]},
    },
}
CRDS = {
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
    "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
}


def table(heading: str) -> dict[str, str]:
    """The rows of the table under ``heading`` in docs/effective-pods.md: field → second column."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    body = text[start + len(heading) + 2 :]
    following = re.search(r"\n#{2,3} ", body)
    body = body[: following.start()] if following else body
    rows: dict[str, str] = {}
    for line in body.splitlines():
        match = re.match(r"^\| `([^`]+)` \| (.*) \|$", line)
        if match:
            field = match[1].replace("<pod>", POD).replace("<job>", JOB)
            assert field not in rows, f"{field} listed twice under {heading}"
            rows[field] = match[2]
    assert rows, f"no table under {heading}"
    return rows


def covers(entry: str, leaf: str) -> bool:
    if entry.endswith(".*"):
        prefix = entry[:-2]
        return leaf.startswith((prefix + ".", prefix + "[")) or leaf == prefix
    return leaf == entry


def entry_for(entries: Mapping[str, str], leaf: str) -> str | None:
    found = [e for e in entries if covers(e, leaf)]
    assert len(found) <= 1, f"{leaf} is covered by several entries: {found}"
    return found[0] if found else None


RUNTIMES_HEADING = "### Runtimes (TrainingRuntime and ClusterTrainingRuntime)"


def unlisted_and_stale(schema: Mapping[str, Any], kind: str) -> tuple[list[str], list[str], set[str]]:
    """Fields of ``schema`` that reach no pod but are not listed, listed fields that do reach the
    pods, and the list's entries that matched nothing."""
    heading = "### TrainJob" if kind == "TrainJob" else RUNTIMES_HEADING
    not_reached = table(heading)
    unlisted, stale = [], []
    used: set[str] = set()
    for leaf in leaves(schema):
        name = dotted(leaf[0])
        entry = entry_for(not_reached, name)
        reached = reaches(schema, leaf, TRAINJOB, RUNTIME, on_runtime=kind != "TrainJob")
        if entry is not None:
            used.add(entry)
            if reached:
                stale.append(f"{name} reaches the pods but {entry} is listed as not reaching them")
        elif not reached:
            unlisted.append(name)
    return unlisted, stale, set(not_reached) - used


def unexamined(schema: Mapping[str, Any]) -> tuple[list[str], set[str]]:
    """TrainJob fields that reach the pods without an entry in the tenant table (and the entries
    that match no such field); every entry names known rules or says why it is allowed."""
    entries = table("## Pod fields a tenant can set")
    known_rules = set(all_rules())
    used: set[str] = set()
    missing = []
    for leaf in leaves(schema):
        if not reaches(schema, leaf, TRAINJOB, RUNTIME, on_runtime=False):
            continue
        name = dotted(leaf[0])
        entry = entry_for(entries, name)
        if entry is None:
            missing.append(name)
            continue
        used.add(entry)
        how = entries[entry]
        rules = set(re.findall(r"MPG-[A-Z0-9]+(?:-[A-Z0-9]+)*", how))
        assert rules or how.startswith(("allowed", "as ")), f"{entry}: neither rules nor 'allowed': {how}"
        assert rules <= known_rules, f"{entry} names unknown rules {sorted(rules - known_rules)}"
    return missing, set(entries) - used


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_every_crd_field_reaches_the_pods_or_is_listed_with_its_reason(upstream: Path, kind: str) -> None:
    schema = crd_spec(upstream / "trainer" / "crds" / CRDS[kind])
    assert len(list(leaves(schema))) > 300, "the CRD walk found too few fields"
    unlisted, stale, unused = unlisted_and_stale(schema, kind)
    assert not unlisted, (
        f"{kind} fields that reach no pod and are not listed in docs/effective-pods.md: "
        + ", ".join(unlisted)
    )
    assert not stale, "\n".join(stale)
    assert not unused, f"entries that match no {kind} field: {sorted(unused)}"


def test_every_pod_field_a_tenant_sets_is_examined_or_allowed(upstream: Path) -> None:
    missing, unused = unexamined(crd_spec(upstream / "trainer" / "crds" / CRDS["TrainJob"]))
    assert not missing, "TrainJob fields that reach the pods with no rule and no reason: " + ", ".join(
        missing
    )
    assert not unused, f"entries that match no field reaching the pods: {sorted(unused)}"


def test_a_new_crd_field_on_neither_list_fails(upstream: Path) -> None:
    """The check is real: a field Trainer might add tomorrow — one that reaches no pod, and a pod
    field a patch could set — is reported until it is listed."""
    schema = copy.deepcopy(dict(crd_spec(upstream / "trainer" / "crds" / CRDS["TrainJob"])))
    schema["properties"]["trainer"]["properties"]["priorityHint"] = {"type": "string"}
    pod_spec = _schema_at(schema, POD.removeprefix("spec.") + ".spec")
    assert pod_spec is not None
    pod_spec["properties"]["hostNetwork"] = {"type": "boolean"}  # type: ignore[index]
    unlisted, _, _ = unlisted_and_stale(schema, "TrainJob")
    assert unlisted == ["spec.trainer.priorityHint"]
    missing, _ = unexamined(schema)
    assert missing == [POD + ".spec.hostNetwork"]


def _shape_leaves(shape: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(path, JSON type)`` of every typed leaf of a shape from trainjob/shapes.py."""
    if isinstance(shape, str):
        yield path, shape
    elif isinstance(shape, Mapping):
        for key, sub in shape.items():
            yield from _shape_leaves(sub, f"{path}.{key}")
    elif shape[0] == "map":
        yield path, "object"
    else:
        yield from _shape_leaves(shape[-1], f"{path}[]")


def _schema_at(schema: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    node: Any = schema
    for part in re.findall(r"[A-Za-z]+|\[\]", path):
        if part == "[]":
            node = node.get("items")
        else:
            node = (node.get("properties") or {}).get(part)
        if node is None:
            return None
    return node  # type: ignore[no-any-return]


_JSON_TYPES = {"string": {"string"}, "integer": {"integer"}, "boolean": {"boolean"}, "object": {"object"}}


@pytest.mark.parametrize("kind", ["TrainJob", "TrainingRuntime"])
def test_the_types_mpigate_checks_are_the_crds(upstream: Path, kind: str) -> None:
    """shapes.py types every field a patch can set (TrainJob) and those the rules read in runtimes:
    each must exist in the CRD with that type, and every field of the TrainJob's patch pod
    template must be typed there (or sit below a field typed as a whole)."""
    schema = crd_spec(upstream / "trainer" / "crds" / CRDS[kind])
    base = (
        "runtimePatches.[].trainingRuntimeSpec.template.spec.replicatedJobs.[].template.spec.template"
        if kind == "TrainJob"
        else "template.spec.replicatedJobs.[].template.spec.template"
    )
    pod_schema = _schema_at(schema, base.replace(".[]", "[]"))
    assert pod_schema is not None
    checked = 0
    for path, kind_name in _shape_leaves(shapes.POD_TEMPLATE, ""):
        node = _schema_at(pod_schema, path)
        if node is None:
            assert kind == "TrainJob", f"{path} is not in the {kind} CRD"
            continue  # the rules read it in runtimes; a patch cannot set it
        checked += 1
        if kind_name == "quantity":
            assert node.get("x-kubernetes-int-or-string") or node.get("anyOf"), path
        elif kind_name != "any":
            assert node.get("type") in _JSON_TYPES[kind_name], (
                f"{path}: CRD {node.get('type')}, mpigate {kind_name}"
            )
    assert checked > 50
    if kind == "TrainJob":
        typed = {p for p, _ in _shape_leaves(shapes.POD_TEMPLATE, "")}
        objects = {p for p, k in _shape_leaves(shapes.POD_TEMPLATE, "") if k == "object"}
        for path, _leaf in leaves(pod_schema, ()):
            name = "." + dotted(path) if path else ""
            assert name in typed or any(name.startswith((o + ".", o + "[")) for o in objects), (
                f"{name}: a field of the TrainJob's patch pod template that trainjob/shapes.py does not type"
            )
