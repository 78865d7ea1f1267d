"""CustomRules judge the job and its pods cut down to what the config's expressions read
(mpigate.cel.reads), and blame skips the lists and fields no rule reads: neither may change a
decision, a message, a blamed path, an error or the cost budget (issue 22 item 7)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpigate.cel import REQUEST_BUDGET, Budget
from mpigate.cel.cost import input_size
from mpigate.cel.validation import CompiledPolicy, compile_policy, environment
from mpigate.config import Config, check_tree, load
from mpigate.config.frozen import freeze
from mpigate.policy.custom_blame import Narrowed, blamed_items
from mpigate.policytest import run_suites
from tests.conftest import TODAY
from tests.policy.helpers import decide, smoke_job
from tests.policy.test_custom_pods import _joint_calls
from tests.policy.test_custom_rules import OWNER, _tree
from tests.policy.test_library import NAMES, SUITES, org_with_library


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """test_library's org: every library rule enabled, every suite of theirs in its tests."""
    entries = yaml.safe_load((SUITES / "rules.yaml").read_text(encoding="utf-8"))
    root = org_with_library(tmp_path_factory.mktemp("library") / "org", entries)
    (root / "policies" / "tests").mkdir()
    for name in NAMES:
        shutil.copy(SUITES / f"{name}.yaml", root / "policies" / "tests" / f"{name}.yaml")
    assert check_tree(root, today=TODAY).ok
    return load(root, today=TODAY)


def _decisions(config: Config) -> list[Any]:
    out = []
    for suite in run_suites(config, config.tests):
        for case in suite.cases:
            decision = case.decision
            assert decision is not None, case.error
            out.append((case.name, decision.allowed, decision.violations, decision.warnings))
    return out


def test_cutting_the_inputs_and_blame_changes_no_decision_of_the_library_suites(
    library: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every library rule on every case of its suite (violations on pods blamed at their paths):
    # the same decisions with the inputs cut and blame judging only what each expression reads,
    # and with the inputs converted whole and every list and field tried, as before
    cut = _decisions(library)
    monkeypatch.setattr("mpigate.policy.custom.prune", lambda value, need: None)
    monkeypatch.setattr("mpigate.policy.custom_blame._part_read", lambda *args: True)
    assert cut == _decisions(library)
    assert sum(1 for _, allowed, _, _ in cut if not allowed) >= len(NAMES)


def test_the_pods_judged_in_one_call_change_no_decision_of_the_library_suites(
    library: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each request's pods judged by one call into CEL (the list programs mapped over the pods),
    # and each pod by its own call (the joint call refused): the same decisions, messages, paths
    calls = _joint_calls(monkeypatch)
    together = _decisions(library)
    assert calls["ran"] >= 20  # the pods of most cases were judged together
    calls["refuse"] = 1
    assert together == _decisions(library)


def test_a_value_cel_cannot_represent_fails_the_rule_even_where_no_rule_reads_it(tmp_path: Path) -> None:
    config = load(_tree(tmp_path, OWNER), today=TODAY)
    job = smoke_job(**{"acme.example/owner": "maria"})
    assert not [v for v in decide(config, job).violations if v.rule == "ACME-OWNER-LABEL"]
    job["metadata"]["annotations"] = {"big": 2**70}  # no rule reads annotations
    (violation,) = [v for v in decide(config, job).violations if v.rule == "ACME-OWNER-LABEL"]
    assert "out of range" in violation.message


def _violation_policy() -> CompiledPolicy:
    policy = compile_policy(
        environment(),
        match_conditions=[],
        variables=[],
        validations=[
            {"expression": "object.spec.items.all(i, i.n < 10)", "messageExpression": "'n: ' + string(1)"}
        ],
        failure_policy="Fail",
        params=None,
    )
    assert isinstance(policy, CompiledPolicy)
    return policy


# on these inputs (n 10) the expression's bound is 90 and the messageExpression's 21: enough for
# both, for both exactly, for the expression alone, for neither
@pytest.mark.parametrize("remaining", [10_000_000.0, 111.0, 100.0, 50.0])
def test_a_known_violation_charges_the_budget_as_its_evaluation(remaining: float) -> None:
    # blame does not judge a pod again without a field its expression does not read: it charges
    # what check would
    policy = _violation_policy()
    (validation,) = policy.validations
    env = environment()
    inputs = env.inputs({"object": {"spec": {"items": [{"n": 12}] * 8}}})
    checked, charged = Budget(remaining), Budget(remaining)
    outcome = policy.check(env, inputs, validation, checked)
    violates = outcome is not None and outcome.kind == "violation"
    assert policy.charge_violation(validation, inputs.size, charged) is violates
    assert charged.remaining == checked.remaining


def test_a_numeric_key_that_mends_a_violation_is_blamed() -> None:
    # a YAML key may be a number: blame returns it as it is (the compiled build typed keys as str
    # and raised TypeError)
    policy = compile_policy(
        environment(),
        match_conditions=[],
        variables=[],
        validations=[{"expression": "object.spec.containers.all(c, !(8080 in c))"}],
        failure_policy="Fail",
        params=None,
    )
    assert isinstance(policy, CompiledPolicy)
    (validation,) = policy.validations
    pod = {"spec": {"containers": [{"name": "node", 8080: "x", "image": "i"}]}}
    narrowed = Narrowed({"object": pod}, pod, input_size(pod))
    assert blamed_items(policy, validation, narrowed, Budget()) == [("containers", 0, 8080)]


def test_a_frozen_pod_is_blamed_as_the_same_pod_thawed() -> None:
    # blame reads the whole pod's lists and fields as it is, without a thawed copy: a frozen pod
    # (read-only mappings, tuples) is blamed on the same items and fields, the budget charged alike
    policy = compile_policy(
        environment(),
        match_conditions=[],
        variables=[],
        validations=[
            {
                "expression": "object.spec.containers.all(c, "
                "c.?securityContext.?privileged.orValue(false) == false)"
            }
        ],
        failure_policy="Fail",
        params=None,
    )
    assert isinstance(policy, CompiledPolicy)
    (validation,) = policy.validations
    containers = [
        {"name": "a", "image": "i", "securityContext": {"privileged": True}, "env": [{"name": "X"}]},
        {"name": "b", "image": "i"},
        {"name": "c", "securityContext": {"privileged": True, "runAsUser": 0}},
    ]
    pod = {"spec": {"containers": containers, "volumes": [{"name": "v", "emptyDir": {}}]}}
    plain, frozen = Budget(), Budget()
    found = blamed_items(policy, validation, Narrowed({"object": pod}, pod, input_size(pod)), plain)
    assert found == [("containers", 0, "securityContext"), ("containers", 2, "securityContext")]
    narrowed = Narrowed({"object": pod}, freeze(pod), input_size(pod))
    assert blamed_items(policy, validation, narrowed, frozen) == found
    assert frozen.remaining == plain.remaining < REQUEST_BUDGET


def test_a_programs_cost_bounds_are_kept_per_size_and_bounded() -> None:
    program = environment().compile("object.spec.containers.all(c, c.env.all(e, e.name != ''))")
    for size in range(1, 1_000):
        assert program.bound(size) == program.cost.at(size)
    assert 0 < len(program._bounds) <= 64
