"""MPG-LIFE-001 (maximum runtime), MPG-LIFE-002 (required labels) and MPG-LIFE-003 (UPDATE guard)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mpigate.config import format_duration
from mpigate.config.model import Team
from mpigate.policy.context import (
    CLASSIFICATION_LABEL,
    COST_CENTER_LABEL,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    TEAM_LABEL,
    JobContext,
    as_list,
    as_mapping,
    labels_of,
)
from mpigate.policy.findings import Finding
from mpigate.policy.prepared import memoized
from mpigate.policy.requester import label_change_allowed
from mpigate.trainjob import get_path
from mpigate.trainjob.jsontypes import is_mapping
from mpigate.trainjob.resolve import MPIGATE_MANAGER

__all__ = ["check_lifecycle", "check_update_guard", "own_patch_entry", "policy_labels", "same_patch_entry"]


def check_lifecycle(ctx: JobContext) -> Iterator[Finding]:
    org = ctx.config.org
    lifecycle = org.lifecycle
    where = ctx.shape.deadline_path
    found, deadline = get_path(ctx.obj, ctx.shape.deadline)
    if not found:
        deadline = None
    limit = lifecycle.max_runtime_seconds
    if deadline is not None and (not isinstance(deadline, int) or isinstance(deadline, bool) or deadline < 1):
        yield Finding(
            "MPG-LIFE-001",
            where,
            f"must be a positive number of seconds, got {deadline!r}.",
            f"Set it to at most {limit} ({format_duration(limit)})." if limit else "Set a positive integer.",
            "activeDeadlineSeconds is not a positive integer",
        )
    elif limit is not None:
        if isinstance(deadline, int) and deadline > limit:
            yield Finding(
                "MPG-LIFE-001",
                where,
                f"{deadline}s ({format_duration(deadline)}) exceeds the org's maxRuntime "
                f"{format_duration(limit)} "
                f"({limit}s).",
                f"Set {where} to {limit} or less and checkpoint to resume in a new job"
                + (
                    f" (or remove it: mpigate sets {lifecycle.default_runtime_seconds})."
                    if lifecycle.default_runtime_seconds
                    else "."
                ),
                f"runs up to {format_duration(deadline)}, max {format_duration(limit)}",
            )
        elif deadline is None and lifecycle.default_runtime_seconds is None:
            yield Finding(
                "MPG-LIFE-001",
                where,
                "is not set, so the job could run forever; the org's maxRuntime is "
                f"{format_duration(limit)}.",
                f"Set {where} to {limit} or less.",
                "no activeDeadlineSeconds",
            )

    raw_labels = as_mapping(ctx.obj.get("metadata")).get("labels")
    if raw_labels is not None and (
        not is_mapping(raw_labels) or any(not isinstance(v, str) for v in raw_labels.values())
    ):
        yield Finding(
            "MPG-LIFE-002",
            "metadata.labels",
            "labels must be a map of strings.",
            'Quote label values ("true", "2026").',
            "labels are not a map of strings",
        )
    team: Team | None = ctx.team
    required = list(lifecycle.required_labels)
    if team is not None:
        required += [label for label in team.required_labels if label not in required]
    missing = [label for label in required if not ctx.labels.get(label)]
    for label in missing:
        whose = "the org" if label in lifecycle.required_labels else f"{team.name if team else 'the team'}"
        yield Finding(
            "MPG-LIFE-002",
            f'metadata.labels["{label}"]',
            f"label {label} is required by {whose} but missing.",
            f'Add metadata.labels["{label}"]'
            + (
                f" with one of: {', '.join(_classifications(ctx))}." if label == CLASSIFICATION_LABEL else "."
            ),
            f"required label {label} is missing",
        )
    value = ctx.labels.get(CLASSIFICATION_LABEL)
    if value:
        choices = _classifications(ctx)
        if value not in org.data_classifications:
            yield Finding(
                "MPG-LIFE-002",
                f'metadata.labels["{CLASSIFICATION_LABEL}"]',
                f"data classification {value} is not defined by the org "
                f"({', '.join(org.data_classifications)}).",
                f"Use one of: {', '.join(choices)}.",
                f"unknown data classification {value}",
            )
        elif (
            team is not None
            and team.data_classifications is not None
            and value not in team.data_classifications
        ):
            yield Finding(
                "MPG-LIFE-002",
                f'metadata.labels["{CLASSIFICATION_LABEL}"]',
                f"{team.name} may not process data classified {value} (allowed: {', '.join(choices)}).",
                f"Use one of: {', '.join(choices)}, or ask {ctx.contact} to allow {value} in "
                f"{ctx.team_file}.",
                f"{team.name} may not process {value} data",
            )


def _classifications(ctx: JobContext) -> list[str]:
    names = list(ctx.config.org.data_classifications)
    if ctx.team is not None and ctx.team.data_classifications is not None:
        names = [n for n in names if n in ctx.team.data_classifications]
    return names


def own_patch_entry(obj: Mapping[str, Any]) -> tuple[int, Mapping[str, Any]] | None:
    """mpigate's ``runtimePatches`` entry (index, entry), if present."""
    for index, entry in enumerate(as_list(as_mapping(obj.get("spec")).get("runtimePatches"))):
        if is_mapping(entry) and entry.get("manager") == MPIGATE_MANAGER:
            return index, entry
    return None


