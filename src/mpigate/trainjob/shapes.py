"""The JSON types of the pod-template fields mpigate reads, and a check that refuses the wrong ones.

"Malformed is refused, never absent": a value of the wrong type where the gate reads is a
:class:`~mpigate.trainjob.model.Problem` naming the field, and the part is left out of the merge,
so that the runtime's value stays and everything next to it is still judged (a ``securityContext``
of ``42`` in a patch must not wipe the runtime's ``drop: [ALL]`` and be read as absent).

The table covers every field of the pod template a TrainJob's ``runtimePatches`` can set (the
TrainJob CRD's patch schema: affinity, containers, initContainers, imagePullSecrets, nodeSelector,
schedulingGates, securityContext, serviceAccountName, terminationGracePeriodSeconds, tolerations,
volumes, and the three levels of metadata) and the runtime pod fields the rules read besides
(images, ports, probes, resources, host namespaces ...). ``tests/trainjob/test_coverage.py`` checks
every type here against the upstream CRDs. Fields it does not list are not type-checked: mpigate
does not read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .jsontypes import is_mapping
from .paths import Key, PathPart
from .reading import Recorder, type_name

__all__ = [
    "CONTAINER",
    "METADATA",
    "POD_SPEC",
    "POD_TEMPLATE",
    "Shape",
    "checked",
]

# A shape is a JSON type name ("string", "integer", "boolean", "object": any object, "quantity":
# an integer or a string, "any"), a mapping of field → shape (an object with those fields; others
# unchecked), ("list", item shape), ("map", value shape) or ("keyed", key, item shape): a list
# whose items are named by ``key`` in paths.
Shape = Any

STR: Final = "string"
INT: Final = "integer"
BOOL: Final = "boolean"
OBJ: Final = "object"
QTY: Final = "quantity"


def _list(item: Shape) -> tuple[str, Shape]:
    return ("list", item)


def _map(value: Shape) -> tuple[str, Shape]:
    return ("map", value)


def _keyed(key: str, item: Shape) -> tuple[str, str, Shape]:
    return ("keyed", key, item)


METADATA: Final[Mapping[str, Shape]] = {
    "name": STR,
    "namespace": STR,
    "labels": _map(STR),
    "annotations": _map(STR),
    "finalizers": _list(STR),
}
_PROFILE = {"type": STR, "localhostProfile": STR}
_SE_LINUX = {"level": STR, "role": STR, "type": STR, "user": STR}
_WINDOWS = {
    "gmsaCredentialSpec": STR,
    "gmsaCredentialSpecName": STR,
    "hostProcess": BOOL,
    "runAsUserName": STR,
}
CONTAINER_SECURITY_CONTEXT: Final[Mapping[str, Shape]] = {
    "allowPrivilegeEscalation": BOOL,
    "appArmorProfile": _PROFILE,
    "capabilities": {"add": _list(STR), "drop": _list(STR)},
    "privileged": BOOL,
    "procMount": STR,
    "readOnlyRootFilesystem": BOOL,
    "runAsGroup": INT,
    "runAsNonRoot": BOOL,
    "runAsUser": INT,
    "seLinuxOptions": _SE_LINUX,
    "seccompProfile": _PROFILE,
    "windowsOptions": _WINDOWS,
}
POD_SECURITY_CONTEXT: Final[Mapping[str, Shape]] = {
    "appArmorProfile": _PROFILE,
    "fsGroup": INT,
    "fsGroupChangePolicy": STR,
    "runAsGroup": INT,
    "runAsNonRoot": BOOL,
    "runAsUser": INT,
    "seLinuxChangePolicy": STR,
    "seLinuxOptions": _SE_LINUX,
    "seccompProfile": _PROFILE,
    "supplementalGroups": _list(INT),
    "supplementalGroupsPolicy": STR,
    "sysctls": _list({"name": STR, "value": STR}),
    "windowsOptions": _WINDOWS,
}
ENV: Final = _keyed("name", {"name": STR, "value": STR, "valueFrom": OBJ})
_PROBE = {"httpGet": {"host": STR}, "tcpSocket": {"host": STR}, "exec": OBJ, "grpc": OBJ}
_HANDLER = {"httpGet": {"host": STR}, "tcpSocket": {"host": STR}, "exec": OBJ, "sleep": OBJ}
CONTAINER: Final[Mapping[str, Shape]] = {
    "name": STR,
    "image": STR,
    "command": _list(STR),
    "args": _list(STR),
    "env": ENV,
    "envFrom": _list(OBJ),
    "resources": {"limits": _map(QTY), "requests": _map(QTY), "claims": _list({"name": STR})},
    "ports": _list({"containerPort": INT, "hostPort": INT, "hostIP": STR, "name": STR, "protocol": STR}),
    "securityContext": CONTAINER_SECURITY_CONTEXT,
    "volumeMounts": _keyed(
        "mountPath",
        {
            "name": STR,
            "mountPath": STR,
            "mountPropagation": STR,
            "readOnly": BOOL,
            "recursiveReadOnly": STR,
            "subPath": STR,
            "subPathExpr": STR,
        },
    ),
    "livenessProbe": _PROBE,
    "readinessProbe": _PROBE,
    "startupProbe": _PROBE,
    "lifecycle": {"postStart": _HANDLER, "preStop": _HANDLER},
    "restartPolicy": STR,
}
_TERM = {
    "matchExpressions": _list({"key": STR, "operator": STR, "values": _list(STR)}),
    "matchFields": _list({"key": STR, "operator": STR, "values": _list(STR)}),
}
AFFINITY: Final[Mapping[str, Shape]] = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": _list(_TERM)},
        "preferredDuringSchedulingIgnoredDuringExecution": _list({"weight": INT, "preference": _TERM}),
    },
    "podAffinity": OBJ,
    "podAntiAffinity": OBJ,
}
VOLUME: Final[Mapping[str, Shape]] = {
    "name": STR,
    "hostPath": {"path": STR, "type": STR},
    "image": {"reference": STR, "pullPolicy": STR},
    **dict.fromkeys(
        (
            "awsElasticBlockStore",
            "azureDisk",
            "azureFile",
            "cephfs",
            "cinder",
            "configMap",
            "csi",
            "downwardAPI",
            "emptyDir",
            "ephemeral",
            "fc",
            "flexVolume",
            "flocker",
            "gcePersistentDisk",
            "gitRepo",
            "glusterfs",
            "iscsi",
            "nfs",
            "persistentVolumeClaim",
            "photonPersistentDisk",
            "portworxVolume",
            "projected",
            "quobyte",
            "rbd",
            "scaleIO",
            "secret",
            "storageos",
            "vsphereVolume",
        ),
        OBJ,
    ),
}
POD_SPEC: Final[Mapping[str, Shape]] = {
    "affinity": AFFINITY,
    "containers": _keyed("name", CONTAINER),
    "initContainers": _keyed("name", CONTAINER),
    "ephemeralContainers": _keyed("name", CONTAINER),
    "imagePullSecrets": _list({"name": STR}),
    "nodeSelector": _map(STR),
    "schedulingGates": _list({"name": STR}),
    "securityContext": POD_SECURITY_CONTEXT,
    "serviceAccountName": STR,
    "serviceAccount": STR,
    "automountServiceAccountToken": BOOL,
    "terminationGracePeriodSeconds": INT,
    "tolerations": _list(
        {"key": STR, "operator": STR, "value": STR, "effect": STR, "tolerationSeconds": INT}
    ),
    "volumes": _keyed("name", VOLUME),
    "hostNetwork": BOOL,
    "hostPID": BOOL,
    "hostIPC": BOOL,
    "hostUsers": BOOL,
    "os": {"name": STR},
    "overhead": _map(QTY),
}
POD_TEMPLATE: Final[Mapping[str, Shape]] = {"metadata": METADATA, "spec": POD_SPEC}

_SCALARS: Final[Mapping[str, tuple[type, ...]]] = {
    STR: (str,),
    INT: (int,),
    BOOL: (bool,),
    QTY: (int, str, float),
}
_WANT: Final[Mapping[str, str]] = {
    STR: "a string",
    INT: "an integer",
    BOOL: "a boolean",
    OBJ: "an object",
    QTY: "a quantity (a number or a string)",
}
_DROP: Final = object()


def checked(value: Any, shape: Shape, path: tuple[PathPart, ...], rec: Recorder) -> Any:
    """``value`` with every part of the wrong type left out (and recorded at its path). Unchanged
    values are returned as they are (no copy): the common case costs one walk."""
    out = _check(value, shape, path, rec)
    return None if out is _DROP else out


def _check(value: Any, shape: Shape, path: tuple[PathPart, ...], rec: Recorder) -> Any:
    if value is None:
        return value
    if type(shape) is str:
        # Exact type tests first (decoded JSON holds only plain types): one per field on the
        # admission path, for every field of every runtime patch.
        kind = type(value)
        if (
            (shape == STR and kind is str)
            or (shape == BOOL and kind is bool)
            or (shape == INT and kind is int)
            or (shape == OBJ and kind is dict)
            or shape == "any"
        ):
            return value
        if shape == OBJ:
            return value if is_mapping(value) else _wrong(value, shape, path, rec)
        ok = isinstance(value, _SCALARS[shape]) and (shape == BOOL or not isinstance(value, bool))
        return value if ok else _wrong(value, shape, path, rec)
    if type(shape) is dict or is_mapping(shape):
        if not is_mapping(value):
            return _wrong(value, OBJ, path, rec)
        changed: dict[str, Any] | None = None
        # The value's keys (a patch sets few) rather than the shape's (a pod spec has dozens).
        for key, field_value in value.items():
            sub = shape.get(key)
            if sub is None:
                continue
            out = _check(field_value, sub, (*path, key), rec)
            if out is not field_value:
                if changed is None:
                    changed = dict(value)
                if out is _DROP:
                    del changed[key]
                else:
                    changed[key] = out
        return value if changed is None else changed
    kind = shape[0]
    if kind == "map":
        if not is_mapping(value):
            return _wrong(value, OBJ, path, rec)
        changed_map: dict[str, Any] | None = None
        for key, entry in value.items():
            out = _check(entry, shape[1], (*path, str(key)), rec)
            if out is not entry:
                if changed_map is None:
                    changed_map = dict(value)
                if out is _DROP:
                    del changed_map[key]
                else:
                    changed_map[key] = out
        return value if changed_map is None else changed_map
    if not isinstance(value, list):
        return _wrong(value, "list", path, rec)
    key_field = shape[1] if kind == "keyed" else None
    item_shape = shape[2] if kind == "keyed" else shape[1]
    items: list[Any] | None = None
    element: Any
    for index, element in enumerate(value):
        name = element.get(key_field) if key_field and is_mapping(element) else None
        at: PathPart = Key(key_field, name) if key_field and isinstance(name, str) else index
        result: Any
        if element is None:
            result = _wrong(element, item_shape if isinstance(item_shape, str) else OBJ, (*path, at), rec)
        elif key_field and is_mapping(element) and not isinstance(name, str):
            # A keyed item without its key merges nowhere (strategic merge refuses it): refused,
            # not silently left out.
            rec.malformed((*path, index, key_field), f"each item needs a string {key_field}")
            result = _DROP
        else:
            result = _check(element, item_shape, (*path, at), rec)
        if result is not element:
            if items is None:
                items = list(value[:index])
            if result is not _DROP:
                items.append(result)
        elif items is not None:
            items.append(element)
    return value if items is None else items


def _wrong(value: Any, shape: str, path: tuple[PathPart, ...], rec: Recorder) -> Any:
    want = _WANT.get(shape, "a list")
    rec.malformed(path, f"expected {want}, got {type_name(value)}")
    return _DROP
