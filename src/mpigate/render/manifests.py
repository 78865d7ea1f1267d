"""Kubernetes objects as data, and their one canonical YAML form.

Every rendered file is dumped from parsed data here - never from strings a template built - so the
output is byte-for-byte stable: ``apiVersion``, ``kind``, ``metadata``, ``name``, ``namespace`` lead
any mapping they occur in, other keys follow sorted; multi-line strings are literal blocks;
documents start with ``---``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml
import yaml.resolver

__all__ = [
    "KUSTOMIZATION_KIND",
    "FastLoader",
    "ObjectKey",
    "canonical",
    "dump_documents",
    "dump_object",
    "load_documents",
    "object_key",
]

KUSTOMIZATION_KIND = "Kustomization"
# Keys that lead a mapping, in this order; the others follow sorted. ``apiVersion, kind,
# metadata`` lead an object, ``name, namespace`` lead metadata, list items and references.
_LEAD = {key: rank for rank, key in enumerate(("apiVersion", "kind", "metadata", "name", "namespace"))}
_BaseDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_IMPLICIT = yaml.resolver.Resolver.yaml_implicit_resolvers


@lru_cache(maxsize=1 << 16)
def _implicit_tag(value: str) -> str | None:
    """The tag YAML 1.1 gives a plain scalar (bool, int, float, null, ...), or None for a string."""
    for tag, regexp in _IMPLICIT.get(value[0] if value else "", []) + _IMPLICIT.get(None, []):
        if regexp.match(value):
            return str(tag)
    return None


class _FastResolver:
    """PyYAML's safe resolver, memoised: without path resolvers the tag of a scalar depends on its
    text alone, and rendered manifests repeat the same keys and values thousands of times."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode:
            if implicit[0]:
                tag = _implicit_tag(value)
                if tag is not None:
                    return tag
            return yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG
        return super().resolve(kind, value, implicit)  # type: ignore[misc]

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        return None

    def ascend_resolver(self) -> None:
        return None


class FastLoader(_FastResolver, _BaseLoader):  # type: ignore[misc]
    """The safe loader (libyaml when available) with the memoised resolver."""


class _Dumper(_FastResolver, _BaseDumper):  # type: ignore[misc]
    def ignore_aliases(self, data: Any) -> bool:
        # manifests never share structure on purpose; anchors would only obscure the output
        return True


def _order(item: tuple[Any, Any]) -> tuple[int, str]:
    return (_LEAD.get(item[0], len(_LEAD)), str(item[0]))


def _represent_dict(dumper: Any, value: Mapping[Any, Any]) -> Any:
    return dumper.represent_mapping("tag:yaml.org,2002:map", sorted(value.items(), key=_order))


def _represent_str(dumper: Any, value: str) -> Any:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(dict, _represent_dict)


@dataclass(frozen=True, order=True, slots=True)
class ObjectKey:
    """What identifies an object in a cluster (as kubectl and Argo CD pair them)."""

    api_version: str
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name} ({self.api_version})"


def object_key(obj: Mapping[str, Any]) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return ObjectKey(
        str(obj.get("apiVersion", "")),
        str(obj.get("kind", "")),
        str(meta.get("namespace") or ""),
        str(meta.get("name", "")),
    )


def canonical(value: Any) -> Any:
    """A deep copy of JSON-like data in the canonical key order (the order dumps use)."""
    if isinstance(value, Mapping):
        return {k: canonical(v) for k, v in sorted(value.items(), key=_order)}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


def dump_object(obj: Mapping[str, Any]) -> str:
    """One object (already canonical) as a YAML document without the ``---`` marker."""
    text: str = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16)
    return text


def dump_documents(objects: Iterable[Mapping[str, Any]]) -> str:
    """A multi-document YAML file; each document starts with ``---``."""
    text: str = yaml.dump_all(
        list(objects),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=1 << 16,
        explicit_start=True,
    )
    return text


def load_documents(text: str) -> list[Any]:
    """The non-empty documents of a YAML text (fast loader; for output that mpigate wrote)."""
    return [d for d in yaml.load_all(text, Loader=FastLoader) if d is not None]
