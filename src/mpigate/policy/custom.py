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

import datetime as dt
import fnmatch
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mpigate.cel import Budget, EvalError, Inputs
from mpigate.cel.cost import input_size
from mpigate.cel.env import CompileError, Environment, Program
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
    # a CustomRule's match, read once per config (None: any)
    targets: frozenset[str] = frozenset()
    operations: frozenset[str] = frozenset()
    teams: frozenset[str] | None = None
    namespaces: frozenset[str] | None = None
    labels: tuple[tuple[str, str], ...] = ()
    classifications: frozenset[str] | None = None
    replicated_jobs: frozenset[str] | None = None
    #: the parameter objects are namespaced and chosen by the request's namespace (CollectParams)
    by_namespace: bool = False

    def policies(self, team: Team | None, namespace: str) -> list[CompiledPolicy]:
        chosen = self.per_team.get(team.name, self.default) if team is not None else self.default
        if not self.by_namespace:
            return [policy for _, policy in chosen]
        return [policy for where, policy in chosen if where == namespace]

    def applies(
        self,
        target: str,
        operation: str,
        team: Team | None,
        namespace: str,
        labels: Mapping[str, str],
        classification: str | None,
        job: EffectiveJob | None,
    ) -> bool:
        """Whether a CustomRule's match selects ``target`` (a pod: of ``job``)."""
        if target not in self.targets or operation not in self.operations:
            return False
        if self.teams is not None and (team is None or team.name not in self.teams):
            return False
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        if any(labels.get(k) != v for k, v in self.labels):
            return False
        if self.classifications is not None and classification not in self.classifications:
            return False
        return job is None or self.replicated_jobs is None or job.name in self.replicated_jobs


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


def _chosen(match: Mapping[str, Any], key: str) -> frozenset[str] | None:
    """A match condition as a set (None: absent, anything matches)."""
    value = match.get(key)
    return frozenset(value) if value is not None else None


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
            match = rule.spec.get("match", {})

            out.append(
                _Compiled(
                    rule,
                    default,
                    per_team,
                    digest,
                    targets=frozenset(match.get("targets", ())),
                    operations=frozenset(match.get("operations", ())),
                    teams=_chosen(match, "teams"),
                    namespaces=_chosen(match, "namespaces"),
                    labels=tuple((str(k), str(v)) for k, v in match.get("labels", {}).items()),
                    classifications=_chosen(match, "classifications"),
                    replicated_jobs=_chosen(match, "replicatedJobs") if match.get("replicatedJobs") else None,
                    by_namespace=bool(
                        admission is not None
                        and admission.params is not None
                        and admission.params.by_request_namespace
                    ),
                )
            )
        return tuple(out)

    found: tuple[_Compiled, ...] = memoized(config, ("policy.custom.compiled",), build)
    return found


def _by_target(config: Config) -> Mapping[str, tuple[_Compiled, ...]]:
    """The rules that may judge each target (once per config): a CustomRule under the targets of
    its match, a ValidatingAdmissionPolicy binding under every target (its constraints decide)."""

    def build() -> Mapping[str, tuple[_Compiled, ...]]:
        compiled = _compiled(config)
        return {
            target: tuple(c for c in compiled if c.rule.admission is not None or target in c.targets)
            for target in _TARGETS
        }

    found: Mapping[str, tuple[_Compiled, ...]] = memoized(config, ("policy.custom.by-target",), build)
    return found


def _selects_namespaces(config: Config) -> bool:
    """Whether a binding's or policy's namespaceSelector needs the namespace's labels."""

    def build() -> bool:
        return any(
            isinstance(c, Mapping) and c.get("namespaceSelector")
            for rule in config.custom_rules
            if rule.admission is not None
            for c in rule.admission.constraints
        )

    found: bool = memoized(config, ("policy.custom.namespace-selectors",), build)
    return found


