"""What the engine derives from a config alone, computed lazily once per :class:`Config`.

Stored in ``Config.memo`` (per config object: a reloaded config starts empty, nothing outlives the
config it was derived from, and no module holds state). Every value is read-only by contract and
depends only on the config, never on a request, so sharing it between requests cannot change a
decision — it only saves recomputing it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from mpigate.config import Config
from mpigate.config.model import Runtime
from mpigate.trainjob import PreparedRuntime, get_path, is_mapping, prepare_runtime
from mpigate.trainjob.jsontypes import as_mapping

from . import images
from .demand import gpu_resources

__all__ = ["config_gpu_resources", "config_image_refs", "memoized", "prepared_runtime"]

T = TypeVar("T")


def memoized(config: Config, key: tuple[Any, ...], build: Callable[[], T]) -> T:
    """``build()``, computed once per ``config`` under ``key`` (``build`` must depend on the config
    alone; the first key part names the caller, e.g. ``"policy.residency.schemes"``)."""
    memo = config.memo
    found = memo.get(key)
    if found is None:
        # setdefault: two threads that race here both compute, and both use the first result.
        found = memo.setdefault(key, build())
    return found  # type: ignore[no-any-return]


def prepared_runtime(config: Config, runtime: Runtime) -> PreparedRuntime:
    """``runtime`` (one of ``config.runtimes``) prepared for :func:`mpigate.trainjob.resolve`."""
    key = ("policy.prepared_runtime", runtime.kind, runtime.namespace, runtime.name)
    found: PreparedRuntime = memoized(config, key, lambda: prepare_runtime(runtime.manifest))
    return found


def config_gpu_resources(config: Config) -> frozenset[str]:
    """:func:`mpigate.policy.demand.gpu_resources` of ``config``, once."""
    found: frozenset[str] = memoized(config, ("policy.gpu_resources",), lambda: gpu_resources(config))
    return found


def config_image_refs(config: Config) -> Mapping[str, images.ImageRef | images.ImageRefError]:
    """Every image of the config's runtimes (containers and image volumes), parsed (most images a
    job runs are its runtime's)."""

    def build() -> Mapping[str, images.ImageRef | images.ImageRefError]:
        out: dict[str, images.ImageRef | images.ImageRefError] = {}
        for runtime in config.runtimes.values():
            for _, job in prepared_runtime(config, runtime).jobs:
                found, spec = get_path(job, ("template", "spec", "template", "spec"))
                if not found or not is_mapping(spec):
                    continue
                refs = [
                    container.get("image")
                    for list_field in ("initContainers", "containers", "ephemeralContainers")
                    for container in _items(spec.get(list_field))
                ]
                refs += [
                    as_mapping(volume.get("image")).get("reference") for volume in _items(spec.get("volumes"))
                ]
                for image in refs:
                    if isinstance(image, str) and image not in out:
                        try:
                            out[image] = images.parse_image(image)
                        except images.ImageRefError as error:
                            out[image] = error
        return MappingProxyType(out)

    found: Mapping[str, images.ImageRef | images.ImageRefError] = memoized(
        config, ("policy.image_refs",), build
    )
    return found


def _items(value: Any) -> list[Mapping[str, Any]]:
    """The mapping elements of a list field (none when it is not a list)."""
    return [item for item in value if is_mapping(item)] if isinstance(value, list) else []
