"""Rules that span documents: references, uniqueness, capacity, expiry (CONFIG.md).

One module per concern; each ``check_*`` adds its problems to a :class:`Collector`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path

from mpigate.config.problems import Location, Problem

from .access import check_access, check_personas
from .admissionpolicies import admission_rule_ids, check_admission_policies
from .base import Collector, Entry, Tree, name_of, where_of
from .customrules import check_custom_rules, custom_rule_ids
from .exceptions import check_exceptions
from .library import check_library, enabled_library
from .namespaces import SYSTEM_NAMESPACES, check_namespaces
from .network import check_networks
from .org import check_flavors, check_org
from .ownership import check_ownership
from .policytests import check_tests
from .quotalimits import check_quota_limits
from .quotas import check_quotas
from .reachability import check_reachability
from .runtimes import check_runtimes

__all__ = ["SYSTEM_NAMESPACES", "Entry", "cross_file_problems"]


def _singleton(c: Collector, entries: list[Entry], kind: str, required: bool, root: Path) -> Entry | None:
    real = [e for e in entries if not e.builtin]
    if not entries:
        if required:
            c.problems.append(
                Problem(
                    Location(str(root)),
                    "(tree)",
                    f"no {kind} document found",
                    f"missing.{kind}",
                    hint=f"add one (see `mpigate init` or `mpigate schema {kind}`)",
                )
            )
        return None
    for extra in real[1:]:
        c.error(
            extra,
            ["kind"],
            f"a second {kind}; exactly one is allowed (first in {where_of(real[0])})",
            f"duplicate.{kind}",
            hint="merge the two documents",
        )
    first = entries[0]
    return first if first.valid else None


def cross_file_problems(
    by_kind: Mapping[str, list[Entry]],
    root: Path,
    today: dt.date | None = None,
    objects: Sequence[Entry] = (),
) -> list[Problem]:
    """Every cross-file problem of a tree whose documents are grouped by kind.

    ``today`` (UTC) decides which exceptions have expired; tests pin it. ``objects`` are the tree's
    documents of other kinds (parameters of ValidatingAdmissionPolicyBindings).
    """
    admission = [
        *by_kind.get("ValidatingAdmissionPolicy", []),
        *by_kind.get("ValidatingAdmissionPolicyBinding", []),
    ]
    c = Collector()
    quotas = list(by_kind.get("TeamQuota", []))
    org = _singleton(c, list(by_kind.get("OrgPolicy", [])), "OrgPolicy", True, root)
    tree = Tree(
        root=root,
        org=org,
        flavors_doc=_singleton(c, list(by_kind.get("GPUFlavors", [])), "GPUFlavors", True, root),
        personas_doc=_singleton(c, list(by_kind.get("Personas", [])), "Personas", False, root),
        profiles_doc=_singleton(c, list(by_kind.get("NetworkProfiles", [])), "NetworkProfiles", False, root),
        quotas=quotas,
        team_names={n for n in (name_of(e) for e in quotas) if n},
        today=today or dt.datetime.now(dt.UTC).date(),
        custom_rule_ids=(
            *custom_rule_ids(by_kind.get("CustomRule", [])),
            *admission_rule_ids(admission),
            *(rule.id for _, rule, _ in enabled_library(org)),
        ),
    )
    check_ownership(c, tree, (e for entries in by_kind.values() for e in entries))
    check_org(c, tree)
    check_flavors(c, tree)
    check_quotas(c, tree)
    check_namespaces(c, tree)
    check_quota_limits(c, tree)
    check_personas(c, tree)
    check_access(c, tree, list(by_kind.get("TeamAccess", [])))
    check_networks(c, tree, list(by_kind.get("TeamNetwork", [])))
    check_reachability(c, tree, list(by_kind.get("TeamNetwork", [])))
    check_exceptions(c, tree, list(by_kind.get("PolicyException", [])), list(by_kind.get("TeamAccess", [])))
    check_runtimes(c, tree, [*by_kind.get("ClusterTrainingRuntime", []), *by_kind.get("TrainingRuntime", [])])
    check_tests(c, tree, list(by_kind.get("PolicyTest", [])))
    check_custom_rules(c, tree, list(by_kind.get("CustomRule", [])))
    check_library(c, tree)
    check_admission_policies(c, tree, admission, list(objects))
    return c.problems
