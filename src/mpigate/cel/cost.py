"""A cost bound for a compiled expression, as a polynomial in the size of its inputs.

The API server stops a runaway expression by tracking the cost of an evaluation as it runs
(cel-go's ``interpreter.CostTracker``, limited by ``celconfig.PerCallLimit`` = 1,000,000 per
expression and ``RuntimeCELCostBudget`` = 10,000,000 per admission request; k8s.io/apiserver
pkg/apis/cel/config.go, pkg/admission/plugin/policy/validating/validator.go). cel-cpp, as
cel-expr-python exposes it, has no cost tracker. So mpigate bounds the cost *before* running the
expression instead: at compile time each expression gets a polynomial ``cost(n)`` that bounds the
work of one evaluation when no list, map or string in its inputs is longer than ``n`` (the shape
of cel-go's ``checker.CostEstimator``: every node costs 1, a comprehension costs its range's size
times its loop body, string and list functions cost their operands' size, lists built inside the
expression grow by what their steps add). At evaluation time ``n`` is measured on the actual
inputs, and an evaluation whose bound exceeds the per-call limit is not run — it is a runtime error
of the rule, which then follows its failure policy. The bound is conservative: an expression that
the API server would let finish may be stopped here when its inputs are large.

The expression tree is read from cel-expr-python's serialized ``cel.expr.CheckedExpr`` (an
``Any``; field numbers of cel-spec's ``proto/cel/expr/syntax.proto`` and ``checked.proto``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Cost", "Node", "checked_tree", "estimate", "estimate_tree", "input_size", "wire_fields"]

# Functions whose work is proportional to their operands' size (cel-go checker/cost.go
# "traversal" costs; 0.1 per character for strings there, 1 per element here). Comparisons are
# counted as one step, as cel-go counts them for anything but long strings and lists.
_LINEAR = frozenset(
    {
        "contains",
        "startsWith",
        "endsWith",
        "matches",
        "find",
        "findAll",
        "split",
        "join",
        "replace",
        "lowerAscii",
        "upperAscii",
        "trim",
        "substring",
        "indexOf",
        "lastIndexOf",
        "_+_",
        "@in",
        "string",
        "format",
        "quote",
        "reverse",
        "sort",
        "distinct",
        "flatten",
        "isSorted",
        "sum",
        "min",
        "max",
        "slice",
        "sets.contains",
        "sets.equivalent",
        "sets.intersects",
        "base64.encode",
        "base64.decode",
        "charAt",
    }
)


@dataclass(frozen=True, slots=True)
class Cost:
    """``Σ coefficients[k] · n^k``: a bound on one evaluation's cost for inputs of size ``n``."""

    coefficients: tuple[float, ...]

    @property
    def degree(self) -> int:
        return len(self.coefficients) - 1

    def at(self, n: int) -> float:
        total = 0.0
        for power, coefficient in enumerate(self.coefficients):
            total += coefficient * float(n) ** power
        return total


def _add(a: list[float], b: list[float]) -> list[float]:
    out = [0.0] * max(len(a), len(b))
    for i, v in enumerate(a):
        out[i] += v
    for i, v in enumerate(b):
        out[i] += v
    return out


