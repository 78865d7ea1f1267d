"""Signing of checkpoint records: HMAC-SHA256 with a shared secret, or Ed25519.

A checkpoint's signature covers the canonical encoding of the checkpoint record without ``hash``
and without ``checkpoint.sig`` — so it binds the chain id, the sequence number, the time and
``prev`` (the hash of the chain head it certifies). Rewriting any earlier record changes that head
and every later checkpoint stops verifying unless the forger holds the key.

With Ed25519 (the default) the verifier needs only the public key; with HMAC the verifier holds the
secret and could therefore forge, so HMAC suits self-checks and Ed25519 suits third-party audits.
A key file is checked against the configured method: a PEM key is never taken as an HMAC secret.
Every signature names its ``keyId`` so that a verifier with several keys (key rotation) picks the
right one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ._canonical import canonical_bytes
from .errors import AuditKeyError

__all__ = [
    "ALGORITHMS",
    "Ed25519Signer",
    "HmacSigner",
    "KeyRing",
    "Signer",
    "generate_key",
    "key_method",
    "load_signer",
    "signed_bytes",
]

HMAC_SHA256 = "hmac-sha256"
ED25519 = "ed25519"
ALGORITHMS = (HMAC_SHA256, ED25519)
MIN_HMAC_KEY_BYTES = 16


class Signer(Protocol):
    """Signs checkpoint bytes; ``alg`` and ``key_id`` go into the checkpoint record."""

    @property
    def alg(self) -> str: ...

    @property
    def key_id(self) -> str: ...

    def sign(self, data: bytes) -> str: ...


def signed_bytes(record: Mapping[str, Any]) -> bytes:
    """The bytes a checkpoint signature covers: the record without ``hash`` and ``checkpoint.sig``."""
    body = {k: v for k, v in record.items() if k != "hash"}
    checkpoint = body.get("checkpoint")
    if isinstance(checkpoint, Mapping):
        body["checkpoint"] = {k: v for k, v in checkpoint.items() if k != "sig"}
    return canonical_bytes(body)


def _hmac_key_id(key: bytes) -> str:
    # Derived with the key itself so that the id reveals nothing usable about the secret.
    return hmac.new(key, b"mpigate-audit-key-id", hashlib.sha256).hexdigest()[:16]


def _ed25519_key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class HmacSigner:
    """HMAC-SHA256 over the checkpoint bytes with a shared secret (≥ 16 bytes)."""

    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.key) < MIN_HMAC_KEY_BYTES:
            raise AuditKeyError(
                f"HMAC key is {len(self.key)} bytes; at least {MIN_HMAC_KEY_BYTES} are needed"
            )

    @property
    def alg(self) -> str:
        return HMAC_SHA256

    @property
    def key_id(self) -> str:
        return _hmac_key_id(self.key)

    def sign(self, data: bytes) -> str:
        return base64.b64encode(hmac.new(self.key, data, hashlib.sha256).digest()).decode("ascii")


@dataclass(frozen=True, slots=True)
class Ed25519Signer:
    """Ed25519 signature over the checkpoint bytes (verify needs only the public key)."""

    private_key: Ed25519PrivateKey = field(repr=False)

    @property
    def alg(self) -> str:
        return ED25519

    @property
    def key_id(self) -> str:
        return _ed25519_key_id(self.private_key.public_key())

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self.private_key.sign(data)).decode("ascii")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise AuditKeyError(f"cannot read key file {path}: {exc.strerror or exc}") from exc


def _is_pem(data: bytes) -> bool:
    return data.lstrip().startswith(b"-----BEGIN ")


def _hmac_key_from_file(path: Path) -> bytes:
    # Kubernetes Secrets and `openssl rand` files often end in a newline that is not key material.
    return _read(path).strip()


def _hmac_secret(path: Path) -> bytes:
    """An HMAC secret from a key file — never a PEM key, whose text would otherwise be taken as
    the secret without a word (and every checkpoint would then fail to verify with the key pair)."""
    secret = _hmac_key_from_file(path)
    if _is_pem(secret):
        raise AuditKeyError(
            f"{path} holds a PEM key (such as the Ed25519 key `mpigate audit keygen` makes), but the "
            f"signing method is {HMAC_SHA256}: set OrgPolicy spec.audit.signing.method: {ED25519}, or "
            f"make an HMAC secret with `mpigate audit keygen --method {HMAC_SHA256} KEYFILE`"
        )
    return secret


def key_method(key_file: str | Path) -> str:
    """The signing method a key file is for: ``ed25519`` for a PEM key, else ``hmac-sha256``."""
    return ED25519 if _is_pem(_read(Path(key_file))) else HMAC_SHA256


def _load_private(path: Path) -> Ed25519PrivateKey:
    data = _read(path)
    if not _is_pem(data):
        raise AuditKeyError(
            f"{path} is no PEM key (an HMAC secret?), but the signing method is {ED25519}: make the "
            f"key with `mpigate audit keygen --method {ED25519} KEYFILE --public KEYFILE.pub`, or set "
            f"OrgPolicy spec.audit.signing.method: {HMAC_SHA256}"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except ValueError as exc:
        raise AuditKeyError(f"{path} is not a PEM private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise AuditKeyError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def _load_public(path: Path) -> Ed25519PublicKey:
    data = _read(path)
    if not _is_pem(data):
        raise AuditKeyError(f"{path} is no PEM key (an HMAC secret? give it with --key)")
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        # A private key file also gives the public key.
        return _load_private(path).public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise AuditKeyError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def load_signer(method: str, key_file: str | Path) -> Signer:
    """The signer for ``OrgPolicy.audit.signing`` (``hmac-sha256`` or ``ed25519``)."""
    path = Path(key_file)
    if method == HMAC_SHA256:
        return HmacSigner(_hmac_secret(path))
    if method == ED25519:
        return Ed25519Signer(_load_private(path))
    raise AuditKeyError(f"unknown signing method {method!r} (expected one of {', '.join(ALGORITHMS)})")


def generate_key(method: str) -> tuple[bytes, bytes | None]:
    """A new key file's content, and for Ed25519 the matching public key PEM."""
    if method == HMAC_SHA256:
        import secrets

        return base64.b64encode(secrets.token_bytes(32)) + b"\n", None
    if method == ED25519:
        private = Ed25519PrivateKey.generate()
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        public = private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return pem, public
    raise AuditKeyError(f"unknown signing method {method!r} (expected one of {', '.join(ALGORITHMS)})")


