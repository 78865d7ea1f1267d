"""Training runtimes in the tree against the OrgPolicy's approved list."""

from __future__ import annotations

from .base import Collector, Entry, Tree, check_unique, name_of


def _runtime_key(entry: Entry) -> tuple[str, str, str] | None:
    name = name_of(entry)
    if not name:
        return None
    return (entry.kind, (entry.data.get("metadata") or {}).get("namespace") or "", name)


def check_runtimes(c: Collector, tree: Tree, runtimes: list[Entry]) -> None:
    present: set[tuple[str, str]] = set()
    all_namespaces = set().union(*tree.team_namespaces.values())
    for entry in runtimes:
        rt_name = name_of(entry)
        if not rt_name:
            c.error(entry, ["metadata", "name"], f"{entry.kind} has no metadata.name", "runtime.name")
            continue
        spec = entry.data.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("template"), dict):
            c.error(
                entry,
                ["spec", "template"],
                f"{entry.kind} {rt_name!r} has no spec.template",
                "runtime.template",
                "a training runtime needs spec.template.spec.replicatedJobs",
            )
        present.add((entry.kind, rt_name))
        if entry.kind == "TrainingRuntime":
            ns = entry.data["metadata"].get("namespace")
            if not ns:
                c.error(
                    entry,
                    ["metadata"],
                    f"TrainingRuntime {rt_name!r} needs metadata.namespace",
                    "runtime.namespace",
                    "or make it a ClusterTrainingRuntime",
                )
            else:
                c.ref(
                    entry,
                    ["metadata", "namespace"],
                    ns,
                    all_namespaces,
                    f"namespace {ns!r} belongs to no team",
                    "ref.namespace",
                )
    check_unique(c, runtimes, _runtime_key, "runtime", ["metadata", "name"])
    if tree.org is None:
        return
    for i, allowed in enumerate(tree.org_spec["runtimes"]["allowed"]):
        name, kind, external = (
            (allowed, "ClusterTrainingRuntime", False)
            if isinstance(allowed, str)
            else (allowed["name"], allowed["kind"], allowed["external"])
        )
        if not external and (kind, name) not in present:
            c.error(
                tree.org,
                ["spec", "runtimes", "allowed", i],
                f"approved runtime {name!r} ({kind}) is not in the config tree",
                "ref.runtime",
                "add its manifest (e.g. policies/runtimes/) or mark it `external: true`",
            )
