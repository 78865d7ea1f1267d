"""PolicyException: team, rules, namespaces and expiry, and the second person.

An exception waives rules for a team's jobs, so the team must not grant it to itself: the approver
is not a member of the benefiting team (as far as the tree knows members: the users, service
accounts and groups of its TeamAccess; who is in a group is the identity provider's business and
cannot be checked here), is one of the org's approvers when the OrgPolicy lists them, and every
exception names the rules it waives, has a match condition and ends within the org's bound
(``OrgPolicy.spec.exceptions``). The file itself sits in the security team's folder (ownership).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from mpigate.catalogue import expand_rule_pattern
from mpigate.config.units import parse_duration

from .access import broad_subject
from .base import Collector, Entry, Tree, check_unique, did_you_mean, name_of, team_of

__all__ = ["check_exceptions", "team_members"]


def team_members(access: Iterable[Entry], team: str) -> dict[str, str]:
    """The subjects a team's TeamAccess names, case-folded, each with how it is named there
    (``user maria@acme.example as data-scientist``)."""
    members: dict[str, str] = {}
    for entry in access:
        if not entry.valid or team_of(entry) != team:
            continue
        for persona, who in entry.data["spec"]["members"].items():
            for user in who["users"]:
                members[user.casefold()] = f"user {user} ({persona})"
            for group in who["groups"]:
                members[group.casefold()] = f"group {group} ({persona})"
            for sa in who["serviceAccounts"]:
                members[sa.casefold()] = f"service account {sa} ({persona})"
    return members


def _service_account_name(user: str) -> str | None:
    """``system:serviceaccount:<namespace>:<name>`` → name (how the API server names them)."""
    parts = user.split(":")
    return parts[3] if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] else None


def _matches_everything(
    match: Mapping[str, Any], namespaces: AbstractSet[str], personas: AbstractSet[str]
) -> bool:
    """Whether ``match`` leaves every TrainJob of the team in: no condition, or only conditions
    that hold for all of them (``*`` as the name, every namespace the team has, every persona its
    TeamAccess gives as requesters: ``requestedBy`` is met by any one of its entries, so users and
    groups next to those personas add nobody)."""
    names = match.get("trainJobNames") or ()
    listed = set(match.get("namespaces") or ())
    by = match.get("requestedBy")
    whole_team = by is not None and bool(personas) and personas <= set(by.get("personas") or ())
    return not (
        any(set(n) != {"*"} for n in names)
        or (listed and not (namespaces and namespaces <= listed))
        or match.get("labels")
        or (by and not whole_team)
    )


def _personas_given(access: Iterable[Entry], team: str) -> set[str]:
    """The personas the team's TeamAccess gives to someone."""
    return {p for e in access if e.valid and team_of(e) == team for p in e.data["spec"]["members"]}


def check_exceptions(c: Collector, tree: Tree, exceptions: list[Entry], access: list[Entry]) -> None:
    check_unique(c, exceptions, name_of, "exception", ["metadata", "name"])
    team_namespaces = tree.team_namespaces
    policy: Mapping[str, Any] | None = tree.org_spec["exceptions"] if tree.org else None
    for entry in exceptions:
        if not entry.valid:
            continue
        spec = entry.data["spec"]
        c.ref(
            entry,
            ["spec", "team"],
            spec["team"],
            tree.team_names,
            f"team {spec['team']!r} does not exist",
            "ref.team",
        )
        # An expired exception applies to nothing (a warning says so); the rest is judged on live ones.
        live = policy if _check_expiry(c, tree, entry, spec, policy) else None
        if live is not None:
            _check_approver(c, entry, spec, live, team_members(access, spec["team"]))
        for i, pattern in enumerate(spec["rules"]):
            waived = expand_rule_pattern(pattern, tree.rule_ids)
            if not waived:
                c.error(
                    entry,
                    ["spec", "rules", i],
                    f"{pattern!r} names no rule",
                    "ref.rule",
                    did_you_mean(pattern, tree.rule_ids),
                )
            elif pattern not in tree.rule_ids and live is not None and not live["allowRulePatterns"]:
                shown = ", ".join(sorted(waived)[:6]) + (", ..." if len(waived) > 6 else "")
                c.error(
                    entry,
                    ["spec", "rules", i],
                    f"{pattern!r} waives {len(waived)} rule(s) by pattern ({shown}); an exception "
                    "names each rule it waives",
                    "exception.rule-pattern",
                    "list the rule IDs (or have the OrgPolicy's owners set "
                    "spec.exceptions.allowRulePatterns)",
                )
        everything = _matches_everything(
            spec["match"], team_namespaces.get(spec["team"], set()), _personas_given(access, spec["team"])
        )
        if live is not None and not live["allowTeamWide"] and everything:
            c.error(
                entry,
                ["spec", "match"],
                f"exception {name_of(entry)!r} matches every TrainJob of team {spec['team']!r} (no "
                "condition, or only conditions every job of the team meets: all its namespaces, all "
                "its personas, `*` as the name)",
                "exception.team-wide",
                "narrow it with match.requestedBy, match.namespaces, or match.trainJobNames / "
                "match.labels with match.requestedBy (or have the OrgPolicy's owners set "
                "spec.exceptions.allowTeamWide)",
            )
        for i, ns in enumerate(spec["match"].get("namespaces") or ()):
            c.ref(
                entry,
                ["spec", "match", "namespaces", i],
                ns,
                team_namespaces.get(spec["team"]),
                f"namespace {ns!r} does not belong to team {spec['team']!r}",
                "ref.namespace",
            )
        _check_requesters(c, tree, entry, spec, everything)


