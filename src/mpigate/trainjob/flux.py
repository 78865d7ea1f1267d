"""Trainer's Flux plugin (``pkg/runtime/framework/plugins/flux/flux.go``,
``(*Flux).EnforceMLPolicy``), as far as it changes the pods: on the replicated job named ``node``,
an init container ``flux-installer`` whose image is ``FLUX_VIEW_IMAGE`` — the TrainJob's
``spec.trainer.env`` first, then the trainer container's env in the runtime, else Trainer's default
(``brokerSettingsFromEnvironment``) — with the volumes and mounts it shares with the ``node``
container. A tenant can choose that image, so it is judged like every other one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .jsontypes import is_mapping
from .model import NODE, Layer
from .paths import Key, PathPart
from .pods import upserted_named

__all__ = ["DEFAULT_FLUX_VIEW_IMAGE", "FLUX_INSTALLER", "FLUX_VIEW_IMAGE", "apply_flux", "flux_view_image"]

# pkg/constants: FluxInstallerContainerName, FluxInstallerImage and the volume names and paths.
FLUX_INSTALLER = "flux-installer"
FLUX_VIEW_IMAGE = "FLUX_VIEW_IMAGE"
DEFAULT_FLUX_VIEW_IMAGE = "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy"
_CONFIG = "<trainjob>-flux-entrypoint"
_VOLUMES: tuple[dict[str, Any], ...] = (
    {"name": "spack-install", "emptyDir": {}},
    {"name": "flux-install", "emptyDir": {}},
    {"name": _CONFIG, "configMap": {"name": _CONFIG, "defaultMode": 0o755}},
    {"name": "shared-memory", "emptyDir": {"medium": "Memory"}},
    {"name": "flux-curve", "secret": {"secretName": "<trainjob>-flux-curve", "defaultMode": 0o400}},
)
_NODE_MOUNTS: tuple[dict[str, Any], ...] = (
    {"name": "flux-install", "mountPath": "/mnt/flux"},
    {"name": "spack-install", "mountPath": "/opt/software"},
    {"name": _CONFIG, "mountPath": "/etc/flux-config", "readOnly": True},
    {"name": "flux-curve", "mountPath": "/curve", "readOnly": True},
    {"name": "shared-memory", "mountPath": "/dev/shm", "readOnly": True},
)


def flux_view_image(trainjob_env: Sequence[Mapping[str, Any]], runtime_env: Any) -> tuple[str, bool]:
    """``(image, from the TrainJob)`` as ``brokerSettingsFromEnvironment`` picks it: the value of
    the last ``FLUX_VIEW_IMAGE`` entry of the TrainJob's env (Trainer reads ``Value``, so an entry
    with ``valueFrom`` gives ``""``), else of the runtime trainer container's env entries with a
    value, else Trainer's default."""
    for var in reversed(trainjob_env):
        if var.get("name") == FLUX_VIEW_IMAGE:
            value = var.get("value")
            return (value if isinstance(value, str) else ""), True
    image = DEFAULT_FLUX_VIEW_IMAGE
    for var in runtime_env if isinstance(runtime_env, list) else ():
        if is_mapping(var) and var.get("name") == FLUX_VIEW_IMAGE and isinstance(var.get("value"), str):
            image = var["value"]
    return image, False


def apply_flux(pod: dict[str, Any], image: str, from_trainjob: bool, root: str) -> list[Layer]:
    """The plugin on the ``node`` job's pod (a private copy): its volumes, the mounts of the
    ``node`` container and the ``flux-installer`` init container. The layers say where each value
    came from (the image from ``spec.trainer.env`` when the TrainJob chose it)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return []
    spec["volumes"] = upserted_named(spec.get("volumes"), "name", _VOLUMES)
    containers = spec.get("containers")
    if isinstance(containers, list):
        for container in containers:
            if isinstance(container, dict) and container.get("name") == NODE:
                container["volumeMounts"] = upserted_named(
                    container.get("volumeMounts"), "mountPath", _NODE_MOUNTS
                )
    installer: dict[str, Any] = {
        "name": FLUX_INSTALLER,
        "command": ["/bin/bash", "/etc/flux-config/init.sh"],
        "volumeMounts": [
            {"name": "flux-install", "mountPath": "/mnt/flux"},
            {"name": _CONFIG, "mountPath": "/etc/flux-config", "readOnly": True},
        ],
    }
    if image:  # (*JobSet).Build sets an image only when there is one
        installer["image"] = image
    current = spec.get("initContainers")
    spec["initContainers"] = [*(current if isinstance(current, list) else []), installer]
    plugin = {
        "spec": {
            "volumes": list(_VOLUMES),
            "containers": [{"name": NODE, "volumeMounts": list(_NODE_MOUNTS)}],
            "initContainers": [installer],
        }
    }
    layers = [Layer("flux", plugin, (), root)]
    if from_trainjob:
        at: tuple[PathPart, ...] = ("spec", "initContainers", Key("name", FLUX_INSTALLER), "image")
        layers.append(
            Layer(
                "trainer",
                {"spec": {"initContainers": [{"name": FLUX_INSTALLER, "image": image}]}},
                (),
                "",
                aliases=((at, ("spec", "trainer", "env", Key("name", FLUX_VIEW_IMAGE))),),
            )
        )
    return layers
