"""The status of a control: its evidence counts and the rule that turns them into met, attention
or no evidence (:data:`STATUS_RULES`, printed in every report). Pure functions over counts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .controls import Control

__all__ = ["EFFECTS", "STATUS_RULES", "EvidenceFacts", "assess_control"]

# What a violation did: denied (enforce, not waived), warned, audited (recorded only), waived
# (an exception applied).
EFFECTS = ("denied", "warned", "audited", "waived")

# The status of a control, written down once: the report prints these texts next to the table.
STATUS_RULES: Mapping[str, str] = MappingProxyType(
    {
        "no evidence": "No record of any kind the control names (its records list) is in the period, "
        "so nothing can be said about it from mpigate's evidence.",
        "attention": "Evidence exists, and at least one of: an audit chain failed verification; a "
        "violation of one of the control's (non-advisory) rules was admitted without enforcement "
        "(warn or audit mode); an exception waived one of its rules after the exception had expired; "
        "(controls evidenced by placement) a pod ran outside its team's region; (controls evidenced by "
        "API-server activity) a TrainJob or runtime write was admitted without an mpigate decision "
        "by an identity the webhooks do not exempt; (controls evidenced by checkpoints) a chain's "
        "signatures were not verified with a key.",
        "met": "Evidence exists and none of the attention conditions holds. This says the control "
        "operated as recorded in the period; it is not an audit opinion.",
    }
)


@dataclass(frozen=True, slots=True)
class EvidenceFacts:
    """What the period's records say, as far as control status needs it."""

    validate_by_kind: Mapping[str, int]
    effects: Mapping[tuple[str, str], int]
    advisory: frozenset[str]
    expired: Mapping[str, int]
    counts: Mapping[str, int]
    broken: list[str]
    unverified_signatures: list[str]
    outside: int
    unjudged: int
    k8s_given: bool


def _kinds_judged(rule_ids: Iterable[str], rules: Mapping[str, Any]) -> set[str]:
    kinds: set[str] = set()
    for rule_id in rule_ids:
        info = rules.get(rule_id)
        if info is None:
            continue
        kinds.update(info.applies)
        if "TrainingRuntime" in info.applies:
            kinds.add("ClusterTrainingRuntime")
    return kinds


def assess_control(control: Control, facts: EvidenceFacts, rules: Mapping[str, Any]) -> dict[str, Any]:
    """A control's evidence counts and status (the rule is :data:`STATUS_RULES`)."""
    evidence: dict[str, int] = {}
    for kind in control.records:
        if kind == "validate":
            judged = _kinds_judged(control.rules, rules)
            evidence[kind] = sum(c for k, c in facts.validate_by_kind.items() if k in judged)
        else:
            evidence[kind] = facts.counts.get(kind, 0)
    violations = dict.fromkeys(EFFECTS, 0)
    for rule in control.rules:
        for effect in EFFECTS:
            violations[effect] += facts.effects.get((rule, effect), 0)
    total = sum(evidence.values())
    reasons: list[str] = []
    if total == 0:
        status = "no evidence"
    else:
        if facts.broken:
            reasons.append(
                f"audit chain(s) {', '.join(facts.broken)} failed verification: "
                "the evidence may be incomplete or altered"
            )
        unenforced = {
            rule: facts.effects.get((rule, "warned"), 0) + facts.effects.get((rule, "audited"), 0)
            for rule in control.rules
            if rule not in facts.advisory
        }
        unenforced = {r: n for r, n in unenforced.items() if n}
        if unenforced:
            listed = ", ".join(f"{r} ({n})" for r, n in sorted(unenforced.items()))
            reasons.append(f"violations admitted without enforcement (warn/audit mode): {listed}")
        expired = {r: facts.expired[r] for r in control.rules if facts.expired.get(r)}
        if expired:
            listed = ", ".join(f"{r} ({n})" for r, n in sorted(expired.items()))
            reasons.append(f"waived by an exception after it had expired: {listed}")
        if "evidence" in control.records and facts.outside:
            reasons.append(f"{facts.outside} pod placement(s) outside the team's region")
        if "k8s-activity" in control.records and facts.unjudged:
            reasons.append(f"{facts.unjudged} API-server write(s) admitted without an mpigate decision")
        if "checkpoint" in control.records and facts.unverified_signatures:
            reasons.append(
                f"checkpoint signatures not verified for chain(s) {', '.join(facts.unverified_signatures)} "
                "(pass --key or --public-key)"
            )
        status = "attention" if reasons else "met"
    notes = []
    if any(k.startswith("k8s-") for k in control.records) and not facts.k8s_given:
        notes.append("no API-server audit log was given (--k8s-audit): its evidence is missing")
    return {
        "id": control.id,
        "fullId": control.full_id,
        "title": control.title,
        "description": control.description,
        "gaps": control.gaps,
        "rules": list(control.rules),
        "records": list(control.records),
        "evidence": evidence,
        "evidenceTotal": total,
        "violations": violations,
        "status": status,
        "reasons": reasons,
        "notes": notes,
    }
