"""examples/rules/gatekeeper/library.yaml: the library rules that stand in for the pod checks
Gatekeeper's library has only in Rego, enabled from the OrgPolicy as the example does, each run on
the effective pods of the example cpu-smoke job (issue 22)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mpigate.config import Config, check_tree, load
from tests.conftest import REPO, TODAY
from tests.policy.helpers import decide, runtime_patch, smoke_job
from tests.policy.test_library import org_with_library

LIBRARY = REPO / "examples" / "rules" / "gatekeeper" / "library.yaml"
DIGEST = "@sha256:" + "a" * 64


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    entries = yaml.safe_load(LIBRARY.read_text(encoding="utf-8"))["library"]
    root = org_with_library(tmp_path_factory.mktemp("library") / "org", entries)
    result = check_tree(root, today=TODAY)
    assert result.ok, result.errors
    return load(root, today=TODAY)


def _job(
    image: str = "",
    container: dict[str, Any] | None = None,
    volume: dict[str, Any] | None = None,
    limits: dict[str, str] | None = None,
) -> Any:
    job = smoke_job()
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
        job["spec"]["runtimePatches"] = [runtime_patch("acme.example/library-test", "node", pod)]
    return job


def _fired(config: Config, job: Any) -> set[str]:
    return {v.rule for v in decide(config, job).violations if v.rule.startswith("MPG-LIB-")}


def test_the_example_job_meets_the_rules_it_should(config: Config) -> None:
    assert _fired(config, _job()) == {"MPG-LIB-IMAGEDIGESTS", "MPG-LIB-PROBES"}


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"container": {"securityContext": {"runAsUser": 0}}}, "MPG-LIB-USERS"),
        ({"volume": {"name": "h", "hostPath": {"path": "/data"}}}, "MPG-LIB-VOLUMETYPES"),
        ({"volume": {"name": "f", "flexVolume": {"driver": "other/nfs"}}}, "MPG-LIB-FLEXVOLUMEDRIVERS"),
        ({"limits": {"cpu": "128", "memory": "1Gi"}}, "MPG-LIB-LIMITS"),
        ({"limits": {"cpu": "2"}}, "MPG-LIB-LIMITS"),
        ({"image": "registry.acme.internal/research/smoke:latest"}, "MPG-LIB-DISALLOWEDTAGS"),
        ({"image": "registry.acme.internal/research/smoke"}, "MPG-LIB-DISALLOWEDTAGS"),
        ({"image": "quay.io/acme/smoke:1.0"}, "MPG-LIB-IMAGES"),
    ],
)
def test_each_rule_fires_on_what_it_forbids(config: Config, change: dict[str, Any], rule: str) -> None:
    assert rule in _fired(config, _job(**change))


def test_exempt_and_compliant_values_pass(config: Config) -> None:
    fired = _fired(config, _job(image="registry.acme.internal/research/smoke" + DIGEST))
    assert "MPG-LIB-IMAGEDIGESTS" not in fired and "MPG-LIB-DISALLOWEDTAGS" not in fired
    flex = {"name": "f", "flexVolume": {"driver": "example/lvm"}}
    assert "MPG-LIB-FLEXVOLUMEDRIVERS" not in _fired(config, _job(volume=flex))
    user = {"securityContext": {"runAsUser": 1500}}
    assert "MPG-LIB-USERS" not in _fired(config, _job(container=user))
