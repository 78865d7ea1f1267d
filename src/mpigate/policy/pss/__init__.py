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

from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from typing import Any

from ._model import (
    LEVELS,
    NEWEST_VERSION,
    PSSFinding,
    Version,
    _effective_version,
    effective_version,
    parse_version,
)
from ._registry import PSSCheck, _Check, _Impl, _order, _registry, _rule_for_check, all_checks
from ._restricted import _restricted_passes
from ._view import _pod_view

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
