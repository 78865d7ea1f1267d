"""A validating policy in CEL: match conditions, variables, validations and a failure policy, with
the semantics of Kubernetes' ValidatingAdmissionPolicy (k8s.io/apiserver
pkg/admission/plugin/policy/validating/validator.go ``(*validator).Validate`` and
pkg/admission/plugin/cel/composition.go for variables). mpigate's CustomRule and the adapter for
the cluster's own ValidatingAdmissionPolicies both compile into a :class:`CompiledPolicy`.

Each expression is compiled twice: on its own in an environment that declares ``params`` and
``variables`` (so that a compile error is located in that expression, for ``mpigate check``), and
wrapped in ``cel.bind`` for evaluation, where ``params`` is the policy's parameter object (known
when the config is loaded, so it is part of the program, not converted per request) and
``variables`` the variables the expression reads (directly or through other variables), in
declaration order. The API server evaluates a variable lazily, once per request; here a variable is
evaluated with each expression that reads it — the same results, and an error in a variable fails
only the expressions that read it, as there. The length limit of an expression applies to what
was written, not to the wrapped program.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .env import Budget, CompileError, Environment, EvalError, Inputs, Issue, Program

__all__ = [
    "VARIABLES",
    "CompiledPolicy",
    "Expression",
    "Outcome",
    "PolicyIssue",
    "Validation",
    "compile_policy",
    "environment",
]

# What an expression may read. ``object``/``oldObject``/``request``/``params``/``variables``/
# ``namespaceObject`` as in the API server (authorizer is not available offline); ``trainJob``,
# ``runtime``, ``replicatedJob`` and ``team`` are mpigate's.
VARIABLES = (
    "object",
    "oldObject",
    "request",
    "params",
    "variables",
    "namespaceObject",
    "trainJob",
    "runtime",
    "replicatedJob",
    "team",
)
FailurePolicy = Literal["Fail", "Ignore"]


def environment() -> Environment:
    """The environment every policy compiles in (build once and keep: it is not cheap)."""
    return Environment(VARIABLES)


@dataclass(frozen=True, slots=True)
class PolicyIssue:
    """A compile error: ``path`` is the JSON path of the expression in the policy's document."""

    path: tuple[str | int, ...]
    issue: Issue


@dataclass(frozen=True, slots=True)
class Expression:
    source: str
    program: Program  # wrapped with params and variables, for evaluation

    @property
    def digest(self) -> str:
        return self.program.digest


@dataclass(frozen=True, slots=True)
class Validation:
    index: int
    expression: Expression
    message: str
    message_expression: Expression | None
    reason: str
    field_path: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """One result of evaluating a policy on one object.

    ``kind``: ``violation`` (a validation is false), ``error`` (an expression failed and the
    failure policy is Fail), ``ignored-error`` (failed, failure policy Ignore)."""

    kind: Literal["violation", "error", "ignored-error"]
    message: str
    validation: Validation | None = None
    reason: str = ""


