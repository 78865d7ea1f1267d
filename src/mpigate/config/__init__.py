"""The GitOps config tree: schemas, loading, cross-file checks and the immutable ``Config``.

>>> from mpigate.config import load
>>> config = load("examples/org")            # doctest: +SKIP
>>> config.team_for_namespace("nlp-team").name  # doctest: +SKIP
'nlp-team'
"""

from .frozen import freeze, thaw
from .loader import CheckResult, check_tree, is_config_tree, load
from .model import Config, Team
from .problems import ConfigError, Location, Problem, Severity, format_path
from .schema import API_VERSION, KINDS, kind_schema
from .units import format_duration, parse_duration, parse_quantity
from .yamlsource import Document, parse_documents, parse_file

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
