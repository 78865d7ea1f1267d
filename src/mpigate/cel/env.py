"""Compiling and evaluating CEL expressions as the Kubernetes API server does.

The library is cel-expr-python (Google's C++ CEL behind pybind11), chosen by measurement against
common-expression-language (the Rust interpreter) and cel-python (pure Python); see
docs/architecture.md. An :class:`Environment` declares the variables an expression may read (all
``dyn``, as Kubernetes declares objects without a schema) and the function libraries of
:mod:`mpigate.cel.k8slib`; :meth:`Environment.compile` parses and type-checks, giving located
errors (line and column within the expression), and bounds the expression's cost
(:mod:`mpigate.cel.cost`). A :class:`Program` evaluates against an :class:`Inputs` (the variables'
values, converted once and shared by every program evaluated on the same object).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_encoders, ext_math, ext_optional, ext_strings

from . import k8slib
from .cost import Cost, checked_tree, estimate_tree, input_size
from .fuse import fuse, restore_names
from .reads import Need, reads_of
from .types import pool

__all__ = [
    "PER_CALL_LIMIT",
    "REQUEST_BUDGET",
    "Budget",
    "CompileError",
    "Environment",
    "EvalError",
    "Inputs",
    "Issue",
    "Program",
]

# k8s.io/apiserver pkg/apis/cel/config.go: PerCallLimit and RuntimeCELCostBudget.
PER_CALL_LIMIT = 1_000_000
REQUEST_BUDGET = 10_000_000
_ISSUE = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*?)(?:\n \|.*?)*(?=\nERROR: |\Z| \[[A-Z_]+\]\s*\Z)", re.S)
_MAX_SOURCE = 10_000  # characters; Kubernetes refuses longer expressions (celconfig.MaxRequestSizeBytes)
#: compiled programs (and compile errors) an environment keeps, least recently used first out: a
#: config tree's expressions compile once per process, not once per load (explain per page, the
#: webhook's hot reload), while a stream of distinct sources cannot grow it without bound
COMPILED_CACHE = 4096
_BOUNDS_KEPT = 64  # cost bounds a program keeps by input size


@dataclass(frozen=True, slots=True)
class Issue:
    """A compile error at ``line``:``column`` (1-based) of the expression's source."""

    line: int
    column: int
    message: str


class CompileError(ValueError):
    """The expression does not parse or type-check; ``issues`` says where and why."""

    def __init__(self, issues: Sequence[Issue]) -> None:
        super().__init__("; ".join(f"{i.line}:{i.column}: {i.message}" for i in issues))
        self.issues = tuple(issues)


class EvalError(RuntimeError):
    """The evaluation failed (a missing field, a type error, the cost budget)."""


def _issues(text: str) -> list[Issue]:
    found = [
        Issue(int(m.group(1)), int(m.group(2)), " ".join(m.group(3).split()))
        for m in _ISSUE.finditer(text + "\n")
    ]
    if found:
        return found
    return [Issue(1, 1, " ".join(text.split()) or "invalid expression")]


@dataclass
class Budget:
    """What is left of one request's cost budget (shared by every evaluation of the request)."""

    remaining: float = REQUEST_BUDGET
    per_call: float = PER_CALL_LIMIT


@dataclass(frozen=True, slots=True)
class Inputs:
    """The values of an environment's variables for one evaluation context, converted once."""

    activation: Any
    size: int


@dataclass(frozen=True, slots=True)
class Program:
    """A compiled, type-checked expression."""

    source: str
    expression: Any = field(repr=False, compare=False)
    cost: Cost
    digest: str
    #: what the expression can observe of each variable it reads (:mod:`.reads`; read whole when
    #: the tree could not be read)
    reads: Mapping[str, Need] = field(default_factory=dict, compare=False, repr=False)
    #: cost bounds computed, by input size (a pure function of the size: shared by every request)
    _bounds: dict[int, float] = field(default_factory=dict, compare=False, repr=False)

    def bound(self, size: int) -> float:
        """``cost.at(size)``, computed once per size (the sizes of a config's requests are few;
        only the first :data:`_BOUNDS_KEPT` are kept)."""
        found = self._bounds.get(size)
        if found is None:
            found = self.cost.at(size)
            if len(self._bounds) < _BOUNDS_KEPT:
                self._bounds[size] = found
        return found

    def charge(self, size: int, budget: Budget | None = None) -> None:
        """What an evaluation on inputs of size ``size`` costs before it runs: :class:`EvalError`
        when the cost bound exceeds the per-call limit or what is left of ``budget``, else the bound
        is taken from ``budget``. (:meth:`evaluate` calls it; blame calls it alone for an evaluation
        whose result it knows.)"""
        if self.cost.degree > 0:
            bound = self.bound(size)
            limit = budget.per_call if budget is not None else PER_CALL_LIMIT
            if bound > limit:
                raise EvalError(
                    f"operation cancelled: actual cost limit exceeded (bound {bound:.0f} for inputs "
                    f"of size {size}, limit {limit:.0f})"
                )
            if budget is not None:
                if bound > budget.remaining:
                    raise EvalError(
                        "validation failed due to running out of cost budget, no further validation "
                        "rules will be run"
                    )
                budget.remaining -= bound

    def evaluate(self, inputs: Inputs, budget: Budget | None = None) -> Any:
        """The plain value (bool, int, str, list, dict, ...) of the expression on ``inputs``.

        Raises :class:`EvalError` for an evaluation error or when the expression's cost bound on
        these inputs exceeds the per-call limit or what is left of ``budget``.
        """
        self.charge(inputs.size, budget)
        return self.value(inputs)

    def value(self, inputs: Inputs) -> Any:
        """:meth:`evaluate` without the cost bound: for a program mpigate builds around expressions
        whose bounds it charged itself (:class:`EvalError` for an evaluation error)."""
        try:
            result = self.expression.eval(inputs.activation)
            if result.type() == cel.Type.ERROR:
                raise EvalError(_clean(str(result.value())))
            return result.plain_value()
        except EvalError:
            raise
        except Exception as exc:  # the binding's errors (unsupported values, overflow...)
            raise EvalError(_clean(str(exc))) from None


