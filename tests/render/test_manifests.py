"""The canonical YAML dump: key order, and that any JSON-like value survives dump → load."""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mpigate.render import dump_documents, dump_object
from mpigate.render.manifests import canonical, load_documents

# Strings that YAML 1.1 would read as something else unless quoted, and block-scalar edge cases.
TRICKY = st.sampled_from(
    [
        "yes",
        "no",
        "on",
        "off",
        "~",
        "null",
        "0123",
        "1e3",
        "0x1F",
        "12:30",
        "-",
        "- a",
        "#x",
        "a: b",
        "",
        " lead",
        "trail ",
        "multi\nline",
        "multi\nline\n",
        "tab\there",
        "\n\nblank",
        "é ü ✓",
        "'q'",
        '"q"',
        "line \nwith trailing space",
        "\r\nwindows",
        "a\u2028b",
        "{x}",
        "[x]",
        "*alias",
        "&anchor",
        "!tag",
        "%dir",
        "2026-11-22",
        "true",
        "False",
        ".inf",
        "1_000",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    TRICKY,
    st.text(max_size=40),
)
KEYS = st.one_of(TRICKY, st.text(min_size=1, max_size=20))
VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(KEYS, children, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(KEYS, VALUES, min_size=1, max_size=5), min_size=1, max_size=3))
def test_dump_then_load_gives_the_same_data(documents: list[dict]) -> None:
    text = dump_documents(documents)
    assert load_documents(text) == documents
    assert list(yaml.safe_load_all(text)) == documents  # any YAML reader, not just ours
    assert text.endswith("\n") and text.startswith("---")


@given(st.dictionaries(KEYS, VALUES, max_size=6))
def test_dump_is_independent_of_key_order(data: dict) -> None:
    reordered = dict(reversed(list(data.items())))
    assert dump_object(data) == dump_object(reordered)


def test_key_order() -> None:
    obj = {
        "spec": {"z": 1, "a": [{"value": 1, "name": "x"}]},
        "metadata": {"labels": {"b": "1", "a": "2"}, "namespace": "ns", "name": "n"},
        "kind": "K",
        "apiVersion": "v1",
        "data": {"text": "two\nlines\n"},
    }
    assert dump_object(obj) == (
        "apiVersion: v1\n"
        "kind: K\n"
        "metadata:\n"
        "  name: n\n"
        "  namespace: ns\n"
        "  labels:\n"
        "    a: '2'\n"
        "    b: '1'\n"
        "data:\n"
        "  text: |\n"
        "    two\n"
        "    lines\n"
        "spec:\n"
        "  a:\n"
        "  - name: x\n"
        "    value: 1\n"
        "  z: 1\n"
    )
    assert list(canonical(obj)) == ["apiVersion", "kind", "metadata", "data", "spec"]
