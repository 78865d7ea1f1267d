"""Reduce a Debian rootfs built by mmdebstrap to what the image runs: Python 3.11 and the libraries it
loads, CA certificates, netbase and base-files, without a shell, coreutils, dpkg or perl.

The build installs Debian's essential set (dpkg needs a shell and coreutils to run maintainer
scripts); afterwards those packages are dead weight and an attack surface. This removes the files of
every package outside the runtime set (as `dpkg --purge` would, but without running maintainer
scripts, which need the shell being removed) and drops them from /var/lib/dpkg/status, so that SBOM
and vulnerability scanners see exactly what the image holds.

Usage: python slim_rootfs.py ROOTFS   (prints the kept packages, one "name version" a line)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# What the image runs (the dependencies of python3.11 follow), and packages kept for their data only:
# their own dependencies (openssl, debconf, awk) are there for maintainer scripts.
RUNTIME_ROOTS = ("python3.11",)
DATA_ONLY = ("base-files", "base-passwd", "ca-certificates", "netbase")
# Left behind by installing, and nothing reads them at run time.
STALE = (
    "var/lib/dpkg/status-old",
    "var/lib/dpkg/diversions-old",
    "var/lib/apt",
    "var/cache/apt",
    "var/cache/debconf",
    "var/cache/ldconfig/aux-cache",
    "var/log",
    "tmp",
)
# Dependencies that only maintainer scripts use (readline-common's on dpkg for install-info):
# nothing runs them in the image.
MAINTAINER_ONLY = ("dpkg", "install-info", "debconf", "perl-base")


def _stanzas(status: str) -> list[str]:
    return [s for s in status.split("\n\n") if s.strip()]


def _field(stanza: str, name: str) -> str:
    match = re.search(rf"^{name}: (.*(?:\n .*)*)", stanza, re.MULTILINE)
    return match.group(1).replace("\n", " ") if match else ""


def runtime_packages(status: str) -> set[str]:
    """The closure of RUNTIME_ROOTS over Pre-Depends and Depends (first installed alternative)."""
    deps: dict[str, list[list[str]]] = {}
    for stanza in _stanzas(status):
        if "install ok installed" not in _field(stanza, "Status"):
            continue
        relations = ", ".join(f for f in (_field(stanza, "Pre-Depends"), _field(stanza, "Depends")) if f)
        deps[_field(stanza, "Package")] = [
            [re.split(r"[\s(:]", alt.strip())[0] for alt in rel.split("|")]
            for rel in relations.split(",")
            if rel.strip()
        ]
    missing = [p for p in (*RUNTIME_ROOTS, *DATA_ONLY) if p not in deps]
    if missing:
        raise SystemExit(f"slim_rootfs: not installed in the rootfs: {', '.join(missing)}")
    keep = set(DATA_ONLY)
    todo = list(RUNTIME_ROOTS)
    while todo:
        package = todo.pop()
        if package in keep:
            continue
        keep.add(package)
        for alternatives in deps[package]:
            if any(a in MAINTAINER_ONLY for a in alternatives):
                continue
            chosen = next((a for a in alternatives if a in deps), None)
            if chosen is None:
                raise SystemExit(f"slim_rootfs: {package} needs one of {alternatives}, none installed")
            todo.append(chosen)
    return keep


def _list_file(info: Path, package: str) -> Path:
    for name in (f"{package}.list", f"{package}:amd64.list"):
        if (info / name).exists():
            return info / name
    raise SystemExit(f"slim_rootfs: no file list for {package}")


def slim(root: Path) -> list[str]:
    status_path = root / "var/lib/dpkg/status"
    status = status_path.read_text(encoding="utf-8")
    keep = runtime_packages(status)
    info = root / "var/lib/dpkg/info"
    # ldconfig (libc-bin) goes with the rest, but the linker cache must be rebuilt afterwards
    # (Debian's ldconfig is linked statically, so a copy runs without the rootfs)
    ldconfig = Path(tempfile.mkdtemp()) / "ldconfig"
    shutil.copy2(root / "sbin/ldconfig", ldconfig)
    installed = [_field(s, "Package") for s in _stanzas(status)]
    kept_paths = {line for p in keep for line in _list_file(info, p).read_text(encoding="utf-8").splitlines()}
    for package in sorted(set(installed) - keep):
        for line in sorted(_list_file(info, package).read_text(encoding="utf-8").splitlines(), reverse=True):
            if line in kept_paths or line in ("/.", ""):
                continue
            path = root / line.lstrip("/")
            if path.is_symlink() or path.is_file():
                # a symlink to a directory may be what merged /usr rests on: leave directories alone
                if path.is_symlink() and path.is_dir():
                    continue
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        for leftover in list(info.iterdir()):
            if leftover.name.rsplit(".", 1)[0] in (package, f"{package}:amd64"):
                leftover.unlink()
    # alternatives and other links that pointed into the removed packages
    for directory in ("etc/alternatives", "usr/bin", "usr/sbin", "bin", "sbin"):
        base = root / directory
        if not base.is_dir() or base.is_symlink():
            continue
        for link in base.iterdir():
            if link.is_symlink() and not _resolves(root, link):
                link.unlink()
    kept = [s for s in _stanzas(status) if _field(s, "Package") in keep]
    status_path.write_text("\n\n".join(kept) + "\n\n", encoding="utf-8")
    subprocess.run([str(ldconfig), "-r", str(root)], check=True)
    shutil.rmtree(ldconfig.parent)
    for stale in STALE:
        target = root / stale
        if target.is_dir() and not target.is_symlink():
            for child in target.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        elif target.exists():
            target.unlink()
    return sorted(f"{_field(s, 'Package')} {_field(s, 'Version')}" for s in kept)


def _resolves(root: Path, link: Path) -> bool:
    """Whether a symlink inside ROOT resolves to something that exists inside ROOT."""
    current = link
    for _ in range(40):
        target = os.readlink(current)
        base = root if target.startswith("/") else current.parent
        current = base / target.lstrip("/")
        if not current.is_symlink():
            return current.exists()
    return False


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: slim_rootfs.py ROOTFS")
    print("\n".join(slim(Path(sys.argv[1]))))
