"""How close a rendered object comes to what the API server stores, so that ``render`` and ``check``
warn while there is room left instead of ``kubectl apply`` failing on the day the org grows past it.

Two limits apply (the figures and their sources are in :mod:`mpigate.config.bundle`):

- a ConfigMap's ``data`` and ``binaryData`` values, decoded, at most 1 MiB
  (:data:`~mpigate.config.bundle.CONFIGMAP_DATA_LIMIT`);
- any object at most etcd's 1.5 MiB request size
  (:data:`~mpigate.config.bundle.ETCD_REQUEST_LIMIT`; measured here as compact JSON, which is
  larger than the protobuf etcd stores, so the estimate errs on the safe side).

Warnings start at :data:`WARN_FRACTION` of a limit.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Final

from mpigate.config.bundle import CONFIGMAP_DATA_LIMIT, ETCD_REQUEST_LIMIT

from .bundle import Bundle

__all__ = ["WARN_FRACTION", "bundle_size_warning", "object_size_warnings"]

WARN_FRACTION: Final = 0.8


def _kib(n: int) -> str:
    return f"{n / 1024:,.0f} KiB"


def configmap_values_bytes(obj: Mapping[str, Any]) -> int:
    """What ``ValidateConfigMap`` adds up: the bytes of every ``data`` value and every decoded
    ``binaryData`` value."""
    total = 0
    data = obj.get("data")
    if isinstance(data, Mapping):
        total += sum(len(str(v).encode()) for v in data.values())
    binary = obj.get("binaryData")
    if isinstance(binary, Mapping):
        for value in binary.values():
            try:
                total += len(base64.b64decode(str(value)))
            except (binascii.Error, ValueError):
                total += len(str(value))
    return total


def object_size_warnings(obj: Mapping[str, Any], name: str) -> list[str]:
    """Warnings for ``obj`` (shown as ``name``) at or above :data:`WARN_FRACTION` of a limit."""
    out: list[str] = []
    if obj.get("kind") == "ConfigMap":
        values = configmap_values_bytes(obj)
        if values >= WARN_FRACTION * CONFIGMAP_DATA_LIMIT:
            out.append(
                f"{name} holds {_kib(values)} of data, {values / CONFIGMAP_DATA_LIMIT:.0%} of the "
                f"{_kib(CONFIGMAP_DATA_LIMIT)} the API server accepts in a ConfigMap"
            )
    size = len(json.dumps(obj, separators=(",", ":")).encode())
    if size >= WARN_FRACTION * ETCD_REQUEST_LIMIT:
        out.append(
            f"{name} is {_kib(size)} as JSON, {size / ETCD_REQUEST_LIMIT:.0%} of the "
            f"{_kib(ETCD_REQUEST_LIMIT)} etcd stores in one object"
        )
    return out


def bundle_size_warning(bundle: Bundle) -> str | None:
    """The warning for the config bundle ConfigMap (the one rendered object whose size grows with
    the config tree), with what it carries and the way out; None while it has room."""
    if bundle.stored < WARN_FRACTION * CONFIGMAP_DATA_LIMIT:
        return None
    how = (
        f"{len(bundle.files)} config files ({_kib(bundle.size)}) compressed to {_kib(bundle.stored)}"
        if bundle.archive is not None
        else f"{len(bundle.files)} config files, {_kib(bundle.stored)}"
    )
    return (
        f"the config bundle ConfigMap nears the API server's limit: {how}, "
        f"{bundle.stored / CONFIGMAP_DATA_LIMIT:.0%} of the {_kib(CONFIGMAP_DATA_LIMIT)} a ConfigMap may "
        "hold; PolicyTests stay out of it already — remove unused teams or exceptions, or split the org "
        "(docs/rendering.md#the-config-bundle)"
    )
