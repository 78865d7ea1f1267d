"""``quantity(s).asApproximateFloat()`` as one call into Python instead of two.

Every call from cel-cpp into a Python function crosses the binding, and a Kubernetes opaque value
crosses it as a protobuf message, serialized and parsed each way (:mod:`.types`): ``quantity(s)``
costs about 2 µs and ``.asApproximateFloat()`` on its result 1.7 µs, against 0.9 µs for a call
that takes a string and returns a number. A limits/requests ratio rule makes four such calls per
container. So a checked expression's ``quantity(x).asApproximateFloat()`` is rewritten into
``@mpigate_quantity_float(x)`` (a name no source can spell, declared in :mod:`.k8slib`), which
parses ``x`` exactly as ``quantity(x)`` does and returns what ``asApproximateFloat`` would: the
same value, the same error for text that is no quantity, and — the fused name put back in the
message by :func:`restore_names` — the same ``No matching overloads found : quantity(int64)`` for
a value that is not a string. The cost bound and the reads are taken from the expression as
written; only the evaluated program is rewritten.

The rewrite works on the serialized ``cel.expr.CheckedExpr`` (cel-spec ``checked.proto`` and
``syntax.proto`` field numbers) that cel-expr-python's ``Expression.serialize`` gives and
``Env.deserialize`` takes back.
"""

from __future__ import annotations

from collections.abc import Callable

from .cost import wire_fields

__all__ = ["FUSED", "fuse", "restore_names"]

#: fused function name -> (its overload id, the function its errors are reported as)
FUSED: dict[str, tuple[str, str]] = {"@mpigate_quantity_float": ("mpigate_quantity_float", "quantity")}

_Field = tuple[int, int, int | bytes]  # (number, wire type, varint or raw bytes)


def _decode(data: bytes) -> list[_Field]:
    return list(wire_fields(data))


