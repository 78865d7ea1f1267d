"""Serving TLS: TLS 1.2+ with forward-secret AEAD ciphers, and certificate hot reload.

A listening socket keeps the ``SSLContext`` it was created with. To rotate a certificate without
restarting (cert-manager renews it into the mounted Secret), the server listens with a *front*
context whose SNI callback hands every new handshake the *current* context; existing connections
keep the context they were established with and continue undisturbed. OpenSSL runs the callback
for every ClientHello, with or without a server name.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["CIPHERS_TLS12", "ReloadingTLS", "server_context"]

log = logging.getLogger(__name__)

# TLS 1.3 suites are fixed by OpenSSL (all AEAD); for TLS 1.2 allow only ECDHE key exchange
# with AES-GCM or ChaCha20-Poly1305 (Mozilla "intermediate" minus the finite-field DHE suites).
CIPHERS_TLS12: Final = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!MD5:!DSS:!SHA1"


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for ``cert``/``key`` (PEM); raises ``ssl.SSLError``/``OSError``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(CIPHERS_TLS12)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    # No TLS 1.3 session tickets (OpenSSL sends two after every full handshake): the API server
    # never resumes a session — its webhook client's tls.Config has no ClientSessionCache
    # (client-go: transport/transport.go TLSConfigFor, transport/cache.go (*tlsTransportCache).get)
    # — so tickets are work and bytes per connection for nobody but an attacker; measured ~10% of
    # a full ECDSA P-256 handshake's server CPU here.
    ctx.num_tickets = 0
    ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    return ctx


@dataclass(frozen=True, slots=True)
class _Stamp:
    cert: tuple[int, int, int] | None
    key: tuple[int, int, int] | None


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)  # follows symlinks: a Secret volume swaps its ..data link
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class ReloadingTLS:
    """The serving certificate, reloaded when its files change (call :meth:`check`)."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert = cert
        self.key = key
        self._stamp = self._read_stamp()
        self._current = server_context(cert, key)
        self._failed: _Stamp | None = None
        self.front = server_context(cert, key)
        self.front.sni_callback = self._select

    def _read_stamp(self) -> _Stamp:
        return _Stamp(_stat(self.cert), _stat(self.key))

    def _select(self, sslobj: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        current = self._current
        if current is not ctx:
            sslobj.context = current

    @property
    def current(self) -> ssl.SSLContext:
        return self._current

    def check(self) -> bool | None:
        """Reload when the files changed. Returns True (reloaded), False (changed but invalid —
        e.g. the key not yet written; the old certificate keeps serving) or None (unchanged)."""
        stamp = self._read_stamp()
        if stamp == self._stamp or stamp == self._failed:
            return None
        try:
            ctx = server_context(self.cert, self.key)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._failed = stamp
            log.warning("serving certificate changed but cannot be loaded (keeping the old one): %s", exc)
            return False
        self._current = ctx
        self._stamp = stamp
        self._failed = None
        log.info("serving certificate reloaded from %s", self.cert)
        return True
