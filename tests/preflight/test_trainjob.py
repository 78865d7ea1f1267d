"""The per-team smoke TrainJob built from the example org."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from mpigate.config import Config
from mpigate.preflight import PreflightSettings, SmokeJobError, build_smoke_trainjob

RUNTIME_IMAGE_PREFIX = "registry.acme.internal/mpigate/openmpi-runtime:4.1.4-cuda12.4@sha256:"


def _program(job: dict[str, Any]) -> list[str]:
    command: list[str] = job["spec"]["trainer"]["command"]
    return command[command.index("-m") + 1 :]


def test_pinned_team_job_expects_the_injected_ports(example_org: Config) -> None:
    job = build_smoke_trainjob(example_org, "research-team")

    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job["metadata"]["name"] == "mpigate-preflight"
    assert job["metadata"]["namespace"] == "research"
    assert job["metadata"]["labels"] == {
        "app.kubernetes.io/component": "smoke-test",
        "app.kubernetes.io/managed-by": "mpigate",
        "app.kubernetes.io/name": "mpigate-preflight",
        "kueue.x-k8s.io/priority-class": "low",
        "kueue.x-k8s.io/queue-name": "research-team",
        "mpigate.io/cost-center": "mpigate-preflight",
        "mpigate.io/data-classification": "public",
    }
    spec = job["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "mpi-openmpi-gpu",
    }
    assert spec["trainer"]["numNodes"] == 2
    assert spec["trainer"]["image"].startswith(RUNTIME_IMAGE_PREFIX)
    command = spec["trainer"]["command"]
    assert command[:4] == ["mpirun", "--hostfile", "/etc/mpi/hostfile", "python3"]
    assert _program(job)[0] == "mpigate.preflight"
    assert "--expect-pinned" in command
    assert command[command.index("--hold") + 1] == "5"
    # The env is left to the mutating webhook: the job proves the injection happened.
    assert "env" not in spec["trainer"]


def test_isolated_team_job_does_not_demand_pinning(example_org: Config) -> None:
    assert example_org.network_profile_for("nlp-team").mode == "isolated"
    job = build_smoke_trainjob(
        example_org, "nlp-team", image="registry.acme.internal/nlp/preflight:1.0", num_nodes=1
    )
    assert job["metadata"]["namespace"] == "nlp-team"
    assert "--expect-pinned" not in job["spec"]["trainer"]["command"]
    assert job["spec"]["trainer"]["image"] == "registry.acme.internal/nlp/preflight:1.0"
    assert job["spec"]["trainer"]["numNodes"] == 1


def test_given_labels_and_settings_win(example_org: Config) -> None:
    job = build_smoke_trainjob(
        example_org,
        "cv-team",
        labels={"mpigate.io/cost-center": "cc-0042"},
        settings=PreflightSettings(sizes=(8, 4096), iterations=3, hold=2, min_bandwidth_mbs=100),
        name="cv-preflight",
    )
    assert job["metadata"]["name"] == "cv-preflight"
    assert job["metadata"]["labels"]["mpigate.io/cost-center"] == "cc-0042"
    program = _program(job)
    assert program[program.index("--sizes") + 1] == "8,4096"
    assert program[program.index("--iterations") + 1] == "3"
    assert program[program.index("--min-bandwidth-mbs") + 1] == "100"


@pytest.mark.parametrize(
    ("team", "kwargs", "message"),
    [
        ("nope", {}, "unknown team 'nope' (teams: cv-team, nlp-team, research-team)"),
        ("cv-team", {"num_nodes": 9}, "team 'cv-team' may use 1..8 nodes per job, not 9"),
        ("research-team", {"runtime": "other"}, "team 'research-team' may not use runtime 'other'"),
        ("cv-team", {"runtime": "absent"}, "runtime 'absent' is not in the config tree; pass the image"),
    ],
)
def test_impossible_jobs_are_errors(
    example_org: Config, team: str, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(SmokeJobError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_smoke_trainjob(example_org, team, **kwargs)


@pytest.mark.upstream
def test_job_is_valid_against_the_trainjob_crd(example_org: Config, upstream: Path) -> None:
    crd = yaml.safe_load((upstream / "trainer" / "crds" / "trainer.kubeflow.org_trainjobs.yaml").read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = version["schema"]["openAPIV3Schema"]
    for team in example_org.teams:
        job = build_smoke_trainjob(example_org, team)
        jsonschema.validate(job, schema)
    broken = build_smoke_trainjob(example_org, "cv-team")
    broken["spec"]["trainer"]["numProcPerNode"] = "1"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)
