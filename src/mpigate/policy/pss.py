"""Pod Security Standards, evaluated exactly like Kubernetes' pod-security-admission.

This is a re-implementation of upstream's ``policy`` package (``check_*.go``, ``registry.go``,
``visitor.go``, ``helpers.go``) over plain JSON: the same checks, the same versioned
implementations, the same ``ForbiddenReason``/``ForbiddenDetail`` texts and the same order, so that
a TrainJob that mpigate admits is not rejected later by the namespace's PodSecurity admission when
the pods are created (and so that mpigate's messages read like the ones operators already know).

Evaluation model (see ``docs/pod-security.md``):

* levels ``privileged`` (no checks), ``baseline`` and ``restricted``; versions ``v1.0`` … and
  ``latest``. ``latest`` and any version newer than the newest check implementation
  (:data:`NEWEST_VERSION`) evaluate as that newest version;
* per check, the implementation with the greatest minimum version ``<=`` the requested version is
  used; a check whose first implementation is newer than the version is not run;
* ``restricted`` runs every baseline check except those a restricted implementation overrides;
* "containers" are ``initContainers``, ``containers`` and ``ephemeralContainers``, in that order;
* every failing check is reported, baseline check IDs (sorted) first, then restricted ones.

Inputs are untrusted JSON. The API server would reject a pod whose fields have the wrong type
before PodSecurity ever saw it; here a malformed field (a string where a boolean, list or object
belongs, ``null``, a non-object list element) is treated as **absent**, i.e. as Go's zero value —
which never makes a required setting count as present (``allowPrivilegeEscalation: "false"`` still
fails ``restricted``). ``evaluate_pod`` never raises on any JSON-like input.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any, Final, Literal, NamedTuple

from mpigate.catalogue import all_rules
from mpigate.trainjob.jsontypes import is_mapping

__all__ = [
    "LEVELS",
    "NEWEST_VERSION",
    "PSSCheck",
    "PSSFinding",
    "all_checks",
    "check_ids",
    "effective_version",
    "evaluate_pod",
    "format_message",
    "parse_version",
]

Version = tuple[int, int]

LEVELS: Final = ("privileged", "baseline", "restricted")
#: The newest minimum version of any check implementation; ``latest`` and newer versions use it.
NEWEST_VERSION: Final[Version] = (1, 37)

_VERSION_RE: Final = re.compile(r"v1\.(0|[1-9][0-9]*)")


@dataclass(frozen=True, slots=True)
class PSSFinding:
    """One failing upstream check.

    ``paths`` are Kubernetes-style JSON paths inside the Pod object
    (``spec.containers[0].securityContext.runAsNonRoot``,
    ``metadata.annotations["container.apparmor.security.beta.kubernetes.io/node"]``) of the
    offending fields, or, when a required field is missing, of the place where it must be set.
    """

    check: str
    rule: str
    level: str
    reason: str
    detail: str
    paths: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PSSCheck:
    """A check of the registry: its upstream ID, level, implementation versions and overrides."""

    id: str
    level: str
    #: Minimum versions of its implementations, oldest first (``since`` is the first).
    versions: tuple[Version, ...]
    #: Baseline check IDs a restricted implementation replaces, as ``(since, ids)``.
    overrides: tuple[tuple[Version, tuple[str, ...]], ...]

    @property
    def since(self) -> Version:
        """The first version that runs this check."""
        return self.versions[0]

    @property
    def rule(self) -> str:
        """The catalogue rule ID (``MPG-SEC-*``) of this check."""
        return _rule_for_check()[self.id]


# --------------------------------------------------------------------------------------------------
# Versions


def parse_version(text: str) -> Version | Literal["latest"]:
    """``"v1.29"`` → ``(1, 29)``; ``"latest"`` → ``"latest"``; anything else → ``ValueError``.

    The grammar is upstream's (``api.ParseVersion``): ``v1.<minor>`` without leading zeros.
    """
    if text == "latest":
        return "latest"
    if not isinstance(text, str):
        raise ValueError(f"invalid Pod Security version {text!r}: expected 'latest' or 'v1.<minor>'")
    match = _VERSION_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid Pod Security version {text!r}: expected 'latest' or 'v1.<minor>'")
    return (1, int(match.group(1)))


def effective_version(version: str) -> Version:
    """The version ``version`` evaluates as: ``latest`` and newer versions → :data:`NEWEST_VERSION`."""
    parsed = parse_version(version)
    if parsed == "latest" or parsed > NEWEST_VERSION:
        return NEWEST_VERSION
    return parsed


_effective_version = cache(effective_version)  # the config's one or two version strings


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


# Named tuples, not frozen dataclasses: built for every container of every pod checked, and a
# frozen dataclass's __init__ costs a setattr call per field (hot path).
class _Container(NamedTuple):
    list_field: str
    position: int  # the index in its list ("index" would shadow tuple.index)
    name: str
    data: Mapping[str, Any]
    security_context: Mapping[str, Any] | None

    @property
    def path(self) -> str:
        """e.g. ``spec.initContainers[1]`` (built only for a failing check)."""
        return f"spec.{self.list_field}[{self.position}]"

    def sc_path(self, *keys: str) -> str:
        return ".".join((self.path, "securityContext", *keys))


class _Pod(NamedTuple):
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


_CheckFn = Callable[[_Pod], _Fail | None]


def _setters(pod_setter: bool, containers: Sequence[str]) -> list[str]:
    setters = ["pod"] if pod_setter else []
    if containers:
        setters.append(f"{_pluralize('container', 'containers', len(containers))} {_join_quote(containers)}")
    return setters


def _containers_phrase(names: Sequence[str]) -> str:
    return f"{_pluralize('container', 'containers', len(names))} {_join_quote(names)}"


# --------------------------------------------------------------------------------------------------
# Baseline checks


def _host_namespaces_1_0(pod: _Pod) -> _Fail | None:
    found = [
        (f"{field}=true", f"spec.{field}")
        for field in ("hostNetwork", "hostPID", "hostIPC")
        if _bool(pod.spec.get(field)) is True
    ]
    if not found:
        return None
    return _Fail("host namespaces", ", ".join(text for text, _ in found), tuple(p for _, p in found))


def _privileged_1_0(pod: _Pod) -> _Fail | None:
    bad = [c for c in pod.containers if _bool(_at(c.security_context, "privileged")) is True]
    if not bad:
        return None
    return _Fail(
        "privileged",
        f"{_containers_phrase([c.name for c in bad])} must not set securityContext.privileged=true",
        tuple(c.sc_path("privileged") for c in bad),
    )


_CAPABILITIES_BASELINE_1_0: Final = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)


def _added_capabilities(container: _Container) -> list[str]:
    return [c for c in _list(_get(container.security_context, "capabilities", "add")) if isinstance(c, str)]


def _capabilities_baseline_1_0(pod: _Pod) -> _Fail | None:
    bad: list[_Container] = []
    forbidden: set[str] = set()
    for container in pod.containers:
        extra = [c for c in _added_capabilities(container) if c not in _CAPABILITIES_BASELINE_1_0]
        if extra:
            bad.append(container)
            forbidden.update(extra)
    if not bad:
        return None
    return _Fail(
        "non-default capabilities",
        f"{_containers_phrase([c.name for c in bad])} must not include "
        f"{_join_quote(sorted(forbidden))} in securityContext.capabilities.add",
        tuple(c.sc_path("capabilities", "add") for c in bad),
    )


def _host_path_volumes_1_0(pod: _Pod) -> _Fail | None:
    names: list[str] = []
    paths: list[str] = []
    for index, volume in enumerate(_list(pod.spec.get("volumes"))):
        if _mapping(_get(volume, "hostPath")) is not None:
            names.append(_str(_get(volume, "name")) or "")
            paths.append(f"spec.volumes[{index}].hostPath")
    if not names:
        return None
    return _Fail(
        "hostPath volumes",
        f"{_pluralize('volume', 'volumes', len(names))} {_join_quote(names)}",
        tuple(paths),
    )


def _host_ports_1_0(pod: _Pod) -> _Fail | None:
    bad: list[str] = []
    ports: set[str] = set()
    paths: list[str] = []
    for container in pod.containers:
        container_bad = False
        for index, port in enumerate(_list(container.data.get("ports"))):
            host_port = _int(_get(port, "hostPort"))
            if host_port:
                container_bad = True
                ports.add(str(host_port))
                paths.append(f"{container.path}.ports[{index}].hostPort")
        if container_bad:
            bad.append(container.name)
    if not bad:
        return None
    return _Fail(
        "hostPort",
        f"{_containers_phrase(bad)} {_pluralize('uses', 'use', len(bad))} "
        # Go sorts the port numbers as strings.
        f"{_pluralize('hostPort', 'hostPorts', len(ports))} {', '.join(sorted(ports))}",
        tuple(paths),
    )


_PROBES: Final = ("livenessProbe", "readinessProbe", "startupProbe")
_LIFECYCLE_HANDLERS: Final = ("postStart", "preStop")


def _host_probes_and_host_lifecycle_1_34(pod: _Pod) -> _Fail | None:
    bad: set[str] = set()
    hosts: set[str] = set()
    paths: list[str] = []
    for container in pod.containers:
        data = container.data
        # Only the handlers present (most containers have none): the others cannot name a host.
        handlers = [(probe, handler) for probe in _PROBES if (handler := data.get(probe)) is not None]
        lifecycle = _mapping(data.get("lifecycle"))
        if lifecycle is not None:
            handlers += [(f"lifecycle.{name}", lifecycle.get(name)) for name in _LIFECYCLE_HANDLERS]
        for where, handler in handlers:
            for action in ("httpGet", "tcpSocket"):
                host = _str(_get(handler, action, "host"))
                if host:
                    bad.add(container.name)
                    hosts.add(host)
                    paths.append(f"{container.path}.{where}.{action}.host")
    if not bad:
        return None
    # Upstream collects both containers and hosts in sets, so both lists come out sorted.
    return _Fail(
        "probe or lifecycle host",
        f"{_containers_phrase(sorted(bad))} {_pluralize('uses', 'use', len(bad))} "
        f"{_pluralize('probe or lifecycle host', 'probe or lifecycle hosts', len(hosts))} "
        f"{_join_quote(sorted(hosts))}",
        tuple(paths),
    )


_APPARMOR_ANNOTATION_PREFIX: Final = "container.apparmor.security.beta.kubernetes.io/"
_APPARMOR_TYPES: Final = frozenset({"RuntimeDefault", "Localhost"})


def _apparmor_annotation_allowed(value: str) -> bool:
    return value == "" or value == "runtime/default" or value.startswith("localhost/")


def _app_armor_profile_1_0(pod: _Pod) -> _Fail | None:
    bad_values: set[str] = set()
    paths: list[str] = []
    pod_bad = False
    profile = _mapping(_at(pod.security_context, "appArmorProfile"))
    if profile is not None:
        profile_type = _str(profile.get("type")) or ""
        if profile_type not in _APPARMOR_TYPES:
            pod_bad = True
            bad_values.add(profile_type)
            paths.append("spec.securityContext.appArmorProfile.type")
    bad_containers: list[str] = []
    for container in pod.containers:
        profile = _mapping(_at(container.security_context, "appArmorProfile"))
        if profile is None:
            continue
        profile_type = _str(profile.get("type")) or ""
        if profile_type not in _APPARMOR_TYPES:
            bad_containers.append(container.name)
            bad_values.add(profile_type)
            paths.append(container.sc_path("appArmorProfile", "type"))
    setters = _setters(pod_bad, bad_containers)
    annotations = (
        sorted(
            (f"{key}={_go_quote(value)}", key)
            for key, value in pod.annotations.items()
            if key.startswith(_APPARMOR_ANNOTATION_PREFIX) and not _apparmor_annotation_allowed(value)
        )
        if pod.annotations
        else []
    )
    values = sorted(bad_values)
    if annotations:
        values += [text for text, _ in annotations]
        setters.append(_pluralize("annotation", "annotations", len(annotations)))
        paths += [_annotation_path(key) for _, key in annotations]
    if not setters:
        return None
    return _Fail(
        _pluralize("forbidden AppArmor profile", "forbidden AppArmor profiles", len(values)),
        f"{' and '.join(setters)} must not set AppArmor profile type to {_join_quote(values)}",
        tuple(paths),
    )


_SELINUX_TYPES_1_0: Final = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
_SELINUX_TYPES_1_31: Final = _SELINUX_TYPES_1_0 | {"container_engine_t"}


def _se_linux_options(allowed_types: frozenset[str]) -> _CheckFn:
    def check(pod: _Pod) -> _Fail | None:
        bad_types: set[str] = set()
        set_user = set_role = False
        paths: list[str] = []

        def valid(options: Mapping[str, Any], prefix: str) -> bool:
            nonlocal set_user, set_role
            ok = True
            selinux_type = _str(options.get("type")) or ""
            if selinux_type not in allowed_types:
                ok = False
                bad_types.add(selinux_type)
                paths.append(f"{prefix}.type")
            if _str(options.get("user")):
                ok, set_user = False, True
                paths.append(f"{prefix}.user")
            if _str(options.get("role")):
                ok, set_role = False, True
                paths.append(f"{prefix}.role")
            return ok

        pod_bad = False
        pod_options = _mapping(_at(pod.security_context, "seLinuxOptions"))
        if pod_options is not None:
            pod_bad = not valid(pod_options, "spec.securityContext.seLinuxOptions")
        bad_containers: list[str] = []
        for container in pod.containers:
            options = _mapping(_at(container.security_context, "seLinuxOptions"))
            if options is not None and not valid(options, container.sc_path("seLinuxOptions")):
                bad_containers.append(container.name)
        setters = _setters(pod_bad, bad_containers)
        if not setters:
            return None
        data: list[str] = []
        if bad_types:
            data.append(f"{_pluralize('type', 'types', len(bad_types))} {_join_quote(sorted(bad_types))}")
        if set_user:
            data.append("user may not be set")
        if set_role:
            data.append("role may not be set")
        return _Fail(
            "seLinuxOptions",
            f"{' and '.join(setters)} set forbidden securityContext.seLinuxOptions: {'; '.join(data)}",
            tuple(paths),
        )

    return check


def _proc_mount_1_0(pod: _Pod) -> _Fail | None:
    bad: list[_Container] = []
    types: set[str] = set()
    for container in pod.containers:
        proc_mount = _str(_at(container.security_context, "procMount"))
        if proc_mount is not None and proc_mount != "Default":
            bad.append(container)
            types.add(proc_mount)
    if not bad:
        return None
    return _Fail(
        "procMount",
        f"{_containers_phrase([c.name for c in bad])} must not set securityContext.procMount to "
        f"{_join_quote(sorted(types))}",
        tuple(c.sc_path("procMount") for c in bad),
    )


def _proc_mount_1_35_baseline(pod: _Pod) -> _Fail | None:
    if pod.in_user_namespace:
        return None
    return _proc_mount_1_0(pod)


_SECCOMP_POD_ANNOTATION: Final = "seccomp.security.alpha.kubernetes.io/pod"
_SECCOMP_CONTAINER_ANNOTATION_PREFIX: Final = "container.seccomp.security.alpha.kubernetes.io/"
_SECCOMP_TYPES: Final = frozenset({"RuntimeDefault", "Localhost"})


def _seccomp_annotation_valid(value: str) -> bool:
    return value in ("runtime/default", "docker/default") or value.startswith("localhost/")


def _seccomp_profile_baseline_1_0(pod: _Pod) -> _Fail | None:
    keys = [_SECCOMP_POD_ANNOTATION] + [_SECCOMP_CONTAINER_ANNOTATION_PREFIX + c.name for c in pod.containers]
    forbidden: dict[str, str] = {}
    for key in keys:
        value = pod.annotations.get(key)
        if value is not None and not _seccomp_annotation_valid(value):
            forbidden[f"{key}={_go_quote(value)}"] = key
    if not forbidden:
        return None
    texts = sorted(forbidden)
    return _Fail(
        "seccompProfile",
        f"forbidden {_pluralize('annotation', 'annotations', len(texts))} {', '.join(texts)}",
        tuple(_annotation_path(forbidden[text]) for text in texts),
    )


def _seccomp_type(security_context: Mapping[str, Any] | None) -> str | None:
    """The seccomp profile type, ``""`` for a profile without a type, ``None`` without a profile."""
    profile = _mapping(_get(security_context, "seccompProfile"))
    if profile is None:
        return None
    return _str(profile.get("type")) or ""


def _seccomp_profile_fields(pod: _Pod, *, require: bool) -> _Fail | None:
    bad_values: set[str] = set()
    paths: list[str] = []
    pod_type = _seccomp_type(pod.security_context)
    pod_bad = pod_type is not None and pod_type not in _SECCOMP_TYPES
    if pod_bad:
        bad_values.add(pod_type or "")
        paths.append("spec.securityContext.seccompProfile.type")
    pod_valid = pod_type is not None and not pod_bad
    explicitly_bad: list[str] = []
    implicitly_bad: list[_Container] = []
    for container in pod.containers:
        container_type = _seccomp_type(container.security_context)
        if container_type is not None:
            if container_type not in _SECCOMP_TYPES:
                explicitly_bad.append(container.name)
                bad_values.add(container_type)
                paths.append(container.sc_path("seccompProfile", "type"))
        elif require and not pod_valid:
            implicitly_bad.append(container)
    setters = _setters(pod_bad, explicitly_bad)
    if setters:
        return _Fail(
            "seccompProfile",
            f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to "
            f"{_join_quote(sorted(bad_values))}",
            tuple(paths),
        )
    if implicitly_bad:
        return _Fail(
            "seccompProfile",
            f"pod or {_containers_phrase([c.name for c in implicitly_bad])} must set "
            'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"',
            tuple(c.sc_path("seccompProfile", "type") for c in implicitly_bad),
        )
    return None


def _seccomp_profile_baseline_1_19(pod: _Pod) -> _Fail | None:
    return _seccomp_profile_fields(pod, require=False)


_SYSCTLS_1_0: Final = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
    }
)
_SYSCTLS_1_27: Final = _SYSCTLS_1_0 | {"net.ipv4.ip_local_reserved_ports"}
_SYSCTLS_1_29: Final = _SYSCTLS_1_27 | {
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
_SYSCTLS_1_32: Final = _SYSCTLS_1_29 | {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}
_SYSCTLS_1_37: Final = _SYSCTLS_1_32 | {"net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"}


def _sysctls(allowed: frozenset[str]) -> _CheckFn:
    def check(pod: _Pod) -> _Fail | None:
        names: list[str] = []
        paths: list[str] = []
        for index, sysctl in enumerate(_list(_at(pod.security_context, "sysctls"))):
            if _mapping(sysctl) is None:
                continue
            name = _str(_get(sysctl, "name")) or ""
            if name not in allowed:
                names.append(name)
                paths.append(f"spec.securityContext.sysctls[{index}].name")
        if not names:
            return None
        return _Fail("forbidden sysctls", ", ".join(names), tuple(paths))

    return check


def _windows_host_process_1_0(pod: _Pod) -> _Fail | None:
    bad = [
        c for c in pod.containers if _bool(_get(c.security_context, "windowsOptions", "hostProcess")) is True
    ]
    pod_bad = _bool(_get(pod.security_context, "windowsOptions", "hostProcess")) is True
    setters = _setters(pod_bad, [c.name for c in bad])
    if not setters:
        return None
    paths = ["spec.securityContext.windowsOptions.hostProcess"] if pod_bad else []
    paths += [c.sc_path("windowsOptions", "hostProcess") for c in bad]
    return _Fail(
        "hostProcess",
        f"{' and '.join(setters)} must not set securityContext.windowsOptions.hostProcess=true",
        tuple(paths),
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


# --------------------------------------------------------------------------------------------------
# The registry


@dataclass(frozen=True, slots=True)
class _Impl:
    since: Version
    fn: _CheckFn
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Check:
    id: str
    level: str
    impls: tuple[_Impl, ...]
    #: The fields without which the check passes (every implementation reads only these, from the
    #: pod spec, a container or a security context; _ANNOTATIONS for the annotations): a pod that
    #: sets none of them skips the check, so a typical pod runs a handful of checks, not all
    #: (speed). None for a check that can fail on a field's absence (``runAsNonRoot`` ...).
    gate: frozenset[str] | None = None

    def impl_for(self, version: Version) -> _Impl | None:
        chosen = None
        for impl in self.impls:
            if impl.since <= version:
                chosen = impl
        return chosen


@cache
def _registry() -> tuple[_Check, ...]:
    """Every check, in upstream's evaluation order: baseline IDs sorted, then restricted IDs sorted."""
    baseline = [
        _Check(
            "hostNamespaces",
            "baseline",
            (_Impl((1, 0), _host_namespaces_1_0),),
            frozenset({"hostNetwork", "hostPID", "hostIPC"}),
        ),
        _Check(
            "privileged",
            "baseline",
            (_Impl((1, 0), _privileged_1_0),),
            frozenset({"privileged"}),
        ),
        _Check(
            "capabilities_baseline",
            "baseline",
            (_Impl((1, 0), _capabilities_baseline_1_0),),
            frozenset({"capabilities"}),
        ),
        _Check(
            "hostPathVolumes", "baseline", (_Impl((1, 0), _host_path_volumes_1_0),), frozenset({"volumes"})
        ),
        _Check("hostPorts", "baseline", (_Impl((1, 0), _host_ports_1_0),), frozenset({"ports"})),
        _Check(
            "hostProbesAndHostLifecycle",
            "baseline",
            (_Impl((1, 34), _host_probes_and_host_lifecycle_1_34),),
            frozenset({*_PROBES, "lifecycle"}),
        ),
        _Check(
            "appArmorProfile",
            "baseline",
            (_Impl((1, 0), _app_armor_profile_1_0),),
            frozenset({"appArmorProfile", _ANNOTATIONS}),
        ),
        _Check(
            "seLinuxOptions",
            "baseline",
            (
                _Impl((1, 0), _se_linux_options(_SELINUX_TYPES_1_0)),
                _Impl((1, 31), _se_linux_options(_SELINUX_TYPES_1_31)),
            ),
            frozenset({"seLinuxOptions"}),
        ),
        _Check(
            "procMount",
            "baseline",
            (_Impl((1, 0), _proc_mount_1_0), _Impl((1, 35), _proc_mount_1_35_baseline)),
            frozenset({"procMount"}),
        ),
        _Check(
            "seccompProfile_baseline",
            "baseline",
            (_Impl((1, 0), _seccomp_profile_baseline_1_0), _Impl((1, 19), _seccomp_profile_baseline_1_19)),
            # 1.0 reads the annotations, 1.19 the profiles.
            frozenset({"seccompProfile", _ANNOTATIONS}),
        ),
        _Check(
            "sysctls",
            "baseline",
            (
                _Impl((1, 0), _sysctls(_SYSCTLS_1_0)),
                _Impl((1, 27), _sysctls(_SYSCTLS_1_27)),
                _Impl((1, 29), _sysctls(_SYSCTLS_1_29)),
                _Impl((1, 32), _sysctls(_SYSCTLS_1_32)),
                _Impl((1, 37), _sysctls(_SYSCTLS_1_37)),
            ),
            frozenset({"sysctls"}),
        ),
        _Check(
            "windowsHostProcess",
            "baseline",
            (_Impl((1, 0), _windows_host_process_1_0),),
            frozenset({"windowsOptions"}),
        ),
    ]
    restricted = [
        _Check(
            "restrictedVolumes",
            "restricted",
            (_Impl((1, 0), _restricted_volumes_1_0, ("hostPathVolumes",)),),
            frozenset({"volumes"}),
        ),
        _Check(
            "allowPrivilegeEscalation",
            "restricted",
            (
                _Impl((1, 8), _allow_privilege_escalation_1_8),
                _Impl((1, 25), _windows_exempt(_allow_privilege_escalation_1_8)),
            ),
        ),
        _Check(
            "runAsNonRoot",
            "restricted",
            (
                _Impl((1, 0), _run_as_non_root_1_0),
                _Impl((1, 35), _user_namespace_exempt(_run_as_non_root_1_0)),
            ),
        ),
        _Check(
            "runAsUser",
            "restricted",
            (_Impl((1, 23), _run_as_user_1_23), _Impl((1, 35), _user_namespace_exempt(_run_as_user_1_23))),
            frozenset({"runAsUser"}),
        ),
        _Check(
            "seccompProfile_restricted",
            "restricted",
            (
                _Impl((1, 19), _seccomp_profile_restricted_1_19, ("seccompProfile_baseline",)),
                _Impl(
                    (1, 25), _windows_exempt(_seccomp_profile_restricted_1_19), ("seccompProfile_baseline",)
                ),
            ),
        ),
        _Check(
            "capabilities_restricted",
            "restricted",
            (
                _Impl((1, 22), _capabilities_restricted_1_22, ("capabilities_baseline",)),
                _Impl((1, 25), _windows_exempt(_capabilities_restricted_1_22), ("capabilities_baseline",)),
            ),
        ),
        _Check(
            "procMount_restricted",
            "restricted",
            (_Impl((1, 35), _proc_mount_1_0, ("procMount",)),),
            frozenset({"procMount"}),
        ),
    ]
    return tuple(sorted(baseline, key=lambda c: c.id)) + tuple(sorted(restricted, key=lambda c: c.id))


