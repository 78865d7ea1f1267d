"""CustomRules and ValidatingAdmissionPolicy bindings as the engine judges them, derived once per
config (:func:`mpigate.policy.prepared.memoized`): each rule's programs per parameter object and
team, its match read into sets, its mode and audit digest, the rules that may judge each target,
the optional inputs any rule reads, and the list programs that judge a request's rules together."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpigate.cel.env import CompileError, Environment, Program
from mpigate.cel.reads import Need, merge
from mpigate.cel.validation import CompiledPolicy, Validation
from mpigate.config import Config
from mpigate.config.crossfile.customrules import compile_rule
from mpigate.config.frozen import thaw
from mpigate.config.model import CustomRule, Mode, Team
from mpigate.trainjob import EffectiveJob

from .prepared import memoized

__all__ = [
    "EACH_POD",
    "MAX_CACHED",
    "TARGETS",
    "CompiledRule",
    "Plan",
    "RuleMeta",
    "Selection",
    "admission_rules",
    "batch_plan",
    "by_target",
    "compiled_rules",
    "config_cache",
    "custom_rule_meta",
    "input_needs",
    "inputs_read",
    "joint_program",
    "joint_source",
    "rule_label_keys",
    "selection",
    "selects_namespaces",
]


@dataclass(frozen=True, slots=True)
class RuleMeta:
    """What :func:`mpigate.policy.engine` needs to turn a custom finding into a violation:
    ``digest`` fixes the rule's compiled expressions (written into each audit record)."""

    mode: Mode
    controls: tuple[str, ...]
    digest: str


@dataclass(frozen=True, slots=True)
class CompiledRule:
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


def mode_for(config: Config, rule: CustomRule) -> Mode:
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


