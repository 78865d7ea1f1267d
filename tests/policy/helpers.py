"""Shared helpers for the engine tests: the example org, the fixture org, and one-line evaluation."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from mpigate.config import Config, check_tree, load
from mpigate.policy import AdmissionInput, Decision, LiveContext, UserInfo, evaluate
from tests.conftest import FIXTURES, REPO, TODAY

NOW = dt.datetime.combine(TODAY, dt.time(12), tzinfo=dt.UTC)
EXAMPLES = REPO / "examples"


def example_org() -> Config:
    return load(REPO, revision="test", today=TODAY)


def fixture_org() -> Config:
    return load(FIXTURES / "config" / "base", revision="test", today=TODAY)


def org_tree(root: Path, files: Mapping[str, str] | None = None) -> Path:
    """A copy of the example org's config folders (without their policy tests) at ``root``, plus
    ``files`` (path under ``root`` → text), for a test that adds rules or policies to the org."""
    for part in ("policies", "quotas", "rbac", "networkpolicies"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("tests"))
    for relative, text in (files or {}).items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return root


def smoke_job(*patches: Mapping[str, Any], **labels: str) -> dict[str, Any]:
    """The example CPU smoke TrainJob (allowed as it is) with extra ``labels`` and ``patches`` as
    its ``runtimePatches``."""
    job = read("trainjobs/cpu-smoke.yaml")
    if labels:
        job["metadata"].setdefault("labels", {}).update(labels)
    if patches:
        job["spec"]["runtimePatches"] = [dict(p) for p in patches]
    return job


def read(path: Path | str) -> dict[str, Any]:
    """The first document of a YAML file (relative paths: under examples/)."""
    full = Path(path) if Path(path).is_absolute() else EXAMPLES / path
    doc = next(d for d in yaml.safe_load_all(full.read_text(encoding="utf-8")) if d)
    assert isinstance(doc, dict)
    return doc


def decide(
    config: Config,
    obj: Mapping[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    live: LiveContext | None = None,
    now: dt.datetime = NOW,
    namespace: str | None = None,
    user: str = "maria@acme.example",
) -> Decision:
    source = obj if obj is not None else old
    assert source is not None
    meta = source.get("metadata") if isinstance(source.get("metadata"), dict) else {}
    request = AdmissionInput(
        operation=operation,  # type: ignore[arg-type]
        kind=str(source.get("kind", "TrainJob")),
        namespace=namespace if namespace is not None else meta.get("namespace"),
        name=str(meta.get("name", "")),
        obj=obj,
        old_obj=old,
        user=UserInfo(user, ("nlp-team-scientists",)),
    )
    return evaluate(config, request, live, now)


def trainjob(namespace: str = "nlp-team", name: str = "job", **spec: Any) -> dict[str, Any]:
    """A well-formed TrainJob on the example org's approved runtime, with ``spec`` overrides."""
    body: dict[str, Any] = {
        "runtimeRef": {"name": "mpi-openmpi-gpu"},
        "trainer": {
            "numNodes": 2,
            "image": "registry.acme.internal/nlp/llm-train:1.4.2",
            "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
        },
    }
    body.update(spec)
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {"mpigate.io/cost-center": "cc-1"}},
        "spec": body,
    }


def runtime_patch(
    manager: str, job: str, pod_spec: Mapping[str, Any], metadata: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": dict(pod_spec)}
    if metadata is not None:
        template["metadata"] = dict(metadata)
    return {
        "manager": manager,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {"replicatedJobs": [{"name": job, "template": {"spec": {"template": template}}}]}
            }
        },
    }


def ids(decision: Decision, *, denying: bool = False) -> set[str]:
    return {v.rule for v in decision.violations if v.denies or not denying}


def custom_rule(
    i: int, expression: str, *, target: str = "Pod", condition: bool = False, message: str = ""
) -> str:
    """A CustomRule document ``ACME-R<i>`` with one validation on ``target``; ``condition``: a match
    condition, which keeps the rule out of the list program that judges rules together."""
    conditions = "\n  matchConditions: [{name: always, expression: 'true'}]" if condition else ""
    return f"""\
apiVersion: mpigate.io/v1alpha1
kind: CustomRule
metadata: {{name: r{i}}}
spec:
  id: ACME-R{i}
  title: rule {i}
  match: {{targets: [{target}]}}{conditions}
  validations:
    - expression: {json.dumps(expression)}
      message: {message or f"rule {i}"}
"""


def custom_config(tmp_path: Path, *docs: str) -> Config:
    """The example org with ``docs`` (CustomRule documents) added, checked and loaded."""
    root = org_tree(tmp_path / "org", {"policies/rules/custom.yaml": "---\n".join(docs)})
    result = check_tree(root, today=TODAY)
    assert result.ok, result.errors
    return load(root, today=TODAY)
