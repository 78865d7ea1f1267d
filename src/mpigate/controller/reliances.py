"""What the gate relies on that the controller can see from inside the cluster (docs/security.md,
"What the gate relies on"): Kueue's own Configuration.

mpigate sets the team's ``kueue.x-k8s.io/queue-name`` label on every TrainJob and MPIJob it admits,
but quotas are enforced by Kueue, and only for jobs Kueue manages: a job without the label is left
alone unless ``manageJobsWithoutQueueName`` is true (Kueue ``apis/config/v1beta2``
``Configuration.ManageJobsWithoutQueueName``; ``pkg/controller/jobframework`` ``QueueName`` /
``ApplyDefaultForSuspend``), and only job kinds listed in ``integrations.frameworks`` are managed at
all. :func:`kueue_reliances` reads the Configuration as Kueue's install ships it — the
``controller_manager_config.yaml`` key of the ``kueue-manager-config`` ConfigMap in ``kueue-system``
(``config/components/manager``: configMapGenerator ``manager-config`` with ``namePrefix: kueue-``)
— and says which of these hold. The controller logs a warning and sets
``mpigate_controller_reliance{check}`` (1 holds, 0 does not, -1 could not be checked).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

__all__ = [
    "DEFAULT_KUEUE_CONFIG",
    "KUEUE_CONFIG_KEY",
    "MANAGE_WITHOUT_QUEUE",
    "Reliance",
    "kueue_reliances",
    "unknown_reliances",
]

KUEUE_CONFIG_KEY: Final = "controller_manager_config.yaml"
DEFAULT_KUEUE_CONFIG: Final = "kueue-system/kueue-manager-config"
# Kueue's integration names (pkg/controller/jobs/*: FrameworkName) of the jobs mpigate admits.
_FRAMEWORKS: Final = (
    ("kueue-framework-trainjob", "trainer.kubeflow.org/trainjob", "TrainJobs"),
    ("kueue-framework-mpijob", "kubeflow.org/mpijob", "MPIJobs"),
)
MANAGE_WITHOUT_QUEUE: Final = "kueue-manage-jobs-without-queue-name"


@dataclass(frozen=True, slots=True)
class Reliance:
    """One reliance as found: ``holds`` None when it could not be checked."""

    check: str
    holds: bool | None
    message: str

    @property
    def value(self) -> int:
        """The metric's value: 1 holds, 0 does not, -1 unknown."""
        return -1 if self.holds is None else int(self.holds)


def unknown_reliances(why: str) -> list[Reliance]:
    """Every check, unknown (the Configuration could not be read)."""
    return [
        Reliance(check, None, f"cannot check that Kueue manages {what}: {why}")
        for check, what in (
            (MANAGE_WITHOUT_QUEUE, "jobs without a queue label"),
            *((c, what) for c, _, what in _FRAMEWORKS),
        )
    ]


def kueue_reliances(configmap: Mapping[str, Any] | None, where: str) -> list[Reliance]:
    """The reliances on Kueue's Configuration, from its ConfigMap (``None``: not found) at ``where``
    (``namespace/name``, for messages)."""
    if configmap is None:
        return unknown_reliances(f"ConfigMap {where} not found (pass --kueue-config NAMESPACE/NAME)")
    data = configmap.get("data")
    text = data.get(KUEUE_CONFIG_KEY) if isinstance(data, Mapping) else None
    if not isinstance(text, str):
        return unknown_reliances(f"ConfigMap {where} has no {KUEUE_CONFIG_KEY}")
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return unknown_reliances(f"{where} {KUEUE_CONFIG_KEY} is not valid YAML ({type(exc).__name__})")
    if not isinstance(config, Mapping):
        return unknown_reliances(f"{where} {KUEUE_CONFIG_KEY} is not a Kueue Configuration")
    found: list[Reliance] = []
    manage = config.get("manageJobsWithoutQueueName") is True
    found.append(
        Reliance(
            MANAGE_WITHOUT_QUEUE,
            manage,
            "Kueue manages jobs without a queue label"
            if manage
            else "Kueue ignores jobs without the kueue.x-k8s.io/queue-name label (manageJobsWithoutQueueName "
            f"is not true in {where}): a TrainJob or MPIJob whose label is removed after admission runs "
            "outside the team's quotas unless mpigate's webhook refuses that update; set "
            "manageJobsWithoutQueueName: true (with managedJobsNamespaceSelector covering the team "
            "namespaces)",
        )
    )
    integrations = config.get("integrations")
    frameworks = integrations.get("frameworks") if isinstance(integrations, Mapping) else None
    listed = {f for f in frameworks if isinstance(f, str)} if isinstance(frameworks, list) else set()
    for check, framework, what in _FRAMEWORKS:
        holds = framework in listed
        found.append(
            Reliance(
                check,
                holds,
                f"Kueue manages {what} ({framework})"
                if holds
                else f"Kueue does not manage {what}: {framework} is not in integrations.frameworks of "
                f"{where}, so their queue label and the team's quotas have no effect",
            )
        )
    return found
