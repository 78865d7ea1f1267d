"""A request's effective pods judged by one CEL call (mpigate.policy.custom._prejudge: the pods' list
programs mapped over the list of pods) decide exactly as each pod judged on its own: the same
violations, messages, paths and warnings, the cost budget charged in the same order and running
out at the same rule of the same pod, an error in one pod's list leaving every pod to its own
evaluation (issue 22 item 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mpigate.cel.env import EvalError, Program
from mpigate.config import Config, check_tree
from mpigate.policy.custom_compiled import EACH_POD
from tests.conftest import TODAY
from tests.policy.helpers import custom_config, custom_rule, decide, org_tree, runtime_patch, smoke_job


def _joint_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the joint calls over a request's pods: ``ran`` (gave results) and ``failed``; while
    ``refuse`` is set, a joint call fails as an evaluation error does and every pod is judged on
    its own (through Program, pure Python in either build: a mypyc-compiled engine calls its own
    functions bound at compile time, which no monkeypatch replaces)."""
    calls = {"ran": 0, "failed": 0, "refuse": 0}
    value = Program.value

    def counted(self: Program, inputs: Any) -> Any:
        if not self.source.startswith(f"[object[0].map({EACH_POD},"):
            return value(self, inputs)
        if calls["refuse"]:
            raise EvalError("refused by the test")
        try:
            found = value(self, inputs)
        except Exception:
            calls["failed"] += 1
            raise
        calls["ran"] += 1
        return found

    monkeypatch.setattr(Program, "value", counted)
    return calls


def _both(config: Config, job: dict[str, Any], calls: dict[str, int]) -> tuple[Any, Any]:
    """What the engine decides on ``job`` with the pods judged together, and each on its own."""
    together = decide(config, job)
    calls["refuse"] = 1
    try:
        alone = decide(config, job)
    finally:
        calls["refuse"] = 0
    return (together.allowed, together.violations, together.warnings), (
        alone.allowed,
        alone.violations,
        alone.warnings,
    )


# a cost bound cubic in the env's length (the budget runs out) that stops after two iterations
# (cel-cpp stops an evaluation after 10,000: the joint call stays within it)
_CUBIC = "object.spec.containers.all(c, c.?env.orValue([]).exists(a, c.env.exists(b, b.name == a.name)))"


def _with_env(n: int) -> dict[str, Any]:
    env = [{"name": f"V{i}", "value": "x"} for i in range(n)]
    return smoke_job(
        runtime_patch("acme.example/a", "launcher", {"containers": [{"name": "node", "env": env}]}),
        runtime_patch("acme.example/b", "node", {"containers": [{"name": "node", "env": env[: n - 4]}]}),
    )


def test_the_budget_runs_out_at_the_same_rule_of_the_same_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # eight rules in the list program, four judged on their own after it, on each of two pods whose
    # env grows: the request's budget first suffices, then runs out at ever earlier rules of the
    # second pod (whose list was evaluated with the first's), then the joint call is not made
    config = custom_config(tmp_path, *(custom_rule(i, _CUBIC, condition=i % 3 == 2) for i in range(12)))
    calls = _joint_calls(monkeypatch)
    out_of_budget: list[int] = []
    for n in range(16, 32, 2):
        before = calls["ran"]
        together, alone = _both(config, _with_env(n), calls)
        assert together == alone, n
        stopped = sum("running out of cost budget" in v.message for v in together[1])
        if stopped and calls["ran"] > before:
            out_of_budget.append(stopped)
    # the budget ran out after a joint call, at different rules as the pods grew
    assert len(set(out_of_budget)) >= 2, out_of_budget
    assert calls["ran"] >= 4


def test_an_error_in_one_pods_list_leaves_each_pod_to_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the launcher's container has no ports (an error there), the node's runs as root (a violation)
    config = custom_config(
        tmp_path,
        custom_rule(0, "object.spec.containers.all(c, c.ports[0].containerPort > 0)"),
        custom_rule(1, "object.spec.containers.all(c, c.?securityContext.?runAsUser.orValue(1000) != 0)"),
    )
    root = {"name": "node", "securityContext": {"runAsUser": 0}, "ports": [{"containerPort": 2222}]}
    job = smoke_job(runtime_patch("acme.example/root", "node", {"containers": [root]}))
    calls = _joint_calls(monkeypatch)
    together, alone = _both(config, job, calls)
    assert calls["failed"] == 1 and calls["ran"] == 0
    assert together == alone
    found = {(v.rule, "resulted in error" in v.message) for v in together[1] if v.rule.startswith("ACME")}
    assert ("ACME-R0", True) in found
    assert ("ACME-R1", False) in found


def test_each_pod_sees_its_own_replicated_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = custom_config(
        tmp_path,
        custom_rule(0, "replicatedJob.name != 'node'", message="not on node"),
        custom_rule(1, "object.spec.containers.all(c, c.name != '')"),
    )
    calls = _joint_calls(monkeypatch)
    together, alone = _both(config, smoke_job(), calls)
    assert calls["ran"] == 1
    assert together == alone
    (violation,) = [v for v in together[1] if v.rule == "ACME-R0"]
    assert "node" in violation.message or "node" in violation.path


def test_no_rule_reads_the_list_of_pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the joint call's own variable is undeclared where a rule compiles: check refuses it
    reading = custom_rule(0, f"size({EACH_POD}) < 2")
    root = org_tree(tmp_path / "refused", {"policies/rules/custom.yaml": reading})
    assert "cel.compile" in {p.code for p in check_tree(root, today=TODAY).errors}
    # a rule's own comprehension variable of that name is its own
    config = custom_config(
        tmp_path,
        custom_rule(0, f"object.spec.containers.all({EACH_POD}, {EACH_POD}.name != 'node')"),
        custom_rule(1, "object.spec.containers.all(c, has(c.image))"),
    )
    calls = _joint_calls(monkeypatch)
    together, alone = _both(config, smoke_job(), calls)
    assert calls["ran"] == 1
    assert together == alone
    assert [v.rule for v in together[1] if v.rule.startswith("ACME")] == ["ACME-R0", "ACME-R0"]


def test_pods_judged_by_different_rules_are_judged_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a rule for the node pods only: the launcher's and the node's list programs differ, and both
    # are mapped over their own pods in the same call
    node_only = custom_rule(0, "object.spec.containers.all(c, c.name != 'node')").replace(
        "match: {targets: [Pod]}", "match: {targets: [Pod], replicatedJobs: [node]}"
    )
    config = custom_config(
        tmp_path,
        node_only,
        custom_rule(1, "object.spec.containers.all(c, has(c.image))"),
        custom_rule(3, "object.spec.containers.all(c, c.name == '')"),
    )
    calls = _joint_calls(monkeypatch)
    together, alone = _both(config, smoke_job(), calls)
    assert calls["ran"] == 1
    assert together == alone
    # the node-only rule fires once (the node pod), the one for every pod on both
    fired = [v.rule for v in together[1] if v.rule.startswith("ACME")]
    assert fired.count("ACME-R0") == 1, together[1]
    assert fired.count("ACME-R3") == 2, together[1]
