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

What is derived once per config (programs, match sets, modes, digests, list programs) is in
:mod:`.custom_compiled`; where a pod's violation is reported, in :mod:`.custom_blame`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_
from typing import Any

from mpigate.cel import Budget, EvalError, Inputs
from mpigate.cel.cost import input_size
from mpigate.cel.reads import Need, prune
from mpigate.cel.validation import CompiledPolicy, Outcome
from mpigate.config import Config
from mpigate.config.admission import POD_CREATOR, binding_matches
from mpigate.config.crossfile.customrules import _environment
from mpigate.config.frozen import thaw
from mpigate.config.model import CustomRule, Team
from mpigate.trainjob import EffectiveJob, Resolution

from .custom_blame import Narrowed, blame
from .custom_compiled import (
    MAX_CACHED,
    CompiledRule,
    Plan,
    RuleMeta,
    Selection,
    admission_rules,
    by_target,
    config_cache,
    custom_rule_meta,
    input_needs,
    inputs_read,
    joint_program,
    rule_label_keys,
    selection,
    selects_namespaces,
)
from .decision import AdmissionInput
from .findings import Finding
from .prepared import memoized

__all__ = ["RuleMeta", "custom_findings", "custom_rule_meta"]


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


def _pod_view(job: EffectiveJob, namespace: str) -> dict[str, Any]:
    """The effective pod as a ``v1`` Pod, sharing the (frozen) template's values."""
    meta = dict(job.metadata)
    if namespace:
        meta.setdefault("namespace", namespace)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": job.spec}


def _pod(job: EffectiveJob, namespace: str) -> dict[str, Any]:
    """The effective pod as a plain ``v1`` Pod."""
    found: dict[str, Any] = thaw(_pod_view(job, namespace))
    return found


def _cut(needs: Mapping[str, Need], name: str, value: Any) -> tuple[Any, int]:
    """``value`` as the input ``name`` — cut down to what the config's expressions read of it — and
    the cost bound's n of all of it; whole when it holds what CEL cannot represent (its evaluation
    then fails as it always did)."""
    found = prune(value, needs.get(name))
    if found is not None:
        return found
    plain = thaw(value)
    return plain, input_size(plain)


