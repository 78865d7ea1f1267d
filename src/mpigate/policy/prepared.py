"""What the engine derives from a config alone, computed lazily once per :class:`Config`.

Stored in ``Config.memo`` (per config object: a reloaded config starts empty, nothing outlives the
config it was derived from, and no module holds state). Every value is read-only by contract and
depends only on the config, never on a request, so sharing it between requests cannot change a
decision — it only saves recomputing it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from mpigate.config import Config
from mpigate.config.model import Runtime
from mpigate.trainjob import PreparedRuntime, get_path, is_mapping, prepare_runtime

from . import images
from .demand import gpu_resources

__all__ = ["config_gpu_resources", "config_image_refs", "prepared_runtime"]


def _memo(config: Config, key: tuple[Any, ...], build: Any) -> Any:
    memo = config.memo
    found = memo.get(key)
    if found is None:
        # setdefault: two threads that race here both compute, and both use the first result.
        found = memo.setdefault(key, build())
    return found


def prepared_runtime(config: Config, runtime: Runtime) -> PreparedRuntime:
    """``runtime`` (one of ``config.runtimes``) prepared for :func:`mpigate.trainjob.resolve`."""
    key = ("policy.prepared_runtime", runtime.kind, runtime.namespace, runtime.name)
    found: PreparedRuntime = _memo(config, key, lambda: prepare_runtime(runtime.manifest))
    return found


def config_gpu_resources(config: Config) -> frozenset[str]:
    """:func:`mpigate.policy.demand.gpu_resources` of ``config``, once."""
    found: frozenset[str] = _memo(config, ("policy.gpu_resources",), lambda: gpu_resources(config))
    return found


def config_image_refs(config: Config) -> Mapping[str, images.ImageRef | images.ImageRefError]:
    """Every container image of the config's runtimes, parsed (most images a job runs are its
    runtime's)."""

    def build() -> Mapping[str, images.ImageRef | images.ImageRefError]:
        out: dict[str, images.ImageRef | images.ImageRefError] = {}
        for runtime in config.runtimes.values():
            for _, job in prepared_runtime(config, runtime).jobs:
                found, spec = get_path(job, ("template", "spec", "template", "spec"))
                for list_field in ("initContainers", "containers", "ephemeralContainers"):
                    items = spec.get(list_field) if found and is_mapping(spec) else None
                    for container in items if isinstance(items, list) else ():
                        image = container.get("image") if is_mapping(container) else None
                        if isinstance(image, str) and image not in out:
                            try:
                                out[image] = images.parse_image(image)
                            except images.ImageRefError as error:
                                out[image] = error
        return MappingProxyType(out)

    found: Mapping[str, images.ImageRef | images.ImageRefError] = _memo(config, ("policy.image_refs",), build)
    return found
