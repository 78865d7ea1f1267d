"""The controller's view of what the gate relies on: Kueue's Configuration (controller/reliances.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml
from tests.conftest import REPO

from mpigate.config import load
from mpigate.config.model import KueueSettings, WaitForPodsReady
from mpigate.controller.reliances import (
    FAIR_SHARING,
    KUEUE_CONFIG_KEY,
    MANAGE_WITHOUT_QUEUE,
    QUOTA_CHECK,
    WAIT_FOR_PODS_READY,
    kueue_reliances,
)
from mpigate.render import render


def configmap(text: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": {KUEUE_CONFIG_KEY: text}}


@pytest.mark.upstream
def test_kueues_shipped_configuration_does_not_manage_jobs_without_a_queue_name(upstream: Path) -> None:
    """Kueue's default (config/components/manager/controller_manager_config.yaml): the trainjob and
    mpijob integrations are on, manageJobsWithoutQueueName is not."""
    text = (upstream / "kueue" / "examples" / "config" / "controller_manager_config.yaml").read_text()
    found = {r.check: r for r in kueue_reliances(configmap(text), "kueue-system/kueue-manager-config")}
    assert found[MANAGE_WITHOUT_QUEUE].holds is False and found[MANAGE_WITHOUT_QUEUE].value == 0
    assert "manageJobsWithoutQueueName is not true in kueue-system/kueue-manager-config" in (
        found[MANAGE_WITHOUT_QUEUE].message
    )
    assert found["kueue-framework-trainjob"].holds is True
    assert found["kueue-framework-mpijob"].holds is True
    config = yaml.safe_load(text)
    config["manageJobsWithoutQueueName"] = True
    config["integrations"]["frameworks"].remove("kubeflow.org/mpijob")
    found = {r.check: r for r in kueue_reliances(configmap(yaml.safe_dump(config)), "x/y")}
    assert found[MANAGE_WITHOUT_QUEUE].value == 1
    assert found["kueue-framework-mpijob"].value == 0
    assert (
        "kubeflow.org/mpijob is not in integrations.frameworks of x/y"
        in found["kueue-framework-mpijob"].message
    )


@pytest.mark.parametrize(
    "obj",
    [None, {"data": {}}, {"data": "x"}, configmap("{"), configmap("- a list"), configmap("42")],
    ids=["absent", "no-key", "bad-data", "bad-yaml", "list", "scalar"],
)
def test_what_cannot_be_read_is_unknown_never_ok(obj: dict[str, object] | None) -> None:
    found = kueue_reliances(obj, "kueue-system/kueue-manager-config")
    assert {r.check for r in found} == {
        MANAGE_WITHOUT_QUEUE,
        "kueue-framework-trainjob",
        "kueue-framework-mpijob",
        QUOTA_CHECK,
        FAIR_SHARING,
        WAIT_FOR_PODS_READY,
    }
    assert all(r.holds is None and r.value == -1 and r.message.startswith("cannot check") for r in found)


def test_the_rendered_kueue_configuration_makes_every_reliance_hold() -> None:
    """kueue/configuration.yaml, merged into Kueue's Configuration, is what the gate relies on."""
    config = load(REPO, today=dt.date(2026, 11, 22))
    text = render(config, today=dt.date(2026, 11, 22)).files["kueue/configuration.yaml"]
    found = kueue_reliances(configmap(text), "kueue-system/kueue-manager-config", config.kueue)
    assert [(r.check, r.message) for r in found if not r.holds] == []


@pytest.mark.upstream
def test_quota_settings_against_kueues_shipped_configuration(upstream: Path) -> None:
    """Kueue's default Configuration blocks undeclared resources but has neither fair sharing nor
    waitForPodsReady: a tree that declares them is told, one that does not is fine."""
    text = (upstream / "kueue" / "examples" / "config" / "controller_manager_config.yaml").read_text()
    plain = {r.check: r for r in kueue_reliances(configmap(text), "k/c", KueueSettings())}
    assert (plain[QUOTA_CHECK].holds, plain[FAIR_SHARING].holds, plain[WAIT_FOR_PODS_READY].holds) == (
        True,
        True,
        True,
    )
    wanting = KueueSettings(fair_sharing=True, wait_for_pods_ready=WaitForPodsReady(600))
    found = {r.check: r for r in kueue_reliances(configmap(text), "k/c", wanting)}
    assert found[FAIR_SHARING].value == 0 and "fairShareWeight has no effect" in found[FAIR_SHARING].message
    assert found[WAIT_FOR_PODS_READY].value == 0
    assert "wants a 10m timeout but k/c has no waitForPodsReady" in found[WAIT_FOR_PODS_READY].message
    config = yaml.safe_load(text)
    config["resources"] = {"quotaCheckStrategy": "IgnoreUndeclared"}
    config["fairSharing"] = {"preemptionStrategies": ["LessThanOrEqualToFinalShare"]}
    config["waitForPodsReady"] = {"timeout": "5m"}
    found = {r.check: r for r in kueue_reliances(configmap(yaml.safe_dump(config)), "k/c", wanting)}
    assert found[QUOTA_CHECK].value == 0 and "IgnoreUndeclared" in found[QUOTA_CHECK].message
    assert found[FAIR_SHARING].value == 1
    assert "has 5m" in found[WAIT_FOR_PODS_READY].message