def _labels(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object's labels as a binding's objectSelector reads them."""
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    found: dict[str, Any] = thaw(labels) if isinstance(labels, Mapping) else {}
    return found


def _replicated(job: EffectiveJob) -> dict[str, Any]:
    return {"name": job.name, "replicas": job.replicas, "parallelism": job.parallelism, "pods": job.pods}


def _admits(run: _Run, rule: CustomRule, kind: str, labels: Mapping[str, Any]) -> bool:
    """Whether a binding selects the request for an object of ``kind`` with ``labels`` (a pod: its
    creation)."""
    admission = rule.admission
    if admission is None:
        return False
    pod = kind == "Pod"
    return binding_matches(
        admission.constraints,
        kind,
        "CREATE" if pod else run.request.operation,
        "" if kind == "ClusterTrainingRuntime" else run.namespace,
        "" if pod else run.name,
        labels,
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


@dataclass
class _Object:
    """One object judged: ``base`` holds the inputs with the object as the rules read it, ``whole``
    the object itself, ``size`` the cost bound's n of the object and the shared inputs; what a
    ValidatingAdmissionPolicy sees of a pod (its creation request) and the pods narrowed for blame
    are built when first needed."""

    target: str
    base: Mapping[str, Any]
    whole: Mapping[str, Any]
    size: int
    where: str
    job: EffectiveJob | None
    #: the results of a plan's list program on this object, evaluated with other pods' (_prejudge)
    prejudged: tuple[Plan, list[Any]] | None = None
    _admission_base: Mapping[str, Any] | None = None
    _narrowed: dict[bool, Narrowed] = field(default_factory=dict)
    _inputs: dict[bool, Inputs] = field(default_factory=dict)
    _selection: Selection | None = None

    def inputs(self, admission: bool) -> Inputs:
        """The activation of :meth:`values` (converted once; :class:`EvalError` when it cannot be
        built)."""
        found = self._inputs.get(admission)
        if found is None:
            found = self._inputs[admission] = _environment().inputs(self.values(admission), self.size)
        return found

    def selection(self, run: _Run) -> Selection:
        """The CustomRules that may judge this object, with their list program."""
        if self._selection is None:
            self._selection = _custom_selection(run, self.target, self.job)
        return self._selection

    def results(self, plan: Plan) -> list[Any] | None:
        """What ``plan``'s list program gave on this object when it was judged with other pods."""
        prejudged = self.prejudged
        return prejudged[1] if prejudged is not None and prejudged[0] is plan else None

    def values(self, admission: bool) -> Mapping[str, Any]:
        """The inputs of a CustomRule, or of a binding (``admission``): a pod is judged by a
        ValidatingAdmissionPolicy as the request that will create it."""
        if not admission or self.target != "Pod":
            return self.base
        if self._admission_base is None:
            base = self.base
            self._admission_base = {
                **base,
                "request": {
                    **base["request"],
                    "operation": "CREATE",
                    "userInfo": dict(POD_CREATOR),
                    "name": "",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                },
            }
        return self._admission_base

    def narrowed(self, admission: bool) -> Narrowed:
        """The pod narrowed for blame, per kind of rule (shared by every rule blamed on it)."""
        found = self._narrowed.get(admission)
        if found is None:
            found = self._narrowed[admission] = Narrowed(self.values(admission), self.whole, self.size)
        return found


def _judge(run: _Run, obj: _Object, notes: list[str]) -> Iterator[Finding]:
    """The findings on one object: its CustomRules (those without match conditions as one list
    program), then the ValidatingAdmissionPolicy bindings that select it."""
    env = _environment()
    chosen = obj.selection(run)
    custom = chosen.rules
    bindings = admission_rules(run.config)
    admitted: list[CompiledRule] = []
    if bindings:
        kind = run.request.kind if obj.target == "Runtime" else obj.target
        labels = _labels(obj.whole)
        admitted = [c for c in bindings if _admits(run, c.rule, kind, labels)]
    batched: _Batched | None = None
    if custom and chosen.batched_all and not admitted:
        # the common case: one list program judges every rule; only what fails is looked at
        known = obj.results(chosen.plan) if chosen.plan is not None else None
        try:
            if known is None or not _all_true(known):
                obj.inputs(False)  # built first, as for a rule judged on its own
        except EvalError as exc:
            rule = custom[0].rule
            yield Finding(rule.id, obj.where, f"{rule.title}: {exc}", "", str(exc)[:100])
            return
        batched = _batched(run, obj, chosen.plan)
        if batched is not _NOT_BATCHED:
            if batched.found:
                for compiled in custom:
                    for by, result in batched.found.get(id(compiled), ()):
                        yield from _outcome_findings(run, compiled.rule, by, result, obj, False, notes)
            return
    for compiled in (*custom, *admitted):
        rule = compiled.rule
        admission = rule.admission is not None
        if batched is not None and id(compiled) in batched.members:
            for by, result in batched.found.get(id(compiled), ()):
                yield from _outcome_findings(run, rule, by, result, obj, False, notes)
            continue
        try:
            inputs = obj.inputs(admission)
        except EvalError as exc:
            yield Finding(rule.id, obj.where, f"{rule.title}: {exc}", "", str(exc)[:100])
            return
        if not admission and batched is None:
            batched = _batched(run, obj, chosen.plan)
            if id(compiled) in batched.members:
                for by, result in batched.found.get(id(compiled), ()):
                    yield from _outcome_findings(run, rule, by, result, obj, False, notes)
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
            found, annotations = program.evaluate_all(env, inputs, run.budget)
            outcomes.extend((program, o) for o in found)
            if annotations and binding is not None:
                for key, value in annotations:
                    # dispatcher.go auditAnnotationCollector: per policy, distinct values joined
                    values_seen = run.annotations.setdefault(f"{binding.policy}/{key}", [])
                    if value not in values_seen:
                        values_seen.append(value)
        for owner, outcome in outcomes:
            yield from _outcome_findings(run, rule, owner, outcome, obj, admission, notes)


def _outcome_findings(
    run: _Run,
    rule: CustomRule,
    owner: CompiledPolicy | None,
    outcome: Outcome,
    obj: _Object,
    admission: bool,
    notes: list[str],
) -> Iterator[Finding]:
    """The findings of one outcome of ``rule`` (``owner``: the program, None for a configuration
    error), each at the paths it is blamed on; an ignored error is a note."""
    if outcome.kind == "ignored-error":
        notes.append(f"[{rule.id}] not evaluated (failurePolicy Ignore): {outcome.message}")
        return
    paths = (
        blame(owner, outcome, obj.narrowed(admission), obj.where, obj.job, run.budget)
        if owner is not None
        else [obj.where or "(object)"]
    )
    for path in paths:
        yield _finding(rule, outcome, path)


@dataclass(frozen=True, slots=True)
class _Batched:
    """The CustomRules judged by one list program on an object (``members``: ``id`` of each
    compiled rule) and the outcomes of those that did not pass."""

    members: frozenset[int]
    found: Mapping[int, list[tuple[CompiledPolicy, Outcome]]]


_NOT_BATCHED = _Batched(frozenset(), {})


def _all_true(results: list[Any]) -> bool:
    """Whether every result is ``True`` itself (not 1, not a non-empty value): one C loop."""
    return all(map(is_, results, repeat(True)))


def _batched(run: _Run, obj: _Object, plan: Plan | None) -> _Batched:
    """The outcomes of the CustomRules of ``plan`` evaluated as one program (a list of their
    validations): one call into CEL per object (or per request's pods, :func:`_prejudge`) instead of
    one per validation. Only rules without match conditions; when the list fails (one expression's
    error fails it) or its cost bound exceeds the per-call limit, its rules are evaluated one by
    one, as if it had not run — the result is the same either way."""
    if plan is None:
        return _NOT_BATCHED
    size = obj.size
    bound = plan.program.bound(size)
    if bound > run.budget.per_call and any(
        v.expression.program.bound(size) > run.budget.per_call for _, _, v in plan.elements
    ):
        return _NOT_BATCHED  # one of them is stopped on its own
    trial = Budget(run.budget.remaining, float("inf"))
    results = obj.results(plan)
    try:
        if results is None:
            results = plan.program.evaluate(obj.inputs(False), trial)
        else:
            plan.program.charge(size, trial)  # what evaluating it here would have taken
    except EvalError:
        return _NOT_BATCHED
    if not isinstance(results, list):  # pragma: no cover - a list literal is a list
        return _NOT_BATCHED
    run.budget.remaining = trial.remaining
    found: dict[int, list[tuple[CompiledPolicy, Outcome]]] = {}
    if len(results) == len(plan.elements) and _all_true(results):
        return _Batched(plan.members, found)  # every rule holds: nothing to look at
    for (member, program, validation), result in zip(plan.elements, results, strict=True):
        if result is not True:
            outcome = program.judged(obj.inputs(False), validation, result, run.budget)
            if outcome is not None:
                found.setdefault(member, []).append((program, outcome))
    return _Batched(plan.members, found)


def _prejudge(run: _Run, pods: list[_Object], shared: Mapping[str, Any]) -> None:
    """Evaluate the pods' list programs for all of them in one call (:func:`joint_program`), for
    :func:`_batched` to take each pod's results from when it judges the pod — where, in the
    request's order, it charges the budget as it always did. Only pods whose list program
    :func:`_batched` would run, and only when their bounds together fit in what is left of the
    request's budget (so that no more is evaluated than the budget allows); any error leaves every
    pod to be judged on its own."""
    per_call = run.budget.per_call
    total = 0.0
    chosen: list[tuple[_Object, Plan]] = []
    for obj in pods:
        plan = obj.selection(run).plan
        if plan is None:
            continue
        bound = plan.program.bound(obj.size)
        if bound > per_call and any(
            v.expression.program.bound(obj.size) > per_call for _, _, v in plan.elements
        ):
            continue  # _batched does not run it
        chosen.append((obj, plan))
        if plan.program.cost.degree > 0:
            total += bound
    if len(chosen) < 2 or total > run.budget.remaining:
        return
    # the pods by plan, in the order each plan first appears (what the joint program is kept by)
    groups: dict[int, tuple[Plan, list[_Object]]] = {}
    for obj, plan in chosen:
        groups.setdefault(id(plan), (plan, []))[1].append(obj)
    env = _environment()
    program = joint_program(run.config, env, tuple(plan for plan, _ in groups.values()))
    if program is None:  # pragma: no cover - each list compiled
        return
    lists = [[[o.base["object"], o.base.get("replicatedJob")] for o in objs] for _, objs in groups.values()]
    try:
        results = program.value(env.inputs({**shared, "object": lists}, 1))
    except EvalError:
        return
    if not isinstance(results, list) or len(results) != len(groups):  # pragma: no cover
        return
    for (plan, objs), found in zip(groups.values(), results, strict=True):
        if not isinstance(found, list) or len(found) != len(objs):  # pragma: no cover
            continue
        for obj, each in zip(objs, found, strict=True):
            if isinstance(each, list):
                obj.prejudged = (plan, each)


def _custom_selection(run: _Run, target: str, job: EffectiveJob | None) -> Selection:
    """The CustomRules whose match selects ``target`` of this request and their list program, once
    per distinct request shape (target, operation, team, namespace, classification, replicated
    job, the labels rules name)."""
    config = run.config
    label_keys = rule_label_keys(config)
    key = (
        target,
        run.request.operation,
        run.team.name if run.team is not None else None,
        run.namespace,
        run.classification,
        job.name if job is not None else None,
        tuple(run.labels.get(k) for k in label_keys),
    )
    cache = config_cache(config, "policy.custom.selections")
    found: Selection | None = cache.get(key)
    if found is None:
        rules = tuple(
            c
            for c in by_target(config)[target]
            if c.rule.admission is None
            and c.applies(
                target, run.request.operation, run.team, run.namespace, run.labels, run.classification, job
            )
        )
        found = selection(config, run.team, run.namespace, _environment(), rules)
        if len(cache) < MAX_CACHED:
            cache[key] = found
    return found


_JOBS = ("TrainJob", "MPIJob")
_SHARED = frozenset({"team", "trainJob", "runtime", "namespaceObject"})


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
    if namespace and selects_namespaces(config):
        run.namespace_labels = _namespace_labels(config, namespace, today or dt.datetime.now(dt.UTC).date())
    reads = inputs_read(config)
    # the job, runtime and pods as the rules read them: converting what no rule reads into CEL
    # values costs more than judging them (the cost bound's n is measured on all of each)
    needs = input_needs(config)
    plain, plain_size = _cut(needs, "object", obj)
    # request is always built: a pod's ValidatingAdmissionPolicy request is derived from it
    shared: dict[str, Any] = {"request": _request_value(request, namespace, name)}
    sizes = [len(shared) + len(reads & _SHARED), input_size(shared["request"])]
    if "team" in reads:
        shared["team"] = _team_value(team, classification)
        sizes.append(input_size(shared["team"]))
    if "trainJob" in reads:
        shared["trainJob"], size = _cut(needs, "trainJob", obj) if target in _JOBS else (None, 1)
        sizes.append(size)
    if "runtime" in reads:
        found = runtime if runtime is not None else (obj if target == "Runtime" else None)
        shared["runtime"], size = _cut(needs, "runtime", found) if found is not None else (None, 1)
        sizes.append(size)
    if "namespaceObject" in reads:
        shared["namespaceObject"] = {"metadata": {"name": namespace}} if namespace else None
        sizes.append(input_size(shared["namespaceObject"]))
    # n of what every evaluation shares (the admission request of a pod is no larger)
    run.shared_size = max(sizes)
    first = {**shared, "object": plain}
    if "oldObject" in reads and old is not None:
        first["oldObject"], size = _cut(needs, "oldObject", old)
        run.shared_size = max(run.shared_size, size)
    out = list(_judge(run, _Object(target, first, obj, max(run.shared_size, plain_size), "", None), notes))
    if resolution is not None:
        root = f"runtime {resolution.runtime_name}: " if target == "Runtime" else ""
        pods: list[_Object] = []
        for job in resolution.jobs:
            pod = _pod_view(job, namespace)
            base = {**shared}
            base["object"], size = _cut(needs, "object", pod)
            if "replicatedJob" in reads:
                base["replicatedJob"] = _replicated(job)
            pods.append(_Object("Pod", base, pod, max(run.shared_size, size), root, job))
        if len(pods) > 1:
            _prejudge(run, pods, shared)
        for each in pods:
            out.extend(_judge(run, each, notes))
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
