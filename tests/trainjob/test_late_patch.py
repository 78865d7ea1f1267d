"""``with_last_patch``: the resolution of a job whose last runtime patch is mpigate's own entry,
computed from the resolution without it (the validating webhook resolves a mutated job once), is
exactly what :func:`resolve` gives for the whole job — and it declines every entry for which that
would not hold."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpigate.trainjob import resolve
from mpigate.trainjob.model import MPIGATE_MANAGER
from mpigate.trainjob.pods import pod_template
from mpigate.trainjob.resolve import with_last_patch
from tests.conftest import REPO

OWN = frozenset({MPIGATE_MANAGER})


def _runtimes(upstream: Path | None) -> dict[str, dict[str, Any]]:
    files = sorted((REPO / "policies").rglob("*.yaml"))
    if upstream is not None:
        files += sorted((upstream / "trainer").glob("runtimes/*.yaml"))
        files += sorted((upstream / "trainer").glob("examples/*.yaml"))
    found: dict[str, dict[str, Any]] = {}
    for path in files:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime"):
                found[doc["metadata"]["name"]] = doc
    return found


def _entry(runtime: dict[str, Any], *, containers: bool = True) -> dict[str, Any]:
    """An entry shaped as mpigate writes it, for every job of ``runtime`` and every container."""
    jobs = []
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        spec = pod_template(rjob).get("spec", {})
        pod_spec: dict[str, Any] = {
            "nodeSelector": {"topology.kubernetes.io/region": "eu"},
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        }
        if containers:
            for field in ("initContainers", "containers"):
                items = [c["name"] for c in spec.get(field, []) if isinstance(c, dict) and "name" in c]
                if items:
                    pod_spec[field] = [
                        {"name": n, "securityContext": {"allowPrivilegeEscalation": False}} for n in items
                    ]
        template = {"metadata": {"labels": {"mpigate.io/team": "nlp-team"}}, "spec": pod_spec}
        jobs.append({"name": rjob["name"], "template": {"spec": {"template": template}}})
    return {
        "manager": MPIGATE_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": jobs}}},
    }


def _job(runtime: dict[str, Any], *patches: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "j", "namespace": "nlp-team"},
        "spec": {
            "runtimeRef": {"name": runtime["metadata"]["name"], "kind": runtime["kind"]},
            "trainer": {
                "numNodes": 3,
                "image": "registry.acme.internal/nlp/llm-train:1.4.2",
                "env": [{"name": "A", "value": "1"}],
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": 2, "cpu": "8"}},
            },
            "initializer": {"dataset": {"storageUri": "hf://x/y"}, "model": {"storageUri": "hf://a/b"}},
            "runtimePatches": list(patches),
        },
    }


def _cases() -> list[tuple[str, dict[str, Any]]]:
    from tests.conftest import upstream_dir

    return sorted(_runtimes(upstream_dir()).items())


@pytest.mark.parametrize(("name", "runtime"), _cases(), ids=[n for n, _ in _cases()])
def test_the_late_merge_is_the_resolution_of_the_whole_job(name: str, runtime: dict[str, Any]) -> None:
    tenant = {
        "manager": "acme.example/debug",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["name"],
                            "template": {"spec": {"template": {"spec": {"priorityClassName": "low"}}}},
                        }
                    ]
                }
            }
        },
    }
    for entry in (_entry(runtime), _entry(runtime, containers=False)):
        job = _job(runtime, tenant, entry)
        whole = resolve(job, runtime)
        late = with_last_patch(resolve(job, runtime, exclude_managers=OWN), job, MPIGATE_MANAGER)
        assert late is not None, name
        assert late == whole, name
        # the same origins, field by field (the entry's layer sits after the other patches)
        for a, b in zip(late.jobs, whole.jobs, strict=True):
            assert a.layers == b.layers
            assert a.origin(("spec", "securityContext", "runAsNonRoot")) == b.origin(
                ("spec", "securityContext", "runAsNonRoot")
            )


def _declined(runtime: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Jobs whose own entry with_last_patch must not merge late, and why."""
    first = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["name"]
    out: list[tuple[str, dict[str, Any]]] = []

    def edited(why: str, change: Any) -> None:
        entry = _entry(runtime)
        change(entry)
        out.append((why, _job(runtime, entry)))

    def pod(entry: dict[str, Any]) -> dict[str, Any]:
        jobs = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        template: dict[str, Any] = jobs[0]["template"]["spec"]["template"]
        return template

    edited("sets env (the plugins write env)", lambda e: pod(e)["spec"]["containers"][0].update(env=[]))
    edited("sets volumes", lambda e: pod(e)["spec"].update(volumes=[]))
    edited("an unknown container", lambda e: pod(e)["spec"]["containers"].append({"name": "ghost"}))
    edited(
        "a container twice", lambda e: pod(e)["spec"]["containers"].append(pod(e)["spec"]["containers"][0])
    )
    edited(
        "job metadata",
        lambda e: e["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"].update(
            metadata={"labels": {"a": "b"}}
        ),
    )
    edited("pod annotations", lambda e: pod(e)["metadata"].update(annotations={"a": "b"}))
    edited("a label of the wrong type", lambda e: pod(e)["metadata"]["labels"].update(x=1))
    edited(
        "an unknown job",
        lambda e: e["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"].append(
            {"name": "ghost", "template": {"spec": {"template": {}}}}
        ),
    )
    edited(
        "a job twice",
        lambda e: e["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"].append(
            copy.deepcopy(e["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0])
        ),
    )
    tenant = {
        "manager": "acme.example/x",
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": []}}},
    }
    last = _job(runtime, _entry(runtime), tenant)
    out.append(("not the last entry", last))
    twice = _job(runtime, _entry(runtime), _entry(runtime))
    out.append(("two entries under the manager", twice))
    assert first
    return out


def test_entries_it_cannot_merge_late_are_declined() -> None:
    runtime = _runtimes(None)["mpi-openmpi-gpu"]
    cases = _declined(runtime)
    assert len(cases) == 11
    for why, job in cases:
        base = resolve(job, runtime, exclude_managers=OWN)
        assert with_last_patch(base, job, MPIGATE_MANAGER) is None, why
