"""Which build of mpigate is running: the mypyc-compiled wheel or pure Python (docs/building.md).

The compiled wheel carries the hot modules (:data:`COMPILED`, packages with all their modules) as
extension modules next to their pure-Python source; the import system prefers the extension
module, so what a module's ``__file__`` names is what runs.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from importlib.machinery import EXTENSION_SUFFIXES, PathFinder

import mpigate

__all__ = ["COMPILED", "compiled", "module_builds"]

# What the wheel's mypyc hook compiles (pyproject.toml: tool.hatch.build.targets.wheel.hooks.mypyc).
COMPILED = (
    "mpigate.trainjob",
    "mpigate.kueue",
    "mpigate.policy",
    "mpigate.catalogue",
    "mpigate.admission.review",
    "mpigate.admission.fastpath",
    "mpigate.admission.slots",
    "mpigate.admission.logjson",
    "mpigate.admission.service",
    "mpigate.admission.metrics",
    "mpigate.admission.deadline",
    "mpigate.admission.routes",
    "mpigate.config.model",
    "mpigate.config.queueing",
    "mpigate.audit.records",
    "mpigate.cel.reads",
)


def _is_extension(path: str | None) -> bool:
    return path is not None and path.endswith(tuple(EXTENSION_SUFFIXES))


def module_builds() -> dict[str, bool]:
    """Every module of :data:`COMPILED` (imported) → whether it runs compiled."""
    out: dict[str, bool] = {}
    for name in COMPILED:
        module = importlib.import_module(name)
        out[name] = _is_extension(module.__file__)
        for info in pkgutil.walk_packages(getattr(module, "__path__", ()), f"{name}."):
            out[info.name] = _is_extension(importlib.import_module(info.name).__file__)
    return out


_ENGINE = "mpigate.policy.engine"


def compiled() -> bool:
    """Whether the policy engine runs mypyc-compiled (its entry module is an extension module).

    Answered without importing the engine (``mpigate --version`` asks, and the engine with its
    CEL library is most of the CLI's start-up time): the file the import system would load, found
    by the same path finder, which prefers an extension module to the source next to it."""
    module = sys.modules.get(_ENGINE)
    if module is not None:
        return _is_extension(module.__file__)
    package_dirs = [f"{path}/policy" for path in mpigate.__path__]
    spec = PathFinder.find_spec(_ENGINE, package_dirs)
    return spec is not None and _is_extension(spec.origin)
