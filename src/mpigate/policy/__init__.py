"""The rule catalogue's checks: pure evaluation of TrainJobs and runtimes into a ``Decision``.

>>> from mpigate.config import load
>>> from mpigate.policy import AdmissionInput, evaluate
>>> request = AdmissionInput("CREATE", "TrainJob", "nlp-team", "job", trainjob)  # doctest: +SKIP
>>> decision = evaluate(load("."), request)  # doctest: +SKIP
>>> decision.allowed, decision.rule_ids, decision.patch  # doctest: +SKIP

Contract types live in :mod:`mpigate.policy.decision`; JSONPatch in :mod:`mpigate.policy.jsonpatch`.
"""

from .decision import (
    AdmissionInput,
    AppliedException,
    Decision,
    Demand,
    JobDemand,
    LiveContext,
    UserInfo,
    Violation,
)
from .engine import evaluate, judge, mutations
from .jsonpatch import JsonPatchError, apply_patch, diff

__all__ = [
    "AdmissionInput",
    "AppliedException",
    "Decision",
    "Demand",
    "JobDemand",
    "JsonPatchError",
    "LiveContext",
    "UserInfo",
    "Violation",
    "apply_patch",
    "diff",
    "evaluate",
    "judge",
    "mutations",
]
