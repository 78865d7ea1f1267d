"""The engine's performance contract, checked without timing: runtimes are prepared once per config
(never copied per request), resolutions and mutations share rather than copy, and nothing that is
shared is ever modified — neither the request, nor the config's prepared runtimes, nor a decision
by its caller.

Also :func:`mpigate.policy.mutations` (the mutating webhook's entry point): the same patch as
:func:`mpigate.policy.evaluate` for every object.
"""

from __future__ import annotations

import copy
import importlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpigate._build import compiled
from mpigate.config import Config
from mpigate.policy import AdmissionInput, UserInfo, evaluate, mutations
from mpigate.policy.prepared import prepared_runtime
from mpigate.trainjob import copy_json, prepare_runtime
from tests.conftest import REPO
from tests.policy.helpers import NOW, example_org, read
from tests.policy.test_properties import BASE, PATHS, json_values, trainjobs

ORG: Config = example_org()
EXAMPLES = sorted((REPO / "examples" / "trainjobs").glob("*.yaml"))


def request(obj: dict[str, Any], operation: str = "CREATE") -> AdmissionInput:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    return AdmissionInput(
        operation,  # type: ignore[arg-type]
        str(obj.get("kind", "TrainJob")),
        str(meta.get("namespace", "nlp-team")),
        str(meta.get("name", "")),
        obj,
        user=UserInfo("maria@acme.example"),
    )


def nodes(value: Any) -> int:
    """Mappings, lists and scalars in a JSON document (plain or frozen)."""
    if isinstance(value, Mapping):
        return 1 + sum(nodes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return 1 + sum(nodes(v) for v in value)
    return 1


@pytest.mark.skipif(
    compiled(),
    reason="counts copy_json calls by monkeypatching module attributes, which cannot intercept calls "
    "between mypyc-compiled modules (bound at compile time); the copying is the same source, "
    "counted by the pure-Python run",
)
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_evaluation_copies_less_than_one_runtime(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a config's runtime is prepared, evaluating a job copies only what its patch adds — far
    less than the runtime manifest it runs on (the engine used to deep-copy it twice per call)."""
    config = example_org()
    obj = read(path)
    evaluate(config, request(obj), None, NOW)  # prepares the runtime
    copied: list[int] = []

    def counting(value: Any) -> Any:
        copied.append(nodes(value))
        return copy_json(value)

    # Every module that copies documents imports copy_json by name; smp's own recursion is not counted.
    for name in ("mpigate.trainjob.runtime", "mpigate.policy.jsonpatch"):
        monkeypatch.setattr(importlib.import_module(name), "copy_json", counting)
    decision = evaluate(config, request(obj), None, NOW)
    # what is copied is the patch's values, nothing else
    assert sum(copied) <= sum(nodes(op["value"]) for op in decision.patch if "value" in op)
    runtime = config.runtime("ClusterTrainingRuntime", obj["spec"]["runtimeRef"]["name"])
    if runtime is not None:
        assert sum(copied) < nodes(runtime.manifest), copied


def test_runtimes_are_prepared_once_per_config(caplog: pytest.LogCaptureFixture) -> None:
    config = example_org()
    jobs = [read(path) for path in EXAMPLES]

    def prepared() -> list[str]:
        # prepare_runtime's debug record, one per preparation: a count that holds on the compiled
        # build too, where calls between modules cannot be intercepted by monkeypatching
        return [
            r.getMessage().removeprefix("preparing runtime ")
            for r in caplog.records
            if r.name == "mpigate.trainjob.runtime" and r.getMessage().startswith("preparing runtime ")
        ]

    with caplog.at_level(logging.DEBUG, logger="mpigate.trainjob.runtime"):
        for _ in range(3):
            for obj in jobs:
                evaluate(config, request(obj), None, NOW)
                mutations(config, request(obj), None, NOW)
        # each runtime of the config once (its images are parsed on first use, so all are prepared)
        assert sorted(prepared()) == sorted(r.name for r in config.runtimes.values())
        # and what the engine uses is what it prepared: the same object on every call
        for runtime in config.runtimes.values():
            assert prepared_runtime(config, runtime) is prepared_runtime(config, runtime)
        # a new config (a reload) prepares its own
        fresh = example_org()
        evaluate(fresh, request(jobs[0]), None, NOW)
        assert len(prepared()) == 2 * len(config.runtimes)


def test_nothing_shared_is_modified() -> None:
    """The request objects, the prepared runtimes and the decisions stay independent."""
    config = example_org()
    jobs = [read(path) for path in EXAMPLES + sorted((REPO / "examples" / "mpijobs").glob("*.yaml"))]
    originals = copy.deepcopy(jobs)
    decisions = []
    for obj in jobs:
        decisions.append(evaluate(config, request(obj), None, NOW))
        decisions.append(mutations(config, request(obj), None, NOW))
    assert jobs == originals
    for runtime in config.runtimes.values():
        prepared = prepared_runtime(config, runtime)
        fresh = prepare_runtime(runtime.manifest)
        assert prepared.jobs == fresh.jobs, runtime.name
        assert [layer.template for layer in prepared.layers] == [layer.template for layer in fresh.layers]
    # a caller that edits a decision's patch changes neither the request nor the next decision
    before = [d.patch for d in (evaluate(config, request(o), None, NOW) for o in jobs)]
    for decision in decisions:
        for op in decision.patch:
            value = op.get("value")
            if isinstance(value, dict):
                value["edited"] = True
            elif isinstance(value, list):
                value.append("edited")
    assert jobs == originals
    assert [evaluate(config, request(o), None, NOW).patch for o in jobs] == before


def _same_patch(obj: dict[str, Any]) -> None:
    snapshot = copy.deepcopy(obj)
    full = evaluate(ORG, request(obj), None, NOW)
    only = mutations(ORG, request(obj), None, NOW)
    assert obj == snapshot  # neither entry point modifies the request
    assert only.patch == full.patch
    assert only.allowed and only.violations == () and only.warnings == () and only.demand is None
    assert (only.team, only.revision, only.namespace, only.name) == (
        full.team,
        full.revision,
        full.namespace,
        full.name,
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_mutations_give_evaluates_patch_on_every_example(path: Path) -> None:
    obj = read(path)
    _same_patch(obj)
    # and on the object the API server sends to the validating webhook: nothing more to patch
    patched = evaluate(ORG, request(obj), None, NOW)
    assert patched.patch == () or mutations(ORG, request(obj), None, NOW).patch == patched.patch


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trainjobs())
def test_mutations_give_evaluates_patch(job: dict[str, Any]) -> None:
    _same_patch(job)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), json_values)
def test_mutations_give_evaluates_patch_on_malformed_fields(path: tuple[Any, ...], value: Any) -> None:
    obj = copy.deepcopy(BASE)
    node: Any = obj
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    _same_patch(obj)


def test_mutations_defer_to_evaluate_beyond_trainjob_creates() -> None:
    obj = read(EXAMPLES[0])
    for operation in ("UPDATE", "DELETE"):
        assert mutations(ORG, request(obj, operation), None, NOW) == evaluate(
            ORG, request(obj, operation), None, NOW
        )
    runtime = copy_json(next(iter(ORG.runtimes.values())).manifest)
    assert mutations(ORG, request(runtime), None, NOW) == evaluate(ORG, request(runtime), None, NOW)
