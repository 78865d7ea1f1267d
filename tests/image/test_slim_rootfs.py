"""scripts/image/slim_rootfs.py keeps what the venv's native extensions link against.

The image once lost libstdc++.so.6 (never installed, and not in python3.11's closure), so
cel-expr-python's extension failed to import and `mpigate serve` exited in the image.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts" / "image"))
import slim_rootfs

STATUS = """\
Package: python3.11
Status: install ok installed
Depends: libc6 (>= 2.34)

Package: libc6
Status: install ok installed
Depends: libgcc-s1

Package: libgcc-s1
Status: install ok installed

Package: libstdc++6
Status: install ok installed
Depends: libc6, libgcc-s1

Package: coreutils
Status: install ok installed
Pre-Depends: libc6
"""
FILES = {
    "python3.11": ["/usr/bin/python3.11"],
    "libc6": [
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libpthread.so.0",
        "/usr/lib/x86_64-linux-gnu/libdl.so.2",
        "/usr/lib/x86_64-linux-gnu/librt.so.1",
        "/usr/lib64/ld-linux-x86-64.so.2",
    ],
    "libgcc-s1": ["/usr/lib/x86_64-linux-gnu/libgcc_s.so.1"],
    "libstdc++6": ["/usr/lib/x86_64-linux-gnu/libstdc++.so.6"],
    "coreutils": ["/usr/bin/ls", "/usr/share/doc/coreutils/libstdc++.so.6"],  # not in a lib dir
}


def _cel_extension() -> Path:
    spec = importlib.util.find_spec("cel_expr_python.cel")  # the extension module
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    info = tmp_path / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(STATUS)
    for package, files in FILES.items():
        (info / f"{package}.list").write_text("\n".join(["/.", *files]) + "\n")
    venv = tmp_path / "opt/venv/lib/python3.11/site-packages/cel_expr_python"
    venv.mkdir(parents=True)
    shutil.copy(_cel_extension(), venv)
    (venv / "__init__.py").write_text("")
    return tmp_path


def test_the_elf_reader_finds_what_cel_expr_python_links() -> None:
    needed = slim_rootfs.elf_needed(_cel_extension().read_bytes())
    assert "libstdc++.so.6" in needed and "libc.so.6" in needed
    assert slim_rootfs.elf_needed(b"#!/bin/sh\n") == []


def test_the_packages_providing_the_venvs_libraries_are_kept(rootfs: Path) -> None:
    installed = list(FILES)
    needed = slim_rootfs.venv_libraries(rootfs / "opt/venv")
    assert needed["libstdc++.so.6"].endswith("cel_expr_python/" + _cel_extension().name)
    libraries = slim_rootfs.library_packages(rootfs / "var/lib/dpkg/info", installed, needed)
    assert "libstdc++6" in libraries and "coreutils" not in libraries
    keep = slim_rootfs.runtime_packages(STATUS + "\n" + _data_only(), ("python3.11", *sorted(libraries)))
    assert {"python3.11", "libc6", "libgcc-s1", "libstdc++6"} <= keep
    assert "coreutils" not in keep
    # without the venv's libraries, python3.11's closure alone loses libstdc++6 (the old bug)
    assert "libstdc++6" not in slim_rootfs.runtime_packages(STATUS + "\n" + _data_only())


def test_a_library_no_package_provides_stops_the_build_naming_it(rootfs: Path) -> None:
    installed = [p for p in FILES if p != "libstdc++6"]
    needed = slim_rootfs.venv_libraries(rootfs / "opt/venv")
    with pytest.raises(SystemExit, match=r"libstdc\+\+\.so\.6 \(needed by .*cel_expr_python/cel"):
        slim_rootfs.library_packages(rootfs / "var/lib/dpkg/info", installed, needed)


def test_a_library_the_wheel_bundles_is_not_needed_from_the_system(rootfs: Path) -> None:
    bundled = rootfs / "opt/venv/lib/python3.11/site-packages/cel_expr_python.libs"
    bundled.mkdir()
    (bundled / "libstdc++.so.6").write_bytes(b"")
    assert "libstdc++.so.6" not in slim_rootfs.venv_libraries(rootfs / "opt/venv")


def _data_only() -> str:
    return "\n".join(f"Package: {name}\nStatus: install ok installed\n" for name in slim_rootfs.DATA_ONLY)