def same_patch_entry(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two runtime patch entries say the same, ignoring ``time``, which Trainer's defaulter
    stamps on every entry it sees change (Trainer: pkg/webhooks/trainjob_webhook.go
    (*TrainJobDefaulter).Default)."""
    if a.keys() - {"time"} != b.keys() - {"time"}:
        return False
    return all(a[k] == b[k] for k in a if k != "time")


# Labels whose value decides a policy: Kueue's queue and priority (quota), the classification
# (residency, network profile, digests), the cost center (chargeback) and the team label the
# NetworkPolicies select on. The org's and the team's required labels and the labels that
# PolicyExceptions of the team match on are added per team.
_FIXED_POLICY_LABELS = (QUEUE_LABEL, PRIORITY_LABEL, CLASSIFICATION_LABEL, COST_CENTER_LABEL, TEAM_LABEL)


def policy_labels(ctx: JobContext) -> tuple[str, ...]:
    """The TrainJob labels that carry policy for ``ctx``'s team (computed once per config and team)."""
    config = ctx.config
    team = ctx.team

    def build() -> tuple[str, ...]:
        labels = dict.fromkeys(_FIXED_POLICY_LABELS)
        labels.update(dict.fromkeys(config.org.lifecycle.required_labels))
        if team is not None:
            labels.update(dict.fromkeys(team.required_labels))
            for exception in config.exceptions_for(team.name):
                labels.update(dict.fromkeys(exception.labels))
        return tuple(labels)

    found: tuple[str, ...] = memoized(
        config, ("policy.lifecycle.policy_labels", team.name if team else ""), build
    )
    return found


_WHY = {
    QUEUE_LABEL: "it decides which Kueue queue, cohort and limits the job counts against",
    PRIORITY_LABEL: "it decides the job's Kueue priority",
    CLASSIFICATION_LABEL: "it decides residency, the network profile and digest requirements",
    COST_CENTER_LABEL: "chargeback bills the job to it",
    TEAM_LABEL: "the team's NetworkPolicies select on it",
}


def check_update_guard(ctx: JobContext, old: Mapping[str, Any]) -> Iterator[Finding]:
    """MPG-LIFE-003: mpigate's patch entry is unchanged, and the policy-carrying labels keep the
    values they were admitted with unless OrgPolicy ``updates.labelChanges`` names the requester."""
    before = own_patch_entry(old)
    after = own_patch_entry(ctx.obj)
    path = f"spec.runtimePatches[manager={MPIGATE_MANAGER}]"
    if before is not None and (after is None or not same_patch_entry(after[1], before[1])):
        what = "removed" if after is None else "changed"
        yield Finding(
            "MPG-LIFE-003",
            path,
            f"mpigate's runtime patch (residency, team label, security defaults) was {what}; it is set at "
            "creation and may not be edited.",
            "Leave the mpigate.io/admission entry as it is; delete and re-create the TrainJob to change it.",
            f"mpigate's runtime patch was {what}",
        )
    elif before is None and after is not None:
        yield Finding(
            "MPG-LIFE-003",
            path,
            "adds an entry under mpigate's manager after creation; only the admission webhook "
            "writes it, on CREATE.",
            "Remove the mpigate.io/admission entry.",
            "mpigate's runtime patch may only be set on CREATE",
        )
    old_labels = labels_of(old)
    for label in policy_labels(ctx):
        was, now = old_labels.get(label), ctx.labels.get(label)
        if was == now or label_change_allowed(ctx.config, ctx.team, ctx.requester, label) is not None:
            continue
        if was is None:
            what = f"adds policy label {label}={now}"
        elif now is None:
            what = f"removes policy label {label} (was {was})"
        else:
            what = f"changes policy label {label} from {was} to {now}"
        why = _WHY.get(label, "the org or the team requires it")
        who = _who_may(ctx, label)
        yield Finding(
            "MPG-LIFE-003",
            f'metadata.labels["{label}"]',
            f"{what} after creation; {why}, so it keeps the value the job was admitted with.",
            f"Restore {label}{f'={was}' if was is not None else ' (remove it)'}, or delete and re-create the "
            f"TrainJob with the new value{who}.",
            f"{what.split(' (')[0]} after creation",
        )


def _who_may(ctx: JobContext, label: str) -> str:
    """``; <who> may change it`` from OrgPolicy ``updates.labelChanges`` (or nothing)."""
    names: list[str] = []
    for grant in ctx.config.org.updates.label_changes:
        if label not in grant.labels:
            continue
        names.extend(f"persona {p}" for p in sorted(grant.personas))
        for persona in sorted(grant.personas):
            access = ctx.config.access.get(ctx.team_name)
            members = access.members.get(persona) if access else None
            if members is not None:
                names.extend(members.users)
        names.extend(sorted(grant.users))
        names.extend(f"group {g}" for g in sorted(grant.groups))
    if not names:
        return ""
    return f"; {', '.join(dict.fromkeys(names))} may change it"
