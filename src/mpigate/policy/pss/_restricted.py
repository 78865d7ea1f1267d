"""The restricted checks (upstream ``check_*.go``), each versioned implementation a function."""

from __future__ import annotations

from typing import Final

from ._baseline import _SECCOMP_TYPES, _added_capabilities, _seccomp_profile_fields, _seccomp_type
from ._view import (
    _at,
    _bool,
    _CheckFn,
    _Container,
    _containers_phrase,
    _Fail,
    _int,
    _join_quote,
    _list,
    _mapping,
    _pluralize,
    _Pod,
    _setters,
    _str,
)

# --------------------------------------------------------------------------------------------------
# Restricted checks

_ALLOWED_VOLUME_SOURCES: Final = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
# Upstream's switch order, which decides the type reported for a volume with several sources.
_RESTRICTED_VOLUME_SOURCES: Final = (
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
)


_ALLOWED_SOURCE_SET: Final = frozenset(_ALLOWED_VOLUME_SOURCES)


def _restricted_volumes_1_0(pod: _Pod) -> _Fail | None:
    names: list[str] = []
    types: set[str] = set()
    paths: list[str] = []
    for index, item in enumerate(_list(pod.spec.get("volumes"))):
        volume = _mapping(item)
        if volume is None:
            continue
        # Any allowed source admits the volume (tested over the volume's few keys, not the list; a
        # loop rather than any(<genexpr>), which costs a generator per volume).
        admitted = False
        for key, value in volume.items():
            if key in _ALLOWED_SOURCE_SET and _mapping(value) is not None:
                admitted = True
                break
        if admitted:
            continue
        source = next((s for s in _RESTRICTED_VOLUME_SOURCES if _mapping(volume.get(s)) is not None), None)
        if source is None:
            # No source at all: the API server defaults such a volume to emptyDir before admission
            # (upstream's pass fixture restrictedvolumes0 relies on it), so it is allowed.
            continue
        names.append(_str(volume.get("name")) or "")
        types.add(source)
        paths.append(f"spec.volumes[{index}].{source}")
    if not names:
        return None
    return _Fail(
        "restricted volume types",
        f"{_pluralize('volume', 'volumes', len(names))} {_join_quote(names)} "
        f"{_pluralize('uses', 'use', len(names))} "
        f"{_pluralize('restricted volume type', 'restricted volume types', len(types))} "
        f"{_join_quote(sorted(types))}",
        tuple(paths),
    )


def _allow_privilege_escalation_1_8(pod: _Pod) -> _Fail | None:
    bad = [
        c for c in pod.containers if _bool(_at(c.security_context, "allowPrivilegeEscalation")) is not False
    ]
    if not bad:
        return None
    return _Fail(
        "allowPrivilegeEscalation != false",
        f"{_containers_phrase([c.name for c in bad])} must set "
        "securityContext.allowPrivilegeEscalation=false",
        tuple(c.sc_path("allowPrivilegeEscalation") for c in bad),
    )


def _windows_exempt(check: _CheckFn) -> _CheckFn:
    """The 1.25 variants: pods with ``spec.os.name: windows`` pass unconditionally."""

    def exempted(pod: _Pod) -> _Fail | None:
        return None if pod.is_windows else check(pod)

    return exempted


def _user_namespace_exempt(check: _CheckFn) -> _CheckFn:
    """The 1.35 variants: pods with ``spec.hostUsers: false`` pass unconditionally."""

    def exempted(pod: _Pod) -> _Fail | None:
        return None if pod.in_user_namespace else check(pod)

    return exempted


def _run_as_non_root_1_0(pod: _Pod) -> _Fail | None:
    setters: list[str] = []
    paths: list[str] = []
    pod_value = _bool(_at(pod.security_context, "runAsNonRoot"))
    if pod_value is False:
        setters.append("pod")
        paths.append("spec.securityContext.runAsNonRoot")
    explicitly_bad: list[str] = []
    implicitly_bad: list[_Container] = []
    for container in pod.containers:
        value = _bool(_at(container.security_context, "runAsNonRoot"))
        if value is False:
            explicitly_bad.append(container.name)
            paths.append(container.sc_path("runAsNonRoot"))
        elif value is None and pod_value is not True:
            implicitly_bad.append(container)
    if explicitly_bad:
        setters.append(_containers_phrase(explicitly_bad))
    if setters:
        return _Fail(
            "runAsNonRoot != true",
            f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false",
            tuple(paths),
        )
    if implicitly_bad:
        return _Fail(
            "runAsNonRoot != true",
            f"pod or {_containers_phrase([c.name for c in implicitly_bad])} must set "
            "securityContext.runAsNonRoot=true",
            tuple(c.sc_path("runAsNonRoot") for c in implicitly_bad),
        )
    return None


