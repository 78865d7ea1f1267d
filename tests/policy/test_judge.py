"""``judge`` (the validating webhook's entry point) gives ``evaluate``'s verdict on an object that
went through mpigate's mutation, without computing the patch again."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpigate._build import compiled
from mpigate.config import Config, load
from mpigate.policy import AdmissionInput, apply_patch, evaluate, judge
from tests.conftest import REPO, TODAY

EXAMPLES = sorted((REPO / "examples" / "trainjobs").glob("*.yaml")) + sorted(
    (REPO / "examples" / "mpijobs").glob("*.yaml")
)


@pytest.fixture(scope="module")
def config() -> Config:
    return load(REPO)


def _input(obj: dict[str, object]) -> AdmissionInput:
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    return AdmissionInput("CREATE", str(obj["kind"]), meta.get("namespace"), str(meta.get("name", "")), obj)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_judge_of_the_mutated_object_is_evaluate_of_the_manifest(path: Path, config: Config) -> None:
    now = dt.datetime.combine(TODAY, dt.time(12), dt.UTC)
    obj = yaml.safe_load(path.read_text())
    evaluated = evaluate(config, _input(obj), now=now)
    mutated = apply_patch(obj, evaluated.patch)
    judged = judge(config, _input(mutated), now=now)
    assert judged.patch == ()
    assert (judged.allowed, judged.violations, judged.warnings, judged.demand, judged.message) == (
        evaluated.allowed,
        evaluated.violations,
        evaluated.warnings,
        evaluated.demand,
        evaluated.message,
    )


def test_judge_does_not_assume_the_mutation(config: Config) -> None:
    obj = yaml.safe_load((REPO / "examples" / "trainjobs" / "llm-finetune.yaml").read_text())
    assert evaluate(config, _input(obj)).allowed is True
    judged = judge(config, _input(obj))
    assert judged.allowed is False
    assert {"MPG-NET-001", "MPG-RES-001"} <= set(judged.rule_ids)


@pytest.mark.skipif(
    compiled(),
    reason="counts resolve calls by monkeypatching a module attribute, which cannot intercept calls "
    "between mypyc-compiled modules (bound at compile time); the same source is counted by the "
    "pure-Python run",
)
def test_judge_resolves_a_job_mpigate_mutated_once(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """The validating webhook's judgement of a mutated TrainJob resolves it once (the resolution
    without mpigate's entry, which checks the entry, gives the whole job's by a late merge)."""
    import mpigate.policy.jobcontext as jobcontext  # where a job's context resolves it

    calls: list[object] = []
    real = jobcontext.resolve

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(jobcontext, "resolve", counted)
    judged = 0
    for path in EXAMPLES:
        obj = yaml.safe_load(path.read_text())
        mutated = apply_patch(obj, evaluate(config, _input(obj)).patch)
        if not any(
            p.get("manager") == "mpigate.io/admission" for p in mutated["spec"].get("runtimePatches", [])
        ):
            continue
        calls.clear()
        judge(config, _input(mutated))
        assert len(calls) == 1, path.name
        judged += 1
    assert judged >= 10


@pytest.mark.skipif(compiled(), reason="replaces with_last_patch by monkeypatching (see above)")
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_late_merge_changes_no_decision(
    path: Path, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mpigate.policy.jobs as jobs  # where judging a TrainJob merges mpigate's entry late

    now = dt.datetime.combine(TODAY, dt.time(12), dt.UTC)
    obj = yaml.safe_load(path.read_text())
    mutated = apply_patch(obj, evaluate(config, _input(obj), now=now).patch)
    fast = judge(config, _input(mutated), now=now)
    monkeypatch.setattr(jobs, "with_last_patch", lambda *_: None)
    assert judge(config, _input(mutated), now=now) == fast
