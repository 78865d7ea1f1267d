"""RFC 6902 diff and apply, including RFC 6901 escaping, with hypothesis properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpigate.policy.jsonpatch import JsonPatchError, apply_patch, diff, pointer, resolve_pointer

json_scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8)
keys = st.text(alphabet="ab/~01-._", min_size=0, max_size=6)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(json_values, json_values)
def test_applying_the_diff_yields_the_target(old: Any, new: Any) -> None:
    ops = diff(old, new)
    assert apply_patch(old, ops) == new
    assert diff(new, new) == []


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(keys, json_values, max_size=5), keys, json_values)
def test_adding_a_key_is_one_add_op_with_an_escaped_pointer(
    doc: dict[str, Any], key: str, value: Any
) -> None:
    if key in doc:
        return
    target = {**doc, key: value}
    assert diff(doc, target) == [{"op": "add", "path": pointer([key]), "value": value}]
    assert resolve_pointer(target, pointer([key])) == value


def test_escaping() -> None:
    assert pointer(["metadata", "labels", "kueue.x-k8s.io/queue-name", "a~b"]) == (
        "/metadata/labels/kueue.x-k8s.io~1queue-name/a~0b"
    )
    doc = {"a/b": {"c~d": 1}}
    assert apply_patch(doc, [{"op": "replace", "path": "/a~1b/c~0d", "value": 2}]) == {"a/b": {"c~d": 2}}
    assert doc == {"a/b": {"c~d": 1}}  # never modified in place


def test_all_operations() -> None:
    doc = {"list": [1, 2, 3], "obj": {"k": "v"}}
    ops = [
        {"op": "add", "path": "/list/-", "value": 4},
        {"op": "add", "path": "/list/0", "value": 0},
        {"op": "remove", "path": "/list/1"},
        {"op": "replace", "path": "/obj/k", "value": "w"},
        {"op": "copy", "from": "/obj", "path": "/copy"},
        {"op": "move", "from": "/copy/k", "path": "/moved"},
        {"op": "test", "path": "/moved", "value": "w"},
    ]
    assert apply_patch(doc, ops) == {"list": [0, 2, 3, 4], "obj": {"k": "w"}, "copy": {}, "moved": "w"}


@pytest.mark.parametrize(
    ("op", "why"),
    [
        ({"op": "remove", "path": "/missing"}, "does not exist"),
        ({"op": "add", "path": "/list/9", "value": 1}, "out of range"),
        ({"op": "add", "path": "/list/01", "value": 1}, "not an array index"),
        ({"op": "test", "path": "/list/0", "value": True}, "test failed"),
        ({"op": "replace", "path": "x", "value": 1}, "not a JSON pointer"),
        ({"op": "bogus", "path": "/list"}, "unknown op"),
        ({"op": "move", "from": "/obj", "path": "/obj/x"}, "into itself"),
    ],
)
def test_errors_say_which_operation_failed(op: dict[str, Any], why: str) -> None:
    with pytest.raises(JsonPatchError, match=why) as info:
        apply_patch({"list": [1], "obj": {}}, [op])
    assert str(info.value).startswith("operation 0 (")


def test_booleans_and_numbers_are_different_json_values() -> None:
    assert diff({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert diff([1], [1.0]) == []
