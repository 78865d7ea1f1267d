"""The rule catalogue's checks: pure evaluation of TrainJobs and runtimes into a ``Decision``.

Contract types live in :mod:`mpigate.policy.decision`; the entry point is ``evaluate`` (added by
the engine).
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

__all__ = [
    "AdmissionInput",
    "AppliedException",
    "Decision",
    "Demand",
    "JobDemand",
    "LiveContext",
    "UserInfo",
    "Violation",
]
