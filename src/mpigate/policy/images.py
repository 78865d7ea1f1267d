"""Container image references: parsing, registry allow-lists and mirrors.

Parsing follows ``github.com/distribution/reference``'s ``ParseNormalizedNamed`` — what the
kubelet, containerd and Docker do with the ``image`` field — so that a reference is judged by the
registry it is actually pulled from:

* the first path component is a registry host only if it contains ``.`` or ``:``, is
  ``localhost``, or has an upper-case letter; otherwise the image is on ``docker.io``
  (``registry.acme.internal.evil.com/x`` is on ``registry.acme.internal.evil.com``; ``acme/x`` is
  on ``docker.io``);
* ``index.docker.io`` is ``docker.io``; single-component Docker Hub names get ``library/``;
* repository components are lower-case ``[a-z0-9]`` runs joined by ``.``, ``_``, ``__`` or dashes;
  a tag is ``[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}``; a digest is ``algorithm:hex`` with a known
  algorithm (``sha256``/``sha384``/``sha512``) and its exact lower-case hex length;
* the fully qualified name is at most 255 characters.

Allow-list entries and mirror keys are registry prefixes ``host[:port][/path]``; they match on the
exact host and port (case-insensitive) and on the repository path at a ``/`` boundary.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final

__all__ = [
    "ImageRef",
    "ImageRefError",
    "mirror_image",
    "parse_image",
    "registry_allowed",
    "split_registry_prefix",
    "unmirror_image",
]

DEFAULT_REGISTRY: Final = "docker.io"
_LEGACY_DEFAULT_REGISTRY: Final = "index.docker.io"
_OFFICIAL_REPOSITORY_PREFIX: Final = "library/"
NAME_TOTAL_LENGTH_MAX: Final = 255
# Far beyond any valid reference (name 255 + tag 128 + digest); bounds the regular expressions' work.
_INPUT_LENGTH_MAX: Final = 1024

# The grammar of distribution/reference (regexp.go), ASCII only like Go's regexp.
_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_IPV6 = r"\[(?:[a-fA-F0-9:]+)\]"
_HOST = rf"(?:{_DOMAIN_NAME}|{_IPV6})"
_DOMAIN_AND_PORT = rf"{_HOST}(?::[0-9]+)?"
_PATH_COMPONENT = rf"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_REMOTE_NAME = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_NAME = rf"(?:{_DOMAIN_AND_PORT}/)?{_REMOTE_NAME}"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

_REFERENCE_RE: Final = re.compile(rf"({_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?", re.ASCII)
_NAME_RE: Final = re.compile(rf"(?:({_DOMAIN_AND_PORT})/)?({_REMOTE_NAME})", re.ASCII)
_DOMAIN_RE: Final = re.compile(_DOMAIN_AND_PORT, re.ASCII)
_REMOTE_NAME_RE: Final = re.compile(_REMOTE_NAME, re.ASCII)
_IDENTIFIER_RE: Final = re.compile(r"[a-f0-9]{64}")
# go-digest's registered algorithms and the length of their lower-case hex encoding.
_DIGEST_HEX_LENGTHS: Final = {"sha256": 64, "sha384": 96, "sha512": 128}


class ImageRefError(ValueError):
    """An image reference (or registry prefix) that does not parse; the message says why."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """A normalised image reference.

    ``original`` is the text the reference was parsed (or, for :meth:`with_registry`, derived)
    from; it does not take part in equality, so ``parse_image("python")`` equals
    ``parse_image("docker.io/library/python")``.
    """

    original: str = field(compare=False)
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """``registry/repository``."""
        return f"{self.registry}/{self.repository}"

    @property
    def is_latest(self) -> bool:
        """No tag and no digest (the runtime pulls ``:latest``), or the tag ``latest`` itself."""
        return (self.tag is None and self.digest is None) or self.tag == "latest"

    def with_registry(self, registry_and_prefix: str) -> ImageRef:
        """The same repository, tag and digest under ``host[:port][/path/prefix]``.

        ``ImageRefError`` when the prefix is malformed or the result is not a valid reference.
        """
        host, path = split_registry_prefix(registry_and_prefix)
        repository = f"{path}/{self.repository}" if path else self.repository
        return _rebuilt(self, host, repository)

    def __str__(self) -> str:
        text = self.name
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


def _fail(ref: str, why: str) -> ImageRefError:
    shown = ref if len(ref) <= 80 else ref[:77] + "..."
    return ImageRefError(f"invalid image reference {shown!r}: {why}")


def _split_docker_domain(name: str) -> tuple[str, str]:
    """distribution/reference's splitDockerDomain: (registry, remainder)."""
    first, slash, rest = name.partition("/")
    if not slash or (not any(ch in first for ch in ".:") and first != "localhost" and first.lower() == first):
        domain, remainder = DEFAULT_REGISTRY, name
    else:
        domain, remainder = first, rest
    if domain == _LEGACY_DEFAULT_REGISTRY:
        domain = DEFAULT_REGISTRY
    if domain == DEFAULT_REGISTRY and "/" not in remainder:
        remainder = _OFFICIAL_REPOSITORY_PREFIX + remainder
    return domain, remainder


