"""mpigate.cel.reads: what an expression can observe of its inputs, and inputs cut down to that —
judged exactly as the whole ones, measured as the whole ones for the cost bound."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from mpigate.cel import Environment, EvalError
from mpigate.cel.cost import input_size
from mpigate.cel.reads import merge, prune
from mpigate.config.frozen import freeze, thaw

ENV = Environment(["object", "oldObject", "params", "team"])


def _reads(source: str) -> Any:
    return {name: need.describe() for name, need in ENV.compile(source).reads.items()}


@pytest.mark.parametrize(
    ("source", "reads"),
    [
        ("object.metadata.name == 'x'", {"object": {"metadata": {"name": "*"}}}),
        # has() observes presence only: the field is kept, its content is not read
        ("has(object.spec.x)", {"object": {"spec": {"x": {}}}}),
        (
            "object.spec.containers.all(c, !has(c.securityContext) || c.securityContext.runAsUser > 0)",
            {"object": {"spec": {"containers": {"[]": {"securityContext": {"runAsUser": "*"}}}}}},
        ),
        (
            "object.spec.containers.all(c, c.?ports.orValue([]).all(p, !has(p.hostPort)))",
            {"object": {"spec": {"containers": {"[]": {"ports": {"[]": {"hostPort": {}}}}}}}},
        ),
        # a value put into a list (filter's step) is read whole
        (
            "object.spec.containers.filter(c, has(c.ports)).size() > 0",
            {"object": {"spec": {"containers": {"[]": "*"}}}},
        ),
        (
            "cel.bind(cs, object.spec.containers, cs.all(c, c.image != ''))",
            {"object": {"spec": {"containers": {"[]": {"image": "*"}}}}},
        ),
        (
            "object.metadata.labels.all(k, k.startsWith('a'))",
            {"object": {"metadata": {"labels": {"[]": "*"}}}},
        ),
        (
            "object.spec.limits['nvidia.com/gpu'] == '1'",
            {"object": {"spec": {"limits": {"nvidia.com/gpu": "*"}}}},
        ),
        ("'memory' in object.spec.limits", {"object": {"spec": {"limits": "*"}}}),
        ("object.spec.items[1].name == 'x'", {"object": {"spec": {"items": {"[]": {"name": "*"}}}}}),
        (
            "(object.spec.a ? object.spec.b : object.spec.c).d == 1",
            {"object": {"spec": {"a": "*", "b": {"d": "*"}, "c": {"d": "*"}}}},
        ),
        ("object == oldObject", {"object": "*", "oldObject": "*"}),
        ("team == null || team.name == 'x'", {"team": "*"}),
        # a comprehension variable shadows an input of the same name
        ("[1, 2].all(object, object > 0)", {}),
        ("size(object)", {"object": "*"}),
        ("object.spec.?x.orValue({}).y == 1", {"object": {"spec": {"x": {"y": "*"}}}}),
        # a map literal's keys are expressions too: a key is read whole, as a value is
        ("{object.metadata.name: 1}.size() == 1", {"object": {"metadata": {"name": "*"}}}),
        (
            "{object.?metadata.?labels.?tier.orValue('none'): true}.exists(k, k == 'gpu')",
            {"object": {"metadata": {"labels": {"tier": "*"}}}},
        ),
    ],
)
def test_an_expression_reads_what_it_can_observe(source: str, reads: Any) -> None:
    assert _reads(source) == reads


POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "labels": {"a": "1"}, "annotations": {"note": "x" * 95}},
    "spec": {
        "containers": [
            {
                "name": "node",
                "image": "registry.example/img:1",
                "ports": [{"containerPort": 1, "hostPort": 2}, {"containerPort": 3}],
                "env": [{"name": f"V{i}", "value": str(i)} for i in range(12)],
                "securityContext": {"runAsUser": 1000, "capabilities": {"add": ["NET_ADMIN"]}},
            },
            {"name": "side", "image": "x", "resources": {"limits": {"memory": "1Gi"}}},
        ],
        "volumes": [{"name": "v", "emptyDir": {}}],
    },
}

SOURCES = [
    "object.spec.containers.all(c, c.?ports.orValue([]).all(p, !has(p.hostPort)))",
    "object.spec.containers.all(c, !has(c.securityContext) || c.securityContext.runAsUser >= 1000)",
    "object.spec.containers.exists(c, "
    "c.?securityContext.?capabilities.?add.orValue([]).exists(x, x == 'NET_ADMIN'))",
    "object.spec.containers.map(c, c.name) == ['node', 'side']",
    "object.spec.containers.all(c, "
    "quantity(c.?resources.?limits.?memory.orValue('0')).asApproximateFloat() < 2e9)",
    "size(object.spec.containers[0].env) == 12",
    "object.spec.containers[1].ports.size() == 0",  # a missing field: the same error
    "object.metadata.annotations.note.size() > 90",
    "has(object.spec.volumes[0].emptyDir) && !has(object.spec.volumes[0].hostPath)",
    # what a map literal's key reads decides the result
    "{object.?metadata.?labels.?a.orValue('none'): true}.exists(k, k == '1')",
]


def _outcome(source: str, obj: Any, size: int) -> Any:
    try:
        return ENV.compile(source).evaluate(ENV.inputs({"object": obj}, size))
    except EvalError as exc:
        return f"error: {exc}"


@pytest.mark.parametrize("source", SOURCES)
def test_a_pod_cut_to_what_is_read_is_judged_as_the_whole(source: str) -> None:
    need = merge([ENV.compile(source).reads])["object"]
    found = prune(freeze(POD), need)
    assert found is not None
    cut, size = found
    assert size == input_size(POD)
    assert cut != POD  # something was left out ...
    assert _outcome(source, cut, size) == _outcome(source, POD, size)  # ... that nothing observes


def test_the_cost_bound_n_is_the_whole_objects() -> None:
    # the longest list is one no rule reads: n is still its length, so the bound is unchanged
    obj = {"spec": {"x": 1}, "unread": list(range(40)), "text": "y" * 501}
    found = prune(freeze(obj), merge([ENV.compile("object.spec.x == 1").reads])["object"])
    assert found == ({"spec": {"x": 1}}, 51)
    assert input_size(thaw(freeze(obj))) == 51


@pytest.mark.parametrize(
    "value",
    [2**64, -(2**63) - 1, dt.date(2026, 1, 1), b"x", {1: "a"}, {"k": "\ud800"}, {"\ud800": 1}, {"s": {1, 2}}],
)
def test_what_cel_cannot_represent_is_not_cut(value: Any) -> None:
    # unread, it would no longer fail the evaluation: the object is converted whole instead
    need = merge([ENV.compile("object.spec == 1").reads])["object"]
    assert prune({"spec": 1, "unread": [value]}, need) is None


def test_the_largest_numbers_cel_represents_are_cut() -> None:
    need = merge([ENV.compile("object.spec == 1").reads])["object"]
    assert prune({"spec": 1, "unread": [2**64 - 1, -(2**63), 1.5, None, True, "é"]}, need) == ({"spec": 1}, 6)
