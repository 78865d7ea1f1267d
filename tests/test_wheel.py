"""The wheel carries the templates, the example org and the install base, and works without the
repository: a wheel installed into an empty directory can scaffold and check a tree."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (found,) = out.glob("mpigate-*.whl")
    return found


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in [
        "mpigate/_data/policies/org.yaml",
        "mpigate/_data/policies/runtimes/mpi-openmpi-gpu.yaml",
        "mpigate/_data/quotas/nlp-team.yaml",
        "mpigate/_data/rbac/personas.yaml",
        "mpigate/_data/networkpolicies/profiles.yaml",
        "mpigate/_data/templates/scaffold/org/policies/org.yaml.j2",
        "mpigate/_data/templates/scaffold/team/quotas.yaml.j2",
        "mpigate/_data/webhooks/README.md",
        "mpigate/_data/webhooks/base/webhookconfigurations.yaml",
        "mpigate/_data/templates/team/quota.yaml.j2",
        "mpigate/_data/templates/cluster/clusterqueues.yaml.j2",
        "mpigate/_data/examples/trainjobs/llm-finetune.yaml",
        "mpigate/config/schemas/TeamQuota.yaml",
        "mpigate/config/defaults/personas.yaml",
        "mpigate/catalogue/rules.yaml",
        "mpigate/py.typed",
    ]:
        assert required in names, required
    assert not any(n.startswith("tests/") or "/tests/fixtures" in n for n in names)


def test_installed_wheel_scaffolds_without_the_repository(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    # The wheel's copy must shadow the editable checkout: put it first and run from elsewhere.
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import mpigate._resources as r, mpigate; print(mpigate.__file__); print(r.data_root())",
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    module_file, data_root = probe.stdout.split()
    assert module_file.startswith(str(target))
    assert data_root == str(target / "mpigate" / "_data")
    for args in (
        ["init", "org", "--team", "nlp"],
        ["init", "example", "--example"],
        ["check", "org"],
        ["check", "example"],
        ["render", "example", "-o", "deploy"],
        ["init", "deploy-repo", "--install-base"],  # the kustomize base, which only the wheel holds
    ):
        run = subprocess.run(
            [sys.executable, "-m", "mpigate", *args],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert run.returncode == 0, (args, run.stdout, run.stderr)
    assert (workdir / "example" / "quotas" / "cv-team.yaml").is_file()
    assert (workdir / "deploy" / "teams" / "cv-team" / "quota.yaml").is_file()
    assert (workdir / "deploy-repo" / "webhooks" / "base" / "webhookconfigurations.yaml").is_file()