# dispatcher.go maxAuditAnnotationValueLength
MAX_AUDIT_ANNOTATION_VALUE = 10 * 1024


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    match_conditions: tuple[tuple[str, Expression], ...]
    validations: tuple[Validation, ...]
    failure_policy: FailurePolicy
    digest: str
    #: a ValidatingAdmissionPolicy's auditAnnotations: (key, valueExpression)
    audit_annotations: tuple[tuple[str, Expression], ...] = ()

    def evaluate(self, env: Environment, inputs: Inputs, budget: Budget | None = None) -> list[Outcome]:
        """The outcomes on ``inputs``: nothing when a match condition is false or all validations
        hold (validator.go: match conditions first, an error there follows the failure policy)."""
        return self.evaluate_all(env, inputs, budget)[0]

    def evaluate_all(
        self, env: Environment, inputs: Inputs, budget: Budget | None = None
    ) -> tuple[list[Outcome], list[tuple[str, str]]]:
        """The outcomes and the audit annotations (key, value) on ``inputs``: validator.go
        ``(*validator).Validate`` — match conditions, validations, then auditAnnotations (a string
        value is published trimmed, an empty one or null is not; an error follows the failure
        policy, Ignore leaving the annotation out; any other type is an error that denies)."""
        for name, condition in self.match_conditions:
            try:
                matched = condition.program.evaluate(inputs, budget)
            except EvalError as exc:
                return [self._error(f"failed to evaluate matchCondition {name!r}: {exc}")], []
            if matched is not True:
                if matched is False:
                    return [], []
                return [self._error(f"matchCondition {name!r} returned a non-boolean value")], []
        out: list[Outcome] = []
        for validation in self.validations:
            outcome = self.check(env, inputs, validation, budget)
            if outcome is not None:
                out.append(outcome)
        annotations: list[tuple[str, str]] = []
        for key, expression in self.audit_annotations:
            try:
                value = expression.program.evaluate(inputs, budget)
            except EvalError as exc:
                if self.failure_policy == "Fail":
                    out.append(Outcome("error", f"auditAnnotation {key!r}: {exc}"))
                continue
            if value is None:
                continue
            if not isinstance(value, str):
                out.append(
                    Outcome(
                        "error",
                        f"valueExpression '{expression.source}' resulted in unsupported return type: "
                        f"{type(value).__name__}. Return type must be either string or null.",
                    )
                )
                continue
            value = value.strip()
            if value:
                annotations.append((key, value[:MAX_AUDIT_ANNOTATION_VALUE]))
        return out, annotations

    def check(
        self, env: Environment, inputs: Inputs, validation: Validation, budget: Budget | None = None
    ) -> Outcome | None:
        """One validation on ``inputs`` (None: it holds)."""
        try:
            result = validation.expression.program.evaluate(inputs, budget)
        except EvalError as exc:
            return self._error(f"expression '{validation.expression.source}' resulted in error: {exc}")
        return self.judged(inputs, validation, result, budget)

    def charge_violation(self, validation: Validation, size: int, budget: Budget | None = None) -> bool:
        """What :meth:`check` of ``validation`` on inputs of size ``size`` takes from ``budget`` when
        its expression is known to be false there, without evaluating anything: the expression's
        bound and then the messageExpression's. False when the expression's bound is refused (check
        would give an error, not a violation)."""
        try:
            validation.expression.program.charge(size, budget)
        except EvalError:
            return False
        if validation.message_expression is not None:
            with contextlib.suppress(EvalError):  # _message falls back to the message
                validation.message_expression.program.charge(size, budget)
        return True

    def judged(
        self, inputs: Inputs, validation: Validation, result: Any, budget: Budget | None = None
    ) -> Outcome | None:
        """The outcome of ``validation`` whose expression gave ``result`` on ``inputs``."""
        if result is True:
            return None
        if result is not False:
            return self._error(
                f"expression '{validation.expression.source}' resulted in a non-boolean value "
                f"({type(result).__name__})"
            )
        return Outcome("violation", self._message(inputs, validation, budget), validation, validation.reason)

    def _message(self, inputs: Inputs, validation: Validation, budget: Budget | None) -> str:
        # validator.go: messageExpression's string when it evaluates to a non-empty single-line
        # string, else message, else "failed expression: <expression>"
        if validation.message_expression is not None:
            try:
                text = validation.message_expression.program.evaluate(inputs, budget)
            except EvalError:
                text = None
            if isinstance(text, str) and text.strip() and "\n" not in text:
                return text.strip()
        if validation.message:
            return validation.message
        return f"failed expression: {validation.expression.source}"

    def _error(self, message: str) -> Outcome:
        return Outcome("error" if self.failure_policy == "Fail" else "ignored-error", message)


def _literal(value: Any) -> str:
    """``value`` (JSON-like) as a CEL literal: JSON's syntax is CEL's for these values."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, default=str)


_VARIABLE_REF = re.compile(r"\bvariables\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")


def _read(source: str, variables: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The variables ``source`` reads, directly or through the variables it reads, in declaration
    order (a name in a string literal counts too: reading a variable needlessly is harmless)."""
    wanted = set(_VARIABLE_REF.findall(source))
    for name, expression in reversed(variables):  # a variable reads only earlier ones
        if name in wanted:
            wanted.update(_VARIABLE_REF.findall(expression))
    return [(name, expression) for name, expression in variables if name in wanted]


