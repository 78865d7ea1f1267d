"""mpigate: declarative GitOps governance and admission control for MPI training jobs.

The public surface is small and stable:

- :func:`mpigate.config.load` — load and check a config tree into an immutable ``Config``;
- the ``mpigate`` command (``mpigate --help``).

Everything else is organised in layers (``config`` → ``trainjob`` → ``policy`` → ``admission`` /
``audit`` / ``report`` / ``render`` / ``controller``); see docs/architecture.md.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mpigate")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
