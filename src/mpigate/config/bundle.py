"""The compressed config bundle: the bundle's files as one gzip'd tar in a ConfigMap's ``binaryData``.

``mpigate render`` writes the config bundle (the ConfigMap the webhook and the controller mount)
with one ``data`` key per config file while its files fit comfortably; above
:data:`PLAIN_BUNDLE_BYTES` it writes them, under the same keys, into one deterministic tar archive,
gzip-compressed, under the ``binaryData`` key :data:`BUNDLE_ARCHIVE` (the revision file is inside).
Org configs are repetitive (one TeamQuota and TeamAccess per team), so the archive is about a
tenth of the files: 5,000 teams fit where about 1,000 did (``benchmarks/org_scale.py``).

One ConfigMap keeps a config revision atomic: the kubelet writes a mounted ConfigMap's new keys into
a fresh directory and swaps the ``..data`` link, so a replica sees either the whole old archive or
the whole new one, never half of each (several ConfigMaps, updated and synced one by one, would
need a manifest and a digest to say the same).

:func:`unpack` extracts an archive for the loader with the checks an untrusted archive needs:
regular files with ConfigMap key names only (no paths, links or devices), bounded count and size.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

__all__ = [
    "BUNDLE_ARCHIVE",
    "CONFIGMAP_DATA_LIMIT",
    "ETCD_REQUEST_LIMIT",
    "PLAIN_BUNDLE_BYTES",
    "BundleArchiveError",
    "bundle_files",
    "pack",
    "unpack",
    "unpack_bytes",
]

#: The ``binaryData`` key of a compressed bundle (and its file name in the mounted directory).
BUNDLE_ARCHIVE: Final = "config.tar.gz"
#: The API server refuses a ConfigMap whose ``data`` and ``binaryData`` values (decoded) add up to
#: more than 1 MiB: ``k8s.io/api`` core/v1/types.go ``MaxSecretSize``, checked by
#: ``ValidateConfigMap`` (kubernetes pkg/apis/core/validation/validation.go).
CONFIGMAP_DATA_LIMIT: Final = 1024 * 1024
#: etcd's default ``--max-request-bytes`` (1.5 MiB), the largest object the API server can store:
#: k8s.io/apiserver pkg/server/config.go ``NewConfig`` (the comment above ``MaxRequestBodyBytes``,
#: after etcd's embed/config.go ``DefaultMaxRequestBytes``).
ETCD_REQUEST_LIMIT: Final = 1536 * 1024
#: Plain ``data`` keys up to this size (readable diffs in pull requests); compressed above it.
PLAIN_BUNDLE_BYTES: Final = 256 * 1024

# What an archive may hold, so that a corrupt or hostile one cannot exhaust memory or the disk.
_MAX_MEMBERS: Final = 100_000
_MAX_UNPACKED_BYTES: Final = 256 * 1024 * 1024
_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")


class BundleArchiveError(ValueError):
    """An archive that is not a config bundle mpigate wrote (the message says why)."""


def pack(files: Mapping[str, str]) -> bytes:
    """``files`` (ConfigMap key → text) as a gzip'd tar: the same bytes for the same files (sorted
    members, no times, owners or modes that vary), so that a re-render changes nothing."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for key in sorted(files):
            data = files[key].encode("utf-8")
            info = tarfile.TarInfo(key)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def unpack_bytes(archive: bytes) -> dict[str, bytes]:
    """The files of a bundle archive (key → bytes); :class:`BundleArchiveError` for anything that
    is not one (not gzip or tar, a member that is not a regular file with a ConfigMap key name,
    too many members or bytes)."""
    try:
        raw = _gunzip(archive)
        out: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for member in tar:
                if len(out) >= _MAX_MEMBERS:
                    raise BundleArchiveError(f"more than {_MAX_MEMBERS} files")
                if not member.isfile():
                    raise BundleArchiveError(f"{member.name!r} is not a regular file")
                if not _KEY_RE.match(member.name) or member.name in (".", ".."):
                    raise BundleArchiveError(f"{member.name!r} is not a ConfigMap key (a file name, no path)")
                if member.name in out:
                    raise BundleArchiveError(f"{member.name!r} is in the archive twice")
                handle = tar.extractfile(member)
                if handle is None:  # pragma: no cover - isfile() members always have data
                    raise BundleArchiveError(f"{member.name!r} has no data")
                out[member.name] = handle.read()
    except (tarfile.TarError, OSError, EOFError, gzip.BadGzipFile) as exc:
        raise BundleArchiveError(f"not a gzip'd tar archive ({exc})") from None
    return out


def _gunzip(archive: bytes) -> bytes:
    """Decompress with a bound on the output (a small archive can expand enormously)."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=io.BytesIO(archive)) as stream:
        while chunk := stream.read(1024 * 1024):
            out.write(chunk)
            if out.tell() > _MAX_UNPACKED_BYTES:
                raise BundleArchiveError(f"it unpacks to more than {_MAX_UNPACKED_BYTES // 2**20} MiB")
    return out.getvalue()


def unpack(archive: Path, target: Path) -> None:
    """Extract the bundle archive at ``archive`` into the (empty) directory ``target``."""
    try:
        data = archive.read_bytes()
    except OSError as exc:
        raise BundleArchiveError(f"cannot read it ({exc.strerror})") from None
    for name, content in unpack_bytes(data).items():
        (target / name).write_bytes(content)


def bundle_files(configmap: Mapping[str, Any]) -> dict[str, str] | None:
    """The files a rendered config bundle ConfigMap carries (key → text), plain or compressed;
    None when ``configmap`` carries neither (or its archive does not unpack)."""
    binary = configmap.get("binaryData")
    if isinstance(binary, Mapping) and isinstance(binary.get(BUNDLE_ARCHIVE), str):
        try:
            files = unpack_bytes(base64.b64decode(binary[BUNDLE_ARCHIVE], validate=True))
        except (BundleArchiveError, binascii.Error):
            return None
        return {k: v.decode("utf-8", "replace") for k, v in files.items()}
    data = configmap.get("data")
    if isinstance(data, Mapping):
        return {str(k): str(v) for k, v in data.items()}
    return None
