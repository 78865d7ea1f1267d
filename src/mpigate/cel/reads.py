"""What an expression reads of its inputs, and the inputs cut down to that before conversion.

cel-expr-python converts a variable's Python value into CEL values as a whole, on the first
evaluation that reads the variable: a pod of 1,000 JSON characters costs 20-40 µs, more than the
30 rules a pod is judged by take together apart from their ``quantity()`` calls. Most of a pod is
read by no rule. So each compiled expression knows, from its checked tree, which fields of each
variable it can observe (:func:`reads_of`), a config unites them over all its expressions
(:func:`merge`), and :func:`prune` copies only those fields of an object — while measuring the
whole object for the cost bound's ``n``, which stays what it was.

The analysis follows values through the expression: a field selection (``a.b``, ``a.?b``,
``has(a.b)``, ``a['b']``) reads that field of whatever ``a`` may be; iterating (a comprehension's
range, an index that is not a string constant) reads every element or every entry; ``dyn``,
``orValue``, ``value``, ``optional.of``, ``or`` and the branches of ``?:`` pass their operand on,
as do a comprehension's accumulator and ``cel.bind``; a value used in any other way (compared,
passed to a function, put into a list or map literal, returned) is read whole. A field no
expression can observe is left out, which no expression can tell: the copy keeps every list's
length and every value's type, and an object that holds anything but JSON values CEL can represent
is not cut at all (:func:`prune` returns None), so that a value the binding cannot convert fails
the evaluation exactly as it did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from .cost import _STRING_FACTOR, Node

__all__ = ["Need", "merge", "prune", "reads_of"]


class Need:
    """What is read of one value: all of it (``whole``), the entries ``fields`` names (each with
    what is read of it), and what is read of every element or entry (``any``, None: none is
    read). Built by :func:`reads_of` and :func:`merge`; read-only afterwards."""

    __slots__ = ("_merged", "any", "fields", "whole")

    def __init__(self) -> None:
        self.whole = False
        self.fields: dict[str, Need] = {}
        self.any: Need | None = None
        self._merged: dict[str, Need] = {}

    def field(self, name: str) -> Need:
        found = self.fields.get(name)
        if found is None:
            found = self.fields[name] = Need()
        return found

    def every(self) -> Need:
        if self.any is None:
            self.any = Need()
        return self.any

    def child(self, key: str) -> Need | None:
        """What is read of the entry ``key`` (None: nothing, it may be left out)."""
        named = self.fields.get(key)
        if self.any is None or named is None:
            return named if named is not None else self.any
        found = self._merged.get(key)
        if found is None:
            found = Need()
            _merge_into(found, named)
            _merge_into(found, self.any)
            self._merged[key] = found
        return found

    def describe(self) -> Any:
        """The need as plain data (for tests and messages): ``"*"`` whole, else a dict of fields
        with ``"[]"`` for every element."""
        if self.whole:
            return "*"
        out: dict[str, Any] = {name: need.describe() for name, need in self.fields.items()}
        if self.any is not None:
            out["[]"] = self.any.describe()
        return out


def _merge_into(target: Need, source: Need) -> None:
    if source.whole:
        target.whole = True
    if target.whole:
        return
    for name, need in source.fields.items():
        _merge_into(target.field(name), need)
    if source.any is not None:
        _merge_into(target.every(), source.any)


def merge(reads: Iterable[Mapping[str, Need]]) -> dict[str, Need]:
    """The union of several expressions' reads, per variable."""
    out: dict[str, Need] = {}
    for found in reads:
        for name, need in found.items():
            _merge_into(out.setdefault(name, Need()), need)
    return out


# Functions whose result is (one of) their operands, unchanged.
_PASS = frozenset({"dyn", "orValue", "value", "optional.of", "or", "optional.or"})
# Functions that observe only whether their operand (an optional) holds a value, which a field's
# presence decides and the selection that made the optional already reads.
_PRESENCE = frozenset({"hasValue"})
_SELECT = frozenset({"_?._", "_[_]", "_[?_]"})

_Value = tuple[Need, ...]  # the read values an expression's value may be


class _Reads:
    def __init__(self, variables: frozenset[str]) -> None:
        self.variables = variables
        self.roots: dict[str, Need] = {}

    def whole(self, value: _Value) -> None:
        for need in value:
            need.whole = True

    def visit(self, node: Node, scope: Mapping[str, _Value]) -> _Value:
        kind = node.kind
        if kind == "const":
            return ()
        if kind == "ident":
            bound = scope.get(node.name)
            if bound is not None:
                return bound
            # a checker may fold a selection chain into one qualified name: variable.field...
            first, *fields = node.name.split(".")
            if first not in self.variables or first in scope:
                return ()
            need = self.roots.get(first)
            if need is None:
                need = self.roots[first] = Need()
            for name in fields:
                need = need.field(name)
            return (need,)
        if kind == "select":
            inner = self.visit(node.children[0], scope) if node.children else ()
            selected = tuple(need.field(node.name) for need in inner)
            return () if node.keys else selected  # has(): the field's presence, a bool
        if kind in ("list", "struct"):
            for child in (*node.children, *node.key_nodes):
                self.whole(self.visit(child, scope))
            return ()
        if kind == "call":
            return self._call(node, scope)
        return self._comprehension(node, scope)

    def _call(self, node: Node, scope: Mapping[str, _Value]) -> _Value:
        name, children = node.name, node.children
        if name in _SELECT and len(children) == 2:
            inner = self.visit(children[0], scope)
            key = children[1]
            if key.kind == "const" and key.name:
                return tuple(need.field(key.name) for need in inner)
            self.whole(self.visit(key, scope))
            return tuple(need.every() for need in inner)
        if name == "_?_:_" and len(children) == 3:
            self.whole(self.visit(children[0], scope))
            return self.visit(children[1], scope) + self.visit(children[2], scope)
        parts = [self.visit(child, scope) for child in children]
        if name in _PASS:
            return tuple(need for part in parts for need in part)
        if name not in _PRESENCE:
            for part in parts:
                self.whole(part)
        return ()

    def _comprehension(self, node: Node, scope: Mapping[str, _Value]) -> _Value:
        # children: range, accu init, loop condition, loop step, result; name: accu; keys: iter vars
        rng, init, cond, step, result = node.children
        iterated = tuple(need.every() for need in self.visit(rng, scope))
        accu = self.visit(init, scope)
        inner = dict(scope)
        # each iteration variable may be an element (an entry's value; in a two-variable
        # comprehension over a list the first is the index, for which this reads more than needed)
        for iter_var in node.keys:
            if iter_var:
                inner[iter_var] = iterated
        # the accumulator is the initial value or what a step made of it (a fixpoint: values only grow)
        for _ in range(3):
            inner[node.name] = accu
            self.whole(self.visit(cond, inner))
            grown = tuple(dict.fromkeys(accu + self.visit(step, inner)))
            if len(grown) == len(accu):
                break
            accu = grown
        else:
            # still growing (no step of the standard macros does this): whatever it holds is read whole
            self.whole(accu)
        inner[node.name] = accu
        return self.visit(result, inner)


