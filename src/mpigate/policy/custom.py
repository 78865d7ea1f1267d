"""CustomRules (CEL) and the tree's ValidatingAdmissionPolicies in the engine: compiled once per
config, judged on the job, the runtime and each effective pod, reported as findings like every
built-in rule's.

A ValidatingAdmissionPolicy is judged once per binding (a :class:`CustomRule` whose ``admission``
holds the binding): it applies where its matchConstraints and the binding's matchResources select
the request (:func:`mpigate.config.admission.binding_matches`) — a TrainJob, MPIJob or runtime as
submitted, or each effective pod as the Job controller will create it (operation CREATE, no
oldObject) — once per parameter object of the binding.

A pod is the effective pod template of a replicated job as a ``v1`` Pod; a violation found on it is
reported at the field the rule's ``fieldPath`` names, or else at the container, init container or
volume it fails for (found by judging the pod with that list narrowed to the one item), in the
TrainJob, runtime or runtime patch that set it (:meth:`EffectiveJob.origin`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mpigate.cel import Budget, EvalError, Inputs
from mpigate.cel.validation import CompiledPolicy, Outcome, Validation
from mpigate.config import Config
from mpigate.config.admission import POD_CREATOR, binding_matches
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
    """What :func:`mpigate.policy.engine` needs to turn a custom finding into a violation:
    ``digest`` fixes the rule's compiled expressions (written into each audit record)."""

    mode: Mode
    controls: tuple[str, ...]
    digest: str


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A rule's programs: per parameter object (a CustomRule has one, a binding one per object of
    its paramRef, with that object's namespace) and per team (a CustomRule's teamParams)."""

    rule: CustomRule
    default: tuple[tuple[str, CompiledPolicy], ...]
    per_team: Mapping[str, tuple[tuple[str, CompiledPolicy], ...]]
    #: sha256 of the rule's canonical compiled expressions: each program's digest (its match
    #: conditions, variables, validations, failure policy and parameters), per parameter object
    #: and per team, with the rule's ID — computed once per config, at compile time
    digest: str

    def policies(self, team: Team | None, namespace: str) -> list[CompiledPolicy]:
        chosen = self.per_team.get(team.name, self.default) if team is not None else self.default
        admission = self.rule.admission
        if admission is None or admission.params is None or not admission.params.by_request_namespace:
            return [policy for _, policy in chosen]
        return [policy for where, policy in chosen if where == namespace]


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
    def program(rule: CustomRule, params: Any) -> CompiledPolicy:
        compiled = compile_rule(rule.spec, params)
        if not isinstance(compiled, CompiledPolicy):  # pragma: no cover - check refuses such a tree
            raise ValueError(f"rule {rule.id} does not compile")
        return compiled

    def build() -> tuple[_Compiled, ...]:
        out: list[_Compiled] = []
        for rule in config.custom_rules:
            admission = rule.admission
            if admission is not None and admission.params is not None:
                default = tuple((o.namespace, program(rule, o.data)) for o in admission.params.objects)
            else:
                default = (("", program(rule, rule.spec.get("params"))),)
            per_team = {
                team: (("", program(rule, params)),)
                for team, params in rule.spec.get("teamParams", {}).items()
            }
            canonical = json.dumps(
                {
                    "id": rule.id,
                    "programs": [[where, policy.digest] for where, policy in default],
                    "teams": {t: [p.digest for _, p in programs] for t, programs in per_team.items()},
                },
                sort_keys=True,
            )
            digest = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
            out.append(_Compiled(rule, default, per_team, digest))
        return tuple(out)

    found: tuple[_Compiled, ...] = memoized(config, ("policy.custom.compiled",), build)
    return found


_OPTIONAL_INPUTS = ("oldObject", "request", "trainJob", "runtime", "replicatedJob", "team", "namespaceObject")
_INPUT_NAME = re.compile(r"\b(" + "|".join(_OPTIONAL_INPUTS) + r")\b")


def _reads(config: Config) -> frozenset[str]:
    """The optional inputs any rule's expressions name (once per config): only those are built
    and converted for each object and pod — the job and runtime manifests are the bulk of it."""

    def build() -> frozenset[str]:
        text = " ".join(json.dumps(thaw(rule.spec), default=str) for rule in config.custom_rules)
        return frozenset(_INPUT_NAME.findall(text))

    found: frozenset[str] = memoized(config, ("policy.custom.reads",), build)
    return found


def custom_rule_meta(config: Config) -> Mapping[str, RuleMeta]:
    """Mode and controls of every custom rule, by ID (once per config)."""

    def build() -> Mapping[str, RuleMeta]:
        return {
            c.rule.id: RuleMeta(_mode_for(config, c.rule), c.rule.controls, c.digest)
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


def _admits(run: _Run, rule: CustomRule, kind: str, obj: Mapping[str, Any]) -> bool:
    """Whether a binding selects the request for ``obj`` of ``kind`` (a pod: its creation)."""
    admission = rule.admission
    if admission is None:
        return False
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    pod = kind == "Pod"
    return binding_matches(
        admission.constraints,
        kind,
        "CREATE" if pod else run.request.operation,
        "" if kind == "ClusterTrainingRuntime" else run.namespace,
        "" if pod else run.name,
        labels if isinstance(labels, dict) else {},
    )


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
    #: rules whose configuration error (a binding's missing parameters) was reported already
    reported: set[str] = field(default_factory=set)


def _finding(rule: CustomRule, outcome: Outcome, path: str) -> Finding:
    validation = outcome.validation
    fix = str(rule.spec["validations"][validation.index].get("fix", "")) if validation is not None else ""
    if rule.admission is not None:
        # dispatcher.go: "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: <message>"
        message = f"{rule.title}: {outcome.message}"
        return Finding(
            rule.id, path, message, fix or "Fix the object, or ask the policy's owners.", message[:100]
        )
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
    # a pod is judged by a ValidatingAdmissionPolicy as the request that will create it
    kind = run.request.kind if target == "Runtime" else target
    admission_base = (
        {
            **base,
            "request": {
                **base["request"],
                "operation": "CREATE",
                "userInfo": dict(POD_CREATOR),
                "name": "",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
            },
        }
        if target == "Pod"
        else base
    )
    inputs: dict[bool, Inputs] = {}
    for compiled in _compiled(run.config):
        rule = compiled.rule
        admission = rule.admission is not None
        if admission:
            if not _admits(run, rule, kind, base["object"]):
                continue
        elif not _matches(
            rule, target, run.request.operation, run.team, run.namespace, run.labels, run.classification
        ) or (
            job is not None
            and rule.spec["match"].get("replicatedJobs")
            and job.name not in rule.spec["match"]["replicatedJobs"]
        ):
            continue
        values = admission_base if admission else base
        if admission not in inputs:
            try:
                inputs[admission] = env.inputs(values)
            except EvalError as exc:
                yield Finding(rule.id, where, f"{rule.title}: {exc}", "", str(exc)[:100])
                return
        policies = compiled.policies(run.team, run.namespace)
        binding = rule.admission
        missing = binding.params.missing(run.namespace) if binding is not None and binding.params else ""
        outcomes: list[tuple[CompiledPolicy | None, Outcome]] = []
        if missing and rule.id not in run.reported:
            run.reported.add(rule.id)  # once per request, not once per pod
            # CollectParams' error is a configuration error: the policy's failurePolicy decides
            message = f"failed to configure binding: {missing}"
            fail = rule.spec.get("failurePolicy", "Fail") == "Fail"
            outcomes.append((None, Outcome("error", message) if fail else Outcome("ignored-error", message)))
        for program in policies:
            outcomes.extend((program, o) for o in program.evaluate(env, inputs[admission], run.budget))
        for owner, outcome in outcomes:
            if outcome.kind == "ignored-error":
                notes.append(f"[{rule.id}] not evaluated (failurePolicy Ignore): {outcome.message}")
                continue
            paths = (
                _blame(run, owner, outcome, values, where, job)
                if owner is not None
                else [where or "(object)"]
            )
            for path in paths:
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
    picks: list[tuple[str, int, str] | None] = list(items) or [None]
    for pick in picks:
        if validation.field_path:
            paths.append(job.origin(_field_path(validation.field_path, pick[:2] if pick else None)))
        elif pick is not None:
            list_field, index, key = pick
            paths.append(job.origin(("spec", list_field, index, key) if key else ("spec", list_field, index)))
        else:
            paths.append(job.origin(("spec",)))
    return list(dict.fromkeys(paths))


def _blamed_items(
    run: _Run, policy: CompiledPolicy, validation: Validation, base: Mapping[str, Any]
) -> list[tuple[str, int, str]]:
    """The items (containers, volumes...) a violation comes from — each alone still violates, and
    the pod without that list does not — and, within an item, the fields whose removal mends it
    (``""``: the item as a whole); only evaluated for a violation, never on a passing pod."""
    env = _environment()
    pod = base["object"]
    spec = pod.get("spec") or {}
    out: list[tuple[str, int, str]] = []

    def violates(items: list[Any], list_field: str) -> bool:
        narrowed = {**pod, "spec": {**spec, list_field: items}}
        try:
            verdict = policy.check(env, env.inputs({**base, "object": narrowed}), validation, run.budget)
        except EvalError:
            return False
        return verdict is not None and verdict.kind == "violation"

    for list_field in _LISTS:
        items = spec.get(list_field)
        if not isinstance(items, list) or len(items) < 1:
            continue
        if violates([], list_field):
            continue  # the violation does not come from this list (a pod's volumes for its containers)
        for index, item in enumerate(items):
            if not violates([item], list_field):
                continue
            keys = (
                [
                    k
                    for k in item
                    if k != "name" and not violates([{n: v for n, v in item.items() if n != k}], list_field)
                ]
                if isinstance(item, dict)
                else []
            )
            out.extend((list_field, index, key) for key in keys or [""])
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
    reads = _reads(config)
    plain = thaw(obj)
    # request is always built: a pod's ValidatingAdmissionPolicy request is derived from it
    shared: dict[str, Any] = {"request": _request_value(request, namespace, name)}
    if "team" in reads:
        shared["team"] = _team_value(team, classification)
    if "trainJob" in reads:
        shared["trainJob"] = plain if target in ("TrainJob", "MPIJob") else None
    if "runtime" in reads:
        shared["runtime"] = thaw(runtime) if runtime is not None else (plain if target == "Runtime" else None)
    if "namespaceObject" in reads:
        shared["namespaceObject"] = {"metadata": {"name": namespace}} if namespace else None
    first = {**shared, "object": plain}
    if "oldObject" in reads and old is not None:
        first["oldObject"] = thaw(old)
    out = list(_judge(run, target, first, "", None, notes))
    if resolution is not None:
        root = f"runtime {resolution.runtime_name}: " if target == "Runtime" else ""
        for job in resolution.jobs:
            base = {**shared, "object": _pod(job, namespace)}
            if "replicatedJob" in reads:
                base["replicatedJob"] = _replicated(job)
            out.extend(_judge(run, "Pod", base, root, job, notes))
    return out
