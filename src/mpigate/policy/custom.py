"""CustomRules (CEL) in the engine: compiled once per config, judged on the job, the runtime and
each effective pod, reported as findings like every built-in rule's.

A pod is the effective pod template of a replicated job as a ``v1`` Pod; a violation found on it is
reported at the field the rule's ``fieldPath`` names, or else at the container, init container or
volume it fails for (found by judging the pod with that list narrowed to the one item), in the
TrainJob, runtime or runtime patch that set it (:meth:`EffectiveJob.origin`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mpigate.cel import Budget, EvalError
from mpigate.cel.validation import CompiledPolicy, Outcome, Validation
from mpigate.config import Config
from mpigate.config.crossfile.customrules import _environment, compile_rule
from mpigate.config.frozen import thaw
from mpigate.config.model import CustomRule, Mode, Team
from mpigate.trainjob import EffectiveJob, Resolution

from .decision import AdmissionInput
from .findings import Finding
from .prepared import memoized

__all__ = ["RuleMeta", "custom_findings", "custom_rule_meta"]

_LISTS = ("initContainers", "containers", "ephemeralContainers", "volumes")


@dataclass(frozen=True, slots=True)
class RuleMeta:
    """What :func:`mpigate.policy.engine` needs to turn a custom finding into a violation."""

    mode: Mode
    controls: tuple[str, ...]
    digest: str


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: CustomRule
    default: CompiledPolicy
    per_team: Mapping[str, CompiledPolicy]

    def policy(self, team: Team | None) -> CompiledPolicy:
        return self.per_team.get(team.name, self.default) if team is not None else self.default


def _mode_for(config: Config, rule: CustomRule) -> Mode:
    # the catalogue's precedence (model.Enforcement): exact ID > longer prefix > glob; the rule's
    # own action when no override names it
    best: tuple[int, int] | None = None
    mode: Mode = rule.action
    for pattern, override in config.org.enforcement.overrides.items():
        glob = any(c in pattern for c in "*?[")
        if pattern == rule.id:
            rank = (2, len(pattern))
        elif glob and fnmatch.fnmatchcase(rule.id, pattern):
            rank = (0, len(pattern))
        elif not glob and rule.id.startswith(pattern + "-"):
            rank = (1, len(pattern))
        else:
            continue
        if best is None or rank > best:
            best, mode = rank, override
    return mode


def _compiled(config: Config) -> tuple[_Compiled, ...]:
    def build() -> tuple[_Compiled, ...]:
        out: list[_Compiled] = []
        for rule in config.custom_rules:
            default = compile_rule(rule.spec, rule.spec.get("params"))
            if isinstance(default, list):  # pragma: no cover - check refuses such a tree
                raise ValueError(f"custom rule {rule.id} does not compile")
            per_team: dict[str, CompiledPolicy] = {}
            for team, params in rule.spec.get("teamParams", {}).items():
                compiled = compile_rule(rule.spec, params)
                if isinstance(compiled, CompiledPolicy):
                    per_team[team] = compiled
            out.append(_Compiled(rule, default, per_team))
        return tuple(out)

    found: tuple[_Compiled, ...] = memoized(config, ("policy.custom.compiled",), build)
    return found


def custom_rule_meta(config: Config) -> Mapping[str, RuleMeta]:
    """Mode, controls and digest of every custom rule, by ID (once per config)."""

    def build() -> Mapping[str, RuleMeta]:
        return {
            c.rule.id: RuleMeta(_mode_for(config, c.rule), c.rule.controls, c.default.digest)
            for c in _compiled(config)
        }

    found: Mapping[str, RuleMeta] = memoized(config, ("policy.custom.meta",), build)
    return found


def _matches(
    rule: CustomRule,
    target: str,
    operation: str,
    team: Team | None,
    namespace: str,
    labels: Mapping[str, str],
    classification: str | None,
) -> bool:
    match = rule.spec.get("match", {})
    if target not in match.get("targets", ()) or operation not in match.get("operations", ()):
        return False
    if match.get("teams") is not None and (team is None or team.name not in match["teams"]):
        return False
    if match.get("namespaces") is not None and namespace not in match["namespaces"]:
        return False
    if any(labels.get(k) != v for k, v in match.get("labels", {}).items()):
        return False
    return not (match.get("classifications") is not None and classification not in match["classifications"])


def _team_value(team: Team | None, classification: str | None) -> dict[str, Any] | None:
    if team is None:
        return None
    return {
        "name": team.name,
        "region": team.region,
        "namespaces": list(team.namespaces),
        "classification": classification,
        "gpus": {
            flavor: {"nominal": q.nominal, "borrowingLimit": q.borrowing_limit}
            for flavor, q in team.gpus.items()
        },
        "maxNodesPerJob": team.max_nodes_per_job,
        "maxConcurrentJobs": team.max_concurrent_jobs,
        "cohort": team.cohort,
    }


def _request_value(request: AdmissionInput, namespace: str, name: str) -> dict[str, Any]:
    return {
        "operation": request.operation,
        "userInfo": request.user.to_dict(),
        "dryRun": request.dry_run,
        "namespace": namespace,
        "name": name,
        "kind": {"kind": request.kind},
        "uid": request.uid,
    }


def _pod(job: EffectiveJob, namespace: str) -> dict[str, Any]:
    meta = dict(thaw(job.metadata))
    if namespace:
        meta.setdefault("namespace", namespace)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": thaw(job.spec)}


def _replicated(job: EffectiveJob) -> dict[str, Any]:
    return {"name": job.name, "replicas": job.replicas, "parallelism": job.parallelism, "pods": job.pods}


@dataclass
class _Run:
    """One request's evaluation state: the shared values and the cost budget."""

    config: Config
    request: AdmissionInput
    team: Team | None
    namespace: str
    name: str
    labels: Mapping[str, str]
    classification: str | None
    budget: Budget


