"""MPG-SEC-SECRETREF: a TrainJob mounts only the secrets its team's TeamAccess names.

Anyone who may create a TrainJob in a namespace could otherwise read every secret of it through
``runtimePatches``, ``spec.trainer.env`` or an initializer: a secret volume (also inside a
projected volume), an env ``valueFrom.secretKeyRef`` or an ``envFrom.secretRef``. Allowed are the
secrets listed (names or globs) in ``TeamAccess.spec.secrets``, what the approved runtime itself
references (reviewed with the runtime), and the SSH-auth secret Trainer's MPI plugin creates for
this very TrainJob — ``<trainjob>-mpi-ssh-auth``, never another job's, whose key would open that
job's pods (Trainer: pkg/runtime/framework/plugins/mpi/mpi.go sshAuthSecretName and
``constants.MPISSHAuthSecretSuffix``). An MPIJob is judged alike: the MPI Operator's own SSH volume
(``<mpijob>-ssh``, mpi-operator: pkg/controller/mpi_job_controller.go setupSSHOnPod) is its
``operator`` layer; what the MPIJob's author writes is judged.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence
from functools import lru_cache

from mpigate.policy.context import as_list, as_mapping, as_str
from mpigate.policy.findings import Finding
from mpigate.trainjob import EffectiveJob, keyed_path

__all__ = ["MPI_SSH_AUTH_SUFFIX", "check_secret_refs", "secret_refs"]

# Trainer: pkg/constants/constants.go MPISSHAuthSecretSuffix
MPI_SSH_AUTH_SUFFIX = "-mpi-ssh-auth"
# Layers whose references are not the submitter's: the approved runtime, Trainer's MPI plugin and
# the MPI Operator (for MPIJobs).
_REVIEWED_LAYERS = ("runtime", "mpi", "operator")
# How the resolver names the plugin's SSH secret (mpigate.trainjob.mpi.mpi_plugin): no secret can
# have this name, so it is the plugin's, and every MPI pod has it (no layer lookup on the hot path).
_PLUGIN_SSH = "<trainjob>" + MPI_SSH_AUTH_SUFFIX

PodPath = tuple[str | int, ...]


def secret_refs(job: EffectiveJob) -> Iterator[tuple[PodPath, str, str]]:
    """(pod path of the name, secret name, how it is used) for every secret the pod reads."""
    spec = job.spec
    for i, volume in enumerate(as_list(spec.get("volumes"))):
        vol = as_mapping(volume)
        name = as_str(as_mapping(vol.get("secret")).get("secretName"))
        if name is not None:
            yield ("spec", "volumes", i, "secret", "secretName"), name, "volume"
        for j, source in enumerate(as_list(as_mapping(vol.get("projected")).get("sources"))):
            name = as_str(as_mapping(as_mapping(source).get("secret")).get("name"))
            if name is not None:
                yield (
                    ("spec", "volumes", i, "projected", "sources", j, "secret", "name"),
                    name,
                    "projected volume",
                )
    for list_field, index, container in job.containers():
        for e, var in enumerate(as_list(container.get("env"))):
            ref = as_mapping(as_mapping(as_mapping(var).get("valueFrom")).get("secretKeyRef"))
            name = as_str(ref.get("name"))
            if name is not None:
                yield ("spec", list_field, index, "env", e, "valueFrom", "secretKeyRef", "name"), name, "env"
        for e, source in enumerate(as_list(container.get("envFrom"))):
            name = as_str(as_mapping(as_mapping(source).get("secretRef")).get("name"))
            if name is not None:
                yield ("spec", list_field, index, "envFrom", e, "secretRef", "name"), name, "envFrom"


def _reviewed(job: EffectiveJob, pod_path: PodPath) -> bool:
    """Whether the value at ``pod_path`` comes from the runtime or Trainer's plugin (the last layer
    that defines it wins, as in :meth:`EffectiveJob.origin`)."""
    keyed = keyed_path(job.template, pod_path)
    for layer in reversed(job.layers):
        if layer.depth(keyed) == len(keyed):
            return layer.kind in _REVIEWED_LAYERS
    return False


@lru_cache(maxsize=4096)
def _allowed(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether the team lists ``name``. Another job's MPI SSH secret only by its exact name: a glob
    (``*``, ``nlp-*``) meant for the team's own secrets never hands one job the key to another's pods."""
    if name.endswith(MPI_SSH_AUTH_SUFFIX):
        return name in patterns
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def check_secret_refs(
    jobs: Sequence[EffectiveJob], trainjob: str, team: str, patterns: tuple[str, ...]
) -> Iterator[Finding]:
    """MPG-SEC-SECRETREF on every secret the effective pods read, except the runtime's and
    Trainer's own; ``patterns`` are the team's ``TeamAccess.spec.secrets``."""
    own_ssh = trainjob + MPI_SSH_AUTH_SUFFIX
    listed = ", ".join(patterns) or "none"
    seen: set[str] = set()
    for job in jobs:
        for pod_path, name, how in secret_refs(job):
            if name in (own_ssh, _PLUGIN_SSH) or _allowed(name, patterns) or _reviewed(job, pod_path):
                continue
            path = job.origin(pod_path)
            if path in seen:
                continue
            seen.add(path)
            other_ssh = name.endswith(MPI_SSH_AUTH_SUFFIX)
            yield Finding(
                "MPG-SEC-SECRETREF",
                path,
                f"{how} reads secret {name}, which is not one of {team}'s mountable secrets "
                f"({listed})"
                + (f"; it is another TrainJob's MPI SSH key (this job's is {own_ssh})" if other_ssh else "")
                + ". A job's pods can read every secret they mount.",
                f"Use one of {team}'s secrets ({listed}), or ask the team admin to list it under "
                f"spec.secrets in the team's TeamAccess (rbac/{team}.yaml).",
                f"secret {name} is not one {team} may mount",
            )