@cache
def _order() -> Mapping[str, int]:
    return MappingProxyType({check.id: index for index, check in enumerate(_registry())})


@cache
def _rule_for_check() -> Mapping[str, str]:
    return MappingProxyType({r.pss_check: r.id for r in all_rules().values() if r.pss_check is not None})


def all_checks() -> tuple[PSSCheck, ...]:
    """Every check of the registry, in evaluation order (baseline IDs sorted, then restricted)."""
    return tuple(
        PSSCheck(
            id=check.id,
            level=check.level,
            versions=tuple(impl.since for impl in check.impls),
            overrides=tuple((impl.since, impl.overrides) for impl in check.impls if impl.overrides),
        )
        for check in _registry()
    )


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"invalid Pod Security level {level!r}: expected one of {', '.join(LEVELS)}")


@cache
def _active(level: str, version: Version) -> tuple[tuple[_Check, _Impl], ...]:
    """The checks ``level`` runs at ``version`` with their implementations (computed once)."""
    return tuple(_select(level, version))


def _select(level: str, version: Version) -> Iterator[tuple[_Check, _Impl]]:
    if level == "privileged":
        return
    chosen = [(check, impl) for check in _registry() if (impl := check.impl_for(version)) is not None]
    if level == "baseline":
        yield from ((c, i) for c, i in chosen if c.level == "baseline")
        return
    overridden = {oid for c, i in chosen if c.level == "restricted" for oid in i.overrides}
    yield from ((c, i) for c, i in chosen if c.id not in overridden)


