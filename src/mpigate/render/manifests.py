"""Kubernetes objects as data, and their one canonical YAML form.

Every rendered file is dumped from parsed data here - never from strings a template built - so the
output is byte-for-byte stable: ``apiVersion``, ``kind``, ``metadata`` lead; ``name`` leads every
mapping; other keys are sorted; multi-line strings are literal blocks; documents start with ``---``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = [
    "KUSTOMIZATION_KIND",
    "ObjectKey",
    "canonical",
    "dump_documents",
    "dump_object",
    "load_documents",
    "object_key",
]

KUSTOMIZATION_KIND = "Kustomization"
_TOP = ("apiVersion", "kind", "metadata")
_META = ("name", "namespace")
_BaseDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Dumper(_BaseDumper):  # type: ignore[misc]
    pass


def _represent_str(dumper: Any, value: str) -> Any:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _represent_str)


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


def _ordered(mapping: Mapping[str, Any], lead: tuple[str, ...]) -> list[str]:
    first = [k for k in lead if k in mapping]
    return first + sorted((k for k in mapping if k not in lead), key=str)


def canonical(value: Any, *, top: bool = False, metadata: bool = False) -> Any:
    """A deep copy of JSON-like data with the canonical key order."""
    if isinstance(value, Mapping):
        lead = _TOP if top else (_META if metadata else ("name",))
        return {k: canonical(value[k], metadata=top and k == "metadata") for k in _ordered(value, lead)}
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
    return [d for d in yaml.load_all(text, Loader=_BaseLoader) if d is not None]
