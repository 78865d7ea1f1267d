"""mpigate.cel.fuse: quantity(x).asApproximateFloat() evaluated as one call into Python, with the
results and errors of the expression as written."""

from __future__ import annotations

from typing import Any

import pytest
from cel_expr_python import cel

from mpigate.cel import CompileError, Environment, EvalError
from mpigate.cel.cost import estimate
from mpigate.cel.env import _clean

ENV = Environment(["object"])

SOURCES = [
    "quantity(object.x).asApproximateFloat()",
    "quantity(object.x).asApproximateFloat() <= 4.0 * quantity(object.y).asApproximateFloat()",
    "quantity(object.x).asApproximateFloat() > 1.0 || true",
    "object.list.map(q, quantity(q).asApproximateFloat())",
    "[quantity(object.x).asApproximateFloat(), quantity(object.x).isInteger()]",
    "quantity(quantity(object.x).asApproximateFloat() > 1.0 ? '2' : '3').asApproximateFloat()",
]
VALUES: list[Any] = ["1500m", "2Gi", "1e3", ".5", "zz", " 1", "", 7, 2**63, None, 1.5, ["1"], {"a": 1}]


def _written(source: str, obj: Any) -> Any:
    """The expression compiled as written (not fused), evaluated as mpigate reports it."""
    expression = ENV._env.compile(source)
    try:
        result = expression.eval(ENV._env.Activation({"object": obj}))
    except Exception as exc:
        return f"error: {_clean(str(exc))}"
    if result.type() == cel.Type.ERROR:
        return f"error: {_clean(str(result.value()))}"
    return result.plain_value()


def _fused(source: str, obj: Any) -> Any:
    try:
        return ENV.compile(source).evaluate(ENV.inputs({"object": obj}))
    except EvalError as exc:
        return f"error: {exc}"


@pytest.mark.parametrize("source", SOURCES)
def test_a_fused_quantity_gives_the_results_and_errors_of_the_expression_as_written(source: str) -> None:
    program = ENV.compile(source)
    assert b"@mpigate_quantity_float" in program.expression.serialize()
    for value in VALUES:
        obj = {"x": value, "y": "1Gi", "list": [value, "3"]}
        assert _fused(source, obj) == _written(source, obj), value


def test_errors_name_quantity() -> None:
    assert _fused(SOURCES[0], {"x": 7}) == "error: No matching overloads found : quantity(int64)"
    assert _fused(SOURCES[0], {"x": "zz"}).startswith("error: quantities must match the regular expression")


def test_the_cost_bound_and_reads_are_the_expressions_as_written() -> None:
    source = "object.list.all(q, quantity(q).asApproximateFloat() > 0.0)"
    program = ENV.compile(source)
    assert program.cost == estimate(ENV._env.compile(source).serialize())
    assert program.cost.degree == 1
    assert {k: v.describe() for k, v in program.reads.items()} == {"object": {"list": {"[]": "*"}}}


def test_no_source_can_call_the_fused_function() -> None:
    with pytest.raises(CompileError):
        ENV.compile("@mpigate_quantity_float('1')")
