"""Mutations on CREATE: one deterministic JSONPatch, idempotent, never weakening, never touching
other managers' runtime patches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpigate.config import Config, load
from mpigate.policy import apply_patch
from mpigate.trainjob.resolve import MPIGATE_MANAGER
from tests.conftest import FIXTURES, TODAY
from tests.policy.helpers import decide, example_org, fixture_org, ids, read, runtime_patch, trainjob


@pytest.fixture(scope="module")
def org() -> Config:
    return example_org()


def mutated(config: Config, obj: dict[str, Any]) -> dict[str, Any]:
    decision = decide(config, obj)
    out = apply_patch(obj, decision.patch)
    assert isinstance(out, dict)
    return out


def own_entry(obj: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in obj["spec"]["runtimePatches"] if p["manager"] == MPIGATE_MANAGER)


def test_defaults_and_patch_order(org: Config) -> None:
    decision = decide(org, read("trainjobs/minimal.yaml"))
    assert [(p["op"], p["path"]) for p in decision.patch] == [
        ("add", "/metadata/labels/kueue.x-k8s.io~1queue-name"),
        ("add", "/metadata/labels/kueue.x-k8s.io~1priority-class"),
        ("add", "/spec/suspend"),
        ("add", "/spec/activeDeadlineSeconds"),
        ("add", "/spec/runtimePatches"),
    ]
    out = apply_patch(read("trainjobs/minimal.yaml"), decision.patch)
    entry = own_entry(out)
    jobs = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["node", "launcher"]
    assert jobs[0]["template"]["spec"]["template"] == {
        "metadata": {"labels": {"mpigate.io/team": "nlp-team"}},
        "spec": {"nodeSelector": {"topology.kubernetes.io/region": "eu-west-1"}},
    }
    assert out["spec"]["activeDeadlineSeconds"] == 86400
    assert out["spec"]["suspend"] is True


def test_existing_labels_and_deadline_are_kept(org: Config) -> None:
    decision = decide(org, read("trainjobs/cv-large.yaml"))
    paths = [p["path"] for p in decision.patch]
    assert paths == ["/spec/suspend", "/spec/runtimePatches"]


def test_mutation_is_idempotent_on_every_example(org: Config) -> None:
    from tests.policy.helpers import EXAMPLES

    for path in sorted((EXAMPLES / "trainjobs").glob("*.yaml")):
        obj = read(path)
        once = mutated(org, obj)
        assert decide(org, once).patch == (), path


def test_security_defaults_are_injected_where_a_patch_may_set_them(tmp_path: Path) -> None:
    # The fixture org with a runtime that sets no security fields at all (the fixture's own runtime
    # is restricted-compliant as written, so that `mpigate check` passes it).
    tree = tmp_path / "org"
    shutil.copytree(FIXTURES / "config" / "base", tree)
    runtime_file = tree / "policies" / "runtimes" / "mpi-fixture.yaml"
    runtime = yaml.safe_load(runtime_file.read_text())
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    del pod["securityContext"]
    del pod["containers"][0]["securityContext"]
    runtime_file.write_text(yaml.safe_dump(runtime))
    config = load(tree, revision="test", today=TODAY)
    job = read(config.root + "/jobs/hello.yaml")
    job["spec"]["runtimePatches"] = [
        runtime_patch(
            "x.example/dbg",
            "node",
            {"containers": [{"name": "node", "securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}]},
        )
    ]
    out = mutated(config, job)
    entry = own_entry(out)
    pod = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"
    ]
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["spec"]["containers"] == [
        {
            "name": "node",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL", "NET_RAW"]},
            },
        }
    ]
    assert pod["metadata"] == {"labels": {"mpigate.io/team": "alpha"}}
    # other managers' entries are untouched and stay first
    assert out["spec"]["runtimePatches"][0] == job["spec"]["runtimePatches"][0]
    # validation runs on the mutated object: no Pod Security violation is left
    assert not [r for r in ids(decide(config, out)) if r.startswith("MPG-SEC-")]
    assert not [r for r in ids(decide(config, job)) if r.startswith("MPG-SEC-")]


def test_explicit_settings_are_never_weakened_or_overridden() -> None:
    config = fixture_org()
    job = read(config.root + "/jobs/hello.yaml")
    job["spec"]["runtimePatches"] = [
        runtime_patch(
            "x.example/dbg",
            "node",
            {
                "securityContext": {"runAsNonRoot": False, "seccompProfile": {"type": "Unconfined"}},
                "containers": [
                    {
                        "name": "node",
                        "securityContext": {
                            "allowPrivilegeEscalation": True,
                            "privileged": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
            },
        )
    ]
    decision = decide(config, job)
    out = apply_patch(job, decision.patch)
    entry = own_entry(out)
    pod = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"
    ]
    assert "securityContext" not in pod["spec"] and "containers" not in pod["spec"]
    assert {
        "MPG-SEC-RUNASNONROOT",
        "MPG-SEC-SECCOMPPROFILE-RESTRICTED",
        "MPG-SEC-ALLOWPRIVILEGEESCALATION",
    } <= ids(decision, denying=True)
    privileged = read(config.root + "/jobs/hello.yaml")
    privileged["spec"]["runtimePatches"] = [
        runtime_patch(
            "x.example/dbg",
            "node",
            {"containers": [{"name": "node", "securityContext": {"privileged": True}}]},
        )
    ]
    pod = own_entry(mutated(config, privileged))["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][
        0
    ]
    assert "containers" not in pod["template"]["spec"]["template"]["spec"]  # APE=false would be rejected


def test_an_existing_entry_is_rebuilt_in_place_and_other_managers_are_kept(org: Config) -> None:
    job = read("trainjobs/minimal.yaml")
    kueue = runtime_patch(
        "kueue.x-k8s.io/manager", "node", {"nodeSelector": {"nvidia.com/gpu.product": "A100-SXM4-80GB"}}
    )
    sdk = runtime_patch("trainer.kubeflow.org/kubeflow-sdk", "launcher", {"nodeSelector": {"pool": "a"}})
    stale = runtime_patch(
        MPIGATE_MANAGER, "node", {"nodeSelector": {"topology.kubernetes.io/region": "us-east-1"}}
    )
    job["spec"]["runtimePatches"] = [sdk, stale, kueue]
    decision = decide(org, job)
    rp_ops = [p for p in decision.patch if p["path"].startswith("/spec/runtimePatches")]
    # only mpigate's own entry (index 1) changes; its job list is replaced as a whole
    assert [(p["op"], p["path"]) for p in rp_ops] == [
        ("replace", "/spec/runtimePatches/1/trainingRuntimeSpec/template/spec/replicatedJobs")
    ]
    out = apply_patch(job, decision.patch)
    assert out["spec"]["runtimePatches"][0] == sdk and out["spec"]["runtimePatches"][2] == kueue
    assert decide(org, out).patch == ()


def test_trainer_image_mirror_and_pinned_ports(org: Config) -> None:
    job = trainjob()
    job["spec"]["trainer"]["image"] = "docker.io/library/python:3.12"
    decision = decide(org, job)
    assert {
        "op": "replace",
        "path": "/spec/trainer/image",
        "value": "registry.acme.internal/mirror/docker.io/library/python:3.12",
    } in decision.patch
    assert "MPG-IMG-001" not in ids(decision)  # validation ran on the mirrored image
    phi = read("trainjobs/phi-pinned.yaml")
    out = mutated(org, phi)
    pinned = [name for name, _ in org.network_profiles["pinned-ports"].openmpi_env]
    assert [e["name"] for e in out["spec"]["trainer"]["env"]] == pinned
    assert "OMPI_MCA_oob_tcp_static_ipv6_ports" in pinned
    override = read("trainjobs/deny-pinned-port-override.yaml")
    kept = mutated(org, override)["spec"]["trainer"]["env"]
    assert kept[0] == {
        "name": "OMPI_MCA_btl_tcp_port_min_v4",
        "value": "1024",
    }  # never overwritten: denied instead
    assert len(kept) == len(pinned)


def test_no_mutation_on_update_or_delete(org: Config) -> None:
    job = read("trainjobs/minimal.yaml")
    assert decide(org, job, operation="UPDATE", old=job).patch == ()
    assert decide(org, None, operation="DELETE", old=job).patch == ()


def test_patch_is_json(org: Config) -> None:
    json.dumps(list(decide(org, read("trainjobs/llm-finetune.yaml")).patch))


def test_mirror_that_would_make_an_invalid_name_is_not_applied(org: Config) -> None:
    """A long Docker Hub name plus the mirror prefix exceeds the 255-character limit: no mirror
    rewrite (and no crash); the image stays unallowed and is denied with MPG-IMG-001."""
    job = read("trainjobs/minimal.yaml")
    job["spec"]["trainer"]["image"] = "docker.io/acme/" + "x" * 230 + ":1.0"
    decision = decide(org, job)
    assert not any(op.get("path") == "/spec/trainer/image" for op in decision.patch)
    assert "MPG-IMG-001" in ids(decision)
    assert not decision.allowed
