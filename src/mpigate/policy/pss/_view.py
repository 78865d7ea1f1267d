"""Text helpers as upstream's ``helpers.go`` writes them, a defensive view of the pod (malformed
fields read as absent: Go's zero value) and what a failing check returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from mpigate.trainjob.jsontypes import is_mapping

# --------------------------------------------------------------------------------------------------
# Text helpers (upstream helpers.go and Go's fmt verbs)


def _pluralize(singular: str, plural: str, count: int) -> str:
    return singular if count == 1 else plural


def _join_quote(items: Sequence[str]) -> str:
    # Upstream's joinQuote: plain double quotes, no escaping.
    if not items:
        return ""
    return '"' + '", "'.join(items) + '"'


_GO_ESCAPES: Final = {
    "\a": r"\a",
    "\b": r"\b",
    "\f": r"\f",
    "\n": r"\n",
    "\r": r"\r",
    "\t": r"\t",
    "\v": r"\v",
    "\\": "\\\\",
    '"': '\\"',
}


def _go_quote(text: str) -> str:
    """Go's ``%q`` (``strconv.Quote``) for the annotation values upstream quotes."""
    out = ['"']
    for char in text:
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        else:
            code = ord(char)
            if code < 0x80:
                out.append(f"\\x{code:02x}")
            elif code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _annotation_path(key: str) -> str:
    return f"metadata.annotations[{_go_quote(key)}]"


# --------------------------------------------------------------------------------------------------
# A defensive view of the pod: malformed fields read as absent (Go's zero value)


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if type(value) is dict or is_mapping(value) else None


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _get(value: Any, *keys: str) -> Any:
    """``value[k1][k2]…`` through mappings only; ``None`` when any step is missing or malformed."""
    for key in keys:
        if type(value) is not dict and not is_mapping(value):
            return None
        value = value.get(key)
    return value


def _at(mapping: Mapping[str, Any] | None, key: str) -> Any:
    """``mapping[key]`` or ``None``, for a mapping already read through :func:`_mapping` (the
    security contexts): one cheap call where ``_get`` would re-test the type (hot path)."""
    return None if mapping is None else mapping.get(key)


# The views read each shared field once (the checks ask for them many times per pod).


# Slotted classes with a written-out __init__ (built for every container of every pod checked): in
# the compiled build their construction and attribute reads are native, where a NamedTuple's
# __new__ (and a generated dataclass __init__) stays interpreted and its fields are read by name.
@dataclass(frozen=True, slots=True)
class _Container:
    list_field: str
    position: int  # the index in its list
    name: str
    data: Mapping[str, Any]
    security_context: Mapping[str, Any] | None

    def __init__(
        self,
        list_field: str,
        position: int,
        name: str,
        data: Mapping[str, Any],
        security_context: Mapping[str, Any] | None,
    ) -> None:
        object.__setattr__(self, "list_field", list_field)
        object.__setattr__(self, "position", position)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "security_context", security_context)

    @property
    def path(self) -> str:
        """e.g. ``spec.initContainers[1]`` (built only for a failing check)."""
        return f"spec.{self.list_field}[{self.position}]"

    def sc_path(self, *keys: str) -> str:
        return ".".join((self.path, "securityContext", *keys))


@dataclass(frozen=True, slots=True)
class _Pod:
    annotations: Mapping[str, str]
    spec: Mapping[str, Any]
    containers: tuple[_Container, ...]
    security_context: Mapping[str, Any] | None
    is_windows: bool
    # helpers.go relaxPolicyForUserNamespacePod: hostUsers explicitly false.
    in_user_namespace: bool
    # Every key of the pod spec, of any container and of the pod's or any container's security
    # context, and _ANNOTATIONS if the pod has annotations: lets evaluate_pod skip the checks
    # whose fields the pod does not set (see _Check.gate).
    present: AbstractSet[Any]

    def __init__(
        self,
        annotations: Mapping[str, str],
        spec: Mapping[str, Any],
        containers: tuple[_Container, ...],
        security_context: Mapping[str, Any] | None,
        is_windows: bool,
        in_user_namespace: bool,
        present: AbstractSet[Any],
    ) -> None:
        object.__setattr__(self, "annotations", annotations)
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "containers", containers)
        object.__setattr__(self, "security_context", security_context)
        object.__setattr__(self, "is_windows", is_windows)
        object.__setattr__(self, "in_user_namespace", in_user_namespace)
        object.__setattr__(self, "present", present)


_CONTAINER_LISTS: Final = ("initContainers", "containers", "ephemeralContainers")
#: In _Pod.present when the pod has annotations (not a valid field name: it cannot collide).
_ANNOTATIONS: Final = "metadata.annotations"


def _pod_view(metadata: Any, spec: Any) -> _Pod:
    spec_map = _mapping(spec) or {}
    raw_annotations = _mapping(_get(metadata, "annotations")) or {}
    annotations = {k: v for k, v in raw_annotations.items() if isinstance(k, str) and isinstance(v, str)}
    pod_sc = _mapping(spec_map.get("securityContext"))
    containers: list[_Container] = []
    present: set[Any] = set(spec_map)
    if pod_sc is not None:
        present.update(pod_sc)
    if annotations:
        present.add(_ANNOTATIONS)
    for key in _CONTAINER_LISTS:
        for index, item in enumerate(_list(spec_map.get(key))):
            data = _mapping(item)
            if data is None:
                continue
            sc = _mapping(data.get("securityContext"))
            containers.append(_Container(key, index, _str(data.get("name")) or "", data, sc))
            present.update(data)
            if sc is not None:
                present.update(sc)
    return _Pod(
        MappingProxyType(annotations),
        spec_map,
        tuple(containers),
        pod_sc,
        _str(_get(spec_map, "os", "name")) == "windows",
        _bool(spec_map.get("hostUsers")) is False,
        present,
    )


# --------------------------------------------------------------------------------------------------
# Check results


@dataclass(frozen=True, slots=True)
class _Fail:
    reason: str
    detail: str
    paths: tuple[str, ...]

    def __init__(self, reason: str, detail: str, paths: tuple[str, ...]) -> None:
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "detail", detail)
        object.__setattr__(self, "paths", paths)


_CheckFn = Callable[[_Pod], _Fail | None]


def _setters(pod_setter: bool, containers: Sequence[str]) -> list[str]:
    setters = ["pod"] if pod_setter else []
    if containers:
        setters.append(f"{_pluralize('container', 'containers', len(containers))} {_join_quote(containers)}")
    return setters


def _containers_phrase(names: Sequence[str]) -> str:
    return f"{_pluralize('container', 'containers', len(names))} {_join_quote(names)}"
