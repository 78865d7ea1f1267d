"""The baseline checks (upstream ``check_*.go``), each versioned implementation a function."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ._view import (
    _annotation_path,
    _at,
    _bool,
    _CheckFn,
    _Container,
    _containers_phrase,
    _Fail,
    _get,
    _go_quote,
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