def reads_of(tree: Node | None, variables: Iterable[str]) -> dict[str, Need]:
    """What the expression ``tree`` (:func:`mpigate.cel.cost.checked_tree`) reads of each of
    ``variables``; its result is read whole. A variable it does not name is absent."""
    if tree is None:
        return {name: _whole() for name in variables}
    reads = _Reads(frozenset(variables))
    reads.whole(reads.visit(tree, {}))
    return reads.roots


def _whole() -> Need:
    need = Need()
    need.whole = True
    return need


# -- cutting a value down to what is read -----------------------------------------------------------

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # int64 and uint64: what the binding converts


class _Unrepresentable(Exception):
    pass


def _utf8(text: str) -> bool:
    # the binding converts a string through UTF-8: a lone surrogate cannot be
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _measure(value: Any) -> tuple[int, bool]:
    """:func:`mpigate.cel.cost.input_size` of ``value``'s plain copy, and whether ``value`` is plain
    already (dicts and lists only); :class:`_Unrepresentable` when it holds anything but JSON values
    the binding converts (mappings with string keys, sequences, strings, 64-bit integers, floats,
    booleans, null)."""
    plain = True
    largest = 1
    longest_text = largest * _STRING_FACTOR
    stack = [value]
    pop = stack.pop
    extend = stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is str:
            if len(item) > longest_text:
                largest = -(-len(item) // _STRING_FACTOR)
                longest_text = largest * _STRING_FACTOR
            if not item.isascii() and not _utf8(item):
                raise _Unrepresentable
        elif kind is dict or kind is MappingProxyType:
            if kind is not dict:
                plain = False
            if len(item) > largest:
                largest = len(item)
                longest_text = largest * _STRING_FACTOR
            try:
                ascii_keys = all(map(str.isascii, item))
            except TypeError:  # a key that is not a string
                raise _Unrepresentable from None
            if not ascii_keys and not all(map(_utf8, item)):
                raise _Unrepresentable
            extend(item.values())
        elif kind is list or kind is tuple:
            if kind is not list:
                plain = False
            if len(item) > largest:
                largest = len(item)
                longest_text = largest * _STRING_FACTOR
            extend(item)
        elif kind is int:
            if not _INT_MIN <= item <= _INT_MAX:
                raise _Unrepresentable
        elif kind is not bool and kind is not float and item is not None:
            raise _Unrepresentable
    return largest, plain


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind is dict or kind is MappingProxyType:
        return {k: _plain(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_plain(v) for v in value]
    return value


def _cut(value: Any, need: Need, shared: bool) -> Any:
    # shared: value is plain data already, whose parts read whole can be handed over as they are
    # (nothing mutates the inputs, and they are converted within the request)
    if need.whole:
        return value if shared else _plain(value)
    kind = type(value)
    if kind is dict or kind is MappingProxyType:
        every = need.any
        if every is not None:
            return {key: _cut(item, need.child(key) or every, shared) for key, item in value.items()}
        # only looked up by key (nothing iterates it, or it would be read every entry): the order
        # of the entries cannot be observed
        out: dict[str, Any] = {}
        for key, child in need.fields.items():
            item = value.get(key, _ABSENT)
            if item is not _ABSENT:
                out[key] = item if child.whole and shared else _cut(item, child, shared)
        return out
    if kind is list or kind is tuple:
        element = need.any or _NOTHING
        if element.whole and shared:
            return value
        return [_cut(item, element, shared) for item in value]
    return value


_ABSENT = object()
_NOTHING = Need()


def prune(value: Any, need: Need | None) -> tuple[Any, int] | None:
    """``value`` (plain or frozen JSON-like data) as plain data holding what ``need`` reads, and
    the cost bound's ``n`` of all of ``value`` — what :func:`mpigate.config.thaw` and
    :func:`mpigate.cel.cost.input_size` give for it, but without the fields no expression reads.
    None when ``value`` holds anything CEL cannot represent (a number beyond 64 bits, a key that is
    not a string, a string with a lone surrogate, a date...): the caller converts it whole."""
    try:
        size, plain = _measure(value)
    except _Unrepresentable:
        return None
    return _cut(value, need if need is not None else _NOTHING, plain), size
