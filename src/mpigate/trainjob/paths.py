"""JSON paths as users read them, with keyed list selectors.

Kubernetes lists such as ``containers`` or ``env`` are merged by a key (``name``), so a message
that points at ``containers[0]`` is ambiguous once patches are involved. mpigate writes
``containers[name=node]`` instead, and ``runtimePatches[manager=acme.example/debug]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .jsontypes import is_mapping

__all__ = [
    "MERGE_KEYS",
    "Key",
    "PathPart",
    "format_path",
    "get_path",
    "keyed_path",
    "parse_path",
]


@dataclass(frozen=True, slots=True)
class Key:
    """A list element selected by the value of its merge key: ``containers[name=node]``."""

    field: str
    value: str

    def __str__(self) -> str:
        return f"[{self.field}={self.value}]"


PathPart = str | int | Key

# Strategic-merge keys of the pod-template lists (k8s.io/api core/v1 ``patchMergeKey`` tags) plus
# the Trainer lists keyed by CRD list-map keys. The same field name has the same key everywhere
# in a pod template, so a context-free table is exact for the objects mpigate reads.
MERGE_KEYS: Mapping[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "ports": "containerPort",
    "schedulingGates": "name",
    "resourceClaims": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "replicatedJobs": "name",
    "runtimePatches": "manager",
}

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def format_path(parts: Iterable[PathPart]) -> str:
    """``("spec", "containers", Key("name", "node"), "image")`` → ``spec.containers[name=node].image``.

    Map keys that are not plain identifiers are quoted (``limits["nvidia.com/gpu"]``).
    """
    out: list[str] = []
    for part in parts:
        if isinstance(part, Key):
            out.append(str(part))
        elif isinstance(part, int):
            out.append(f"[{part}]")
        elif _IDENT.match(part):
            out.append(f".{part}" if out else part)
        else:
            escaped = part.replace("\\", "\\\\").replace('"', '\\"')
            out.append(f'["{escaped}"]')
    return "".join(out)


_TOKEN = re.compile(r'\.?([A-Za-z_$][A-Za-z0-9_$-]*)|\[(\d+)\]|\["((?:[^"\\]|\\.)*)"\]')


def parse_path(text: str) -> tuple[str | int, ...]:
    """Parse a pod-relative JSON path such as ``spec.containers[0].securityContext.runAsNonRoot`` or
    ``metadata.annotations["container.apparmor.security.beta.kubernetes.io/node"]``.

    Unparseable tails are kept as one opaque string part rather than raising.
    """
    parts: list[str | int] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            parts.append(text[pos:])
            break
        if match.group(1) is not None:
            parts.append(match.group(1))
        elif match.group(2) is not None:
            parts.append(int(match.group(2)))
        else:
            parts.append(re.sub(r"\\(.)", r"\1", match.group(3)))
        pos = match.end()
    return tuple(parts)


def get_path(doc: Any, parts: Sequence[PathPart]) -> tuple[bool, Any]:
    """``(True, value)`` when ``parts`` exists in ``doc`` (index or keyed), else ``(False, None)``."""
    node = doc
    for part in parts:
        if type(part) is str:  # the common case first, with exact type tests (hot path)
            if (type(node) is not dict and not is_mapping(node)) or part not in node:
                return False, None
            node = node[part]
        elif isinstance(part, Key):
            if not isinstance(node, list | tuple):
                return False, None
            for item in node:
                if is_mapping(item) and str(item.get(part.field)) == part.value:
                    node = item
                    break
            else:
                return False, None
        elif isinstance(part, int):
            if not isinstance(node, list | tuple) or not 0 <= part < len(node):
                return False, None
            node = node[part]
        else:
            if not is_mapping(node) or part not in node:
                return False, None
            node = node[part]
    return True, node


def keyed_path(doc: Any, parts: Sequence[str | int]) -> tuple[PathPart, ...]:
    """Replace list indexes by merge-key selectors where the list has a merge key and the element
    carries it: ``containers, 0`` → ``containers, Key("name", "node")`` (looked up in ``doc``)."""
    out: list[PathPart] = []
    node = doc
    previous: str | int | None = None
    for part in parts:
        if isinstance(part, int) and isinstance(node, list):
            item = node[part] if 0 <= part < len(node) else None
            key_field = MERGE_KEYS.get(previous) if isinstance(previous, str) else None
            if key_field and is_mapping(item) and key_field in item:
                out.append(Key(key_field, str(item[key_field])))
            else:
                out.append(part)
            node = item
        else:
            out.append(part)
            node = node.get(part) if is_mapping(node) and isinstance(part, str) else None
        previous = part
    return tuple(out)
