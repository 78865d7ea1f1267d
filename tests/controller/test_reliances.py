"""The controller's view of what the gate relies on: Kueue's Configuration (controller/reliances.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mpigate.controller.reliances import KUEUE_CONFIG_KEY, MANAGE_WITHOUT_QUEUE, kueue_reliances


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
    }
    assert all(r.holds is None and r.value == -1 and r.message.startswith("cannot check") for r in found)
