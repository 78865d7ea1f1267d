"""mpigate.kueue against Kueue's arithmetic: hand-checked cases from Kueue's own tests and docs, and
a property test that compares the model with the independent transcription in ``oracle.py`` on
random cohort trees (nested cohorts with their own quotas, lending and borrowing limits) and
random workloads — 0 disagreements."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpigate import kueue
from tests.kueue.oracle import Kueue

GPU = "nvidia.com/gpu"


def cq(
    name: str,
    cohort: str | None,
    quotas: dict[tuple[str, str], kueue.Quota],
    groups: list[tuple[list[str], list[str]]],
) -> kueue.ClusterQueue:
    return kueue.ClusterQueue(
        name,
        cohort,
        tuple(kueue.ResourceGroup(tuple(c), tuple(f)) for c, f in groups),
        MappingProxyType(quotas),
    )


def test_potential_available_follows_lending_and_borrowing_limits() -> None:
    """The example org's shape: nlp lends at most 4 of its 16; research (nominal 4, borrowingLimit
    4) can reach 8; a queue borrowing with nobody to lend from stays at its nominal quota."""
    fr = ("a100", GPU)
    tree = kueue.QuotaTree(
        [
            cq("nlp", "pool", {fr: kueue.Quota(16, 0, 4)}, [([GPU], ["a100"])]),
            cq("research", "pool", {fr: kueue.Quota(4, 4)}, [([GPU], ["a100"])]),
            cq("cv", "pool", {("h100", GPU): kueue.Quota(32, 8)}, [([GPU], ["h100"])]),
            cq("alone", None, {fr: kueue.Quota(2)}, [([GPU], ["a100"])]),
        ]
    )
    assert tree.potential_available("nlp", fr) == 16
    assert tree.potential_available("research", fr) == 8
    assert tree.potential_available("cv", ("h100", GPU)) == 32  # borrowingLimit 8, no lender
    assert tree.potential_available("alone", fr) == 2
    assert tree.subtree_quota("cohort/pool", fr) == 8  # 4 lent by nlp + research's 4


def test_available_takes_what_the_cohort_uses_off() -> None:
    fr = ("a100", GPU)
    tree = kueue.QuotaTree(
        [
            cq("nlp", "pool", {fr: kueue.Quota(16, 0, 4)}, [([GPU], ["a100"])]),
            cq("research", "pool", {fr: kueue.Quota(4, 4)}, [([GPU], ["a100"])]),
        ]
    )
    # research borrowed nlp's 4 lendable GPUs: nlp keeps its 12 local ones.
    usage = tree.usage({"nlp": {fr: 4}, "research": {fr: 8}})
    assert usage.of("cohort/pool", fr) == 8
    assert tree.available("nlp", fr, usage) == 8
    assert tree.available("research", fr, usage) == 0
    # nothing used: available is potentialAvailable
    empty = tree.usage({})
    for name in ("nlp", "research"):
        assert tree.available(name, fr, empty) == tree.potential_available(name, fr)


def test_hierarchical_cohorts_with_their_own_quota() -> None:
    """Kueue's hierarchical cohorts (site/content/en/docs/concepts/cohort.md): a parent cohort's
    own nominal quota is lendable to every queue below it, within borrowing limits."""
    fr = ("f", "cpu")
    tree = kueue.QuotaTree(
        [cq("a", "child", {fr: kueue.Quota(10_000)}, [(["cpu"], ["f"])])],
        [
            kueue.Cohort("child", "root", MappingProxyType({fr: kueue.Quota(0, 5_000)})),
            kueue.Cohort("root", None, MappingProxyType({fr: kueue.Quota(20_000)})),
        ],
    )
    assert tree.ancestors("a") == ("child", "root")
    # a: its 10 + the child cohort may borrow at most 5 from root (SubtreeQuota 10 + 5)
    assert tree.potential_available("a", fr) == 15_000


def test_a_cycle_of_cohorts_is_refused() -> None:
    with pytest.raises(kueue.CohortCycleError):
        kueue.QuotaTree([], [kueue.Cohort("x", "y"), kueue.Cohort("y", "x")])


def test_one_flavor_per_resource_group_and_earlier_pod_sets_count() -> None:
    """Two GPU flavors of 8 each: a 12-GPU pod set fits neither (one flavor per group, never 8 +
    4), and a second pod set sees what the first took on the same flavor."""
    queue = cq(
        "q",
        None,
        {("a", GPU): kueue.Quota(8), ("b", GPU): kueue.Quota(8)},
        [([GPU], ["a", "b"])],
    )
    tree = kueue.QuotaTree([queue])
    flavors = {"a": kueue.Flavor("a"), "b": kueue.Flavor("b")}
    big = kueue.PodSet("node", 3, MappingProxyType({GPU: 12}))
    result = kueue.assign(tree, "q", [big], flavors)
    assert not result.admissible
    (failure,) = result.failures
    assert [(a.flavor, a.requested, a.maximum) for a in failure.attempts] == [("a", 12, 8), ("b", 12, 8)]
    two = [
        kueue.PodSet("launcher", 1, MappingProxyType({GPU: 6})),
        kueue.PodSet("node", 1, MappingProxyType({GPU: 6})),
    ]
    result = kueue.assign(tree, "q", two, flavors)
    assert result.admissible
    assert [dict(f) for _, f in result.flavors] == [{GPU: "a"}, {GPU: "b"}]


def test_uncovered_resources_and_node_labels() -> None:
    queue = cq("q", None, {("gpu-x", GPU): kueue.Quota(8)}, [([GPU], ["gpu-x"])])
    tree = kueue.QuotaTree([queue])
    flavors = {"gpu-x": kueue.Flavor("gpu-x", MappingProxyType({"product": "X"}))}
    scratch = kueue.PodSet("node", 1, MappingProxyType({GPU: 1, "ephemeral-storage": 10}))
    (failure,) = kueue.assign(tree, "q", [scratch], flavors).failures
    assert failure.uncovered and failure.resources == ("ephemeral-storage",)
    zero = kueue.PodSet("node", 1, MappingProxyType({GPU: 1, "ephemeral-storage": 0}))
    assert kueue.assign(tree, "q", [zero], flavors).admissible  # zero is skipped (Kueue #8079)
    wrong = kueue.PodSet("node", 1, MappingProxyType({GPU: 1}), MappingProxyType({"product": "Y"}))
    (failure,) = kueue.assign(tree, "q", [wrong], flavors).failures
    assert [a.reason for a in failure.attempts] == ["affinity"]
    other_key = kueue.PodSet("node", 1, MappingProxyType({GPU: 1}), MappingProxyType({"zone": "z1"}))
    assert kueue.assign(tree, "q", [other_key], flavors).admissible  # only the flavor's own keys count
    affinity = ((kueue.Requirement("product", "NotIn", ("X",)),), (kueue.Requirement("zone", "Exists"),))
    # a term left without the flavor's keys matches every flavor (Kueue's flavorSelector)
    assert kueue.assign(
        tree, "q", [kueue.PodSet("n", 1, MappingProxyType({GPU: 1}), affinity=affinity)], flavors
    ).admissible
    only = ((kueue.Requirement("product", "NotIn", ("X",)),),)
    assert not kueue.assign(
        tree, "q", [kueue.PodSet("n", 1, MappingProxyType({GPU: 1}), affinity=only)], flavors
    ).admissible


def test_shortfalls_with_usage() -> None:
    fr = ("a", GPU)
    queue = cq("q", None, {fr: kueue.Quota(16)}, [([GPU], ["a"])])
    tree = kueue.QuotaTree([queue])
    flavors = {"a": kueue.Flavor("a")}
    podsets = [
        kueue.PodSet("launcher", 1, MappingProxyType({GPU: 8})),
        kueue.PodSet("node", 1, MappingProxyType({GPU: 8})),
    ]
    result = kueue.assign(tree, "q", podsets, flavors, tree.usage({"q": {fr: 12}}))
    assert result.admissible and not result.fits_now
    assert [(s.podset, s.requested, s.available, s.needed) for s in result.shortfalls] == [
        ("launcher", 8, 4, 4),
        ("node", 16, 4, 12),
    ]
    assert kueue.assign(tree, "q", podsets, flavors, tree.usage({"q": {fr: 0}})).fits_now


# -- property: the model equals the oracle on random trees -----------------------------------------

FLAVORS = ("f1", "f2", "f3")
RESOURCES = ("cpu", GPU)
GROUPS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("cpu", "pods"), ("f1",)),
    ((GPU,), ("f2", "f3")),
)
LABELS = {"f1": {"region": "r"}, "f2": {"region": "r", "gpu": "a"}, "f3": {"region": "r", "gpu": "b"}}


@st.composite
def quotas(
    draw: Any, resources: tuple[tuple[str, str], ...], cohort: bool
) -> dict[tuple[str, str], kueue.Quota]:
    out: dict[tuple[str, str], kueue.Quota] = {}
    for fr in resources:
        nominal = draw(st.integers(0, 12))
        borrowing = draw(st.none() | st.integers(0, 8)) if cohort else None
        lending = draw(st.none() | st.integers(0, nominal)) if cohort else None
        out[fr] = kueue.Quota(nominal, borrowing, lending)
    return out


@st.composite
def trees(draw: Any) -> tuple[list[kueue.ClusterQueue], list[kueue.Cohort]]:
    frs = tuple((f, r) for covered, flavors in GROUPS for f in flavors for r in covered)
    n_cohorts = draw(st.integers(0, 4))
    cohorts = []
    for i in range(n_cohorts):
        parent = draw(st.none() | st.integers(0, i - 1)) if i else None
        own = draw(st.lists(st.sampled_from(frs), unique=True, max_size=3))
        cohorts.append(
            kueue.Cohort(
                f"c{i}",
                f"c{parent}" if parent is not None else None,
                MappingProxyType(draw(quotas(tuple(own), True))),
            )
        )
    queues = []
    for j in range(draw(st.integers(1, 4))):
        cohort = draw(st.none() | st.integers(0, n_cohorts - 1)) if n_cohorts else None
        queues.append(
            cq(
                f"q{j}",
                f"c{cohort}" if cohort is not None else None,
                draw(quotas(frs, cohort is not None)),
                [(list(c), list(f)) for c, f in GROUPS],
            )
        )
    return queues, cohorts


def manifests(queues: list[kueue.ClusterQueue], cohorts: list[kueue.Cohort]) -> tuple[list[Any], list[Any]]:
    def groups(quotas: Any, layout: Any) -> list[Any]:
        out = []
        for covered, flavors in layout:
            group_flavors = []
            for f in flavors:
                resources = []
                for r in covered:
                    q = quotas.get((f, r))
                    if q is None:
                        continue
                    res: dict[str, Any] = {
                        "name": r,
                        "nominalQuota": f"{q.nominal}m" if r == "cpu" else q.nominal,
                    }
                    if q.borrowing_limit is not None:
                        res["borrowingLimit"] = f"{q.borrowing_limit}m" if r == "cpu" else q.borrowing_limit
                    if q.lending_limit is not None:
                        res["lendingLimit"] = f"{q.lending_limit}m" if r == "cpu" else q.lending_limit
                    resources.append(res)
                if resources:
                    group_flavors.append({"name": f, "resources": resources})
            if group_flavors:
                out.append({"coveredResources": list(covered), "flavors": group_flavors})
        return out

    cq_manifests = [
        {
            "metadata": {"name": q.name},
            "spec": {
                "cohortName": q.cohort,
                "resourceGroups": groups(q.quotas, [(g.covered, g.flavors) for g in q.resource_groups]),
            }
            if q.cohort
            else {"resourceGroups": groups(q.quotas, [(g.covered, g.flavors) for g in q.resource_groups])},
        }
        for q in queues
    ]
    cohort_manifests = [
        {
            "metadata": {"name": c.name},
            "spec": {
                **({"parentName": c.parent} if c.parent else {}),
                "resourceGroups": groups(c.quotas, [((r,), (f,)) for f, r in c.quotas]),
            },
        }
        for c in cohorts
    ]
    return cq_manifests, cohort_manifests


FLAVOR_MANIFESTS = [{"metadata": {"name": f}, "spec": {"nodeLabels": LABELS[f]}} for f in FLAVORS]
MODEL_FLAVORS = {f: kueue.Flavor(f, MappingProxyType(LABELS[f])) for f in FLAVORS}


@st.composite
def podsets(draw: Any) -> list[tuple[str, int, dict[str, Any]]]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        requests = {}
        for resource in ("cpu", GPU, "example.com/fpga"):
            value = (
                draw(st.none() | st.integers(0, 9))
                if resource != "example.com/fpga"
                else draw(st.sampled_from([None, None, None, 0, 1]))
            )
            if value is not None:
                requests[resource] = f"{value}m" if resource == "cpu" else value
        spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": requests}}]}
        selector = draw(st.sampled_from([None, {"gpu": "a"}, {"gpu": "b"}, {"region": "x"}, {"zone": "z"}]))
        if selector:
            spec["nodeSelector"] = selector
        out.append((f"ps{i}", draw(st.integers(1, 4)), spec))
    return out


def model_podsets(raw: list[tuple[str, int, dict[str, Any]]]) -> list[kueue.PodSet]:
    out = []
    for name, count, spec in raw:
        requests = spec["containers"][0]["resources"]["requests"]
        per_pod = {r: int(str(v).rstrip("m")) for r, v in requests.items()}  # milli-CPU already
        out.append(
            kueue.PodSet(
                name,
                count,
                MappingProxyType({r: v * count for r, v in per_pod.items()}),
                MappingProxyType(spec.get("nodeSelector") or {}),
            )
        )
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(), podsets())
def test_model_equals_kueues_arithmetic(tree_parts: Any, raw: list[tuple[str, int, dict[str, Any]]]) -> None:
    queues, cohorts = tree_parts
    tree = kueue.QuotaTree(queues, cohorts)
    cq_manifests, cohort_manifests = manifests(queues, cohorts)
    oracle = Kueue(cq_manifests, cohort_manifests, FLAVOR_MANIFESTS)
    for queue in queues:
        for group in queue.resource_groups:
            for flavor in group.flavors:
                for resource in group.covered:
                    fr = (flavor, resource)
                    assert tree.potential_available(queue.name, fr) == oracle.cq_potential(queue.name, fr), (
                        queue.name,
                        fr,
                    )
        mine = kueue.assign(tree, queue.name, model_podsets(raw), MODEL_FLAVORS).admissible
        assert mine == oracle.admissible(queue.name, raw, None), (queue.name, raw)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(), st.data())
def test_available_now_equals_kueues_arithmetic(tree_parts: Any, data: st.DataObject) -> None:
    """What is free now (MPG-Q008's "needs N more free"): mpigate recomputes every node's usage from
    the ClusterQueues' reservations; the oracle adds admitted workloads one at a time as Kueue's
    cache does (addUsage), in a random order. Both must give every queue the same ``available``."""
    queues, cohorts = tree_parts
    tree = kueue.QuotaTree(queues, cohorts)
    oracle = Kueue(*manifests(queues, cohorts), FLAVOR_MANIFESTS)
    frs = sorted({fr for queue in queues for fr in queue.quotas})
    workloads: list[tuple[str, tuple[str, str], int]] = []
    for queue in queues:
        for fr in frs:
            ceiling = tree.potential_available(queue.name, fr)
            if ceiling > 0:  # admitted workloads that fit, a few per queue
                for _ in range(data.draw(st.integers(0, 2))):
                    workloads.append((queue.name, fr, data.draw(st.integers(0, ceiling))))
    per_queue: dict[str, dict[tuple[str, str], int]] = {}
    for name, fr, amount in workloads:
        per_queue.setdefault(name, {})[fr] = per_queue.get(name, {}).get(fr, 0) + amount
    for name, fr, amount in data.draw(st.permutations(workloads)):
        oracle.add_usage(name, fr, amount)
    usage = tree.usage(per_queue)
    for queue in queues:
        for fr in frs:
            assert tree.available(queue.name, fr, usage) == oracle.cq_available(queue.name, fr), (
                queue.name,
                fr,
                per_queue,
            )
