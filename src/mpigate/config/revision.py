"""The revision of a config tree: its git commit, or a content hash when it is not a checkout."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterable
from pathlib import Path

__all__ = ["content_hash", "tree_revision"]


def content_hash(root: Path, files: Iterable[Path]) -> str:
    """SHA-256 over the relative paths and bytes of ``files`` (order-independent)."""
    digest = hashlib.sha256()
    base = root if root.is_dir() else root.parent
    for path in sorted(files, key=lambda p: p.as_posix()):
        rel = path.relative_to(base).as_posix() if path.is_relative_to(base) else path.as_posix()
        digest.update(rel.encode())
        digest.update(b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
        digest.update(b"\0")
    return digest.hexdigest()


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def tree_revision(root: Path, files: list[Path]) -> str:
    """``<commit>`` for a clean git checkout, ``<commit>-dirty.<hash12>`` when any config file has
    uncommitted changes, ``sha256.<hash16>`` outside git. The content hash makes a dirty
    revision still identify exactly what was loaded."""
    digest = content_hash(root, files)
    cwd = root if root.is_dir() else root.parent
    head = _git(["rev-parse", "--verify", "-q", "HEAD"], cwd)
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    if not head or not top:
        return f"sha256.{digest[:16]}"
    head = head.strip()
    status = _git(["status", "--porcelain=v1", "-z", "--untracked-files=all", "--", "."], cwd)
    if status is None:
        return f"{head}-dirty.{digest[:12]}"
    toplevel = Path(top.strip()).resolve()
    changed = set()
    for entry in status.split("\0"):
        if len(entry) > 3:
            changed.add((toplevel / entry[3:]).resolve())
    if any(f.resolve() in changed for f in files):
        return f"{head}-dirty.{digest[:12]}"
    return head
