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

The quota rules rely on three more settings, which the config tree declares in
``GPUFlavors.spec.kueue`` (docs/quota.md) and ``mpigate render`` writes to
``kueue/configuration.yaml``: ``resources.quotaCheckStrategy`` is ``BlockUndeclared`` (MPG-Q001
refuses a job asking a resource no ClusterQueue covers, as Kueue then never admits it); fair sharing
is on exactly when the tree says so (the teams' ``fairShareWeight`` and MPG-Q008's account of
preemption); ``waitForPodsReady`` is set when the tree wants gang semantics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from mpigate.config.model import KueueSettings
from mpigate.config.units import format_duration, parse_duration

__all__ = [
    "DEFAULT_KUEUE_CONFIG",
    "FAIR_SHARING",
    "KUEUE_CONFIG_KEY",
    "MANAGE_WITHOUT_QUEUE",
    "QUOTA_CHECK",
    "WAIT_FOR_PODS_READY",
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
QUOTA_CHECK: Final = "kueue-quota-check-strategy"
FAIR_SHARING: Final = "kueue-fair-sharing"
WAIT_FOR_PODS_READY: Final = "kueue-wait-for-pods-ready"
_QUOTA_CHECKS: Final = (
    (QUOTA_CHECK, "resources it does not cover the way MPG-Q001 assumes"),
    (FAIR_SHARING, "fair sharing as GPUFlavors.spec.kueue.fairSharing says"),
    (WAIT_FOR_PODS_READY, "waitForPodsReady as GPUFlavors.spec.kueue says"),
)


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
            *_QUOTA_CHECKS,
        )
    ]


def kueue_reliances(
    configmap: Mapping[str, Any] | None, where: str, settings: KueueSettings | None = None
) -> list[Reliance]:
    """The reliances on Kueue's Configuration, from its ConfigMap (``None``: not found) at ``where``
    (``namespace/name``, for messages); ``settings``: what the config tree declares (default:
    GPUFlavors' defaults)."""
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
    found.extend(_quota_reliances(config, where, settings or KueueSettings()))
    return found


def _quota_reliances(config: Mapping[str, Any], where: str, settings: KueueSettings) -> list[Reliance]:
    """Kueue v0.19.2 apis/config/v1beta2: ``Resources.QuotaCheckStrategy`` (default
    BlockUndeclared), ``FairSharing`` (on when present), ``WaitForPodsReady``."""
    resources = config.get("resources")
    strategy = resources.get("quotaCheckStrategy") if isinstance(resources, Mapping) else None
    blocks = strategy in (None, "BlockUndeclared")
    out = [
        Reliance(
            QUOTA_CHECK,
            blocks,
            "Kueue never admits a job asking a resource its ClusterQueue does not cover (quotaCheckStrategy "
            "BlockUndeclared), as MPG-Q001 assumes"
            if blocks
            else f"{where} sets quotaCheckStrategy {strategy}: Kueue admits jobs asking resources their "
            "ClusterQueue does not cover, which MPG-Q001 refuses; set BlockUndeclared "
            "(kueue/configuration.yaml)",
        )
    ]
    kueue_fair = isinstance(config.get("fairSharing"), Mapping)
    same = kueue_fair == settings.fair_sharing
    state, declared = ("on" if kueue_fair else "off"), ("on" if settings.fair_sharing else "off")
    out.append(
        Reliance(
            FAIR_SHARING,
            same,
            f"fair sharing is {state} in Kueue, as GPUFlavors.spec.kueue.fairSharing says"
            if same
            else f"fair sharing is {state} in {where} but GPUFlavors.spec.kueue.fairSharing says {declared}: "
            f"the teams' fairShareWeight {'has no effect' if settings.fair_sharing else 'is applied'} and "
            "MPG-Q008 describes preemption wrongly; merge kueue/configuration.yaml or correct GPUFlavors",
        )
    )
    wanted = settings.wait_for_pods_ready
    ready = config.get("waitForPodsReady")
    timeout: int | None = None
    if isinstance(ready, Mapping):
        try:
            timeout = parse_duration(str(ready.get("timeout", "5m")))
        except ValueError:
            timeout = None
    if wanted is None:
        out.append(Reliance(WAIT_FOR_PODS_READY, True, "the config tree does not rely on waitForPodsReady"))
    else:
        holds = timeout == wanted.timeout_seconds
        want = format_duration(wanted.timeout_seconds)
        out.append(
            Reliance(
                WAIT_FOR_PODS_READY,
                holds,
                f"Kueue evicts admitted jobs whose pods are not ready within {want} (waitForPodsReady)"
                if holds
                else f"GPUFlavors.spec.kueue.waitForPodsReady wants a {want} timeout but {where} has "
                + (f"{format_duration(timeout)}" if timeout is not None else "no waitForPodsReady")
                + ": admitted jobs whose pods cannot all start hold their quota; merge "
                "kueue/configuration.yaml",
            )
        )
    return out
