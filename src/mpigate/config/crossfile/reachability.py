"""Admission and network agree: what a team may read, its network lets it reach.

A region's ``dataLocations`` say which URIs a team's jobs may read (MPG-RES-003 admits a job
whose ``storageUri`` starts with one of them); its TeamNetwork's egress (lists from
NetworkProfiles and its own rules) says where its pods may connect. An egress destination that
declares what it ``serves`` (``serves: ["hf://"]`` on an egress proxy, ``["s3://acme-eu-"]`` on
the S3 endpoints) lets the two be compared: a location a team may read that none of its egress
serves is a job admitted and then stuck at its initializer, so ``check`` warns.

CIDRs alone say nothing about which data is behind them: a tree in which no egress destination
declares ``serves`` is not judged. Volumes (``pvc://``) need no egress.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .base import Collector, Entry, Tree, name_of

__all__ = ["IN_CLUSTER_SCHEMES", "check_reachability"]

# Data read from inside the cluster, without egress (Trainer's initializers: a PVC).
IN_CLUSTER_SCHEMES = ("pvc://",)


def _serves(rules: Iterable[Mapping[str, Any]]) -> list[str]:
    return [prefix for rule in rules for prefix in rule.get("serves") or ()]


def check_reachability(c: Collector, tree: Tree, networks: list[Entry]) -> None:
    if tree.org is None or not tree.org.valid or tree.profiles_doc is None or not tree.profiles_doc.valid:
        return
    lists: Mapping[str, list[Mapping[str, Any]]] = tree.profiles_doc.data["spec"].get("egress") or {}
    by_team = {e.data["spec"]["team"]: e for e in networks if e.valid}
    if not _serves(r for rules in lists.values() for r in rules) and not _serves(
        r for e in by_team.values() for r in e.data["spec"]["egress"]
    ):
        return  # nothing declares what it serves: nothing to compare with
    regions: Mapping[str, Mapping[str, Any]] = tree.org_spec["regions"]
    for quota in tree.valid_quotas:
        team, region = name_of(quota), quota.data["spec"].get("region")
        if team is None or region not in regions:
            continue
        network = by_team.get(team)
        names: list[str] = list(network.data["spec"]["egressLists"]) if network else []
        rules = [r for n in names for r in lists.get(n, ())]
        rules += list(network.data["spec"]["egress"]) if network else []
        served = _serves(rules)
        for location in regions[region].get("dataLocations") or ():
            if location.startswith(IN_CLUSTER_SCHEMES) or any(location.startswith(s) for s in served):
                continue
            where = network or quota
            path = ["spec", "egressLists"] if network else ["spec", "region"]
            c.warning(
                where,
                path,
                f"team {team} may read {location} (region {region}'s dataLocations), but none of its "
                f"egress serves it (egress lists: {', '.join(names) or 'none'}): its jobs would be "
                "admitted and then fail to reach their data",
                "reachability.data",
                hint=f'add an egress list whose destination serves {location} (`serves: ["{location}"]`) '
                f"to the team's TeamNetwork, or remove {location} from region {region}'s dataLocations",
            )
