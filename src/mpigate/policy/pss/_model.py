"""The Pod Security model: levels, versions and what a failing check reports."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Final, Literal

Version = tuple[int, int]

LEVELS: Final = ("privileged", "baseline", "restricted")
#: The newest minimum version of any check implementation; ``latest`` and newer versions use it.
NEWEST_VERSION: Final[Version] = (1, 37)

_VERSION_RE: Final = re.compile(r"v1\.(0|[1-9][0-9]*)")


@dataclass(frozen=True, slots=True)
class PSSFinding:
    """One failing upstream check.

    ``paths`` are Kubernetes-style JSON paths inside the Pod object
    (``spec.containers[0].securityContext.runAsNonRoot``,
    ``metadata.annotations["container.apparmor.security.beta.kubernetes.io/node"]``) of the
    offending fields, or, when a required field is missing, of the place where it must be set.
    """

    check: str
    rule: str
    level: str
    reason: str
    detail: str
    paths: tuple[str, ...]


# --------------------------------------------------------------------------------------------------
# Versions


def parse_version(text: str) -> Version | Literal["latest"]:
    """``"v1.29"`` → ``(1, 29)``; ``"latest"`` → ``"latest"``; anything else → ``ValueError``.

    The grammar is upstream's (``api.ParseVersion``): ``v1.<minor>`` without leading zeros.
    """
    if text == "latest":
        return "latest"
    if not isinstance(text, str):
        raise ValueError(f"invalid Pod Security version {text!r}: expected 'latest' or 'v1.<minor>'")
    match = _VERSION_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid Pod Security version {text!r}: expected 'latest' or 'v1.<minor>'")
    return (1, int(match.group(1)))


def effective_version(version: str) -> Version:
    """The version ``version`` evaluates as: ``latest`` and newer versions → :data:`NEWEST_VERSION`."""
    parsed = parse_version(version)
    if parsed == "latest" or parsed > NEWEST_VERSION:
        return NEWEST_VERSION
    return parsed


_effective_version = cache(effective_version)  # the config's one or two version strings
