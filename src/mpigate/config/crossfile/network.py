"""NetworkProfiles and TeamNetwork: references, port ranges, CIDRs."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from mpigate.config.problems import PathPart

from .base import Collector, Entry, Tree, check_unique, team_of


def check_networks(c: Collector, tree: Tree, networks: list[Entry]) -> None:
    profiles = tree.profiles
    if tree.profiles_doc is not None and profiles is not None:
        doc = tree.profiles_doc
        spec = doc.data["spec"]
        c.ref(
            doc,
            ["spec", "default"],
            spec["default"],
            profiles,
            f"default profile {spec['default']!r} is not defined",
            "ref.profile",
        )
        for name, profile in profiles.items():
            _check_ports(c, doc, name, profile)
        for list_name, rules in spec["egress"].items():
            for i, rule in enumerate(rules):
                _check_cidr(c, doc, ["spec", "egress", list_name, i], rule)
    valid = [e for e in networks if e.valid]
    check_unique(c, valid, team_of, "TeamNetwork for team", ["spec", "team"])
    for entry in valid:
        spec = entry.data["spec"]
        c.ref(
            entry,
            ["spec", "team"],
            spec["team"],
            tree.team_names,
            f"team {spec['team']!r} does not exist (no TeamQuota)",
            "ref.team",
        )
        if spec.get("profile"):
            c.ref(
                entry,
                ["spec", "profile"],
                spec["profile"],
                profiles,
                f"network profile {spec['profile']!r} does not exist",
                "ref.profile",
            )
        for i, name in enumerate(spec["egressLists"]):
            c.ref(
                entry,
                ["spec", "egressLists", i],
                name,
                tree.egress_lists,
                f"egress list {name!r} does not exist",
                "ref.egress",
            )
        for i, rule in enumerate(spec["egress"]):
            _check_cidr(c, entry, ["spec", "egress", i], rule)


def _check_ports(c: Collector, doc: Entry, name: str, profile: Mapping[str, Any]) -> None:
    mpi = profile["openmpi"]
    path: list[PathPart] = ["spec", "profiles", name, "openmpi"]
    if mpi["oobPortMin"] > mpi["oobPortMax"]:
        c.error(doc, [*path, "oobPortMax"], "oobPortMax is below oobPortMin", "value.ports")
    btl = range(mpi["btlPortMin"], mpi["btlPortMin"] + mpi["btlPortRange"])
    if btl.stop - 1 > 65535:
        c.error(
            doc, [*path, "btlPortRange"], f"BTL ports would end at {btl.stop - 1}, above 65535", "value.ports"
        )
    oob = range(mpi["oobPortMin"], mpi["oobPortMax"] + 1)
    ssh = profile["sshPort"]
    if profile["mode"] == "pinned-ports" and (set(btl) & set(oob) or ssh in btl or ssh in oob):
        c.error(
            doc, path, "the BTL, OOB and SSH port ranges overlap", "value.ports", "give each its own range"
        )


def _check_cidr(c: Collector, entry: Entry, path: list[PathPart], rule: Mapping[str, Any]) -> None:
    try:
        net = ipaddress.ip_network(rule["cidr"], strict=True)
    except ValueError as exc:
        c.error(
            entry,
            [*path, "cidr"],
            f"{rule['cidr']!r} is not a CIDR: {exc}",
            "value.cidr",
            "e.g. 10.20.0.0/16 (host bits must be zero)",
        )
        return
    for i, ex in enumerate(rule.get("except") or ()):
        try:
            inner = ipaddress.ip_network(ex, strict=True)
        except ValueError as exc:
            c.error(entry, [*path, "except", i], f"{ex!r} is not a CIDR: {exc}", "value.cidr")
            continue
        if inner.version != net.version or not inner.subnet_of(net):  # type: ignore[arg-type]
            c.error(entry, [*path, "except", i], f"{ex} is not inside {net}", "value.cidr")
