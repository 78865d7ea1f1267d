"""The rule library enabled from the OrgPolicy (``spec.rules.library``): each entry names a rule
shipped with mpigate (:func:`mpigate.catalogue.library_rules`, a CustomRule document) and gives its
parameters, mode, match, failure policy and extra controls. An enabled library rule becomes a
:class:`~mpigate.config.model.CustomRule` of the config: the same compiled CEL, modes, overrides,
exceptions, tests and reports as every other rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mpigate.catalogue import LibraryRule, library_rules
from mpigate.config.frozen import thaw
from mpigate.config.problems import PathPart
from mpigate.config.schema import apply_defaults

from .base import Collector, Entry, Tree, did_you_mean
from .customrules import check_params, check_rule_refs, compile_rule, resolved_spec

__all__ = ["check_library", "enabled_library", "library_spec"]

_PATH: tuple[PathPart, ...] = ("spec", "rules", "library")


def library_spec(rule: LibraryRule, enabled: Any) -> dict[str, Any]:
    """The CustomRule spec of library ``rule`` as an OrgPolicy entry ``enabled`` configures it:
    its parameters over the rule's defaults, the entry's action, failure policy and match
    conditions instead of the rule's, its controls added to the rule's."""
    enabled = thaw(enabled)
    spec = dict(apply_defaults("CustomRule", thaw(rule.document))["spec"])
    spec["params"] = enabled.get("params")
    spec["teamParams"] = dict(enabled.get("teamParams", {}))
    for key in ("action", "failurePolicy"):
        if key in enabled:
            spec[key] = enabled[key]
    spec["match"] = {**spec["match"], **enabled.get("match", {})}
    spec["controls"] = list(dict.fromkeys([*spec["controls"], *enabled.get("controls", [])]))
    return resolved_spec(spec)


def enabled_library(org: Entry | None) -> Iterator[tuple[int, LibraryRule, Any]]:
    """``(index, rule, entry)`` of each entry of a valid OrgPolicy that names a library rule (the
    first entry of a name wins; :func:`check_library` reports the others)."""
    if org is None or not org.valid:
        return
    known = library_rules()
    seen: set[str] = set()
    for index, entry in enumerate(org.data["spec"]["rules"]["library"]):
        rule = known.get(entry["name"])
        if rule is not None and rule.name not in seen:
            seen.add(rule.name)
            yield index, rule, entry


def check_library(c: Collector, tree: Tree) -> None:
    """Each entry names a library rule once, with parameters its schema accepts, teams,
    classifications and controls that exist, and compiles with them."""
    org = tree.org
    if org is None or not org.valid:
        return
    known = library_rules()
    first: dict[str, int] = {}
    for index, entry in enumerate(org.data["spec"]["rules"]["library"]):
        path: list[PathPart] = [*_PATH, index]
        name = entry["name"]
        if name not in known:
            c.error(
                org,
                [*path, "name"],
                f"no library rule {name!r}",
                "ref.library",
                did_you_mean(name, known) or "docs/policies/library.md lists them",
            )
            continue
        if name in first:
            c.error(
                org,
                [*path, "name"],
                f"library rule {name} is enabled twice (first at entry {first[name]})",
                "duplicate.name",
                "use teamParams for parameters that differ per team",
            )
            continue
        first[name] = index
        rule = known[name]
        spec = apply_defaults("CustomRule", thaw(rule.document))["spec"]
        check_rule_refs(c, tree, org, entry, path)
        if entry.get("match", {}).get("replicatedJobs") and "Pod" not in spec["match"]["targets"]:
            c.error(
                org,
                [*path, "match", "replicatedJobs"],
                f"replicatedJobs selects pods, but {name} judges {', '.join(spec['match']['targets'])}",
                "customrule.match",
            )
        schema = spec.get("paramsSchema")
        fine = check_params(c, org, schema, entry.get("params"), [*path, "params"])
        for team, params in entry.get("teamParams", {}).items():
            fine = check_params(c, org, schema, params, [*path, "teamParams", team]) and fine
        if not fine:
            continue
        resolved = library_spec(rule, entry)
        for where, params in [("params", resolved["params"]), *resolved["teamParams"].items()]:
            compiled = compile_rule(resolved, params)
            if isinstance(compiled, list):
                at: list[PathPart] = [*path, "params"] if where == "params" else [*path, "teamParams", where]
                c.error(
                    org,
                    at,
                    f"{rule.id} does not compile with these params: "
                    + "; ".join(issue.issue.message for issue in compiled[:3]),
                    "cel.compile",
                    "the rule's page (docs/policies/) lists its parameters and their types",
                )
