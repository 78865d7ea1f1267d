"""A CA and a serving certificate for the webhook, for clusters without cert-manager.

The API server reaches the webhook through its Service, as ``<svc>.<ns>.svc``; the serving
certificate carries every DNS form of that name as a SAN (Common Names are ignored by Go's TLS
stack). The CA is kept and reused: re-running rotates the serving certificate while the
``caBundle`` in the webhook configurations stays valid. Keys are ECDSA P-256 (fast handshakes,
accepted by every supported Kubernetes version) and written with mode 0600.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA_VALIDITY_DAYS", "IssuedCertificates", "issue_certificates", "service_names"]

CA_VALIDITY_DAYS: Final = 3650
CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
# Issued a little in the past so that nodes with a slightly slow clock accept it at once.
BACKDATE: Final = dt.timedelta(minutes=5)


class CertificateError(Exception):
    """The CA in the output directory cannot be used."""


@dataclass(frozen=True, slots=True)
class IssuedCertificates:
    """Where the files are, and what to put into the webhook configurations."""

    directory: Path
    ca_cert: Path
    tls_cert: Path
    tls_key: Path
    ca_reused: bool
    dns_names: tuple[str, ...]
    not_after: dt.datetime

    @property
    def ca_bundle(self) -> str:
        """``clientConfig.caBundle``: the CA certificate, PEM, base64-encoded."""
        return base64.b64encode(self.ca_cert.read_bytes()).decode("ascii")


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    """Every name the API server may use for ``service`` in ``namespace``."""
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _new_ca(now: dt.datetime, common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=CA_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if not cert_path.exists() and not key_path.exists():
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise CertificateError(f"cannot reuse the CA in {directory}: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise CertificateError(f"{key_path} is not the key of {cert_path}")
    return cert, key


def issue_certificates(
    directory: Path,
    *,
    service: str,
    namespace: str,
    days: int = 365,
    new_ca: bool = False,
    extra_names: tuple[str, ...] = (),
    now: dt.datetime | None = None,
) -> IssuedCertificates:
    """Write ``ca.crt``/``ca.key`` (unless a CA is already there) and a fresh ``tls.crt``/``tls.key``
    for ``service`` in ``namespace`` into ``directory``. ``extra_names`` adds DNS names or IP
    addresses (e.g. ``127.0.0.1`` for a local demo)."""
    if days < 1:
        raise ValueError("--days must be at least 1")
    now = now or dt.datetime.now(dt.UTC)
    directory.mkdir(parents=True, exist_ok=True)
    existing = None if new_ca else _load_ca(directory)
    if existing is None:
        ca_cert, ca_key = _new_ca(now, f"mpigate webhook CA ({namespace})")
        _write_private(directory / CA_KEY, _key_pem(ca_key))
        _write_public(directory / CA_CERT, ca_cert.public_bytes(serialization.Encoding.PEM))
    else:
        ca_cert, ca_key = existing
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    names = service_names(service, namespace)
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    for extra in extra_names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(extra)))
        except ValueError:
            alt.append(x509.DNSName(extra))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[2])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    # Key first: a server polling the pair never sees a new certificate with the old key for
    # longer than this one rename.
    _write_private(directory / TLS_KEY, _key_pem(key))
    _write_public(directory / TLS_CERT, cert.public_bytes(serialization.Encoding.PEM))
    return IssuedCertificates(
        directory=directory,
        ca_cert=directory / CA_CERT,
        tls_cert=directory / TLS_CERT,
        tls_key=directory / TLS_KEY,
        ca_reused=existing is not None,
        dns_names=names + tuple(extra_names),
        not_after=not_after,
    )