def _put_varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _encode(fields: list[_Field]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _put_varint(number << 3 | wire)
        if wire == 0:
            assert isinstance(value, int)
            out += _put_varint(value)
        elif wire == 2:
            assert isinstance(value, bytes)
            out += _put_varint(len(value)) + value
        else:
            assert isinstance(value, bytes)
            out += value
    return bytes(out)


def _string(text: str) -> bytes:
    return text.encode()


class _Rewrite:
    def __init__(self) -> None:
        self.fused: dict[int, str] = {}  # outer call id -> fused function name
        self.dropped: set[int] = set()  # ids of the quantity() calls folded into them

    def expr(self, data: bytes) -> bytes:
        fields = _decode(data)
        changed = False
        out: list[_Field] = []
        for number, wire, value in fields:
            if wire == 2 and isinstance(value, bytes):
                rewritten = self._child(number, value)
                if rewritten is not value:
                    changed = True
                    value = rewritten
            out.append((number, wire, value))
        fused = self._fused(out)
        if fused is not None:
            return fused
        return _encode(out) if changed else data

    def _child(self, number: int, value: bytes) -> bytes:
        # Expr: 5 select, 6 call, 7 list, 8 struct, 9 comprehension (each holding Exprs)
        if number == 5:
            return self._each(value, {1})
        if number == 6:
            return self._each(value, {1, 3})
        if number == 7:
            return self._each(value, {1})
        if number == 8:
            return self._each(value, {2}, self._entry)
        if number == 9:
            return self._each(value, {2, 4, 5, 6, 7})
        return value

    def _entry(self, data: bytes) -> bytes:
        return self._each(data, {3, 4})  # CreateStruct.Entry: map_key, value

    def _each(self, data: bytes, numbers: set[int], visit: Callable[[bytes], bytes] | None = None) -> bytes:
        fields = _decode(data)
        changed = False
        for i, (number, wire, value) in enumerate(fields):
            if number in numbers and wire == 2 and isinstance(value, bytes):
                rewritten = (visit or self.expr)(value)
                if rewritten is not value:
                    fields[i] = (number, wire, rewritten)
                    changed = True
        return _encode(fields) if changed else data

    def _fused(self, fields: list[_Field]) -> bytes | None:
        """``fields`` of an Expr that calls ``quantity(x).asApproximateFloat()`` as the fused call
        (None: another expression)."""
        ident = next((v for n, w, v in fields if n == 2 and w == 0), None)  # Expr.id
        call = next((v for n, w, v in fields if n == 6 and w == 2), None)
        if not isinstance(ident, int) or not isinstance(call, bytes):
            return None
        parts = _decode(call)
        if [v for n, _, v in parts if n == 2] != [b"asApproximateFloat"]:
            return None
        targets = [v for n, _, v in parts if n == 1]
        if len(targets) != 1 or any(n == 3 for n, _, _ in parts) or not isinstance(targets[0], bytes):
            return None
        inner = _decode(targets[0])
        inner_id = next((v for n, w, v in inner if n == 2 and w == 0), None)
        inner_call = next((v for n, w, v in inner if n == 6 and w == 2), None)
        if not isinstance(inner_id, int) or not isinstance(inner_call, bytes):
            return None
        inner_parts = _decode(inner_call)
        args = [v for n, _, v in inner_parts if n == 3]
        if (
            [v for n, _, v in inner_parts if n == 2] != [b"quantity"]
            or any(n == 1 for n, _, _ in inner_parts)
            or len(args) != 1
            or not isinstance(args[0], bytes)
        ):
            return None
        name = "@mpigate_quantity_float"
        self.fused[ident] = name
        self.dropped.add(inner_id)
        fused_call = _encode([(2, 2, _string(name)), (3, 2, args[0])])
        return _encode([(2, 0, ident), (6, 2, fused_call)])


def fuse(serialized: bytes) -> bytes | None:
    """The serialized checked expression with each ``quantity(x).asApproximateFloat()`` fused
    (None: there is none, or the data is not a checked expression this module reads)."""
    try:
        wrapper = _decode(serialized)
        value = next((v for n, w, v in wrapper if n == 2 and w == 2), None)
        if not isinstance(value, bytes):
            return None
        checked = _decode(value)
        rewrite = _Rewrite()
        out: list[_Field] = []
        for number, wire, field_value in checked:
            if number == 4 and wire == 2 and isinstance(field_value, bytes):
                field_value = rewrite.expr(field_value)
            out.append((number, wire, field_value))
        if not rewrite.fused:
            return None
        references: list[_Field] = []
        for number, wire, field_value in out:
            if number == 2 and wire == 2 and isinstance(field_value, bytes):
                # reference_map entry: 1 key (the expression id), 2 value (cel.expr.Reference)
                entry = _decode(field_value)
                key = next((v for n, w, v in entry if n == 1 and w == 0), None)
                if key in rewrite.dropped:
                    continue
                if isinstance(key, int) and key in rewrite.fused:
                    name = rewrite.fused[key]
                    reference = _encode([(1, 2, _string(name)), (3, 2, _string(FUSED[name][0]))])
                    field_value = _encode([(1, 0, key), (2, 2, reference)])
            elif number == 3 and wire == 2 and isinstance(field_value, bytes):
                # type_map entry: 1 key, 2 value (cel.expr.Type); the folded call has no node now
                entry = _decode(field_value)
                if next((v for n, w, v in entry if n == 1 and w == 0), None) in rewrite.dropped:
                    continue
            references.append((number, wire, field_value))
        checked_bytes = _encode(references)
        return _encode([(n, w, checked_bytes if n == 2 and w == 2 else v) for n, w, v in wrapper])
    except (ValueError, IndexError):  # pragma: no cover - not the binding's format
        return None


def restore_names(message: str) -> str:
    """An evaluation error of a fused program as the program as written gives it."""
    for name, (_, original) in FUSED.items():
        if name in message:
            message = message.replace(f"{name}(", f"{original}(")
    return message