_TARGETS = ("TrainJob", "MPIJob", "Runtime", "Pod")
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
        run.namespace_labels if kind != "ClusterTrainingRuntime" else None,
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
    #: the labels of the request's namespace as the cluster has them (for namespaceSelectors)
    namespace_labels: Mapping[str, str] | None = None
    #: the cost bound's n of the values every evaluation of the request shares
    shared_size: int = 1
    #: rules whose configuration error (a binding's missing parameters) was reported already
    reported: set[str] = field(default_factory=set)
    #: audit annotations of ValidatingAdmissionPolicies: "<policy>/<key>" -> distinct values
    annotations: dict[str, list[str]] = field(default_factory=dict)


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
    size = 0
    # the pod narrowed for blame, per kind of rule (a binding sees the pod's creation request)
    narrowed = {False: _Narrowed(base), True: _Narrowed(admission_base)}
    custom = _custom_selection(run, target, job)
    selected = [
        *custom,
        *(c for c in _admission_rules(run.config) if _admits(run, c.rule, kind, base["object"])),
    ]
    batched: _Batched | None = None
    for compiled in selected:
        rule = compiled.rule
        admission = rule.admission is not None
        if batched is not None and id(compiled) in batched.members:
            for by, result in batched.found.get(id(compiled), ()):
                yield from _outcome_findings(run, rule, by, result, narrowed[False], where, job, notes)
            continue
        values = admission_base if admission else base
        if admission not in inputs:
            if not size:
                # n of the shared values is measured once per request, the object's once per object
                size = max(run.shared_size, input_size(base["object"]))
            try:
                inputs[admission] = env.inputs(values, size)
            except EvalError as exc:
                yield Finding(rule.id, where, f"{rule.title}: {exc}", "", str(exc)[:100])
                return
        if not admission and batched is None:
            batched = _batched(run, env, inputs[False], custom)
            if id(compiled) in batched.members:
                for by, result in batched.found.get(id(compiled), ()):
                    yield from _outcome_findings(run, rule, by, result, narrowed[False], where, job, notes)
                continue
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
            found, annotations = program.evaluate_all(env, inputs[admission], run.budget)
            outcomes.extend((program, o) for o in found)
            if annotations and binding is not None:
                for key, value in annotations:
                    # dispatcher.go auditAnnotationCollector: per policy, distinct values joined
                    values_seen = run.annotations.setdefault(f"{binding.policy}/{key}", [])
                    if value not in values_seen:
                        values_seen.append(value)
        for owner, outcome in outcomes:
            yield from _outcome_findings(run, rule, owner, outcome, narrowed[admission], where, job, notes)


def _outcome_findings(
    run: _Run,
    rule: CustomRule,
    owner: CompiledPolicy | None,
    outcome: Outcome,
    narrowed: _Narrowed,
    where: str,
    job: EffectiveJob | None,
    notes: list[str],
) -> Iterator[Finding]:
    """The findings of one outcome of ``rule`` (``owner``: the program, None for a configuration
    error), each at the paths it is blamed on; an ignored error is a note."""
    if outcome.kind == "ignored-error":
        notes.append(f"[{rule.id}] not evaluated (failurePolicy Ignore): {outcome.message}")
        return
    paths = _blame(run, owner, outcome, narrowed, where, job) if owner is not None else [where or "(object)"]
    for path in paths:
        yield _finding(rule, outcome, path)


@dataclass(frozen=True, slots=True)
class _Batched:
    """The CustomRules judged by one list program on an object (``members``: ``id`` of each
    compiled rule) and the outcomes of those that did not pass."""

    members: frozenset[int]
    found: Mapping[int, list[tuple[CompiledPolicy, Outcome]]]


_NOT_BATCHED = _Batched(frozenset(), {})


def _batched(run: _Run, env: Environment, inputs: Inputs, custom: tuple[_Compiled, ...]) -> _Batched:
    """The outcomes of the CustomRules of ``custom`` evaluated as one program (a list of their
    validations): one call into CEL per object instead of one per validation. Only rules without
    match conditions; when the list fails (one expression's error fails it) or its cost bound
    exceeds the per-call limit, its rules are evaluated one by one, as if it had not run — the
    result is the same either way."""
    plan = _batch_plan(run, env, custom)
    if plan is None:
        return _NOT_BATCHED
    bound = plan.program.cost.at(inputs.size)
    if bound > run.budget.per_call and any(
        v.expression.program.cost.at(inputs.size) > run.budget.per_call for _, _, v in plan.elements
    ):
        return _NOT_BATCHED  # one of them is stopped on its own
    trial = Budget(run.budget.remaining, float("inf"))
    try:
        results = plan.program.evaluate(inputs, trial)
    except EvalError:
        return _NOT_BATCHED
    if not isinstance(results, list):  # pragma: no cover - a list literal is a list
        return _NOT_BATCHED
    run.budget.remaining = trial.remaining
    found: dict[int, list[tuple[CompiledPolicy, Outcome]]] = {}
    for (member, program, validation), result in zip(plan.elements, results, strict=True):
        if result is not True:
            outcome = program.judged(inputs, validation, result, run.budget)
            if outcome is not None:
                found.setdefault(member, []).append((program, outcome))
    return _Batched(plan.members, found)


