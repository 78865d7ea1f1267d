"""The status of a control: what it was tested on (its population), what was in force, and the
rule that turns them into one of five statuses (:data:`STATUS_RULES`, printed in every report).
Pure functions over counts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .controls import Control

__all__ = ["EFFECTS", "STATUSES", "STATUS_RULES", "EvidenceFacts", "assess_control"]

# What a violation did: denied (enforce, not waived), warned, audited (recorded only), waived
# (an exception applied).
EFFECTS = ("denied", "warned", "audited", "waived")

STATUSES = ("met", "attention", "not evaluated", "no occasion", "not applicable")

# The status of a control, written down once: the report prints these texts next to the table.
STATUS_RULES: Mapping[str, str] = MappingProxyType(
    {
        "met": "Tested and passed: every source the control rests on was read and covers the "
        "period, its population (the requests, records and events it was tested on) is not empty, "
        "its rules were in force in enforce mode under every config revision in force, and none of "
        "the attention conditions holds. It says the control operated as recorded in the period; "
        "it is not an audit opinion.",
        "attention": "At least one finding needs review: an audit chain failed verification or a "
        "chain is missing; the inputs leave a gap in the period longer than the heartbeat; the API "
        "server's log and the chains do not reconcile; one of the control's rules was not enforced "
        "(warn or audit mode, or not run at the Pod Security level in force) under a revision in "
        "force, or a finding of it was admitted without enforcement; an exception waived one of its "
        "rules after it had expired; a pod ran outside its team's region; a write reached the API "
        "server without an mpigate decision; an API-server event outside mpigate's judgement is a "
        "finding (an unsafe pod, exec into a pod, a risky RBAC change, a person reading secrets, an "
        "anonymous write, impersonation).",
        "not evaluated": "A source the control rests on is missing (no API-server log, no "
        "controller records, no key to check signatures, the rule modes of a revision not "
        "recorded), so it could not be tested; the reasons name the source.",
        "no occasion": "Every source was read, and nothing in the period called for the control "
        "(its population is empty: no request, record or event of the kinds it is tested on).",
        "not applicable": "Declared not applicable to this system with --not-applicable, with the "
        "justification shown; its evidence is still listed.",
    }
)

# The unit of each record kind's population.
UNITS: Mapping[str, str] = MappingProxyType(
    {
        "validate": "requests",
        "mutate": "requests",
        "lifecycle": "records",
        "evidence": "placements",
        "checkpoint": "checkpoints",
        "chain": "records",
        "config": "revisions",
        "images": "images",
    }
)


@dataclass(frozen=True, slots=True)
class EvidenceFacts:
    """What the period's inputs say, as far as control status needs it.

    ``counts``: population per record kind (``validate`` is counted per object kind in
    ``validate_by_kind``); ``missing``: record kind → why its source is missing; ``findings``:
    record kind → attention reasons its source raised; ``general``: attention reasons for every
    control (integrity, completeness, reconciliation); ``revisions``: the revisions in force with
    their policy (or None when unknown)."""

    validate_by_kind: Mapping[str, int]
    effects: Mapping[tuple[str, str], int]
    advisory: frozenset[str]
    expired: Mapping[str, int]
    counts: Mapping[str, int]
    missing: Mapping[str, str] = field(default_factory=dict)
    findings: Mapping[str, Sequence[str]] = field(default_factory=dict)
    general: Sequence[str] = ()
    revisions: Sequence[Mapping[str, Any]] = ()
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    # reasons that every control resting on the API server's log shares (its coverage)
    k8s_general: Sequence[str] = ()


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


_LEVEL_RANK = {"privileged": 0, "baseline": 1, "restricted": 2}


def _in_force(rule_id: str, policy: Mapping[str, Any], rules: Mapping[str, Any]) -> str:
    """How a rule operated under a revision's policy: its mode, or why it did not run."""
    info = rules.get(rule_id)
    needed = info.pss_level if info is not None else None
    if needed:
        level = str(policy.get("podSecurity", {}).get("level", ""))
        if _LEVEL_RANK.get(level, 2) < _LEVEL_RANK.get(needed, 2):
            return f"not run (Pod Security level {level})"
    if rule_id == "MPG-SEC-SECRETS" and policy.get("forbidPlaintextSecrets") is False:
        return "not run (forbidPlaintextSecrets: false)"
    modes = policy.get("modes") or {}
    return str(modes.get(rule_id) or policy.get("defaultMode") or "enforce")


