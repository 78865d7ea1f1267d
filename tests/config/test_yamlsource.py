"""YAML with locations: round trips, positions, duplicate keys, hostile input."""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mpigate.config.yamlsource import YamlLimits, parse_documents

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(min_size=1, max_size=10), children, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_round_trip_equals_safe_load(value: object) -> None:
    text = yaml.safe_dump({"root": value}, sort_keys=False, allow_unicode=True)
    docs, problems = parse_documents(text, "x.yaml")
    assert problems == []
    assert docs[0].data == yaml.safe_load(text)


def test_positions_point_at_keys_and_values() -> None:
    text = "a:\n  b: 1\n  c:\n    - x\n    - {d: 2}\n"
    (doc,), problems = parse_documents(text, "f.yaml")
    assert problems == []
    assert doc.locate(("a", "b")).line == 2
    assert doc.locate(("a", "c", 1, "d")).line == 5
    assert doc.locate(("a", "c", 1, "d")).column == 8
    assert doc.locate(("a", "c", 0), key=False).line == 4
    # a missing path falls back to the nearest ancestor
    assert doc.locate(("a", "missing", "deeper")).line == 1


def test_keys_stay_text_and_dates_become_strings() -> None:
    (doc,), _ = parse_documents("no: 1\n3: x\nexpires: 2026-12-31\nat: 2026-01-02T03:04:05Z\n", "f")
    assert doc.data == {"no": 1, "3": "x", "expires": "2026-12-31", "at": "2026-01-02T03:04:05Z"}


def test_duplicate_keys_are_reported_at_the_second() -> None:
    _, problems = parse_documents("a: 1\nb: 2\na: 3\n", "f.yaml")
    (problem,) = problems
    assert (problem.code, problem.location.line, problem.path) == ("yaml.duplicate-key", 3, "a")
    assert "first defined on line 1" in problem.message


def test_multiple_documents_and_syntax_error_keeps_earlier_ones() -> None:
    docs, problems = parse_documents("a: 1\n---\n---\nb: 2\n---\nc: [\n", "f.yaml")
    assert [d.data for d in docs] == [{"a": 1}, {"b": 2}]
    assert [d.index for d in docs] == [0, 2]
    assert problems[0].code == "yaml.syntax"
    assert problems[0].location.line == 7


def test_alias_bomb_is_refused_quickly() -> None:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):
        refs = ",".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    docs, problems = parse_documents("\n".join(lines) + "\n", "bomb.yaml")
    assert docs == []
    assert problems[0].code == "yaml.too-large"


def test_deep_nesting_and_size_limits() -> None:
    deep = "a: " + "[" * 300 + "]" * 300 + "\n"
    _, problems = parse_documents(deep, "deep.yaml", YamlLimits(max_depth=100))
    assert problems and problems[0].code == "yaml.too-large"
    _, problems = parse_documents("a: 1\n" * 100, "big.yaml", YamlLimits(max_bytes=64))
    assert problems[0].code == "yaml.too-large"


def test_recursive_alias_does_not_hang() -> None:
    _, problems = parse_documents("a: &x [*x]\n", "rec.yaml")
    assert problems  # either a syntax error or a depth error, never a hang or a crash