def compiled_rules(config: Config) -> tuple[CompiledRule, ...]:
    def program(rule: CustomRule, params: Any) -> CompiledPolicy:
        compiled = compile_rule(rule.spec, params)
        if not isinstance(compiled, CompiledPolicy):  # pragma: no cover - check refuses such a tree
            raise ValueError(f"rule {rule.id} does not compile")
        return compiled

    def build() -> tuple[CompiledRule, ...]:
        out: list[CompiledRule] = []
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
                CompiledRule(
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

    found: tuple[CompiledRule, ...] = memoized(config, ("policy.custom.compiled",), build)
    return found


def by_target(config: Config) -> Mapping[str, tuple[CompiledRule, ...]]:
    """The rules that may judge each target (once per config): a CustomRule under the targets of
    its match, a ValidatingAdmissionPolicy binding under every target (its constraints decide)."""

    def build() -> Mapping[str, tuple[CompiledRule, ...]]:
        compiled = compiled_rules(config)
        return {
            target: tuple(c for c in compiled if c.rule.admission is not None or target in c.targets)
            for target in TARGETS
        }

    found: Mapping[str, tuple[CompiledRule, ...]] = memoized(config, ("policy.custom.by-target",), build)
    return found


def selects_namespaces(config: Config) -> bool:
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


TARGETS = ("TrainJob", "MPIJob", "Runtime", "Pod")
_OPTIONAL_INPUTS = ("oldObject", "request", "trainJob", "runtime", "replicatedJob", "team", "namespaceObject")
_INPUT_NAME = re.compile(r"\b(" + "|".join(_OPTIONAL_INPUTS) + r")\b")


def inputs_read(config: Config) -> frozenset[str]:
    """The optional inputs any rule's expressions name (once per config): only those are built
    and converted for each object and pod — the job and runtime manifests are the bulk of it."""

    def build() -> frozenset[str]:
        text = " ".join(json.dumps(thaw(rule.spec), default=str) for rule in config.custom_rules)
        return frozenset(_INPUT_NAME.findall(text))

    found: frozenset[str] = memoized(config, ("policy.custom.reads",), build)
    return found


def input_needs(config: Config) -> Mapping[str, Need]:
    """What the config's expressions can observe of each input, united over every program of every
    rule (match conditions, validations, messageExpressions, auditAnnotations; once per config):
    the object, the job and the runtime are cut down to it before conversion
    (:func:`mpigate.cel.reads.prune`)."""

    def build() -> Mapping[str, Need]:
        programs: list[Program] = []
        for compiled in compiled_rules(config):
            chosen = [*compiled.default, *(p for ps in compiled.per_team.values() for p in ps)]
            for _, policy in chosen:
                programs.extend(e.program for _, e in policy.match_conditions)
                programs.extend(e.program for _, e in policy.audit_annotations)
                for v in policy.validations:
                    programs.append(v.expression.program)
                    if v.message_expression is not None:
                        programs.append(v.message_expression.program)
        return merge(p.reads for p in programs)

    found: Mapping[str, Need] = memoized(config, ("policy.custom.input-needs",), build)
    return found


def custom_rule_meta(config: Config) -> Mapping[str, RuleMeta]:
    """Mode and controls of every custom rule, by ID (once per config)."""

    def build() -> Mapping[str, RuleMeta]:
        return {
            c.rule.id: RuleMeta(mode_for(config, c.rule), c.rule.controls, c.digest)
            for c in compiled_rules(config)
        }

    found: Mapping[str, RuleMeta] = memoized(config, ("policy.custom.meta",), build)
    return found


MAX_CACHED = 4096  # selections and batches kept per config (beyond: computed per request)


def config_cache(config: Config, name: str) -> dict[Any, Any]:
    found: dict[Any, Any] = memoized(config, (name,), dict)
    return found


def rule_label_keys(config: Config) -> tuple[str, ...]:
    def build() -> tuple[str, ...]:
        return tuple(sorted({k for c in compiled_rules(config) for k, _ in c.labels}))

    found: tuple[str, ...] = memoized(config, ("policy.custom.label-keys",), build)
    return found


def admission_rules(config: Config) -> tuple[CompiledRule, ...]:
    def build() -> tuple[CompiledRule, ...]:
        return tuple(c for c in compiled_rules(config) if c.rule.admission is not None)

    found: tuple[CompiledRule, ...] = memoized(config, ("policy.custom.admission",), build)
    return found


@dataclass(frozen=True, slots=True)
class Plan:
    """CustomRules judged together: their validations as one list program."""

    members: frozenset[int]
    program: Program
    #: (``id`` of the compiled rule, its program, the validation) of each element of the list
    elements: tuple[tuple[int, CompiledPolicy, Validation], ...]


#: The variable the joint program over a request's pods (:func:`joint_program`) binds each
#: ``[pod, replicatedJob]`` entry of its lists to: a name no expression of a rule can read (each
#: compiled on its own, where it is not declared), shadowed by a rule's own variable of that name.
EACH_POD = "__mpigate_pod"


def joint_source(plans: tuple[Plan, ...]) -> str:
    """The list programs of ``plans`` evaluated for the pods of a request in one call: ``object``
    holds one list of ``[pod, replicatedJob]`` entries per plan, and the list program of
    ``plans[i]`` is mapped over ``object[i]`` with ``object`` and ``replicatedJob`` bound to each
    entry's — one activation, one conversion and one call instead of one per pod (the programs side
    by side in a list: no nesting that grows with their number)."""
    each = ", ".join(
        f"object[{index}].map({EACH_POD}, cel.bind(object, {EACH_POD}[0], "
        f"cel.bind(replicatedJob, {EACH_POD}[1], {plan.program.source})))"
        for index, plan in enumerate(plans)
    )
    return f"[{each}]"


def joint_program(config: Config, env: Environment, plans: tuple[Plan, ...]) -> Program | None:
    """:func:`joint_source` compiled, once per config and sequence of plans (None: it does not
    compile). Kept by the plans' ``id`` with the plans themselves, so that no other plan can take
    an ``id`` while the entry lives."""
    key = tuple(map(id, plans))
    cache = config_cache(config, "policy.custom.joint")
    found: tuple[tuple[Plan, ...], Program | None] | None = cache.get(key)
    if found is not None:
        return found[1]
    try:
        program: Program | None = env.compile(joint_source(plans), limit_length=False)
    except CompileError:  # pragma: no cover - each list compiled, side by side
        program = None
    if len(cache) < MAX_CACHED:
        cache[key] = (plans, program)
    return program


def batch_plan(
    config: Config, team: Team | None, namespace: str, env: Environment, custom: tuple[CompiledRule, ...]
) -> Plan | None:
    """The programs of the CustomRules ``custom`` judged together and their list program, once per
    config, team and set of rules (compiled on first use; None: fewer than two)."""
    key = (team.name if team is not None else None, tuple(map(id, custom)))
    cache = config_cache(config, "policy.custom.batches")
    if key in cache:
        found: Plan | None = cache[key]
        return found
    members = [
        (c, c.policies(team, namespace))
        for c in custom
        if all(not p.match_conditions and not p.audit_annotations for p in c.policies(team, namespace))
    ]
    plan: Plan | None = None
    if len(members) > 1:
        elements = tuple((id(c), p, v) for c, ps in members for p in ps for v in p.validations)
        source = "[" + ", ".join(v.expression.program.source for _, _, v in elements) + "]"
        try:
            program = env.compile(source, limit_length=False)
        except CompileError:  # pragma: no cover - each part compiled on its own
            program = None
        if program is not None:
            plan = Plan(frozenset(id(c) for c, _ in members), program, elements)
    if len(cache) < MAX_CACHED:
        cache[key] = plan
    return plan


@dataclass(frozen=True, slots=True)
class Selection:
    """The CustomRules that judge one shape of request and object (in the config's order) and the
    list program that judges those of them without match conditions together (None: fewer than
    two); ``batched_all``: that program judges every one of them."""

    rules: tuple[CompiledRule, ...]
    plan: Plan | None
    batched_all: bool


def selection(
    config: Config, team: Team | None, namespace: str, env: Environment, rules: tuple[CompiledRule, ...]
) -> Selection:
    """``rules`` with their list program (:func:`batch_plan`)."""
    plan = batch_plan(config, team, namespace, env, rules) if rules else None
    return Selection(rules, plan, plan is not None and len(plan.members) == len(rules))
