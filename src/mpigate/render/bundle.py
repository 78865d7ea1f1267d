"""The config bundle: the config tree as the data of one ConfigMap that the webhook mounts.

Each config file becomes one key (its path relative to the tree with ``/`` replaced by ``__``), so
that the mounted directory is itself a config tree that :func:`mpigate.config.load` reads, and the
key :data:`~mpigate.config.loader.REVISION_FILE` carries the revision the bundle was rendered from.
A bundle above :data:`~mpigate.config.bundle.PLAIN_BUNDLE_BYTES` carries the same keys in one
gzip'd tar under ``binaryData`` (:mod:`mpigate.config.bundle`), which the loader reads as well.
PolicyTest documents stay out (they are CI material, and the files their cases point to are not in
the tree the webhook sees); so do documents the loader ignores (not mpigate or Trainer runtime
kinds), and files left with no config document at all.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mpigate.config import Config
from mpigate.config.admission import ADMISSION_API, ADMISSION_KINDS
from mpigate.config.bundle import BUNDLE_ARCHIVE, PLAIN_BUNDLE_BYTES, pack
from mpigate.config.loader import REVISION_FILE, RUNTIME_KINDS, TRAINER_API_GROUP

from .errors import RenderError, RenderProblem
from .manifests import FastLoader as _Loader

__all__ = ["Bundle", "bundle_key", "collect_bundle"]

_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@dataclass(frozen=True)
class Bundle:
    """The bundle's files (sorted by key), their size in bytes, what was left out, and the
    compressed archive that carries them when they are too large to go as plain keys."""

    files: dict[str, str]
    size: int
    excluded: tuple[str, ...]
    archive: bytes | None = None

    @property
    def stored(self) -> int:
        """The bytes the API server counts against a ConfigMap's limit (values, decoded)."""
        return (
            len(self.archive)
            if self.archive is not None
            else sum(len(v.encode()) for v in self.files.values())
        )

    def to_context(self) -> dict[str, Any]:
        binary = (
            {BUNDLE_ARCHIVE: base64.b64encode(self.archive).decode()} if self.archive is not None else None
        )
        return {
            "files": None if binary else dict(self.files),
            "binary": binary,
            "size": self.size,
            "stored": self.stored,
            "excluded": list(self.excluded),
        }


def bundle_key(relative_path: str) -> str:
    """ConfigMap key of a config file: ``policies/org.yaml`` → ``policies__org.yaml``."""
    return relative_path.replace("/", "__")


def _is_config_document(
    api_version: Any, kind: Any, params: frozenset[tuple[str, str]] = frozenset()
) -> bool:
    """Whether the webhook needs the document: mpigate's kinds but PolicyTests, runtimes, the
    cluster's ValidatingAdmissionPolicies and their bindings, and documents of a kind that a
    binding takes its parameters from (``params``: (apiVersion, kind))."""
    if not isinstance(api_version, str):
        return False
    group = api_version.split("/")[0]
    if group == "mpigate.io":
        return bool(kind != "PolicyTest")
    if api_version == ADMISSION_API and kind in ADMISSION_KINDS:
        return True
    if (api_version, kind) in params:
        return True
    return group == TRAINER_API_GROUP and kind in RUNTIME_KINDS


def _identities(text: str) -> list[tuple[Any, Any]]:
    """(apiVersion, kind) of each document, read from the composed nodes without constructing the
    documents (the tree passed ``check``, so it parses)."""
    out = []
    for node in yaml.compose_all(text, Loader=_Loader):
        found: dict[str, Any] = {}
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value in ("apiVersion", "kind"):
                    found[key.value] = value.value if isinstance(value, yaml.ScalarNode) else None
        out.append((found.get("apiVersion"), found.get("kind")))
    return out


def collect_bundle(config: Config, *, plain_limit: int = PLAIN_BUNDLE_BYTES) -> Bundle:
    """Read the config files of ``config`` into bundle data, compressed when their size exceeds
    ``plain_limit`` bytes."""
    root = Path(config.root)
    base = root if root.is_dir() else root.parent
    files: dict[str, str] = {}
    origin: dict[str, str] = {}
    excluded: list[str] = []
    problems: list[RenderProblem] = []
    params = frozenset(
        (o.api_version, o.kind)
        for rule in config.custom_rules
        if rule.admission is not None and rule.admission.params is not None
        for o in rule.admission.params.objects
    )
    for rel in config.files:
        path = base / rel
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            problems.append(RenderProblem(rel, 0, f"cannot read config file: {exc.strerror}"))
            continue
        identities = _identities(text)
        keep = [_is_config_document(*identity, params) for identity in identities]
        if not any(keep):
            excluded.append(rel)
            continue
        if not all(keep):
            # Drop PolicyTest and foreign documents; the rest is re-serialised from its data.
            documents = list(yaml.load_all(text, Loader=_Loader))
            kept = [d for d, k in zip(documents, keep, strict=True) if k]
            text = yaml.dump_all(kept, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
        key = bundle_key(rel)
        if not _KEY_RE.match(key):
            problems.append(
                RenderProblem(
                    rel, 0, f"file name is not a valid ConfigMap key ({key!r}): use [-._a-zA-Z0-9/]"
                )
            )
            continue
        if key in origin:
            problems.append(RenderProblem(rel, 0, f"ConfigMap key {key!r} is also the key of {origin[key]}"))
            continue
        origin[key] = rel
        files[key] = text
    if problems:
        raise RenderError(tuple(problems))
    files[REVISION_FILE] = config.revision + "\n"
    ordered = dict(sorted(files.items()))
    size = sum(len(k.encode()) + len(v.encode()) for k, v in ordered.items())
    return Bundle(ordered, size, tuple(excluded), pack(ordered) if size > plain_limit else None)
