"""The registry (upstream ``registry.go`` and ``check_*.go``'s ``init``): every check with its
versioned implementations, in upstream's evaluation order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

from mpigate.catalogue import all_rules

from ._baseline import (
    _PROBES,
    _SELINUX_TYPES_1_0,
    _SELINUX_TYPES_1_31,
    _SYSCTLS_1_0,
    _SYSCTLS_1_27,
    _SYSCTLS_1_29,
    _SYSCTLS_1_32,
    _SYSCTLS_1_37,
    _app_armor_profile_1_0,
    _capabilities_baseline_1_0,
    _host_namespaces_1_0,
    _host_path_volumes_1_0,
    _host_ports_1_0,
    _host_probes_and_host_lifecycle_1_34,
    _privileged_1_0,
    _proc_mount_1_0,
    _proc_mount_1_35_baseline,
    _se_linux_options,
    _seccomp_profile_baseline_1_0,
    _seccomp_profile_baseline_1_19,
    _sysctls,
    _windows_host_process_1_0,
)
from ._model import Version
from ._restricted import (
    _allow_privilege_escalation_1_8,
    _capabilities_restricted_1_22,
    _restricted_volumes_1_0,
    _run_as_non_root_1_0,
    _run_as_user_1_23,
    _seccomp_profile_restricted_1_19,
    _user_namespace_exempt,
    _windows_exempt,
)
from ._view import _ANNOTATIONS, _CheckFn


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
