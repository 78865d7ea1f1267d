"""A report's signed manifest: the SHA-256 of the report file and of every input it was built
from, signed with the audit key machinery (:mod:`mpigate.audit.signing`), so that
``mpigate audit verify --report-manifest`` can show that a report file is the one mpigate wrote
from those inputs.

The manifest is a JSON file next to the report (``<report>.manifest.json``)::

    {"apiVersion": "mpigate.io/v1alpha1", "kind": "ReportManifest", "reportId": "…",
     "generated": "…", "report": {"file": "november.html", "format": "html", "sha256": "…"},
     "inputs": [{"kind": "chain-segment", "chain": "…", "path": "…", "sha256": "…", "bytes": 1},
                {"kind": "k8s-audit", "path": "…", "sha256": "…", "bytes": 1}],
     "signature": {"alg": "ed25519", "keyId": "…", "sig": "…"}}

The signature covers the canonical encoding (sorted keys, no whitespace) of the manifest without
``signature`` — the encoding the audit chain's checkpoints use.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mpigate.audit._canonical import canonical_bytes
from mpigate.audit.signing import KeyRing, Signer

from .options import REPORT_API_VERSION

__all__ = ["MANIFEST_KIND", "build_manifest", "file_sha256", "manifest_path", "verify_manifest"]

MANIFEST_KIND = "ReportManifest"


def file_sha256(path: str | Path) -> tuple[str, int]:
    """(hex digest, size) of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with Path(path).open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def manifest_path(report_file: str | Path) -> Path:
    return Path(f"{report_file}.manifest.json")


def build_manifest(
    report: Mapping[str, Any], report_file: Path, fmt: str, signer: Signer | None
) -> dict[str, Any]:
    """The manifest of a written report: its digest and its inputs' (from the report document),
    signed when ``signer`` is given."""
    digest, size = file_sha256(report_file)
    manifest: dict[str, Any] = {
        "apiVersion": REPORT_API_VERSION,
        "kind": MANIFEST_KIND,
        "reportId": report["reportId"],
        "generated": report["generated"],
        "report": {"file": report_file.name, "format": fmt, "sha256": digest, "bytes": size},
        "inputs": input_digests(report),
    }
    if signer is not None:
        manifest["signature"] = {
            "alg": signer.alg,
            "keyId": signer.key_id,
            "sig": signer.sign(canonical_bytes(manifest)),
        }
    return manifest


def input_digests(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for chain in report["inputs"]["chains"]:
        for segment in chain.get("segmentDigests", ()):
            out.append({"kind": "chain-segment", "chain": chain["chain"], **segment})
    for log in report["inputs"]["k8sAudit"]:
        out.append({"kind": "k8s-audit", "path": log["file"], "sha256": log["sha256"], "bytes": log["bytes"]})
    return out


def verify_manifest(
    path: str | Path, keys: KeyRing | None, *, check_inputs: bool = False
) -> tuple[dict[str, Any], list[str], list[str]]:
    """(manifest, errors, warnings) of a manifest file: the report file next to it must have the
    digest it states, the signature must verify with ``keys`` (a warning when no key is given),
    and with ``check_inputs`` every input that still exists must have its stated digest."""
    errors: list[str] = []
    warnings: list[str] = []
    manifest_file = Path(path)
    try:
        manifest = json.loads(manifest_file.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        return {}, [f"{manifest_file}: cannot read the manifest: {exc}"], []
    if not isinstance(manifest, dict) or manifest.get("kind") != MANIFEST_KIND:
        return {}, [f"{manifest_file}: not a {MANIFEST_KIND}"], []
    report = manifest.get("report")
    if not isinstance(report, Mapping) or not isinstance(report.get("file"), str):
        return manifest, [f"{manifest_file}: the manifest names no report file"], []
    report_file = manifest_file.parent / Path(str(report["file"])).name
    try:
        digest, _ = file_sha256(report_file)
    except OSError as exc:
        errors.append(f"{report_file}: cannot read the report: {exc.strerror or exc}")
    else:
        if digest != report.get("sha256"):
            errors.append(
                f"{report_file}: the report's SHA-256 is {digest}, the manifest states {report.get('sha256')}"
            )
    signature = manifest.get("signature")
    body = {k: v for k, v in manifest.items() if k != "signature"}
    if not isinstance(signature, Mapping):
        errors.append(f"{manifest_file}: the manifest is not signed")
    elif keys is None or keys.empty:
        warnings.append(f"{manifest_file}: signature not checked (pass --key or --public-key)")
    else:
        problem = keys.verify(
            str(signature.get("alg")),
            str(signature.get("keyId")),
            canonical_bytes(body),
            str(signature.get("sig")),
        )
        if problem is not None:
            errors.append(f"{manifest_file}: {problem}")
    if check_inputs:
        _check_inputs(manifest.get("inputs"), errors, warnings)
    return manifest, errors, warnings


def _check_inputs(inputs: Any, errors: list[str], warnings: list[str]) -> None:
    """An input that changed is an error; one that is not here (the auditor has the report and
    its manifest only) is a warning."""
    absent = 0
    for item in inputs if isinstance(inputs, Sequence) else ():
        if not isinstance(item, Mapping):
            continue
        path = Path(str(item.get("path")))
        try:
            digest, _ = file_sha256(path)
        except FileNotFoundError:
            absent += 1
            continue
        except OSError as exc:
            errors.append(f"{path}: input not readable: {exc.strerror or exc}")
            continue
        if digest != item.get("sha256"):
            errors.append(
                f"{path}: input changed since the report (SHA-256 {digest}, stated {item.get('sha256')})"
            )
    if absent:
        warnings.append(f"{absent} input file(s) are not present here: their digests were not checked")
