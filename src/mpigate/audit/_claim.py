"""Which chain a writer owns: choosing the chain directory and holding its ``flock``.

Each chain has exactly one live writer. An explicit chain id is waited for briefly (a verifier
probes the lock for a moment); without one, the most recent unlocked chain named after this host
is resumed (a restarted StatefulSet pod continues its chain), or a new one is started.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import time
from pathlib import Path

from .errors import AuditError, AuditLockedError
from .layout import LOCK_FILE, list_segments, valid_chain_id

__all__ = ["claim_chain", "default_chain_prefix"]


def default_chain_prefix() -> str:
    """This host's name, cleaned into a chain id prefix."""
    host = socket.gethostname().split(".")[0] or "mpigate"
    cleaned = "".join(c if c.isalnum() or c in "-_" else "-" for c in host).strip("-_") or "mpigate"
    return cleaned[:100]


def claim_chain(root: Path, chain: str | None) -> tuple[str, int]:
    """Pick and lock the chain directory. Returns (chain id, lock fd)."""
    if chain is not None:
        if not valid_chain_id(chain):
            raise AuditError(f"invalid chain id {chain!r} (letters, digits, '.', '_', '-')")
        fd = _try_lock(root / chain)
        for _ in range(10):
            if fd is not None:
                break
            # A verifier probes the lock for a moment; a live writer holds it for good.
            time.sleep(0.05)
            fd = _try_lock(root / chain)
        if fd is None:
            raise AuditLockedError(f"audit chain {chain} in {root} is held by another writer")
        return chain, fd
    prefix = default_chain_prefix()
    candidates = sorted(
        (p for p in root.glob(f"{prefix}-*") if p.is_dir() and list_segments(p)),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for candidate in candidates:
        fd = _try_lock(candidate)
        if fd is not None:
            return candidate.name, fd
    while True:
        name = f"{prefix}-{secrets.token_hex(3)}"
        if not (root / name).exists():
            fd = _try_lock(root / name)
            if fd is not None:
                return name, fd


def _try_lock(chain_dir: Path) -> int | None:
    chain_dir.mkdir(parents=True, exist_ok=True)
    return try_flock(chain_dir / LOCK_FILE)


def try_flock(path: Path) -> int | None:
    """Hold an exclusive ``flock`` on ``path`` (created 0640): an fd to close to release it, or None
    when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
