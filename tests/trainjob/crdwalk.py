"""Walk the upstream Trainer CRD schemas leaf by leaf, set each leaf on a probe TrainJob or runtime,
and tell which leaves change the resolved pods (tests/trainjob/test_coverage.py)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from mpigate.trainjob import MERGE_KEYS, Resolution, resolve, strategic_merge

Leaf = tuple[tuple[str, ...], Mapping[str, Any]]

# Values for the merge keys of list items the probe creates: the names the probe runtime has, so
# that a patch applies to a job and a container that exist.
_KEY_SEEDS = {
    ("replicatedJobs", "name"): "node",
    ("containers", "name"): "node",
    ("initContainers", "name"): "init",
    ("ephemeralContainers", "name"): "debug",
    ("runtimePatches", "manager"): "probe.example/patch",
}


def crd_spec(path: Path) -> Mapping[str, Any]:
    """The ``spec`` schema of a CRD file (its only version)."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    versions = doc["spec"]["versions"]
    assert len(versions) == 1, "the walk reads the CRD's only version"
    schema: Mapping[str, Any] = versions[0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def leaves(schema: Mapping[str, Any], path: tuple[str, ...] = ("spec",)) -> Iterator[Leaf]:
    """Every leaf below ``schema``: a scalar, a list of scalars (``[]`` in the path), a map or an
    object the schema does not describe further."""
    props = schema.get("properties")
    if props:
        for key, sub in props.items():
            yield from leaves(sub, (*path, key))
    elif schema.get("type") == "array" and isinstance(schema.get("items"), Mapping):
        items = schema["items"]
        if items.get("properties"):
            yield from leaves(items, (*path, "[]"))
        else:
            yield (*path, "[]"), items
    else:
        yield path, schema


def dotted(path: tuple[str, ...]) -> str:
    return ".".join(path).replace(".[]", "[]")


def values(schema: Mapping[str, Any], path: tuple[str, ...]) -> tuple[Any, Any]:
    """Two different valid values for a leaf (``_ABSENT`` for "not set")."""
    if "enum" in schema:
        choices = [v for v in schema["enum"] if v != ""] or list(schema["enum"])
        return (choices[0], choices[1]) if len(choices) > 1 else (choices[0], ABSENT)
    if schema.get("x-kubernetes-int-or-string"):
        return "7", "8"
    kind = schema.get("type")
    if kind == "boolean":
        return True, False
    if kind == "integer":
        low = int(schema.get("minimum", 7))
        return max(7, low), max(8, low + 1)
    if kind == "number":
        return 7.5, 8.5
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            if extra.get("x-kubernetes-int-or-string") or extra.get("anyOf"):
                return {"example.com/probe": "7"}, {"example.com/probe": "8"}
            if extra.get("type") == "array":
                return {"probe": ["a"]}, {"probe": ["b"]}
            return {"probe.example/key": "a"}, {"probe.example/key": "b"}
        return {}, ABSENT
    if kind == "array":
        one, other = values(schema.get("items", {}), path)
        return [one], [other]
    if schema.get("format") == "date-time":
        return "2026-01-02T03:04:05Z", "2026-02-03T04:05:06Z"
    if path[-1] == "storageUri":
        return "s3://probe-a/data", "s3://probe-b/data"
    if path[-1] == "fieldPath":
        return "metadata.name", "metadata.namespace"
    return "probe-a", "probe-b"


ABSENT = object()


def fragment(schema: Mapping[str, Any], path: tuple[str, ...], value: Any) -> Any:
    """A minimal ``spec`` that sets the leaf at ``path`` to ``value`` (``ABSENT``: only the
    structure), with the merge keys of every list item filled in."""

    def build(node: Mapping[str, Any], rest: tuple[str, ...], parent: str) -> Any:
        if not rest:
            return value
        head, tail = rest[0], rest[1:]
        if head == "[]":
            items = node["items"]
            element = build(items, tail, parent)
            if element is ABSENT:
                element = {}
            if isinstance(element, dict):
                # the CRD's list-map keys, and the strategic-merge key of the list (an item
                # without it merges nowhere and is refused)
                keys = list(node.get("x-kubernetes-list-map-keys", ()))
                if parent in MERGE_KEYS and MERGE_KEYS[parent] not in keys:
                    keys.append(MERGE_KEYS[parent])
                for key in keys:
                    if key not in element:
                        seed = _KEY_SEEDS.get((parent, key))
                        element[key] = (
                            seed if seed is not None else values(items["properties"][key], (key,))[0]
                        )
            return [element]
        sub = build(node["properties"][head], tail, head)
        return {} if sub is ABSENT else {head: sub}

    return build(schema, path[1:], "spec")


def snapshot(resolution: Resolution) -> str:
    """What a resolution says about the pods: each job's pod template and pod count, the slots."""
    return json.dumps(
        {
            "jobs": [(j.name, j.ancestor, j.replicas, j.parallelism, j.template) for j in resolution.jobs],
            "slots": resolution.slots,
            "num_nodes": resolution.num_nodes,
        },
        sort_keys=True,
        default=str,
    )


def reaches(
    schema: Mapping[str, Any],
    leaf: Leaf,
    job: Mapping[str, Any],
    runtime: Mapping[str, Any],
    *,
    on_runtime: bool,
) -> bool:
    """Whether two different values of ``leaf`` give different pods (set on the TrainJob, or on
    the runtime with ``on_runtime``)."""
    path, leaf_schema = leaf
    snapshots = []
    for value in values(leaf_schema, path):
        part = {"spec": fragment(schema, path, value)}
        if on_runtime:
            resolution = resolve(job, strategic_merge(runtime, part))
        else:
            resolution = resolve(strategic_merge(job, part), runtime)
        snapshots.append(snapshot(resolution))
    return snapshots[0] != snapshots[1]


def load_all(path: Path) -> list[dict[str, Any]]:
    return [copy.deepcopy(d) for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
