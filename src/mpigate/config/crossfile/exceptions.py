"""PolicyException: team, rules, namespaces and expiry."""

from __future__ import annotations

import datetime as dt

from mpigate.catalogue import expand_rule_pattern, rule_ids

from .base import Collector, Entry, Tree, check_unique, did_you_mean, name_of


def check_exceptions(c: Collector, tree: Tree, exceptions: list[Entry]) -> None:
    check_unique(c, exceptions, name_of, "exception", ["metadata", "name"])
    team_namespaces = tree.team_namespaces
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
        for i, pattern in enumerate(spec["rules"]):
            if not expand_rule_pattern(pattern, rule_ids()):
                c.error(
                    entry,
                    ["spec", "rules", i],
                    f"{pattern!r} names no rule",
                    "ref.rule",
                    did_you_mean(pattern, rule_ids()),
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
        try:
            expires = dt.date.fromisoformat(spec["expires"])
        except ValueError:
            c.error(
                entry,
                ["spec", "expires"],
                f"{spec['expires']!r} is not a date",
                "value.date",
                "use YYYY-MM-DD",
            )
            continue
        if expires < tree.today:
            c.warning(
                entry,
                ["spec", "expires"],
                f"exception {name_of(entry)!r} expired on {expires.isoformat()} and no longer applies",
                "expired.exception",
                "renew it with a new approval or delete it",
            )
        elif (expires - tree.today).days > 366:
            c.warning(
                entry,
                ["spec", "expires"],
                f"exception {name_of(entry)!r} runs for more than a year (until {expires.isoformat()})",
                "value.long-exception",
                "exceptions should be short-lived; review it at least yearly",
            )
