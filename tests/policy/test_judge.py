"""``judge`` (the validating webhook's entry point) gives ``evaluate``'s verdict on an object that
went through mpigate's mutation, without computing the patch again."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

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
