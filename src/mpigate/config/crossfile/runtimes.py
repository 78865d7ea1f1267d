"""Training runtimes in the tree against the OrgPolicy's approved list, and the MPI implementation
each one runs against what its approved-runtimes entry declares and what its launcher shows."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from mpigate.config.mpienv import (
    DEFAULT_IMPLEMENTATION,
    LABELS,
    Implementation,
    as_implementation,
    implementation_evidence,
)
from mpigate.config.problems import PathPart

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
    _check_implementations(c, tree, {(e.kind, n): e for e in runtimes if (n := name_of(e))})
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


def _check_implementations(c: Collector, tree: Tree, by_key: dict[tuple[str, str], Entry]) -> None:
    """Each approved runtime's MPI implementation: the one its entry declares must be allowed
    (``mpiImplementations``) and agree with the runtime's ``mlPolicy.mpi.mpiImplementation``; a
    launcher command or environment that shows another implementation is a warning (the webhook
    would inject the pinned-port environment of the wrong one)."""
    assert tree.org is not None
    org = tree.org_spec
    allowed_impls = org["runtimes"]["mpiImplementations"]
    for i, allowed in enumerate(org["runtimes"]["allowed"]):
        if isinstance(allowed, str):
            name, kind, declared = allowed, "ClusterTrainingRuntime", None
        else:
            name, kind = allowed["name"], allowed["kind"]
            declared = as_implementation(allowed.get("mpiImplementation"))
        where: list[PathPart] = ["spec", "runtimes", "allowed", i, "mpiImplementation"]
        if declared is not None and declared not in allowed_impls:
            c.error(
                tree.org,
                where,
                f"approved runtime {name!r} declares mpiImplementation {declared}, which "
                f"spec.runtimes.mpiImplementations does not allow ({', '.join(allowed_impls)})",
                "runtime.mpi-implementation",
                f"add {declared} to spec.runtimes.mpiImplementations, or correct the declaration",
            )
        entry = by_key.get((kind, name))
        if entry is None or not isinstance(entry.data, dict):
            continue
        spec = _dict(entry.data.get("spec"))
        mpi = _dict(spec.get("mlPolicy")).get("mpi")
        policy = (
            as_implementation(mpi.get("mpiImplementation") or "OpenMPI") if isinstance(mpi, dict) else None
        )
        if declared is not None and isinstance(mpi, dict) and policy != declared:
            c.error(
                tree.org,
                where,
                f"approved runtime {name!r} declares mpiImplementation {declared}, but its "
                f"mlPolicy.mpi.mpiImplementation is {policy or mpi.get('mpiImplementation')}",
                "runtime.mpi-implementation",
                "a runtime with Trainer's MPI policy takes its implementation from there: drop the "
                "declaration, or run Intel MPI/MPICH as a plain launcher command without mlPolicy.mpi",
            )
            continue
        effective: Implementation = policy or declared or DEFAULT_IMPLEMENTATION
        for path, command, env_names in _launcher_containers(spec):
            for evidence in implementation_evidence(command, env_names):
                if not evidence.excludes(effective):
                    continue
                shown = " or ".join(LABELS[x] for x in sorted(evidence.implementations))
                source = (
                    f"its approved-runtimes entry declares {effective}"
                    if declared is not None
                    else f"its mlPolicy.mpi says {effective}"
                    if policy is not None
                    else f"no mpiImplementation is declared ({DEFAULT_IMPLEMENTATION} is assumed)"
                )
                c.warning(
                    entry,
                    path,
                    f"{entry.kind} {name!r} runs {shown} ({evidence.what}), but {source}: the webhook "
                    f"would inject {LABELS[effective]}'s pinned-port environment, which {shown} ignores",
                    "runtime.mpi-implementation",
                    f"declare the implementation in the OrgPolicy: spec.runtimes.allowed: "
                    f"[{{name: {name}, mpiImplementation: "
                    f"{next(iter(sorted(evidence.implementations)))}}}] (docs/networking.md)",
                )


def _launcher_containers(spec: dict[str, Any]) -> Iterator[tuple[Sequence[PathPart], list[str], list[str]]]:
    """(path, command + args, env names) of every container of the runtime's replicated jobs (the
    launcher is one of them; sshd-only node containers show nothing)."""
    jobs = _dict(_dict(spec.get("template")).get("spec")).get("replicatedJobs")
    for j, job in enumerate(jobs if isinstance(jobs, list) else []):
        pod = _dict(_dict(_dict(_dict(job).get("template")).get("spec")).get("template")).get("spec")
        if not isinstance(pod, dict) or not isinstance(pod.get("containers"), list):
            continue
        for k, container in enumerate(pod["containers"]):
            if not isinstance(container, dict):
                continue
            words = [
                w
                for key in ("command", "args")
                if isinstance(container.get(key), list)
                for w in container[key]
                if isinstance(w, str)
            ]
            env = container.get("env")
            names = [
                e["name"]
                for e in (env if isinstance(env, list) else [])
                if isinstance(e, dict) and isinstance(e.get("name"), str)
            ]
            path: list[PathPart] = ["spec", "template", "spec", "replicatedJobs", j, "template", "spec"]
            path += ["template", "spec", "containers", k]
            yield path, words, names


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