def _run_as_user_1_23(pod: _Pod) -> _Fail | None:
    pod_bad = _int(_at(pod.security_context, "runAsUser")) == 0
    bad = [c for c in pod.containers if _int(_at(c.security_context, "runAsUser")) == 0]
    setters = _setters(pod_bad, [c.name for c in bad])
    if not setters:
        return None
    paths = ["spec.securityContext.runAsUser"] if pod_bad else []
    paths += [c.sc_path("runAsUser") for c in bad]
    return _Fail("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0", tuple(paths))


def _seccomp_profile_restricted_1_19(pod: _Pod) -> _Fail | None:
    return _seccomp_profile_fields(pod, require=True)


def _capabilities_restricted_1_22(pod: _Pod) -> _Fail | None:
    missing_drop_all: list[_Container] = []
    adding: list[_Container] = []
    forbidden: set[str] = set()
    for container in pod.containers:
        capabilities = _mapping(_at(container.security_context, "capabilities"))
        if capabilities is None:
            missing_drop_all.append(container)
            continue
        if "ALL" not in [c for c in _list(capabilities.get("drop")) if isinstance(c, str)]:
            missing_drop_all.append(container)
        extra = [c for c in _added_capabilities(container) if c != "NET_BIND_SERVICE"]
        if extra:
            adding.append(container)
            forbidden.update(extra)
    details: list[str] = []
    if missing_drop_all:
        details.append(
            f"{_containers_phrase([c.name for c in missing_drop_all])} must set "
            'securityContext.capabilities.drop=["ALL"]'
        )
    if adding:
        details.append(
            f"{_containers_phrase([c.name for c in adding])} must not include "
            f"{_join_quote(sorted(forbidden))} in securityContext.capabilities.add"
        )
    if not details:
        return None
    paths = [c.sc_path("capabilities", "drop") for c in missing_drop_all]
    paths += [c.sc_path("capabilities", "add") for c in adding]
    return _Fail("unrestricted capabilities", "; ".join(details), tuple(paths))


def _restricted_passes(pod: _Pod) -> frozenset[str]:
    """The ungated restricted checks (those that fail on a field's absence) that ``pod`` surely
    passes, found in one pass over its containers: the checks themselves, which build the
    messages, then run only for a pod that may fail them (speed; the same findings)."""
    pod_sc = pod.security_context
    pod_non_root = _bool(_at(pod_sc, "runAsNonRoot"))
    pod_seccomp = _seccomp_type(pod_sc)
    pod_seccomp_valid = pod_seccomp in _SECCOMP_TYPES
    escalation = capabilities = True
    non_root = pod_non_root is not False
    seccomp = pod_seccomp is None or pod_seccomp_valid
    for container in pod.containers:
        sc = container.security_context
        if sc is None:
            escalation = capabilities = False
            non_root = non_root and pod_non_root is True
            seccomp = seccomp and pod_seccomp_valid
            continue
        if sc.get("allowPrivilegeEscalation") is not False:
            escalation = False
        value = _bool(sc.get("runAsNonRoot"))
        if value is False or (value is None and pod_non_root is not True):
            non_root = False
        container_seccomp = _seccomp_type(sc)
        if container_seccomp is None:
            seccomp = seccomp and pod_seccomp_valid
        elif container_seccomp not in _SECCOMP_TYPES:
            seccomp = False
        caps = _mapping(sc.get("capabilities"))
        if (
            caps is None
            or "ALL" not in _list(caps.get("drop"))
            or any(isinstance(c, str) and c != "NET_BIND_SERVICE" for c in _list(caps.get("add")))
        ):
            capabilities = False
    passes = [
        check_id
        for check_id, passed in (
            ("allowPrivilegeEscalation", escalation),
            ("capabilities_restricted", capabilities),
            ("runAsNonRoot", non_root),
            ("seccompProfile_restricted", seccomp),
        )
        if passed
    ]
    return frozenset(passes)
