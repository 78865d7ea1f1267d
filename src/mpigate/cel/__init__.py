"""CEL as the Kubernetes API server evaluates it: an environment with Kubernetes' function
libraries, compilation with located errors, a cost bound per evaluation (:mod:`.env`)."""

from __future__ import annotations

from .cost import Cost, input_size
from .env import (
    PER_CALL_LIMIT,
    REQUEST_BUDGET,
    Budget,
    CompileError,
    Environment,
    EvalError,
    Inputs,
    Issue,
    Program,
)

__all__ = [
    "PER_CALL_LIMIT",
    "REQUEST_BUDGET",
    "Budget",
    "CompileError",
    "Cost",
    "Environment",
    "EvalError",
    "Inputs",
    "Issue",
    "Program",
    "input_size",
]
