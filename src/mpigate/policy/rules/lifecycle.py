"""MPG-LIFE-001 (maximum runtime), MPG-LIFE-002 (required labels) and MPG-LIFE-003 (UPDATE guard)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mpigate.config import format_duration
from mpigate.config.model import Team
from mpigate.policy.context import (
    CLASSIFICATION_LABEL,
    QUEUE_LABEL,
    JobContext,
    as_list,
    as_mapping,
    labels_of,
)
from mpigate.policy.findings import Finding
from mpigate.trainjob import get_path
from mpigate.trainjob.jsontypes import is_mapping
from mpigate.trainjob.resolve import MPIGATE_MANAGER

__all__ = ["check_lifecycle", "check_update_guard", "own_patch_entry"]


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


def check_update_guard(ctx: JobContext, old: Mapping[str, Any]) -> Iterator[Finding]:
    """MPG-LIFE-003: mpigate's patch entry is unchanged; the queue label stays within the team."""
    before = own_patch_entry(old)
    after = own_patch_entry(ctx.obj)
    path = f"spec.runtimePatches[manager={MPIGATE_MANAGER}]"
    if before is not None and (after is None or after[1] != before[1]):
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
    team = ctx.team
    old_queue = labels_of(old).get(QUEUE_LABEL)
    new_queue = ctx.labels.get(QUEUE_LABEL)
    if team is not None and new_queue is not None and new_queue != old_queue and new_queue not in team.queues:
        yield Finding(
            "MPG-LIFE-003",
            f'metadata.labels["{QUEUE_LABEL}"]',
            f"moves the job from queue {old_queue or '(none)'} to {new_queue}, which is not one of "
            f"{team.name}'s "
            f"LocalQueues ({', '.join(team.queues)}).",
            f"Keep the job in one of {team.name}'s queues: {', '.join(team.queues)}.",
            f"queue {new_queue} is not one of {team.name}'s queues",
        )
