"""The org's bounds on what a TeamQuota sets (``OrgPolicy.spec.teamQuotaLimits`` and priority
classes reserved for some teams).

A team's admins edit its quota file; only the sum of nominal GPUs was bounded (by capacity), so a
team could give itself a fair-sharing weight of 1000, borrow 100000 GPUs or allow 1000-node jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from mpigate.config.problems import PathPart
from mpigate.config.units import parse_quantity

from .base import Collector, Entry, Tree

__all__ = ["check_quota_limits"]

# TeamQuota.spec fields bounded by the limit of the same name.
_SCALAR_FIELDS = ("fairShareWeight", "maxNodesPerJob", "maxConcurrentJobs", "pods")
_QUANTITY_FIELDS = ("cpu", "memory")
_HINT = "team quotas are bounded by the org; ask the OrgPolicy's owners to raise the limit"


def _quantity(value: Any) -> Fraction | None:
    try:
        return parse_quantity(value)
    except ValueError:
        return None  # reported where the quantity is written (value.quantity)


class _Limits:
    """The org's limits and where each is written (or that it is the default)."""

    def __init__(self, org: Entry) -> None:
        self.values: Mapping[str, Any] = org.data["spec"]["teamQuotaLimits"]
        raw = org.doc.data.get("spec") if isinstance(org.doc.data, dict) else None
        written = raw.get("teamQuotaLimits") if isinstance(raw, dict) else None
        self._written = set(written) if isinstance(written, dict) else set()
        self._org = org

    def source(self, field: str) -> str:
        if field in self._written:
            where = self._org.doc.locate(("spec", "teamQuotaLimits", field))
            return f"OrgPolicy spec.teamQuotaLimits.{field} at {where}"
        return f"the default of OrgPolicy spec.teamQuotaLimits.{field}"

    def exceeded(
        self, c: Collector, entry: Entry, path: list[PathPart], what: str, value: Any, field: str
    ) -> None:
        limit = self.values[field]
        over = (
            (_quantity(value) or 0) > (_quantity(limit) or 0) if field in _QUANTITY_FIELDS else value > limit
        )
        if over:
            c.error(
                entry,
                path,
                f"{what} {value} is above the org's limit {limit} ({self.source(field)})",
                "limit.quota",
                _HINT,
            )


def check_quota_limits(c: Collector, tree: Tree) -> None:
    if tree.org is None:
        return
    limits = _Limits(tree.org)
    for field in _QUANTITY_FIELDS:
        if _quantity(limits.values[field]) is None:
            c.error(
                tree.org,
                ["spec", "teamQuotaLimits", field],
                f"{limits.values[field]!r} is not a quantity",
                "value.quantity",
            )
    classes = tree.org_spec["priorityClasses"]
    flavors = tree.flavors or {}
    for entry in tree.valid_quotas:
        team = entry.data["metadata"]["name"]
        spec = entry.data["spec"]
        for field in (*_SCALAR_FIELDS, *_QUANTITY_FIELDS):
            if spec.get(field) is not None:
                limits.exceeded(c, entry, ["spec", field], field, spec[field], field)
        stored = spec.get("maxStoredJobs")
        if stored is not None:
            limits.exceeded(c, entry, ["spec", "maxStoredJobs"], "maxStoredJobs", stored, "maxStoredJobs")
        else:
            limits.exceeded(
                c,
                entry,
                ["spec", "maxConcurrentJobs"],
                "maxStoredJobs (by default 4 × maxConcurrentJobs)",
                4 * spec["maxConcurrentJobs"],
                "maxStoredJobs",
            )
        for name, quota in spec["gpus"].items():
            path: list[PathPart] = ["spec", "gpus", name]
            limits.exceeded(
                c, entry, [*path, "nominal"], f"nominal quota on {name}", quota["nominal"], "nominal"
            )
            borrowing = quota["borrowingLimit"]
            limits.exceeded(
                c, entry, [*path, "borrowingLimit"], f"borrowingLimit on {name}", borrowing, "borrowingLimit"
            )
            floor = limits.values.get("minLendingLimit")
            lending = quota.get("lendingLimit")
            if floor is not None and lending is not None and lending < min(floor, quota["nominal"]):
                c.error(
                    entry,
                    [*path, "lendingLimit"],
                    f"lendingLimit {lending} on {name} is below the org's floor "
                    f"{min(floor, quota['nominal'])} ({limits.source('minLendingLimit')})",
                    "limit.quota",
                    "lend more of the unused GPUs to the cohort, or drop lendingLimit (lend all unused)",
                )
            capacity = (flavors.get(name) or {}).get("capacity")
            if capacity is not None and borrowing > capacity:
                c.error(
                    entry,
                    [*path, "borrowingLimit"],
                    f"borrowingLimit {borrowing} is above the capacity of {name} ({capacity} GPUs)",
                    "limit.quota",
                    "a team cannot borrow more GPUs than the flavor has",
                )
        for i, pc in enumerate(spec["priorityClasses"]):
            reserved_for = (classes.get(pc) or {}).get("teams")
            if reserved_for is not None and team not in reserved_for:
                c.error(
                    entry,
                    ["spec", "priorityClasses", i],
                    f"priority class {pc!r} is reserved for {', '.join(reserved_for) or 'no team'} "
                    f"(OrgPolicy spec.priorityClasses.{pc}.teams)",
                    "limit.priority-class",
                    "pick another priority class, or have the OrgPolicy's owners add the team",
                )
    for pc, definition in classes.items():
        for j, team in enumerate(definition.get("teams") or ()):
            c.ref(
                tree.org,
                ["spec", "priorityClasses", pc, "teams", j],
                team,
                tree.team_names,
                f"team {team!r} does not exist",
                "ref.team",
            )
