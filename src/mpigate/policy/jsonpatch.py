"""JSON Patch (RFC 6902): a deterministic diff for the mutating webhook, and an applier.

The diff walks both documents in the mutated document's key order and emits, per mapping,
``remove`` for dropped keys first, then ``replace``/``add`` in key order. Lists that only grew at
the end get ``add`` at their new indexes; any other list change replaces the list, except that
lists of equal length are diffed element by element (so rebuilding mpigate's own
``runtimePatches`` entry becomes one ``replace`` of that entry). Pointers escape ``~`` and ``/``
as ``~0`` and ``~1`` (RFC 6901).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpigate.trainjob.jsontypes import is_mapping
from mpigate.trainjob.smp import copy_json

__all__ = ["JsonPatchError", "apply_patch", "diff", "escape", "pointer", "resolve_pointer", "unescape"]


class JsonPatchError(ValueError):
    """A patch that cannot be applied to the document (with the failing operation's index)."""


def escape(token: str) -> str:
    if "~" not in token and "/" not in token:  # nearly every key: no new string
        return token
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def pointer(parts: Sequence[str | int]) -> str:
    """``("metadata", "labels", "a/b")`` → ``/metadata/labels/a~1b``."""
    return "".join("/" + escape(str(p)) for p in parts)


def _split(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise JsonPatchError(f"{path!r} is not a JSON pointer (must start with '/')")
    return [unescape(t) for t in path[1:].split("/")]


def resolve_pointer(doc: Any, path: str) -> Any:
    """The value at ``path`` (KeyError when it does not exist)."""
    node = doc
    for token in _split(path):
        if is_mapping(node):
            node = node[token]
        elif isinstance(node, list):
            if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
                raise KeyError(token)
            node = node[int(token)]
        else:
            raise KeyError(token)
    return node


def diff(old: Any, new: Any) -> list[dict[str, Any]]:
    """RFC 6902 operations that turn ``old`` into ``new`` (deterministic order). The operations'
    values are copies: the patch shares nothing with either document."""
    ops: list[dict[str, Any]] = []
    _diff(old, new, "", ops)
    for op in ops:
        if "value" in op:
            op["value"] = copy_json(op["value"])
    return ops


def _diff(old: Any, new: Any, path: str, ops: list[dict[str, Any]]) -> None:
    # ``path`` is the JSON pointer so far: each level appends one escaped token instead of
    # re-joining the whole path for every key visited (hot path of the mutating webhook).
    if old is new:  # a subtree shared by both documents (copy-on-write): nothing changed in it
        return
    if is_mapping(old) and is_mapping(new):
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{escape(str(key))}"})
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "add", "path": f"{path}/{escape(str(key))}", "value": value})
            else:
                _diff(old[key], value, f"{path}/{escape(str(key))}", ops)
        return
    if isinstance(old, list) and isinstance(new, list):
        if len(new) >= len(old) and all(_same(a, b) for a, b in zip(old, new, strict=False)):
            for index in range(len(old), len(new)):
                ops.append({"op": "add", "path": f"{path}/{index}", "value": new[index]})
            return
        if len(new) == len(old):
            for index, (a, b) in enumerate(zip(old, new, strict=True)):
                _diff(a, b, f"{path}/{index}", ops)
            return
        ops.append({"op": "replace", "path": path, "value": new})
        return
    if not _same(old, new):
        ops.append({"op": "replace", "path": path, "value": new})


_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})


def _same(a: Any, b: Any) -> bool:
    if a is b:  # shared (copy-on-write) subtrees; JSON has no NaN, so a value equals itself
        return True
    kind = type(a)
    if kind is type(b):  # the common case, decoded JSON on both sides: exact types, no generators
        if kind in _SCALAR_TYPES:
            return bool(a == b)
        if kind is dict:
            if a.keys() != b.keys():
                return False
            for key, value in a.items():  # noqa: SIM110 - a loop: all(<genexpr>) costs a frame per item
                if not _same(value, b[key]):
                    return False
            return True
        if kind is list:
            if len(a) != len(b):
                return False
            for x, y in zip(a, b, strict=True):  # noqa: SIM110 - as above
                if not _same(x, y):
                    return False
            return True
    # JSON equality: 1 == 1.0 == True in Python, but not in JSON.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if is_mapping(a) and is_mapping(b):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping | list | tuple) or isinstance(b, Mapping | list | tuple):
        return False
    return bool(a == b)


def _copy(value: Any) -> Any:
    if is_mapping(value):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def apply_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """``doc`` with ``ops`` applied (``doc`` is not modified). Raises :class:`JsonPatchError`."""
    result = _copy(doc)
    for index, op in enumerate(ops):
        try:
            result = _apply_one(result, op)
        except JsonPatchError as exc:
            raise JsonPatchError(f"operation {index} ({op.get('op')} {op.get('path')}): {exc}") from None
    return result


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise JsonPatchError(f"path segment {token!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise JsonPatchError(f"cannot descend into a {type(node).__name__} at {token!r}")
    return node


def _index(node: list[Any], token: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(node)
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise JsonPatchError(f"{token!r} is not an array index")
    index = int(token)
    limit = len(node) if allow_end else len(node) - 1
    if index > limit:
        raise JsonPatchError(f"index {index} is out of range (length {len(node)})")
    return index


def _apply_one(doc: Any, op: Mapping[str, Any]) -> Any:
    kind = op.get("op")
    path = op.get("path")
    if not isinstance(path, str):
        raise JsonPatchError("missing path")
    tokens = _split(path)
    if kind == "test":
        try:
            current = resolve_pointer(doc, path)
        except (KeyError, IndexError):
            raise JsonPatchError("path does not exist") from None
        if not _same(current, op.get("value")):
            raise JsonPatchError("test failed")
        return doc
    if kind in ("move", "copy"):
        source = op.get("from")
        if not isinstance(source, str):
            raise JsonPatchError("missing from")
        try:
            value = _copy(resolve_pointer(doc, source))
        except (KeyError, IndexError):
            raise JsonPatchError(f"from {source!r} does not exist") from None
        if kind == "move":
            if path.startswith(source + "/"):
                raise JsonPatchError("cannot move a value into itself")
            doc = _apply_one(doc, {"op": "remove", "path": source})
        return _apply_one(doc, {"op": "add", "path": path, "value": value})
    if kind not in ("add", "remove", "replace"):
        raise JsonPatchError(f"unknown op {kind!r}")
    if kind != "remove" and "value" not in op:
        raise JsonPatchError("missing value")
    value = _copy(op.get("value"))
    if not tokens:
        if kind == "remove":
            raise JsonPatchError("cannot remove the whole document")
        return value
    parent = _parent(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if kind != "add" and last not in parent:
            raise JsonPatchError(f"{last!r} does not exist")
        if kind == "remove":
            del parent[last]
        else:
            parent[last] = value
    elif isinstance(parent, list):
        position = _index(parent, last, allow_end=kind == "add")
        if kind == "add":
            parent.insert(position, value)
        elif kind == "remove":
            del parent[position]
        else:
            parent[position] = value
    else:
        raise JsonPatchError(f"cannot {kind} inside a {type(parent).__name__}")
    return doc