def _check_digest(ref: str, digest: str) -> None:
    algorithm, _, encoded = digest.partition(":")
    expected = _DIGEST_HEX_LENGTHS.get(algorithm)
    if expected is None:
        raise _fail(ref, f"unsupported digest algorithm {algorithm!r} (use sha256, sha384 or sha512)")
    if len(encoded) != expected or not re.fullmatch(r"[a-f0-9]+", encoded):
        raise _fail(ref, f"{algorithm} digest must be {expected} lower-case hex characters")


def parse_image(ref: str) -> ImageRef:
    """Parse and normalise an image reference like ``ParseNormalizedNamed``.

    ``python:3.11`` → ``docker.io/library/python:3.11``; ``localhost:5000/x@sha256:…`` keeps its
    registry, tag and digest. Raises :class:`ImageRefError` (never anything else) for any input
    that is not a valid reference.
    """
    if type(ref) is not str:
        if not isinstance(ref, str):
            raise ImageRefError(f"invalid image reference {ref!r}: not a string")
        ref = str(ref)
    return _parse_image(ref)


# The same few images recur in every job of a cluster: parse each string once (a pure function of
# the string; the result is immutable; failures are not cached and re-raise every time).
@lru_cache(maxsize=4096)
def _parse_image(ref: str) -> ImageRef:
    if ref == "":
        raise ImageRefError("invalid image reference '': the name is empty")
    if len(ref) > _INPUT_LENGTH_MAX:
        raise _fail(ref, f"longer than {_INPUT_LENGTH_MAX} characters")
    if _IDENTIFIER_RE.fullmatch(ref):
        raise _fail(ref, "a 64-character hex string is an image ID, not a repository name")
    domain, remainder = _split_docker_domain(ref)
    remote_name = remainder.partition(":")[0]
    if remote_name.lower() != remote_name:
        raise _fail(ref, f"repository name {remote_name.partition('@')[0]!r} must be lowercase")
    full = f"{domain}/{remainder}"
    match = _REFERENCE_RE.fullmatch(full)
    if match is None:
        raise _fail(ref, _why_invalid(full))
    name, tag, digest = match.group(1), match.group(2), match.group(3)
    if len(name) > NAME_TOTAL_LENGTH_MAX:
        raise _fail(ref, f"the repository name is longer than {NAME_TOTAL_LENGTH_MAX} characters")
    if digest is not None:
        _check_digest(ref, digest)
    name_match = _NAME_RE.fullmatch(name)
    if name_match is None or name_match.group(1) != domain:
        # The first component was taken for a host (it has a '.' or ':') but is not a valid one,
        # e.g. "my_registry.io/x": Go would return a reference without a domain that cannot be pulled.
        raise _fail(ref, f"malformed registry host {domain!r}")
    return ImageRef(
        original=ref, registry=name_match.group(1), repository=name_match.group(2), tag=tag, digest=digest
    )


