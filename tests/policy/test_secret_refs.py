"""MPG-SEC-SECRETREF (issue 18, item 8): a TrainJob reads only the secrets its team's TeamAccess
names, the runtime's own and the MPI SSH secret Trainer makes for the job itself."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from mpigate.config import Config, load
from mpigate.policy.rules.secrets import MPI_SSH_AUTH_SUFFIX
from mpigate.scaffold import copy_example
from tests.conftest import TODAY
from tests.policy.helpers import EXAMPLES, decide, example_org, read, trainjob

RULE = "MPG-SEC-SECRETREF"


@pytest.fixture(scope="module")
def config() -> Config:
    return example_org()


def patched(pod_spec: dict[str, Any], job: str = "launcher", **spec: Any) -> dict[str, Any]:
    """The example TrainJob with a runtime patch setting ``pod_spec`` on one replicated job."""
    return trainjob(
        runtimePatches=[
            {
                "manager": "acme.example/debug",
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {"name": job, "template": {"spec": {"template": {"spec": pod_spec}}}}
                            ]
                        }
                    }
                },
            }
        ],
        **spec,
    )


def secret_violations(config: Config, obj: dict[str, Any], **kwargs: Any) -> list[tuple[str, str]]:
    decision = decide(config, obj, **kwargs)
    return [(v.path, v.message) for v in decision.violations if v.rule == RULE]


def env(name: str, secret: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}


@pytest.mark.parametrize(
    ("pod_spec", "where"),
    [
        (
            {"volumes": [{"name": "c", "secret": {"secretName": "nlp-pipeline-registry"}}]},
            "volumes[name=c].secret",
        ),
        (
            {
                "volumes": [
                    {"name": "p", "projected": {"sources": [{"secret": {"name": "nlp-pipeline-registry"}}]}}
                ]
            },
            "volumes[name=p].projected.sources[0].secret",
        ),
        ({"containers": [{"name": "node", "env": [env("X", "nlp-pipeline-registry")]}]}, "env[name=X]"),
        (
            {"containers": [{"name": "node", "envFrom": [{"secretRef": {"name": "nlp-pipeline-registry"}}]}]},
            "envFrom[0].secretRef",
        ),
    ],
)
def test_every_way_of_reading_a_secret_is_judged(
    config: Config, pod_spec: dict[str, Any], where: str
) -> None:
    found = secret_violations(config, patched(pod_spec))
    assert len(found) == 1, found
    path, message = found[0]
    assert path.startswith("spec.runtimePatches[manager=acme.example/debug]") and where in path
    assert (
        "nlp-pipeline-registry" in message
        and "nlp-team's mountable secrets (hf-token, s3-credentials, nlp-data-*)" in message
    )


def test_the_teams_secrets_and_globs_are_fine(config: Config) -> None:
    pod_spec = {"volumes": [{"name": "d", "secret": {"secretName": "nlp-data-reader"}}]}
    obj = patched(pod_spec)
    obj["spec"]["trainer"]["env"] = [env("HF_TOKEN", "hf-token")]
    assert secret_violations(config, obj) == []
    assert decide(config, read("trainjobs/llm-finetune.yaml")).allowed


def test_trainers_ssh_secret_of_this_job_only(config: Config) -> None:
    own = patched(
        {"containers": [{"name": "node", "envFrom": [{"secretRef": {"name": "job" + MPI_SSH_AUTH_SUFFIX}}]}]}
    )
    assert secret_violations(config, own) == []  # trainjob() is named "job"
    other = patched(
        {"containers": [{"name": "node", "envFrom": [{"secretRef": {"name": "llm-finetune-mpi-ssh-auth"}}]}]}
    )
    ((_, message),) = secret_violations(config, other)
    assert "another TrainJob's MPI SSH key (this job's is job-mpi-ssh-auth)" in message


def test_the_node_jobs_and_the_trainers_env_are_judged_too(config: Config) -> None:
    node = patched({"containers": [{"name": "node", "env": [env("X", "nlp-pipeline-registry")]}]}, job="node")
    ((path, _),) = secret_violations(config, node)
    assert "replicatedJobs[name=node]" in path
    trainer = trainjob()
    trainer["spec"]["trainer"]["env"] = [env("X", "nlp-pipeline-registry")]
    assert [p for p, _ in secret_violations(config, trainer)] == [
        "spec.trainer.env[name=X].valueFrom.secretKeyRef.name"
    ]


def test_the_plugins_ssh_volume_and_the_runtimes_own_references_are_not_judged(tmp_path: Path) -> None:
    """Every MPI pod mounts Trainer's SSH volume (resolved as ``<trainjob>-mpi-ssh-auth``); a
    secret the approved runtime names is reviewed with the runtime, the same from the TrainJob is
    judged."""
    copy_example(tmp_path / "org")
    runtime = tmp_path / "org" / "policies" / "runtimes" / "mpi-openmpi-gpu.yaml"
    text = runtime.read_text(encoding="utf-8")
    anchor = "                    - name: node\n"
    assert text.count(anchor) >= 1
    runtime.write_text(
        text.replace(
            anchor,
            anchor + "                      envFrom: [{secretRef: {name: runtime-license}}]\n",
        ),
        encoding="utf-8",
    )
    config = load(tmp_path / "org", revision="test", today=TODAY)
    assert secret_violations(config, trainjob()) == []
    obj = trainjob()
    obj["spec"]["trainer"]["env"] = [env("L", "runtime-license")]
    assert len(secret_violations(config, obj)) == 1


def test_another_teams_access_does_not_count(config: Config) -> None:
    cv_secret = patched({"volumes": [{"name": "c", "secret": {"secretName": "cv-data-reader"}}]})
    assert len(secret_violations(config, cv_secret)) == 1


def test_update_reports_only_new_references(config: Config) -> None:
    old = patched({"volumes": [{"name": "c", "secret": {"secretName": "nlp-pipeline-registry"}}]})
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["extra"] = "x"
    assert secret_violations(config, new, operation="UPDATE", old=old) == []
    added = copy.deepcopy(old)
    added["spec"]["trainer"]["env"] = [env("X", "other-secret")]
    assert [p for p, _ in secret_violations(config, added, operation="UPDATE", old=old)] == [
        "spec.trainer.env[name=X].valueFrom.secretKeyRef.name"
    ]


def test_an_mpijob_is_judged_alike(config: Config) -> None:
    """The MPI Operator's own SSH volume (``<mpijob>-ssh``) is its layer; what the author writes in
    a replica template is judged."""
    mpijob = read(EXAMPLES / "mpijobs" / "mpi-allreduce.yaml")
    assert secret_violations(config, mpijob) == []
    worker = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["volumes"] = [{"name": "other", "secret": {"secretName": "cv-team-ssh"}}]
    ((path, message),) = secret_violations(config, mpijob)
    assert path.startswith("spec.mpiReplicaSpecs.Worker.template.spec.volumes") and "cv-team-ssh" in message


def test_a_glob_never_covers_another_jobs_ssh_key(tmp_path: Path) -> None:
    """A team that lists ``*`` means its own secrets, not the key to every other job's pods:
    another job's MPI SSH secret is allowed only by its exact name."""
    copy_example(tmp_path / "org")
    access = tmp_path / "org" / "rbac" / "nlp-team.yaml"
    text = access.read_text(encoding="utf-8")
    listed = "secrets: [hf-token, s3-credentials, nlp-data-*]"
    assert listed in text

    def reading(secret: str) -> dict[str, Any]:
        return patched({"containers": [{"name": "node", "envFrom": [{"secretRef": {"name": secret}}]}]})

    access.write_text(text.replace(listed, "secrets: ['*']"), encoding="utf-8")
    config = load(tmp_path / "org", revision="test", today=TODAY)
    assert secret_violations(config, reading("nlp-pipeline-registry")) == []
    assert secret_violations(config, reading("job" + MPI_SSH_AUTH_SUFFIX)) == []
    ((_, message),) = secret_violations(config, reading("llm-finetune-mpi-ssh-auth"))
    assert "another TrainJob's MPI SSH key" in message
    access.write_text(text.replace(listed, "secrets: ['*', llm-finetune-mpi-ssh-auth]"), encoding="utf-8")
    config = load(tmp_path / "org", revision="test", today=TODAY)
    assert secret_violations(config, reading("llm-finetune-mpi-ssh-auth")) == []
