"""The kubectl binaries on this machine, and running one against the emulator as a user would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The machine image ships several kubectl minor versions side by side; `make system-deps` installs
# Debian's kubernetes-client when there is none.
KUBECTL_DIRS = (Path("/usr/lib/google-cloud-sdk/bin"),)


@dataclass(frozen=True)
class Kubectl:
    path: Path
    version: tuple[int, int]

    @property
    def id(self) -> str:
        return f"kubectl-{self.version[0]}.{self.version[1]}"


def _version(path: Path) -> tuple[int, int] | None:
    try:
        out = subprocess.run([str(path), "version", "--client", "-o", "json"], capture_output=True,
                             text=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'"major":\s*"(\d+)",\s*"minor":\s*"(\d+)', out)
    return (int(m[1]), int(m[2])) if m else None


def find_kubectls() -> list[Kubectl]:
    """Every distinct kubectl minor version found, oldest first."""
    candidates = [p for d in KUBECTL_DIRS if d.is_dir() for p in sorted(d.glob("kubectl*"))]
    on_path = shutil.which("kubectl")
    if on_path:
        candidates.append(Path(on_path))
    found: dict[tuple[int, int], Kubectl] = {}
    for path in candidates:
        if not os.access(path, os.X_OK) or path.suffix == ".py":
            continue
        named = re.fullmatch(r"kubectl\.(\d+)\.(\d+)", path.name)
        version = (int(named[1]), int(named[2])) if named else _version(path)
        if version is not None and version not in found:
            found[version] = Kubectl(path, version)
    return [found[v] for v in sorted(found)]


def oldest_and_newest() -> list[Kubectl]:
    found = find_kubectls()
    return found if len(found) <= 2 else [found[0], found[-1]]


def run(
    kubectl: Kubectl, kubeconfig: Path, cache: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(cache), "KUBECONFIG": str(kubeconfig)}
    return subprocess.run(
        [str(kubectl.path), "--cache-dir", str(cache / "cache"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
