"""Who is asking: the personas a request's ``userInfo`` holds in a team (TeamAccess).

The API server authenticates the requester and sends ``userInfo`` with every AdmissionReview; a
tenant cannot choose it. A member is matched by username, by group, or — for pipelines — as one of
the persona's service accounts in one of the team's namespaces (the API server names a service
account ``system:serviceaccount:<namespace>:<name>``). The table is built once per config.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from mpigate.config import Config
from mpigate.config.model import LabelChangeGrant, Team

from .decision import UserInfo
from .prepared import memoized

__all__ = [
    "SERVICE_ACCOUNT_PREFIX",
    "label_change_allowed",
    "personas_of",
    "service_account_personas",
    "service_account_user",
    "usable_service_accounts",
]

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

# (users, groups) → personas, per team.
_Table = tuple[Mapping[str, frozenset[str]], Mapping[str, frozenset[str]]]


def service_account_user(namespace: str, name: str) -> str:
    """The username the API server gives service account ``name`` of ``namespace``."""
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def _table(config: Config, team: Team) -> _Table:
    def build() -> _Table:
        users: dict[str, set[str]] = {}
        groups: dict[str, set[str]] = {}
        access = config.access.get(team.name)
        for persona, members in access.members.items() if access else ():
            for user in members.users:
                users.setdefault(user, set()).add(persona)
            for group in members.groups:
                groups.setdefault(group, set()).add(persona)
            for account in members.service_accounts:
                for namespace in team.namespaces:
                    users.setdefault(service_account_user(namespace, account), set()).add(persona)
        return (
            MappingProxyType({k: frozenset(v) for k, v in users.items()}),
            MappingProxyType({k: frozenset(v) for k, v in groups.items()}),
        )

    found: _Table = memoized(config, ("policy.requester.personas", team.name), build)
    return found


def personas_of(config: Config, team: Team, user: UserInfo) -> frozenset[str]:
    """The personas ``user`` holds in ``team`` (empty for someone who is not a member)."""
    users, groups = _table(config, team)
    found = users.get(user.username, frozenset())
    for group in user.groups:
        more = groups.get(group)
        if more:
            found = found | more
    return found


def label_change_allowed(
    config: Config, team: Team | None, user: UserInfo, label: str
) -> LabelChangeGrant | None:
    """The OrgPolicy ``updates.labelChanges`` entry that lets ``user`` change ``label`` of a job of
    ``team``, or ``None`` (nobody may by default)."""
    grants = config.org.updates.label_changes
    if not grants:
        return None
    held = personas_of(config, team, user) if team is not None else frozenset()
    for grant in grants:
        if label not in grant.labels:
            continue
        if (
            user.username in grant.users
            or any(g in grant.groups for g in user.groups)
            or held & grant.personas
        ):
            return grant
    return None


def usable_service_accounts(config: Config, team: Team, personas: frozenset[str]) -> frozenset[str]:
    """The team's service accounts that holders of ``personas`` may name in a TrainJob: those
    TeamAccess binds to each persona's ``serviceAccountsFrom`` (default: the persona itself)."""
    access = config.access.get(team.name)
    if access is None or not personas:
        return frozenset()
    out: set[str] = set()
    for held in personas:
        persona = config.personas.get(held)
        sources = (
            persona.service_accounts_from if persona and persona.service_accounts_from is not None else None
        )
        for source in sources if sources is not None else (held,):
            members = access.members.get(source)
            if members is not None:
                out.update(members.service_accounts)
    return frozenset(out)


def service_account_personas(config: Config, team: Team, account: str) -> tuple[str, ...]:
    """The personas TeamAccess binds ``account`` to in ``team`` (for messages)."""
    access = config.access.get(team.name)
    if access is None:
        return ()
    return tuple(sorted(p for p, m in access.members.items() if account in m.service_accounts))