def _mul(a: list[float], b: list[float]) -> list[float]:
    out = [0.0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


_ONE = [1.0]
_N = [0.0, 1.0]


# -- protobuf wire format -------------------------------------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def wire_fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of one protobuf message: varints as ints, the others as
    bytes (also read by :mod:`.fuse`, which writes them back)."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value = data[pos : pos + length]
            pos += length
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:  # pragma: no cover - groups are not used by cel.expr
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _fields(data: bytes) -> Iterator[tuple[int, Any]]:
    """(field number, value) of one message: varints as ints, length-delimited as bytes."""
    for number, _, value in wire_fields(data):
        yield number, value


def _field(data: bytes, number: int) -> bytes | None:
    return next((v for n, v in _fields(data) if n == number and isinstance(v, bytes)), None)


@dataclass(frozen=True, slots=True)
class Node:
    """One node of a checked expression's tree (cel.expr.Expr, as much as the cost bound and
    :mod:`.reads` need)."""

    kind: str  # const ident select call list struct comprehension
    name: str = ""  # ident name, select field, call function, a string constant's value
    children: tuple[Node, ...] = ()
    # comprehension: (range, accu init, loop condition, loop step, result) in children; name = accu,
    # keys = (iteration variable,) or, with two, (first, second); a select in has(): keys = ("has",)
    keys: tuple[str | None, ...] = ()  # struct: each entry's key when it is a string constant
    # struct: the key expressions of a map literal (evaluated like its values: they cost and read)
    key_nodes: tuple[Node, ...] = ()


def _parse(data: bytes) -> Node:
    for number, value in _fields(data):
        if number == 3:
            text = _field(value, 6)  # cel.expr.Constant.string_value
            return Node("const", text.decode() if text is not None else "")
        if number == 4:
            return Node("ident", (_field(value, 1) or b"").decode())
        if number == 5:
            operand = _field(value, 1)
            return Node(
                "select",
                (_field(value, 2) or b"").decode(),
                (_parse(operand),) if operand is not None else (),
                # has(a.b): cel.expr.Expr.Select.test_only
                ("has",) if any(n == 3 and v for n, v in _fields(value)) else (),
            )
        if number == 6:
            target: list[Node] = []
            args: list[Node] = []
            function = ""
            for n, v in _fields(value):
                if n == 1:
                    target.append(_parse(v))
                elif n == 2:
                    function = v.decode()
                elif n == 3:
                    args.append(_parse(v))
            return Node("call", function, (*target, *args))
        if number == 7:
            return Node("list", "", tuple(_parse(v) for n, v in _fields(value) if n == 1))
        if number == 8:
            entries = [entry for n, entry in _fields(value) if n == 2]
            values = [(_field(entry, 3), _field(entry, 4)) for entry in entries]
            nodes = [(_parse(k) if k is not None else None, _parse(v)) for k, v in values if v is not None]
            keys = tuple(k.name if k is not None and k.kind == "const" else None for k, _ in nodes)
            key_nodes = tuple(k for k, _ in nodes if k is not None)
            return Node("struct", "", tuple(v for _, v in nodes), keys, key_nodes)
        if number == 9:
            parts = dict(_fields(value))
            accu = bytes(parts.get(3, b"")).decode()
            children = tuple(_parse(bytes(parts.get(i, b""))) for i in (2, 4, 5, 6, 7))
            # iter_var (1) and, in a two-variable comprehension, iter_var2 (8)
            iters = (bytes(parts.get(1, b"")).decode(), bytes(parts.get(8, b"")).decode())
            return Node("comprehension", accu, children, iters if iters[1] else iters[:1])
    return Node("const")


def checked_tree(serialized: bytes) -> Node | None:
    """The expression tree of a compiled expression (``Expression.serialize()`` of cel-expr-python:
    a ``google.protobuf.Any`` holding a ``cel.expr.CheckedExpr``); None when it has none."""
    checked = _field(serialized, 2) or serialized  # google.protobuf.Any: value
    expr = _field(checked, 4)
    return _parse(expr) if expr is not None else None


@dataclass(frozen=True, slots=True)
class _Estimate:
    cost: list[float]
    size: list[float]  # bound on the size (elements or characters) of the value
    #: a map literal's entries by key (mpigate binds a policy's params and variables as one: the
    #: size of `params.exemptImages` is then that of the list written, not the inputs' n)
    fields: dict[str, _Estimate] | None = None


def _member(inner: _Estimate, name: str) -> _Estimate:
    """``inner.name`` (or ``inner.?name``): the entry's size when ``inner`` is a known literal."""
    found = inner.fields.get(name) if inner.fields is not None else None
    if found is not None:
        return _Estimate(_add(inner.cost, _ONE), found.size, found.fields)
    return _Estimate(_add(inner.cost, _ONE), _N)


def _estimate(node: Node, accus: dict[str, _Estimate]) -> _Estimate:
    if node.kind == "const":
        return _Estimate(_ONE, _ONE)
    if node.kind == "ident":
        known = accus.get(node.name)
        return _Estimate(_ONE, known.size, known.fields) if known is not None else _Estimate(_ONE, _N)
    if node.kind == "select":
        inner = _estimate(node.children[0], accus) if node.children else _Estimate(_ONE, _N)
        return _member(inner, node.name)
    if node.kind in ("list", "struct"):
        parts = [_estimate(c, accus) for c in node.children]
        cost = _ONE
        for p in (*parts, *(_estimate(k, accus) for k in node.key_nodes)):
            cost = _add(cost, p.cost)
        fields = None
        if node.kind == "struct" and node.keys and all(k is not None for k in node.keys):
            fields = {str(k): p for k, p in zip(node.keys, parts, strict=True)}
        return _Estimate(cost, [float(len(parts) or 1)], fields)
    if node.kind == "call":
        if node.name == "_?._" and len(node.children) == 2 and node.children[1].kind == "const":
            return _member(_estimate(node.children[0], accus), node.children[1].name)
        parts = [_estimate(c, accus) for c in node.children]
        if node.name == "dyn" and len(parts) == 1:
            return _Estimate(_add(parts[0].cost, _ONE), parts[0].size, parts[0].fields)
        cost = _ONE
        size: list[float] = _N
        for p in parts:
            cost = _add(cost, p.cost)
        if node.name in _LINEAR:
            for p in parts:
                cost = _add(cost, p.size)
        if node.name == "_+_" and parts:
            size = [0.0]
            for p in parts:
                size = _add(size, p.size)
        elif node.name == "replace" and len(parts) >= 3:
            size = _mul(parts[0].size, _add(_ONE, parts[2].size))
        elif node.name == "join" and parts:
            size = _mul(parts[0].size, _N)
        elif node.name == "_?_:_" and len(parts) == 3:
            # either branch (a filter's step: `cond ? accu + [x] : accu` grows by one per step)
            size = _add(parts[1].size, parts[2].size)
        return _Estimate(cost, size)
    # comprehension: range, accu init, loop condition, loop step, result
    rng, init, cond, step, result = node.children
    r = _estimate(rng, accus)
    i = _estimate(init, accus)
    # the step's own growth: the accumulator read as empty
    grown = _estimate(step, {**accus, node.name: _Estimate(_ONE, [0.0])})
    accu_size = _add(i.size, _mul(r.size, grown.size))
    # cel.bind (an empty range): the accumulator is the bound value, entries and all
    bound = node.children[0].kind == "list" and not node.children[0].children
    scope = {**accus, node.name: _Estimate(_ONE, accu_size, i.fields if bound else None)}
    c = _estimate(cond, scope)
    s = _estimate(step, scope)
    out = _estimate(result, scope)
    body = _add(c.cost, s.cost)
    cost = _add(_add(r.cost, i.cost), _add(_mul(r.size, body), out.cost))
    return _Estimate(cost, accu_size)


def estimate(serialized: bytes) -> Cost:
    """The cost bound of a compiled expression (``Expression.serialize()`` of cel-expr-python)."""
    return estimate_tree(checked_tree(serialized))


def estimate_tree(tree: Node | None) -> Cost:
    """The cost bound of the expression tree :func:`checked_tree` read."""
    if tree is None:
        return Cost((1.0,))
    found = _estimate(tree, {})
    coefficients = list(found.cost)
    while len(coefficients) > 1 and coefficients[-1] == 0.0:
        coefficients.pop()
    return Cost(tuple(coefficients))


# cel-go common/cost.go StringTraversalCostFactor: a string costs 0.1 per character to traverse.
_STRING_FACTOR = 10


def input_size(value: Any, limit: int = 1 << 30) -> int:
    """The ``n`` of :class:`Cost` for ``value``: the size of its longest list or map, or a tenth of
    its longest string (cel-go charges 0.1 per character where it charges 1 per element), so that a
    pod's image names do not count as long as its containers list in every comprehension."""
    # the engine measures every effective pod: plain comparisons, no calls but the list's own
    largest = 1
    longest_text = largest * _STRING_FACTOR
    stack = [value]
    pop = stack.pop
    extend = stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            if len(item) > largest:
                largest = len(item)
                longest_text = largest * _STRING_FACTOR
            extend(item.values())
        elif kind is list:
            if len(item) > largest:
                largest = len(item)
                longest_text = largest * _STRING_FACTOR
            extend(item)
        elif kind is str and len(item) > longest_text:
            largest = -(-len(item) // _STRING_FACTOR)
            longest_text = largest * _STRING_FACTOR
        else:
            continue
        if largest >= limit:
            break
    return largest
