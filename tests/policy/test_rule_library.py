"""examples/rules/gatekeeper/library.yaml: the CustomRules written for the pod checks Gatekeeper's
library has only in Rego, each run on the effective pods of the example cpu-smoke job (issue 22)."""

from __future__ import annotations

import copy
import shutil
from typing import Any

import pytest

from mpigate.config import Config, check_tree, load
from tests.conftest import REPO, TODAY
from tests.policy.helpers import decide, read

LIBRARY = REPO / "examples" / "rules" / "gatekeeper" / "library.yaml"
DIGEST = "@sha256:" + "a" * 64


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    root = tmp_path_factory.mktemp("library") / "org"
    for part in ("policies", "quotas", "rbac", "networkpolicies"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("tests"))
    (root / "policies" / "rules").mkdir()
    shutil.copy(LIBRARY, root / "policies" / "rules")
    result = check_tree(root, today=TODAY)
    assert result.ok, result.errors
    return load(root, today=TODAY)


def _job(
    image: str = "",
    container: dict[str, Any] | None = None,
    volume: dict[str, Any] | None = None,
    limits: dict[str, str] | None = None,
) -> Any:
    job = copy.deepcopy(read("trainjobs/cpu-smoke.yaml"))
    if image:
        job["spec"]["trainer"]["image"] = image
    if limits:
        job["spec"]["trainer"]["resourcesPerNode"] = {"limits": limits}
    pod: dict[str, Any] = {}
    if container is not None:
        pod["containers"] = [{"name": "node", **container}]
    if volume is not None:
        pod["volumes"] = [volume]
    if pod:
        job["spec"]["runtimePatches"] = [
            {
                "manager": "acme.example/library-test",
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {"name": "node", "template": {"spec": {"template": {"spec": pod}}}}
                            ]
                        }
                    }
                },
            }
        ]
    return job


def _fired(config: Config, job: Any) -> set[str]:
    return {v.rule for v in decide(config, job).violations if v.rule.startswith("ACME-")}


def test_the_example_job_meets_the_rules_it_should(config: Config) -> None:
    assert _fired(config, _job()) == {"ACME-IMAGE-DIGESTS", "ACME-REQUIRED-PROBES"}


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"container": {"securityContext": {"runAsUser": 0}}}, "ACME-PSP-ALLOWED-USERS"),
        ({"volume": {"name": "h", "hostPath": {"path": "/data"}}}, "ACME-PSP-VOLUME-TYPES"),
        ({"volume": {"name": "f", "flexVolume": {"driver": "other/nfs"}}}, "ACME-PSP-FLEXVOLUME-DRIVERS"),
        ({"limits": {"cpu": "128", "memory": "1Gi"}}, "ACME-CONTAINER-LIMITS"),
        ({"limits": {"cpu": "2"}}, "ACME-CONTAINER-LIMITS"),
        ({"image": "registry.acme.internal/research/smoke:latest"}, "ACME-DISALLOWED-TAGS"),
        ({"image": "registry.acme.internal/research/smoke"}, "ACME-DISALLOWED-TAGS"),
        ({"image": "quay.io/acme/smoke:1.0"}, "ACME-ALLOWED-REPOS"),
    ],
)
def test_each_rule_fires_on_what_it_forbids(config: Config, change: dict[str, Any], rule: str) -> None:
    assert rule in _fired(config, _job(**change))


def test_exempt_and_compliant_values_pass(config: Config) -> None:
    fired = _fired(config, _job(image="registry.acme.internal/research/smoke" + DIGEST))
    assert "ACME-IMAGE-DIGESTS" not in fired and "ACME-DISALLOWED-TAGS" not in fired
    flex = {"name": "f", "flexVolume": {"driver": "example/lvm"}}
    assert "ACME-PSP-FLEXVOLUME-DRIVERS" not in _fired(config, _job(volume=flex))
    user = {"securityContext": {"runAsUser": 1500}}
    assert "ACME-PSP-ALLOWED-USERS" not in _fired(config, _job(container=user))
