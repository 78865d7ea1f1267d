"""Where the shipped declarative data lives: inside the wheel, or in a source checkout."""

from __future__ import annotations

from functools import cache
from pathlib import Path

__all__ = ["data_path", "data_root"]

_MARKER = "templates"


@cache
def data_root() -> Path:
    """The folder that holds ``policies/ quotas/ rbac/ networkpolicies/ templates/ webhooks/
    examples/``: ``mpigate/_data`` in an installed wheel, the repository root in a checkout or
    an editable install."""
    packaged = Path(__file__).resolve().parent / "_data"
    if (packaged / _MARKER).is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / _MARKER).is_dir() and (checkout / "pyproject.toml").is_file():
        return checkout
    raise FileNotFoundError(
        "mpigate's data files (templates, example org) are missing: reinstall the mpigate wheel"
    )


def data_path(*parts: str) -> Path:
    """A path below :func:`data_root`."""
    return data_root().joinpath(*parts)