_MAX_CACHED = 4096  # selections and batches kept per config (beyond: computed per request)


def _cache(config: Config, name: str) -> dict[Any, Any]:
    found: dict[Any, Any] = memoized(config, (name,), dict)
    return found


def _custom_selection(run: _Run, target: str, job: EffectiveJob | None) -> tuple[_Compiled, ...]:
    """The CustomRules whose match selects ``target`` of this request, once per distinct request
    shape (target, operation, team, namespace, classification, replicated job, the labels rules
    name)."""
    config = run.config
    label_keys = _label_keys(config)
    key = (
        target,
        run.request.operation,
        run.team.name if run.team is not None else None,
        run.namespace,
        run.classification,
        job.name if job is not None else None,
        tuple(run.labels.get(k) for k in label_keys),
    )
    cache = _cache(config, "policy.custom.selections")
    found: tuple[_Compiled, ...] | None = cache.get(key)
    if found is None:
        found = tuple(
            c
            for c in _by_target(config)[target]
            if c.rule.admission is None
            and c.applies(
                target, run.request.operation, run.team, run.namespace, run.labels, run.classification, job
            )
        )
        if len(cache) < _MAX_CACHED:
            cache[key] = found
    return found


def _label_keys(config: Config) -> tuple[str, ...]:
    def build() -> tuple[str, ...]:
        return tuple(sorted({k for c in _compiled(config) for k, _ in c.labels}))

    found: tuple[str, ...] = memoized(config, ("policy.custom.label-keys",), build)
    return found


def _admission_rules(config: Config) -> tuple[_Compiled, ...]:
    def build() -> tuple[_Compiled, ...]:
        return tuple(c for c in _compiled(config) if c.rule.admission is not None)

    found: tuple[_Compiled, ...] = memoized(config, ("policy.custom.admission",), build)
    return found


@dataclass(frozen=True, slots=True)
class _Plan:
    """CustomRules judged together: their validations as one list program."""

    members: frozenset[int]
    program: Program
    #: (``id`` of the compiled rule, its program, the validation) of each element of the list
    elements: tuple[tuple[int, CompiledPolicy, Validation], ...]


def _batch_plan(run: _Run, env: Environment, custom: tuple[_Compiled, ...]) -> _Plan | None:
    """The programs of the CustomRules ``custom`` judged together and their list program, once per
    config, team and set of rules (compiled on first use; None: fewer than two)."""
    team = run.team.name if run.team is not None else None
    key = (team, tuple(map(id, custom)))
    cache = _cache(run.config, "policy.custom.batches")
    if key in cache:
        found: _Plan | None = cache[key]
        return found
    members = [
        (c, c.policies(run.team, run.namespace))
        for c in custom
        if all(
            not p.match_conditions and not p.audit_annotations for p in c.policies(run.team, run.namespace)
        )
    ]
    plan: _Plan | None = None
    if len(members) > 1:
        elements = tuple((id(c), p, v) for c, ps in members for p in ps for v in p.validations)
        source = "[" + ", ".join(v.expression.program.source for _, _, v in elements) + "]"
        try:
            program = env.compile(source, limit_length=False)
        except CompileError:  # pragma: no cover - each part compiled on its own
            program = None
        if program is not None:
            plan = _Plan(frozenset(id(c) for c, _ in members), program, elements)
    if len(cache) < _MAX_CACHED:
        cache[key] = plan
    return plan


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
    narrowed: _Narrowed,
    where: str,
    job: EffectiveJob | None,
) -> list[str]:
    validation = outcome.validation
    if job is None or validation is None:
        field = validation.field_path if validation is not None else ""
        return [f"{where}{'.' if where and field else ''}{field}" if field else (where or "(object)")]
    items = _blamed_items(run, policy, validation, narrowed)
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