@dataclass(frozen=True, slots=True)
class KeyRing:
    """Keys a verifier knows, by key id: HMAC secrets and Ed25519 public keys."""

    hmac_keys: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    public_keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict, repr=False)

    @staticmethod
    def load(key_files: Iterable[str | Path] = (), public_key_files: Iterable[str | Path] = ()) -> KeyRing:
        """Read ``--key`` files (the signing key: an HMAC secret, or an Ed25519 private key in PEM,
        whose public half is taken) and ``--public-key`` files (Ed25519 PEM)."""
        hmacs: dict[str, bytes] = {}
        publics: dict[str, Ed25519PublicKey] = {}
        for item in key_files:
            path = Path(item)
            if key_method(path) == ED25519:
                public = _load_public(path)
                publics[_ed25519_key_id(public)] = public
            else:
                secret = _hmac_key_from_file(path)
                hmacs[_hmac_key_id(secret)] = secret
        for item in public_key_files:
            public = _load_public(Path(item))
            publics[_ed25519_key_id(public)] = public
        return KeyRing(hmacs, publics)

    @property
    def empty(self) -> bool:
        return not self.hmac_keys and not self.public_keys

    def verify(self, alg: str, key_id: str, data: bytes, signature: str) -> str | None:
        """``None`` when the signature verifies, else why not."""
        try:
            raw = base64.b64decode(signature, validate=True)
        except (ValueError, TypeError):
            return "signature is not base64"
        if alg == HMAC_SHA256:
            secret = self.hmac_keys.get(key_id)
            if secret is None:
                return f"no HMAC key with id {key_id} was given (--key)"
            expected = hmac.new(secret, data, hashlib.sha256).digest()
            return None if hmac.compare_digest(expected, raw) else "HMAC signature does not match"
        if alg == ED25519:
            public = self.public_keys.get(key_id)
            if public is None:
                return f"no Ed25519 public key with id {key_id} was given (--public-key)"
            try:
                public.verify(raw, data)
            except InvalidSignature:
                return "Ed25519 signature does not verify"
            return None
        return f"unknown signature algorithm {alg!r}"
