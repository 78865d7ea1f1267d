"""Trainer's MPI plugin (``pkg/runtime/framework/plugins/mpi/mpi.go``, ``(*MPI).EnforceMLPolicy``):
the SSH-auth Secret volume on ``launcher``/``node``, the hostfile ConfigMap and the reserved
OpenMPI env on the launcher's ``node`` container, and the slots per host."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mpigate.config import parse_quantity

from .model import LAUNCHER, NODE, Layer, MLPolicy
from .pods import container, pod_template, upserted_env, upserted_named
from .reading import mapping

__all__ = [
    "MPI_HOSTFILE_DIR",
    "MPI_HOSTFILE_VOLUME",
    "MPI_SSH_AUTH_VOLUME",
    "OPENMPI_RESERVED_ENV",
    "MPIPlugin",
    "apply_mpi",
    "gpu_count",
    "mpi_plugin",
]

# Trainer's MPI plugin constants (pkg/constants): volume names, hostfile location and the env it
# reserves on the launcher.
MPI_SSH_AUTH_VOLUME = "mpi-ssh-auth"
MPI_HOSTFILE_VOLUME = "mpi-hostfile"
MPI_HOSTFILE_DIR = "/etc/mpi"
OPENMPI_RESERVED_ENV = (
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots",
    "OMPI_MCA_plm_rsh_args",
)


# The same few quantities recur in every job: parse each once (a pure function of the string).
_quantity = lru_cache(maxsize=1024)(parse_quantity)


def gpu_count(resources: Mapping[str, Any]) -> int:
    """Trainer's ``GetNumGPUPerNode`` (``pkg/runtime/runtime.go``): the GPUs in the requests, else in
    the limits, of the first resource whose name contains ``gpu`` (any case), rounded up as
    ``Quantity.Value`` rounds. Go visits a map in random order; with several such resources mpigate
    takes the first by name, so that the answer is deterministic."""
    for section in ("requests", "limits"):
        values = mapping(resources.get(section))
        name: str | None = None
        for key in values:  # min() over a generator, without the generator (hot path)
            if isinstance(key, str) and "gpu" in key.lower() and (name is None or key < name):
                name = key
        if name is None:
            continue
        value = values[name]
        try:
            count = _quantity(value) if type(value) in (str, int) else parse_quantity(value)
        except (ValueError, TypeError, ZeroDivisionError, OverflowError):
            return 0
        gpus = -(-count.numerator // count.denominator)
        if gpus > 0:
            return gpus
    return 0


@dataclass(frozen=True, slots=True)
class MPIPlugin:
    """What Trainer's MPI plugin adds to one job (``node`` or ``launcher``) of an MPI runtime, built
    once per prepared runtime: everything but the slots value depends only on the runtime.

    The plugin *upserts* into lists of the job's pod (its volumes, the ``node`` container's env and
    volumeMounts). Each ``*_from``/``*_to`` pair is that upsert done once on the runtime's own list:
    when a job's list is still the runtime's object (no runtime patch replaced it — resolutions
    share untouched subtrees), the result is reused instead of recomputed (speed).
    """

    #: The plugin's volumes, the node container's mounts and (launcher) reserved env, whose
    #: slots entry (index 2) is a placeholder.
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    env: list[dict[str, Any]]
    volumes_from: Any
    volumes_to: list[Any]
    mounts_from: Any
    mounts_to: list[Any]
    env_from: Any
    env_to: list[Any]
    #: Where the slots entry sits in ``env_to`` (-1: no env).
    env_slots_index: int
    #: The layer when the pod has no ``node`` container, and (node job) when it has one.
    layer_without_node: Layer
    layer_with_node: Layer | None


def mpi_plugin(job: str, doc: Mapping[str, Any], ml: MLPolicy, root: str) -> MPIPlugin:
    volumes: list[dict[str, Any]] = [
        {
            "name": MPI_SSH_AUTH_VOLUME,
            "secret": {"secretName": "<trainjob>-mpi-ssh-auth", "defaultMode": 0o640},
        }
    ]
    mounts: list[dict[str, Any]] = [{"name": MPI_SSH_AUTH_VOLUME, "mountPath": ml.ssh_auth_mount_path}]
    env: list[dict[str, Any]] = []
    # Stands for the slots entry in the precomputed env lists; replaced before a list is used.
    slots_placeholder = {"name": OPENMPI_RESERVED_ENV[2], "value": ""}
    if job == LAUNCHER:
        volumes.append({"name": MPI_HOSTFILE_VOLUME, "configMap": {"name": "<trainjob>-mpi-hostfile"}})
        mounts.append({"name": MPI_HOSTFILE_VOLUME, "mountPath": MPI_HOSTFILE_DIR})
        env = [
            {"name": OPENMPI_RESERVED_ENV[0], "value": f"{MPI_HOSTFILE_DIR}/hostfile"},
            {"name": OPENMPI_RESERVED_ENV[1], "value": "true"},
            slots_placeholder,
            {"name": OPENMPI_RESERVED_ENV[3], "value": "-o ConnectionAttempts=10"},
        ]
    pod = pod_template(doc)
    spec = mapping(pod.get("spec"))
    node = container(pod, NODE) or {}
    volumes_from, mounts_from, env_from = spec.get("volumes"), node.get("volumeMounts"), node.get("env")
    env_to = upserted_env(env_from, env) if env else []
    return MPIPlugin(
        volumes=volumes,
        mounts=mounts,
        env=env,
        volumes_from=volumes_from,
        volumes_to=upserted_named(volumes_from, "name", volumes),
        mounts_from=mounts_from,
        mounts_to=upserted_named(mounts_from, "mountPath", mounts),
        env_from=env_from,
        env_to=env_to,
        env_slots_index=next((i for i, var in enumerate(env_to) if var is slots_placeholder), -1),
        layer_without_node=_mpi_layer(volumes, {"name": NODE}, root),
        layer_with_node=None if env else _mpi_layer(volumes, {"name": NODE, "volumeMounts": mounts}, root),
    )


def _mpi_layer(volumes: list[dict[str, Any]], container: dict[str, Any], root: str) -> Layer:
    return Layer("mpi", {"spec": {"volumes": volumes, "containers": [container]}}, (), root)


def apply_mpi(pod: dict[str, Any], plugin: MPIPlugin, slots: int, root: str) -> Layer:
    """Trainer's MPI plugin: SSH auth Secret volume, hostfile, and the reserved OpenMPI env
    (``plugin``: its parts prepared for the job's runtime)."""
    spec = pod.setdefault("spec", {}) if isinstance(pod.get("spec", {}), dict) else {}
    current = spec.get("volumes")
    spec["volumes"] = (
        plugin.volumes_to
        if current is plugin.volumes_from
        else upserted_named(current, "name", plugin.volumes)
    )
    node = container(pod, NODE)
    if node is None:
        return plugin.layer_without_node
    env: list[dict[str, Any]] = []
    if plugin.env:  # launcher: the reserved env first (as Trainer sets it)
        slots_var = {"name": OPENMPI_RESERVED_ENV[2], "value": str(slots)}
        env = list(plugin.env)
        env[2] = slots_var
        current = node.get("env")
        if current is plugin.env_from:
            node_env = list(plugin.env_to)
            node_env[plugin.env_slots_index] = slots_var
        else:
            node_env = upserted_env(current, env)
        node["env"] = node_env
    current = node.get("volumeMounts")
    node["volumeMounts"] = (
        plugin.mounts_to
        if current is plugin.mounts_from
        else upserted_named(current, "mountPath", plugin.mounts)
    )
    if plugin.layer_with_node is not None:  # node job: the same layer for every job
        return plugin.layer_with_node
    return _mpi_layer(plugin.volumes, {"name": NODE, "volumeMounts": plugin.mounts, "env": env}, root)
