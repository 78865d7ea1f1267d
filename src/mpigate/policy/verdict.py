"""The verdict: findings, the modes the org gives their rules and the exceptions that waive them,
turned into a :class:`~mpigate.policy.decision.Decision`; and the answers that judge nothing (an
audited DELETE, an internal error denied to fail closed).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from mpigate.catalogue import all_rules
from mpigate.config import Config
from mpigate.config.model import Team

from .custom import custom_rule_meta
from .decision import AdmissionInput, AppliedException, Decision, Demand, Mode, Violation
from .findings import Finding, short_warning
from .requester import personas_of

__all__ = ["allowed", "audited", "decide", "failed_closed"]

log = logging.getLogger(__name__)

# Rule families whose violations also evidence the data classification's own controls.
_CLASSIFICATION_FAMILIES = ("MPG-RES-", "MPG-NET-", "MPG-IMG-")


def audited(
    config: Config, request: AdmissionInput, namespace: str, name: str, team: Team | None
) -> Decision:
    who = request.user.username or "(unknown user)"
    info = all_rules()["MPG-LIFE-004"]
    violation = Violation(
        rule="MPG-LIFE-004",
        mode="audit",
        path="metadata.name",
        message=f"{request.operation} of {request.kind} "
        f"{namespace + '/' if namespace else ''}{name} by {who}.",
        controls=info.controls,
    )
    return allowed(config, request, namespace, name, team, violations=(violation,))


def allowed(
    config: Config,
    request: AdmissionInput,
    namespace: str,
    name: str,
    team: Team | None,
    *,
    violations: tuple[Violation, ...] = (),
    patch: tuple[Mapping[str, Any], ...] = (),
) -> Decision:
    """An allowed decision that judged nothing: an audited DELETE/CONNECT (its MPG-LIFE-004
    record in ``violations``) or the mutating webhook's answer (its ``patch``)."""
    return Decision(
        allowed=True,
        operation=request.operation,
        kind=request.kind,
        namespace=namespace or None,
        name=name,
        team=team.name if team else None,
        revision=config.revision,
        violations=violations,
        patch=patch,
    )


def decide(
    config: Config,
    request: AdmissionInput,
    namespace: str | None,
    name: str,
    team: Team | None,
    findings: list[Finding],
    patch: list[dict[str, Any]],
    demand: Demand | None,
    labels: Mapping[str, str],
    now: dt.datetime,
    *,
    classification_controls: tuple[str, ...] = (),
    notes: Iterable[str] = (),
    annotations: Mapping[str, str] | None = None,
) -> Decision:
    exceptions = config.exceptions_for(team.name) if team is not None else ()
    rules = all_rules()
    custom = custom_rule_meta(config)
    day = now.astimezone(dt.UTC).date() if now.tzinfo else now.date()
    user = request.user
    held = personas_of(config, team, user) if team is not None and exceptions else frozenset()
    active = [
        e
        for e in exceptions
        if e.active_on(day) and e.matches(namespace or "", name, labels, user.username, user.groups, held)
    ]
    applied: dict[str, AppliedException] = {}
    violations: list[Violation] = []
    warnings: list[str] = []
    for finding in findings:
        meta = custom.get(finding.rule)
        mode: Mode
        digest = ""
        if meta is not None:
            mode, controls, digest = meta.mode, meta.controls, meta.digest
        else:
            mode, controls = config.org.enforcement.mode_for(finding.rule), rules[finding.rule].controls
        waiver = next((e for e in active if finding.rule in e.rule_ids), None)
        if classification_controls and finding.rule.startswith(_CLASSIFICATION_FAMILIES):
            controls = (*controls, *(c for c in classification_controls if c not in controls))
        violations.append(
            Violation(
                rule=finding.rule,
                mode=mode,
                path=finding.path,
                message=finding.message,
                fix=finding.fix,
                controls=controls,
                waived_by=waiver.name if waiver else None,
                digest=digest,
            )
        )
        if waiver is not None:
            applied.setdefault(
                waiver.name,
                AppliedException(
                    waiver.name,
                    waiver.rules,
                    waiver.approver,
                    waiver.ticket,
                    waiver.expires,
                    waiver.justification,
                ),
            )
            until = waiver.expires.isoformat()
            text = f"waived by {waiver.name} until {until}: {finding.short or finding.message}"
            warnings.append(short_warning(finding.rule, text))
        elif mode == "warn":
            warnings.append(short_warning(finding.rule, finding.short or finding.message))
    warnings.extend(short_warning("mpigate", note)[len("[mpigate] ") :] for note in notes)
    denying = [v for v in violations if v.denies]
    message = ""
    if denying:
        where = f"{namespace}/{name}" if namespace else name
        lines = [f"mpigate denied {request.kind} {where}:"]
        for v in denying:
            lines.append(f"  [{v.rule}] {v.path}: {v.message}{' ' + v.fix if v.fix else ''}")
        message = "\n".join(lines)
    return Decision(
        allowed=not denying,
        operation=request.operation,
        kind=request.kind,
        namespace=namespace,
        name=name,
        team=team.name if team else None,
        revision=config.revision,
        violations=tuple(violations),
        warnings=tuple(dict.fromkeys(warnings)),
        patch=tuple(patch),
        exceptions=tuple(applied.values()),
        demand=demand,
        message=message,
        audit_annotations=tuple(sorted(annotations.items())) if annotations else (),
    )


def failed_closed(config: Config, request: AdmissionInput, doing: str) -> Decision:
    """The answer to an internal error: logged with its traceback, denied with a clean message."""
    log.exception("internal error %s %s %s/%s", doing, request.kind, request.namespace, request.name)
    return Decision.bare(
        request,
        config.revision,
        allowed=False,
        message=f"mpigate could not evaluate {request.kind} {request.namespace}/{request.name}: "
        "internal error (logged); denied to fail closed",
    )