@dataclass
class _Narrowed:
    """One object's pod with one list narrowed — to nothing, to one item, or to one item without one
    field — as CEL inputs: converted on first use and shared by every rule blamed on the pod (each
    conversion costs more than an evaluation)."""

    base: Mapping[str, Any]
    #: the cost bound's n: a narrowed pod is no larger than the pod, so it is measured once
    size: int = 0
    # keyed by (list, index, field): a field's key is whatever the object has (a YAML key may be a number)
    inputs: dict[tuple[str, int, Any], Inputs | None] = field(default_factory=dict)

    def get(self, run: _Run, list_field: str, index: int, removed: Any) -> Inputs | None:
        """The inputs with ``list_field`` narrowed to item ``index`` (-1: none) without its field
        ``removed`` (None: whole); None when they cannot be represented in CEL."""
        key = (list_field, index, removed)
        if key in self.inputs:
            return self.inputs[key]
        pod = self.base["object"]
        spec = pod.get("spec") or {}
        if not self.size:
            self.size = max(run.shared_size, input_size(pod))
        items: list[Any] = []
        if index >= 0:
            item = spec[list_field][index]
            items.append(item if removed is None else {n: v for n, v in item.items() if n != removed})
        narrowed = {**pod, "spec": {**spec, list_field: items}}
        try:
            found: Inputs | None = _environment().inputs({**self.base, "object": narrowed}, self.size)
        except EvalError:
            found = None
        self.inputs[key] = found
        return found


def _blamed_items(
    run: _Run, policy: CompiledPolicy, validation: Validation, narrowed: _Narrowed
) -> list[tuple[str, int, str]]:
    """The items (containers, volumes...) a violation comes from — each alone still violates, and
    the pod without that list does not — and, within an item, the fields whose removal mends it
    (``""``: the item as a whole); only evaluated for a violation, never on a passing pod."""
    env = _environment()
    spec = narrowed.base["object"].get("spec") or {}
    out: list[tuple[str, int, str]] = []

    def violates(list_field: str, index: int, removed: Any = None) -> bool:
        inputs = narrowed.get(run, list_field, index, removed)
        if inputs is None:
            return False
        verdict = policy.check(env, inputs, validation, run.budget)
        return verdict is not None and verdict.kind == "violation"

    for list_field in _LISTS:
        items = spec.get(list_field)
        if not isinstance(items, list) or len(items) < 1:
            continue
        if violates(list_field, -1):
            continue  # the violation does not come from this list (a pod's volumes for its containers)
        for index, item in enumerate(items):
            if not violates(list_field, index):
                continue
            keys = (
                [k for k in item if k != "name" and not violates(list_field, index, k)]
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
    today: dt.date | None = None,
    annotations: dict[str, str] | None = None,
) -> list[Finding]:
    """Every custom rule's findings on ``obj`` (a TrainJob, MPIJob or runtime) and, when
    ``resolution`` is given, on each of its effective pods. Errors the failure policy ignores become
    ``notes`` (warnings); the ValidatingAdmissionPolicies' audit annotations are added to
    ``annotations`` (``<policy>/<key>``: the value, distinct values joined with ``, ``). ``today``
    decides the Pod Security labels of the namespace (its exceptions) for namespaceSelectors."""
    if not config.custom_rules:
        return []
    run = _Run(config, request, team, namespace, name, labels, classification, Budget())
    if namespace and _selects_namespaces(config):
        run.namespace_labels = _namespace_labels(config, namespace, today or dt.datetime.now(dt.UTC).date())
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
    # n of what every evaluation shares (the admission request of a pod is no larger)
    run.shared_size = input_size(shared)
    first = {**shared, "object": plain}
    if "oldObject" in reads and old is not None:
        first["oldObject"] = thaw(old)
        run.shared_size = max(run.shared_size, input_size(first["oldObject"]))
    out = list(_judge(run, target, first, "", None, notes))
    if resolution is not None:
        root = f"runtime {resolution.runtime_name}: " if target == "Runtime" else ""
        for job in resolution.jobs:
            base = {**shared, "object": _pod(job, namespace)}
            if "replicatedJob" in reads:
                base["replicatedJob"] = _replicated(job)
            out.extend(_judge(run, "Pod", base, root, job, notes))
    if annotations is not None:
        for key, values in run.annotations.items():
            annotations[key] = ", ".join(values)
    return out


def _namespace_labels(config: Config, namespace: str, today: dt.date) -> Mapping[str, str]:
    """The namespace's labels in the cluster (render's Namespace objects): once per config and day
    for a team's namespaces; a namespace of no team has only its name label."""
    from mpigate.render.context import namespace_labels

    if config.team_for_namespace(namespace) is None:
        return namespace_labels(config, namespace, today)

    def build() -> Mapping[str, str]:
        return namespace_labels(config, namespace, today)

    found: Mapping[str, str] = memoized(config, ("policy.custom.namespace-labels", namespace, today), build)
    return found