def _clean(text: str) -> str:
    text = re.sub(r"^[A-Z_]+: ", "", restore_names(text.strip()))
    return re.sub(r" \[[A-Z_]+\]$", "", text)


class Environment:
    """Variables (all ``dyn``) and the Kubernetes function libraries, compiled once."""

    def __init__(self, variables: Sequence[str]) -> None:
        self.variables = tuple(variables)
        self._env = cel.NewEnv(
            pool(),
            variables=dict.fromkeys(self.variables, cel.Type.DYN),
            extensions=[
                ext_strings.ExtStrings(),
                ext_optional.ExtOptional(),
                ext_bindings.ExtBindings(),
                ext_math.ExtMath(),
                ext_encoders.ExtEncoders(),
            ],
            functions=k8slib.functions(),
        )
        self._compiled: OrderedDict[tuple[str, bool], Program | tuple[Issue, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, source: str, *, limit_length: bool = True) -> Program:
        """Parse and type-check ``source``; :class:`CompileError` with located issues if it fails.

        ``limit_length``: refuse a source longer than the API server accepts (off for a program
        mpigate builds around a checked expression). Programs are kept per source (the last
        :data:`COMPILED_CACHE`): a program is immutable, so one compilation serves every load."""
        key = (source, limit_length)
        with self._lock:
            found = self._compiled.get(key)
            if found is not None:
                self._compiled.move_to_end(key)
        if found is None:
            try:
                found = self._compile(source, limit_length)
            except CompileError as exc:
                found = exc.issues
            with self._lock:
                self._compiled[key] = found
                if len(self._compiled) > COMPILED_CACHE:
                    self._compiled.popitem(last=False)
        if isinstance(found, Program):
            return found
        raise CompileError(found)

    def _compile(self, source: str, limit_length: bool) -> Program:
        if not isinstance(source, str) or not source.strip():
            raise CompileError([Issue(1, 1, "the expression is empty")])
        if limit_length and len(source) > _MAX_SOURCE:
            raise CompileError([Issue(1, 1, f"the expression is longer than {_MAX_SOURCE} characters")])
        try:
            expression = self._env.compile(source)
        except Exception as exc:
            raise CompileError(_issues(str(exc))) from None
        serialized = expression.serialize()
        try:
            tree = checked_tree(serialized)
        except (ValueError, IndexError, UnicodeDecodeError):  # pragma: no cover - binding format
            tree = None
        # the program evaluated: quantity(x).asApproximateFloat() as one call into Python; the
        # cost bound and the reads are the expression's as written
        fused = fuse(serialized)
        if fused is not None:
            # a rewrite the binding refused would be run as written
            with contextlib.suppress(Exception):
                expression = self._env.deserialize(fused)
        cost = estimate_tree(tree)
        digest = "sha256:" + hashlib.sha256(source.encode()).hexdigest()
        return Program(source, expression, cost, digest, reads_of(tree, self.variables))

    def inputs(self, values: Mapping[str, Any], size: int | None = None) -> Inputs:
        """The activation for ``values`` (every declared variable; missing ones are ``null``).

        ``size`` is the cost bound's ``n``; measured on ``values`` when omitted."""
        data = {name: values.get(name) for name in self.variables}
        try:
            activation = self._env.Activation(data)
        except Exception as exc:
            raise EvalError(f"the inputs cannot be represented in CEL: {_clean(str(exc))}") from None
        return Inputs(activation, size if size is not None else input_size(data))