def assess_control(control: Control, facts: EvidenceFacts, rules: Mapping[str, Any]) -> dict[str, Any]:
    """A control's population, the modes its rules had, and its status (:data:`STATUS_RULES`)."""
    evidence: dict[str, int] = {}
    for kind in control.records:
        if kind == "validate":
            judged = _kinds_judged(control.rules, rules)
            evidence[kind] = sum(c for k, c in facts.validate_by_kind.items() if k in judged)
        else:
            evidence[kind] = facts.counts.get(kind, 0)
    # A request's mutate and validate records are one request: mutations are shown, not added.
    population = sum(n for kind, n in evidence.items() if kind != "mutate")
    violations = dict.fromkeys(EFFECTS, 0)
    for rule in control.rules:
        for effect in EFFECTS:
            violations[effect] += facts.effects.get((rule, effect), 0)
    # The modes of its rules under each revision in force.
    modes: list[dict[str, Any]] = []
    not_enforced: dict[str, list[str]] = {}
    unknown: list[str] = []
    for revision in facts.revisions:
        policy = revision.get("policy")
        name = str(revision.get("revision"))
        if control.rules and policy is None:
            unknown.append(name)
            continue
        if policy is None:
            continue
        for rule in control.rules:
            state = _in_force(rule, policy, rules)
            if state != "enforce" and rule not in facts.advisory:
                not_enforced.setdefault(f"{rule}: {state}", []).append(name)
    for rule in control.rules:
        modes.append(
            {
                "rule": rule,
                "byRevision": {
                    str(r.get("revision")): (_in_force(rule, r["policy"], rules) if r.get("policy") else None)
                    for r in facts.revisions
                },
            }
        )
    attention: list[str] = list(facts.general)
    for text, revisions in sorted(not_enforced.items()):
        attention.append(f"{text} under revision(s) {', '.join(revisions)}")
    unenforced = {
        rule: facts.effects.get((rule, "warned"), 0) + facts.effects.get((rule, "audited"), 0)
        for rule in control.rules
        if rule not in facts.advisory
    }
    unenforced = {r: n for r, n in unenforced.items() if n}
    if unenforced:
        listed = ", ".join(f"{r} ({n})" for r, n in sorted(unenforced.items()))
        attention.append(f"findings admitted without enforcement (warn/audit mode): {listed}")
    expired = {r: facts.expired[r] for r in control.rules if facts.expired.get(r)}
    if expired:
        listed = ", ".join(f"{r} ({n} finding(s))" for r, n in sorted(expired.items()))
        attention.append(f"waived by an exception after it had expired: {listed}")
    for kind in control.records:
        attention.extend(facts.findings.get(kind, ()))
    if any(kind.startswith("k8s-") for kind in control.records):
        attention.extend(facts.k8s_general)
    attention = list(dict.fromkeys(attention))  # a reason shared by several record kinds, once
    missing = [facts.missing[kind] for kind in control.records if kind in facts.missing]
    if unknown:
        missing.append(
            f"the rule modes in force under revision(s) {', '.join(unknown)} are not recorded "
            "(no config record in the chains; --config is another revision)"
        )
    missing = sorted(set(missing), key=missing.index)
    if control.full_id in facts.not_applicable:
        status = "not applicable"
    elif attention:
        status = "attention"
    elif missing:
        status = "not evaluated"
    elif population == 0:
        status = "no occasion"
    else:
        status = "met"
    return {
        "id": control.id,
        "fullId": control.full_id,
        "title": control.title,
        "description": control.description,
        "gaps": control.gaps,
        "rules": list(control.rules),
        "records": list(control.records),
        "evidence": evidence,
        "evidenceTotal": population,
        "population": {kind: {"count": n, "unit": _unit(kind)} for kind, n in evidence.items()},
        "violations": violations,
        "modes": modes,
        "status": status,
        "reasons": attention,
        "notEvaluated": missing,
        "notApplicable": facts.not_applicable.get(control.full_id),
        "notes": [],
    }


def _unit(kind: str) -> str:
    return UNITS.get(kind, "events" if kind.startswith("k8s-") else "records")