def check_ids(level: str, version: str = "latest") -> tuple[str, ...]:
    """IDs of the checks ``level`` runs at ``version``, in evaluation order.

    ``ValueError`` for an unknown level or a malformed version.
    """
    _check_level(level)
    return tuple(check.id for check, _ in _active(level, effective_version(version)))


def evaluate_pod(
    metadata: Mapping[str, Any], spec: Mapping[str, Any], level: str, version: str = "latest"
) -> tuple[PSSFinding, ...]:
    """Every check of ``level`` at ``version`` that the pod fails, in upstream's order.

    ``metadata`` and ``spec`` are the pod's (or pod template's) ``metadata`` and ``spec`` as
    decoded JSON; malformed fields read as absent and never raise. ``level`` and ``version`` come
    from configuration: an unknown level or malformed version is a ``ValueError``.
    """
    _check_level(level)
    evaluated = _effective_version(version)
    pod = _pod_view(metadata, spec)
    rules = _rule_for_check()
    findings: list[PSSFinding] = []
    passes = _restricted_passes(pod) if level == "restricted" else frozenset()
    for check, impl in _active(level, evaluated):
        gate = check.gate
        if (gate is not None and gate.isdisjoint(pod.present)) or check.id in passes:
            continue
        failed = impl.fn(pod)
        if failed is not None:
            findings.append(
                PSSFinding(
                    check=check.id,
                    rule=rules[check.id],
                    level=check.level,
                    reason=failed.reason,
                    detail=failed.detail,
                    paths=failed.paths,
                )
            )
    return tuple(findings)


def format_message(level: str, version: str, findings: Sequence[PSSFinding]) -> str:
    """The admission plugin's message: ``violates PodSecurity "restricted:latest": r1 (d1), r2 (d2)``.

    Findings are listed in upstream's order (baseline check IDs sorted, then restricted ones)
    whatever order they are given in; a finding with an empty detail shows its reason alone.
    """
    order = _order()
    ranked = sorted(findings, key=lambda f: (order.get(f.check, len(order)), f.check))
    parts = [f"{f.reason} ({f.detail})" if f.detail else f.reason for f in ranked]
    return f'violates PodSecurity "{level}:{version}": {", ".join(parts)}'
