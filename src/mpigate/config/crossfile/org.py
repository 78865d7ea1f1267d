"""The OrgPolicy's and GPUFlavors' references."""

from __future__ import annotations

from mpigate.catalogue import expand_rule_pattern
from mpigate.config.units import parse_duration

from .base import Collector, Tree, did_you_mean


def check_org(c: Collector, tree: Tree) -> None:
    org = tree.org
    if org is None:
        return
    spec = tree.org_spec
    profiles = tree.profiles
    for name, cls in spec["dataClassifications"].items():
        for i, region in enumerate(cls.get("regions") or ()):
            c.ref(
                org,
                ["spec", "dataClassifications", name, "regions", i],
                region,
                tree.regions,
                f"region {region!r} is not defined in spec.regions",
                "ref.region",
            )
        profile = cls.get("networkProfile")
        if profile:
            c.ref(
                org,
                ["spec", "dataClassifications", name, "networkProfile"],
                profile,
                profiles,
                f"network profile {profile!r} does not exist",
                "ref.profile",
            )
    for pattern in spec["enforcement"]["overrides"]:
        if not expand_rule_pattern(pattern, tree.rule_ids):
            c.error(
                org,
                ["spec", "enforcement", "overrides", pattern],
                f"{pattern!r} names no rule",
                "ref.rule",
                did_you_mean(pattern, tree.rule_ids),
            )
    background = spec["backgroundAudit"]
    for pattern in background["actions"]:
        if not expand_rule_pattern(pattern, tree.rule_ids):
            c.error(
                org,
                ["spec", "backgroundAudit", "actions", pattern],
                f"{pattern!r} names no rule",
                "ref.rule",
                did_you_mean(pattern, tree.rule_ids),
            )
    if parse_duration(background["interval"]) < 60:
        c.error(
            org,
            ["spec", "backgroundAudit", "interval"],
            f"interval {background['interval']} is shorter than 1m",
            "value.duration",
            "a pass judges every job in the cluster: give it at least 1m (new revisions and expiring "
            "exceptions start one at once anyway)",
        )
    life = spec["lifecycle"]
    if (
        "maxRuntime" in life
        and "defaultRuntime" in life
        and parse_duration(life["defaultRuntime"]) > parse_duration(life["maxRuntime"])
    ):
        c.error(
            org,
            ["spec", "lifecycle", "defaultRuntime"],
            f"defaultRuntime {life['defaultRuntime']} exceeds maxRuntime {life['maxRuntime']}",
            "value.runtime",
            "make defaultRuntime at most maxRuntime",
        )
    audit = spec["audit"]
    for path, text in (
        (["spec", "audit", "checkpointInterval"], audit["checkpointInterval"]),
        (["spec", "audit", "rotate", "maxAge"], audit["rotate"]["maxAge"]),
    ):
        if parse_duration(text) < 1:
            c.error(org, path, f"{text} is no time at all", "value.duration", "give at least 1s, e.g. 10s")
    for i, grant in enumerate(spec["updates"]["labelChanges"]):
        for j, persona in enumerate(grant["personas"]):
            c.ref(
                org,
                ["spec", "updates", "labelChanges", i, "personas", j],
                persona,
                tree.personas,
                f"persona {persona!r} does not exist",
                "ref.persona",
            )
    for i, allowed in enumerate(spec["runtimes"]["allowed"]):
        if isinstance(allowed, dict):
            for j, team in enumerate(allowed.get("teams") or ()):
                c.ref(
                    org,
                    ["spec", "runtimes", "allowed", i, "teams", j],
                    team,
                    tree.team_names,
                    f"team {team!r} does not exist",
                    "ref.team",
                )


def check_flavors(c: Collector, tree: Tree) -> None:
    if tree.flavors_doc is None or tree.flavors is None:
        return
    for name, flavor in tree.flavors.items():
        c.ref(
            tree.flavors_doc,
            ["spec", "flavors", name, "region"],
            flavor["region"],
            tree.regions,
            f"region {flavor['region']!r} is not defined in the OrgPolicy",
            "ref.region",
        )