def _why_invalid(full: str) -> str:
    """A readable reason for a reference that does not match the grammar."""
    rest, at, digest = full.partition("@")
    if at and not re.fullmatch(_DIGEST, digest, re.ASCII):
        return f"malformed digest {digest!r} (expected algorithm:hex, e.g. sha256:<64 hex>)"
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        tag = rest[colon + 1 :]
        if not re.fullmatch(_TAG, tag, re.ASCII):
            return (
                f"malformed tag {tag!r} (1-128 letters, digits, '_', '.' or '-', "
                "not starting with '.' or '-')"
            )
        rest = rest[:colon]
    domain, _, path = rest.partition("/")
    if not _DOMAIN_RE.fullmatch(domain):
        return f"malformed registry host {domain!r}"
    if not _REMOTE_NAME_RE.fullmatch(path):
        return (
            f"malformed repository name {path!r} (lower-case letters and digits, "
            "separated by '.', '_', '__' or '-', in '/'-separated components)"
        )
    return "invalid reference format"


def split_registry_prefix(entry: str) -> tuple[str, str]:
    """``"Registry.Acme.internal:5000/team/"`` → ``("registry.acme.internal:5000", "team")``.

    The host is lower-cased and ``index.docker.io`` becomes ``docker.io``; a trailing ``/`` is
    ignored. ``ImageRefError`` when the host or the path is malformed.
    """
    if not isinstance(entry, str) or not entry.strip("/"):
        raise ImageRefError(f"invalid registry prefix {entry!r}: empty")
    text = entry.rstrip("/")
    host, _, path = text.partition("/")
    if len(text) > _INPUT_LENGTH_MAX or not _DOMAIN_RE.fullmatch(host):
        raise ImageRefError(f"invalid registry prefix {entry!r}: malformed registry host {host!r}")
    if path and not _REMOTE_NAME_RE.fullmatch(path):
        raise ImageRefError(f"invalid registry prefix {entry!r}: malformed repository path {path!r}")
    if not any(ch in host for ch in ".:") and host != "localhost":
        raise ImageRefError(
            f"invalid registry prefix {entry!r}: {host!r} is not a registry host (a host has a '.' or "
            f"':' or is 'localhost'; an image {host + '/x'!r} is pulled from {DEFAULT_REGISTRY})"
        )
    host = host.lower()
    if host == _LEGACY_DEFAULT_REGISTRY:
        host = DEFAULT_REGISTRY
    return host, path


def _prefix_matches(ref: ImageRef, host: str, path: str) -> bool:
    if ref.registry.lower() != host:
        return False
    return not path or ref.repository == path or ref.repository.startswith(path + "/")


def _split_entries(entries: Sequence[str]) -> list[tuple[int, str, str, str]]:
    """(position, entry, host, path) of the well-formed entries (configuration validation reports
    the malformed ones; they never match)."""
    out = []
    for position, entry in enumerate(entries):
        try:
            host, path = split_registry_prefix(entry)
        except ImageRefError:
            continue
        out.append((position, entry, host, path))
    return out


# Allow-lists and mirror keys come from the configuration: parse each list once, not per image.
_split_config_entries = lru_cache(maxsize=64)(_split_entries)


def _matching(ref: ImageRef, entries: Sequence[str]) -> list[tuple[int, int, str]]:
    """(path length, -position, entry) of every well-formed entry that matches ``ref``."""
    try:
        split = _split_config_entries(tuple(entries))
    except TypeError:  # an unhashable entry: not from a validated config
        split = _split_entries(entries)
    return [
        (len(path), -position, entry)
        for position, entry, host, path in split
        if _prefix_matches(ref, host, path)
    ]


