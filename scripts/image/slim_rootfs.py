"""Reduce a Debian rootfs built by mmdebstrap to what the image runs: Python 3.11 and the libraries it
loads, CA certificates, netbase and base-files, without a shell, coreutils, dpkg or perl.

The build installs Debian's essential set (dpkg needs a shell and coreutils to run maintainer
scripts); afterwards those packages are dead weight and an attack surface. This removes the files of
every package outside the runtime set (as `dpkg --purge` would, but without running maintainer
scripts, which need the shell being removed) and drops them from /var/lib/dpkg/status, so that SBOM
and vulnerability scanners see exactly what the image holds.

The runtime set is python3.11's dependency closure plus the packages that provide the shared
libraries the venv's native extensions need (their ELF DT_NEEDED entries, e.g. libstdc++.so.6 for
cel-expr-python): a wheel's extension linking a library nobody kept would only fail when the image
imports it. A needed library that no installed package provides stops the build, naming it.

Usage: python slim_rootfs.py ROOTFS VENV   (VENV as seen inside ROOTFS, e.g. /opt/mpigate/venv;
prints the kept packages, one "name version" a line)
"""

from __future__ import annotations

import os
import re
import shutil
import struct
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


def elf_needed(data: bytes) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF file ([] for anything else): the
    PT_DYNAMIC segment's entries, their strings read from DT_STRTAB mapped through PT_LOAD."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 32)[0], *struct.unpack_from("<HH", data, 54)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    entries = [struct.unpack_from("<qQ", data, dynamic[0] + i) for i in range(0, dynamic[1], 16)]
    strtab = next((value for tag, value in entries if tag == 5), None)  # DT_STRTAB, a virtual address
    offset = next(
        (o + strtab - v for v, o, size in loads if strtab is not None and v <= strtab < v + size), None
    )
    if offset is None:
        return []
    names = []
    for tag, value in entries:
        if tag == 0:  # DT_NULL
            break
        if tag == 1:  # DT_NEEDED
            end = data.index(b"\0", offset + value)
            names.append(data[offset + value : end].decode())
    return names


def venv_libraries(venv: Path) -> dict[str, str]:
    """The shared libraries the venv's ELF files need from the system: {library: a file needing it}.
    Libraries a wheel bundles (auditwheel's <package>.libs/) are the venv's own, not needed."""
    files = [p for p in venv.rglob("*") if p.is_file() and not p.is_symlink() and ".so" in p.name]
    own = {p.name for p in files}
    needed: dict[str, str] = {}
    for path in sorted(files):
        for library in elf_needed(path.read_bytes()):
            if library not in own:
                needed.setdefault(library, str(path.relative_to(venv)))
    return needed


# where the dynamic linker looks: /lib, /lib64, /usr/lib, /usr/lib/x86_64-linux-gnu, ...
_LIB_DIR = re.compile(r"(/usr)?/lib(32|64|x32)?(/[^/]+-linux-gnu[^/]*)?")


def library_packages(info: Path, installed: list[str], needed: dict[str, str]) -> set[str]:
    """The installed packages whose files provide ``needed`` (in a lib directory)."""
    found: dict[str, str] = {}
    for package in installed:
        for line in _list_file(info, package).read_text(encoding="utf-8").splitlines():
            directory, _, name = line.rpartition("/")
            if name in needed and _LIB_DIR.fullmatch(directory):
                found.setdefault(name, package)
    missing = sorted(set(needed) - set(found))
    if missing:
        raise SystemExit(
            "slim_rootfs: no installed Debian package provides "
            + ", ".join(f"{lib} (needed by {needed[lib]})" for lib in missing)
            + ": add its package to the rootfs (scripts/image/build.sh --include, Containerfile)"
        )
    return set(found.values())


def runtime_packages(status: str, roots: tuple[str, ...] = RUNTIME_ROOTS) -> set[str]:
    """The closure of ``roots`` over Pre-Depends and Depends (first installed alternative)."""
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
    missing = [p for p in (*roots, *DATA_ONLY) if p not in deps]
    if missing:
        raise SystemExit(f"slim_rootfs: not installed in the rootfs: {', '.join(missing)}")
    keep = set(DATA_ONLY)
    todo = list(roots)
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


def slim(root: Path, venv: str) -> list[str]:
    status_path = root / "var/lib/dpkg/status"
    status = status_path.read_text(encoding="utf-8")
    info = root / "var/lib/dpkg/info"
    installed = [_field(s, "Package") for s in _stanzas(status)]
    libraries = library_packages(info, installed, venv_libraries(root / venv.lstrip("/")))
    keep = runtime_packages(status, (*RUNTIME_ROOTS, *sorted(libraries)))
    # ldconfig (libc-bin) goes with the rest, but the linker cache must be rebuilt afterwards
    # (Debian's ldconfig is linked statically, so a copy runs without the rootfs)
    ldconfig = Path(tempfile.mkdtemp()) / "ldconfig"
    shutil.copy2(root / "sbin/ldconfig", ldconfig)
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
    if len(sys.argv) != 3:
        raise SystemExit("usage: slim_rootfs.py ROOTFS VENV")
    print("\n".join(slim(Path(sys.argv[1]), sys.argv[2])))