def _finding(rule: CustomRule, outcome: Outcome, path: str) -> Finding:
    validation = outcome.validation
    fix = str(rule.spec["validations"][validation.index].get("fix", "")) if validation is not None else ""
    if outcome.kind == "error":
        return Finding(
            rule.id,
            path,
            f"{rule.title}: {outcome.message}",
            "Fix the rule or the object.",
            outcome.message[:100],
        )
    return Finding(rule.id, path, outcome.message, fix, outcome.message[:100])


def _judge(
    run: _Run, target: str, base: Mapping[str, Any], where: str, job: EffectiveJob | None, notes: list[str]
) -> Iterator[Finding]:
    env = _environment()
    inputs = None
    for compiled in _compiled(run.config):
        rule = compiled.rule
        if not _matches(
            rule, target, run.request.operation, run.team, run.namespace, run.labels, run.classification
        ):
            continue
        if (
            job is not None
            and rule.spec["match"].get("replicatedJobs")
            and job.name not in rule.spec["match"]["replicatedJobs"]
        ):
            continue
        if inputs is None:
            try:
                inputs = env.inputs(base)
            except EvalError as exc:
                yield Finding(rule.id, where, f"{rule.title}: {exc}", "", str(exc)[:100])
                return
        policy = compiled.policy(run.team)
        for outcome in policy.evaluate(env, inputs, run.budget):
            if outcome.kind == "ignored-error":
                notes.append(f"[{rule.id}] not evaluated (failurePolicy Ignore): {outcome.message}")
                continue
            for path in _blame(run, policy, outcome, base, where, job):
                yield _finding(rule, outcome, path)


def _field_path(template: str, index: tuple[str, int] | None) -> list[str | int]:
    """``spec.containers[*].x`` as path parts, ``[*]`` the blamed item."""
    parts: list[str | int] = []
    for piece in template.replace("[*]", ".[*]").split("."):
        if not piece:
            continue
        if piece == "[*]":
            parts.append(index[1] if index is not None else 0)
        elif piece.endswith("]") and "[" in piece:
            name, _, number = piece[:-1].partition("[")
            parts.append(name)
            parts.append(int(number) if number.isdigit() else number)
        else:
            parts.append(piece)
    return parts


def _blame(
    run: _Run,
    policy: CompiledPolicy,
    outcome: Outcome,
    base: Mapping[str, Any],
    where: str,
    job: EffectiveJob | None,
) -> list[str]:
    validation = outcome.validation
    if job is None or validation is None:
        field = validation.field_path if validation is not None else ""
        return [f"{where}{'.' if where and field else ''}{field}" if field else (where or "(object)")]
    items = _blamed_items(run, policy, validation, base)
    paths: list[str] = []
    picks: list[tuple[str, int] | None] = list(items) or [None]
    for pick in picks:
        if validation.field_path:
            paths.append(job.origin(_field_path(validation.field_path, pick)))
        elif pick is not None:
            paths.append(job.origin(("spec", pick[0], pick[1])))
        else:
            paths.append(job.origin(("spec",)))
    return list(dict.fromkeys(paths))


def _blamed_items(
    run: _Run, policy: CompiledPolicy, validation: Validation, base: Mapping[str, Any]
) -> list[tuple[str, int]]:
    env = _environment()
    pod = base["object"]
    spec = pod.get("spec") or {}
    out: list[tuple[str, int]] = []
    for list_field in _LISTS:
        items = spec.get(list_field)
        if not isinstance(items, list) or len(items) < 1:
            continue
        for index, item in enumerate(items):
            narrowed = {**pod, "spec": {**spec, list_field: [item]}}
            try:
                verdict = policy.check(env, env.inputs({**base, "object": narrowed}), validation, run.budget)
            except EvalError:
                continue
            if verdict is not None and verdict.kind == "violation":
                out.append((list_field, index))
    return out


def custom_findings(
    config: Config,
    request: AdmissionInput,
    *,
    target: str,
    obj: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    team: Team | None,
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    classification: str | None,
    resolution: Resolution | None,
    runtime: Mapping[str, Any] | None,
    notes: list[str],
) -> list[Finding]:
    """Every custom rule's findings on ``obj`` (a TrainJob, MPIJob or runtime) and, when
    ``resolution`` is given, on each of its effective pods. Errors the failure policy ignores become
    ``notes`` (warnings)."""
    if not config.custom_rules:
        return []
    run = _Run(config, request, team, namespace, name, labels, classification, Budget())
    plain = thaw(obj)
    shared = {
        "request": _request_value(request, namespace, name),
        "team": _team_value(team, classification),
        "trainJob": plain if target in ("TrainJob", "MPIJob") else None,
        "runtime": thaw(runtime) if runtime is not None else (plain if target == "Runtime" else None),
        "namespaceObject": {"metadata": {"name": namespace}} if namespace else None,
    }
    out = list(
        _judge(
            run,
            target,
            {**shared, "object": plain, "oldObject": thaw(old) if old is not None else None},
            "",
            None,
            notes,
        )
    )
    if resolution is not None:
        root = f"runtime {resolution.runtime_name}: " if target == "Runtime" else ""
        for job in resolution.jobs:
            base = {
                **shared,
                "object": _pod(job, namespace),
                "oldObject": None,
                "replicatedJob": _replicated(job),
            }
            out.extend(_judge(run, "Pod", base, root, job, notes))
    return out
