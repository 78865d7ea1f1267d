"""The GitOps config tree: schemas, loading, cross-file checks and the immutable ``Config``.

>>> from mpigate.config import load
>>> config = load("examples/org")            # doctest: +SKIP
>>> config.team_for_namespace("nlp-team").name  # doctest: +SKIP
'nlp-team'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .frozen import freeze, thaw
    from .loader import CheckResult, check_tree, is_config_tree, load
    from .model import Config, Team
    from .problems import ConfigError, Location, Problem, Severity, format_path
    from .schema import API_VERSION, KINDS, kind_schema
    from .units import format_duration, parse_duration, parse_quantity
    from .yamlsource import Document, parse_documents, parse_file

# Each name is imported from its module when first asked for (PEP 562): a module that needs only
# the model, the MPI environment or the problems (every MPI rank of the preflight) does not pay for
# the loader, its schemas and the CEL environment (0.2 s of CPU).
_HOMES: dict[str, str] = {
    **dict.fromkeys(("freeze", "thaw"), "frozen"),
    **dict.fromkeys(("CheckResult", "check_tree", "is_config_tree", "load"), "loader"),
    **dict.fromkeys(("Config", "Team"), "model"),
    **dict.fromkeys(("ConfigError", "Location", "Problem", "Severity", "format_path"), "problems"),
    **dict.fromkeys(("API_VERSION", "KINDS", "kind_schema"), "schema"),
    **dict.fromkeys(("format_duration", "parse_duration", "parse_quantity"), "units"),
    **dict.fromkeys(("Document", "parse_documents", "parse_file"), "yamlsource"),
}

if not TYPE_CHECKING:  # mypy would read a module __getattr__ as "any name exists here"

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{home}", __name__), name)
        globals()[name] = value
        return value


__all__ = [
    "API_VERSION",
    "KINDS",
    "CheckResult",
    "Config",
    "ConfigError",
    "Document",
    "Location",
    "Problem",
    "Severity",
    "Team",
    "check_tree",
    "format_duration",
    "format_path",
    "freeze",
    "is_config_tree",
    "kind_schema",
    "load",
    "parse_documents",
    "parse_duration",
    "parse_file",
    "parse_quantity",
    "thaw",
]