def _wrap(source: str, params: Any, variables: Sequence[tuple[str, str]]) -> str:
    # Each expression is followed by a newline before what closes around it: CEL has line comments,
    # which the API server accepts at the end of an expression ("x > 0 // why"); on one line with
    # the wrapping, the comment would swallow the closing parenthesis (a valid rule refused) — or,
    # in sources joined side by side, the expressions after it. So every program source ends with
    # a parenthesis of mpigate's own, on a line no comment of the expression reaches, which the
    # list programs that join them (policy.custom_compiled) rely on.
    bound = f"({source}\n)"
    # innermost first: each level binds `variables` to the previous names plus its own
    for level in range(len(variables), 0, -1):
        visible = variables[:level]
        entries = [f"{_literal(n)}: variables.{n}" for n, _ in visible[:-1]]
        last_name, last_expr = visible[-1]
        entries.append(f"{_literal(last_name)}: dyn({last_expr}\n)")
        bound = f"cel.bind(variables, {{{', '.join(entries)}}}, {bound})"
    # dyn, as the API server types params without a paramKind schema and each variable apart:
    # cel-cpp types a map literal's values by one of them (a list variable next to a map one made
    # `variables.theMap` a list, `params.runAsUser` a list beside `exemptImages: []`)
    return f"cel.bind(params, dyn({_literal(params)}), {bound})"


def compile_policy(
    env: Environment,
    *,
    match_conditions: Sequence[tuple[str, str]],
    variables: Sequence[tuple[str, str]],
    validations: Sequence[Mapping[str, Any]],
    failure_policy: FailurePolicy,
    params: Any,
    base: tuple[str | int, ...] = (),
    paths: Mapping[str, tuple[str | int, ...]] | None = None,
    audit_annotations: Sequence[tuple[str, str]] = (),
) -> CompiledPolicy | list[PolicyIssue]:
    """Compile a policy, or return every compile error located by JSON path and position.

    ``validations`` are mappings with ``expression`` and optionally ``message``,
    ``messageExpression``, ``reason`` and ``fieldPath``. ``paths`` names where the match
    conditions, variables and validations sit under ``base`` (defaults: ``matchConditions``,
    ``variables``, ``validations``). ``audit_annotations`` are a ValidatingAdmissionPolicy's
    (key, valueExpression), at ``auditAnnotations``.
    """
    where: dict[str, tuple[str | int, ...]] = {
        "matchConditions": ("matchConditions",),
        "variables": ("variables",),
        "validations": ("validations",),
        "auditAnnotations": ("auditAnnotations",),
    }
    where.update(paths or {})
    issues: list[PolicyIssue] = []

    def compiled(source: str, path: tuple[str | int, ...], wrap: bool = True) -> Expression | None:
        try:
            program = env.compile(source)  # located errors, against the declared variables
            if wrap and not broken_variables:
                program = env.compile(_wrap(source, params, _read(source, variables)), limit_length=False)
        except CompileError as exc:
            issues.extend(PolicyIssue((*base, *path), i) for i in exc.issues)
            return None
        return Expression(source, program)

    broken_variables = False
    for i, (_, source) in enumerate(variables):
        # a variable is checked on its own; it is evaluated inside every expression that runs
        compiled(source, (*where["variables"], i, "expression"), wrap=False)
    broken_variables = bool(issues)
    conditions: list[tuple[str, Expression]] = []
    for i, (name, source) in enumerate(match_conditions):
        found = compiled(source, (*where["matchConditions"], i, "expression"))
        if found is not None:
            conditions.append((name, found))
    checks: list[Validation] = []
    for i, spec in enumerate(validations):
        expression = compiled(str(spec.get("expression", "")), (*where["validations"], i, "expression"))
        message_expression = None
        if spec.get("messageExpression"):
            message_expression = compiled(
                str(spec["messageExpression"]), (*where["validations"], i, "messageExpression")
            )
        if expression is not None:
            checks.append(
                Validation(
                    i,
                    expression,
                    str(spec.get("message") or ""),
                    message_expression,
                    str(spec.get("reason") or "Invalid"),
                    str(spec.get("fieldPath") or ""),
                )
            )
    annotations: list[tuple[str, Expression]] = []
    for i, (key, source) in enumerate(audit_annotations):
        found = compiled(source, (*where["auditAnnotations"], i, "valueExpression"))
        if found is not None:
            annotations.append((key, found))
    if issues:
        return issues
    digest_source = json.dumps(
        [
            match_conditions,
            variables,
            [dict(v) for v in validations],
            failure_policy,
            params,
            *([list(audit_annotations)] if audit_annotations else []),
        ],
        sort_keys=True,
        default=str,
    )
    return CompiledPolicy(
        tuple(conditions),
        tuple(checks),
        failure_policy,
        "sha256:" + hashlib.sha256(digest_source.encode()).hexdigest(),
        tuple(annotations),
    )