def registry_allowed(ref: ImageRef, allowed: Sequence[str]) -> str | None:
    """The allow-list entry that admits ``ref`` (the most specific one), or ``None``.

    An entry ``host[:port][/path]`` matches when host and port are equal (case-insensitive;
    ``registry.acme.internal`` admits neither ``registry.acme.internal.evil.com`` nor
    ``registry.acme.internal:5000``) and the repository is the path or lies under it at a ``/``
    boundary (``quay.io/acme`` admits ``quay.io/acme`` and ``quay.io/acme/x``, not
    ``quay.io/acmecorp/x``).
    """
    if type(allowed) is tuple:  # the config's allow-list: memoised with the (immutable) reference
        return _registry_allowed(ref, allowed)
    found = _matching(ref, allowed)
    return max(found)[2] if found else None


@lru_cache(maxsize=4096)
def _registry_allowed(ref: ImageRef, allowed: tuple[str, ...]) -> str | None:
    found = _matching(ref, allowed)
    return max(found)[2] if found else None


def mirror_image(ref: ImageRef, mirrors: Mapping[str, str]) -> ImageRef | None:
    """``ref`` rewritten to its mirror, or ``None`` when no mirror key matches.

    Keys are registry prefixes matched like :func:`registry_allowed` (the longest path wins);
    the matched prefix is replaced by the value, tag and digest are kept:
    ``{"docker.io": "registry.acme.internal/mirror/docker.io"}`` turns ``python:3.11`` into
    ``registry.acme.internal/mirror/docker.io/library/python:3.11``. ``ImageRefError`` when the
    mirror value is malformed or the rewritten reference is invalid.
    """
    found = _matching(ref, list(mirrors))
    if not found:
        return None
    key = max(found)[2]
    _, key_path = split_registry_prefix(key)
    host, mirror_path = split_registry_prefix(mirrors[key])
    rest = ref.repository[len(key_path) :].lstrip("/") if key_path else ref.repository
    repository = "/".join(part for part in (mirror_path, rest) if part)
    if not repository:
        raise _fail(str(ref), f"mirror {mirrors[key]!r} for {key!r} leaves no repository name")
    return _rebuilt(ref, host, repository)


def unmirror_image(ref: ImageRef, mirrors: Mapping[str, str]) -> ImageRef | None:
    """The upstream image that ``ref`` is a mirror of (``ref`` lies under a mirror *value*), or
    ``None``. ``registry.acme.internal/mirror/docker.io/evil/miner:1`` with
    ``{"docker.io": "registry.acme.internal/mirror/docker.io"}`` is ``docker.io/evil/miner:1``: a
    mirror serves whatever its upstream has, so an image is judged by what it mirrors, not by the
    mirror's host (a pull-through mirror of Docker Hub would otherwise admit all of Docker Hub).
    The longest matching mirror prefix wins."""
    values = {value: key for key, value in mirrors.items()}
    found = _matching(ref, list(values))
    if not found:
        return None
    value = max(found)[2]
    _, mirror_path = split_registry_prefix(value)
    host, key_path = split_registry_prefix(values[value])
    rest = ref.repository[len(mirror_path) :].lstrip("/") if mirror_path else ref.repository
    repository = "/".join(part for part in (key_path, rest) if part)
    if not repository:
        return None
    try:
        return _rebuilt(ref, host, repository)
    except ImageRefError:
        return None


def _rebuilt(ref: ImageRef, host: str, repository: str) -> ImageRef:
    """``ref`` under another host and repository, validated by parsing the result."""
    text = f"{host}/{repository}"
    if ref.tag is not None:
        text += f":{ref.tag}"
    if ref.digest is not None:
        text += f"@{ref.digest}"
    parsed = parse_image(text)
    if parsed.registry.lower() != host:  # pragma: no cover - split_registry_prefix guarantees a host
        raise _fail(text, f"{host!r} would not be read as the registry")
    return ImageRef(
        original=ref.original,
        registry=parsed.registry,
        repository=parsed.repository,
        tag=parsed.tag,
        digest=parsed.digest,
    )
