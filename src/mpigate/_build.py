"""Which build of mpigate is running: the mypyc-compiled wheel or pure Python (docs/building.md).

The compiled wheel carries the hot modules (:data:`COMPILED`, packages with all their modules) as
extension modules next to their pure-Python source; the import system prefers the extension
module, so what a module's ``__file__`` names is what runs.
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.machinery import EXTENSION_SUFFIXES

__all__ = ["COMPILED", "compiled", "module_builds"]

# What the wheel's mypyc hook compiles (pyproject.toml: tool.hatch.build.targets.wheel.hooks.mypyc).
COMPILED = (
    "mpigate.trainjob",
    "mpigate.policy",
    "mpigate.catalogue",
    "mpigate.admission.review",
    "mpigate.admission.logjson",
    "mpigate.audit.records",
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


def compiled() -> bool:
    """Whether the policy engine runs mypyc-compiled (its entry module is an extension module)."""
    return _is_extension(importlib.import_module("mpigate.policy.engine").__file__)