def _check_requesters(
    c: Collector, tree: Tree, entry: Entry, spec: Mapping[str, Any], everything: bool
) -> None:
    """A job's name and labels are chosen by whoever creates it: they narrow an exception, and
    ``match.requestedBy`` (the AdmissionReview's userInfo, which a tenant cannot choose) says who
    benefits. Without it the engine applies such an exception to nothing."""
    match = spec["match"]
    chosen = [k for k in ("trainJobNames", "labels") if k in match]
    # Only ``*`` as the name matches every job: that is the team-wide case, judged on its own.
    if chosen and "requestedBy" not in match and not everything:
        c.error(
            entry,
            ["spec", "match", chosen[0]],
            f"match.{' and match.'.join(chosen)} are chosen by whoever creates the TrainJob, so any "
            f"member of {spec['team']} could name a job to fit; the exception would apply to nothing",
            "exception.tenant-chosen",
            "add match.requestedBy (users, groups or personas of the team) to say who may benefit",
        )
    requested = match.get("requestedBy") or {}
    namespaces = tree.team_namespaces.get(spec["team"], set())
    for kind in ("users", "groups"):
        for i, name in enumerate(requested.get(kind) or ()):
            why = broad_subject(kind, name, namespaces)
            if why is not None:
                c.error(
                    entry,
                    ["spec", "match", "requestedBy", kind, i],
                    f"{name!r} is {why}; requestedBy says who may benefit, so it names the team's own people",
                    "exception.requester-broad",
                    "name the users, groups or personas of the team who may benefit",
                )
    for i, persona in enumerate(requested.get("personas") or ()):
        c.ref(
            entry,
            ["spec", "match", "requestedBy", "personas", i],
            persona,
            tree.personas,
            f"persona {persona!r} does not exist",
            "ref.persona",
        )


def _check_approver(
    c: Collector,
    entry: Entry,
    spec: Mapping[str, Any],
    policy: Mapping[str, Any],
    members: Mapping[str, str],
) -> None:
    approver: str = spec["approver"]
    key = approver.casefold()
    member = members.get(key) or members.get((_service_account_name(approver) or "").casefold())
    if member is not None:
        c.error(
            entry,
            ["spec", "approver"],
            f"approver {approver!r} is in team {spec['team']!r}, which the exception benefits "
            f"(TeamAccess: {member})",
            "exception.self-approved",
            "an exception needs a second person: someone outside the team approves it",
        )
    approvers = policy["approvers"]
    if approvers and key not in {a.casefold() for a in approvers}:
        c.error(
            entry,
            ["spec", "approver"],
            f"approver {approver!r} is not one of the org's approvers ({', '.join(approvers)})",
            "exception.approver",
            "OrgPolicy spec.exceptions.approvers lists who may approve exceptions",
        )


def _check_expiry(
    c: Collector, tree: Tree, entry: Entry, spec: Mapping[str, Any], policy: Mapping[str, Any] | None
) -> bool:
    """Judge ``expires``; False when the exception is no longer live (bad date or expired)."""
    try:
        expires = dt.date.fromisoformat(spec["expires"])
    except ValueError:
        c.error(
            entry, ["spec", "expires"], f"{spec['expires']!r} is not a date", "value.date", "use YYYY-MM-DD"
        )
        return False
    if expires < tree.today:
        c.warning(
            entry,
            ["spec", "expires"],
            f"exception {name_of(entry)!r} expired on {expires.isoformat()} and no longer applies",
            "expired.exception",
            "renew it with a new approval or delete it",
        )
        return False
    if policy is None:
        return True
    max_days = parse_duration(policy["maxDuration"]) // 86400
    last = tree.today + dt.timedelta(days=max_days)
    if expires > last:
        c.error(
            entry,
            ["spec", "expires"],
            f"exception {name_of(entry)!r} runs until {expires.isoformat()}, longer than the org allows "
            f"({policy['maxDuration']} from today: {last.isoformat()} at the latest)",
            "exception.expiry",
            "exceptions are short-lived: renew it with a new approval when it ends (OrgPolicy "
            "spec.exceptions.maxDuration)",
        )
    return True
