"""The kubectl binaries on this machine, and running one against the emulator as a user would.

``MPIGATE_KUBECTL`` adds binaries to test (paths separated by ``:``), e.g. Debian's
kubernetes-client (kubectl 1.20.2, what ``make kubectl-client`` installs where there is no kubectl)
unpacked beside the image's: ``apt-get download kubernetes-client && dpkg -x kubernetes-client_*.deb
DIR``, then ``MPIGATE_KUBECTL=DIR/usr/bin/kubectl``.
"""

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
# kubectl 1.27 and newer ask the API server's OpenAPI v3 whether a resource supports dryRun (kubectl's
# QueryParamVerifierV3, which the emulator serves); older ones read the OpenAPI v2 document, which the
# API server serves as protobuf only and the emulator does not serve (it answers an empty one), so
# they refuse `--dry-run=server` with "doesn't support dry-run" before sending anything.
# 1.27 is the oldest shown to work here; 1.20 (Debian's kubernetes-client) does not.
SERVER_DRY_RUN_SINCE = (1, 27)


def no_server_dry_run(kubectl: Kubectl) -> str | None:
    """Why ``kubectl`` cannot run ``--dry-run=server`` against the emulator, or None."""
    if kubectl.version >= SERVER_DRY_RUN_SINCE:
        return None
    return (
        f"kubectl {kubectl.version[0]}.{kubectl.version[1]} looks for dryRun in the OpenAPI v2 document "
        "(protobuf), which the emulator does not serve; kubectl 1.27+ reads OpenAPI v3"
    )


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
    candidates += [Path(p) for p in os.environ.get("MPIGATE_KUBECTL", "").split(os.pathsep) if p]
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
