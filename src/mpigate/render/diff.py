"""What a render would change, object by object - for reviewing a config pull request.

Objects are paired by apiVersion, kind, namespace and name (as the cluster identifies them), so a
moved or reordered object is no change, and each changed object gets a unified diff of its
canonical YAML. The baseline is either a directory rendered before or the same config tree at a git
revision, rendered now with the same templates and options.
"""

from __future__ import annotations

import datetime as dt
import difflib
import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mpigate.config import ConfigError, Severity, load
from mpigate.config.bundle import BUNDLE_ARCHIVE, bundle_files
from mpigate.config.loader import REVISION_FILE

from .context import LABELS
from .errors import RenderError, RenderProblem
from .manifests import ObjectKey, dump_object, object_key
from .renderer import Rendering, render
from .tree import objects_in_files, read_objects

__all__ = [
    "ObjectChange",
    "baseline_objects",
    "diff_objects",
    "git_tree",
    "render_at_ref",
    "rendering_objects",
]

Change = Literal["added", "removed", "changed"]


@dataclass(frozen=True)
class ObjectChange:
    """One object that differs; ``diff`` is a unified diff of its YAML (old → new)."""

    change: Change
    key: ObjectKey
    old_file: str | None
    new_file: str | None
    diff: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "apiVersion": self.key.api_version,
            "kind": self.key.kind,
            "namespace": self.key.namespace or None,
            "name": self.key.name,
            "oldFile": self.old_file,
            "newFile": self.new_file,
            "diff": self.diff,
        }


def _without_revision(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` without the config revision it carries (the bundle's annotation and data key)."""
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, Mapping) and isinstance(meta.get("annotations"), Mapping):
        annotations = {k: v for k, v in meta["annotations"].items() if k != LABELS["revision"]}
        out["metadata"] = {k: v for k, v in meta.items() if k != "annotations"}
        if annotations:
            out["metadata"]["annotations"] = annotations
    data = out.get("data")
    archived = f"{BUNDLE_ARCHIVE}/{REVISION_FILE}"
    if isinstance(data, Mapping) and (REVISION_FILE in data or archived in data):
        out["data"] = {k: v for k, v in data.items() if k not in (REVISION_FILE, archived)}
    return out


def _readable(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """A compressed config bundle with its archive shown as the files it carries (a change to one
    team's file is then a change to that key, as in a plain bundle, not a new blob)."""
    binary = obj.get("binaryData")
    if obj.get("kind") != "ConfigMap" or not isinstance(binary, Mapping) or BUNDLE_ARCHIVE not in binary:
        return obj
    files = bundle_files(obj)
    if files is None:
        return obj
    out = {k: v for k, v in obj.items() if k != "binaryData"}
    rest = {k: v for k, v in binary.items() if k != BUNDLE_ARCHIVE}
    if rest:
        out["binaryData"] = rest
    out["data"] = {**(obj.get("data") or {}), **{f"{BUNDLE_ARCHIVE}/{k}": v for k, v in files.items()}}
    return out


def _index(
    objects: Iterable[tuple[str, Mapping[str, Any]]], ignore_revision: bool
) -> dict[ObjectKey, tuple[str, str]]:
    out: dict[ObjectKey, tuple[str, str]] = {}
    for file, obj in objects:
        readable = _readable(obj)
        shown = _without_revision(readable) if ignore_revision else readable
        out[object_key(obj)] = (file, dump_object(shown))
    return out


def diff_objects(
    old: Iterable[tuple[str, Mapping[str, Any]]],
    new: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    context: int = 3,
    ignore_revision: bool = True,
) -> list[ObjectChange]:
    """Changes from ``old`` to ``new`` (each an iterable of (file, object)), sorted by object key.

    With ``ignore_revision`` (the default) the config revision that the bundle carries is left
    out of the comparison: every commit has a new one, and a pull request that changes nothing
    else should show no change."""
    before, after = _index(old, ignore_revision), _index(new, ignore_revision)
    changes = []
    for key in sorted(before.keys() | after.keys()):
        old_file, old_text = before.get(key, (None, ""))
        new_file, new_text = after.get(key, (None, ""))
        if old_text == new_text:
            continue
        change: Change = "added" if old_file is None else "removed" if new_file is None else "changed"
        lines = difflib.unified_diff(
            old_text.splitlines(keepends=True),
            new_text.splitlines(keepends=True),
            fromfile=f"a/{old_file}" if old_file else "/dev/null",
            tofile=f"b/{new_file}" if new_file else "/dev/null",
            n=context,
        )
        changes.append(ObjectChange(change, key, old_file, new_file, "".join(lines)))
    return changes


def rendering_objects(rendering: Rendering) -> list[tuple[str, Mapping[str, Any]]]:
    """Every object in the rendering's files, read exactly as :func:`read_objects` reads a written
    tree (the on-demand smoke TrainJobs outside the kustomizations included), so that both sides
    of a diff are seen alike."""
    return [(rel, doc) for rel, doc in objects_in_files(rendering.files.items())]


def _git(cwd: Path, *args: str, failure: Callable[[], str] | None = None) -> bytes:
    """Run git in ``cwd``; when it fails, raise what ``failure()`` says (what went wrong and how to
    fix it, worked out only then) or, for a failure nobody foresaw, git's own last line."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False, timeout=120)
    except FileNotFoundError:
        raise RenderError(
            (
                RenderProblem(
                    str(cwd),
                    0,
                    "git is not installed: --against GIT_REF needs it (or compare with a directory "
                    "rendered before: --against DIR)",
                ),
            )
        ) from None
    except subprocess.TimeoutExpired:
        raise RenderError((RenderProblem(str(cwd), 0, f"git {args[0]} did not finish in 120 s"),)) from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        text = failure() if failure else f"git {args[0]}: {message[-1] if message else 'failed'}"
        raise RenderError((RenderProblem(str(cwd), 0, text),))
    return done.stdout


def _missing_ref(top: Path, ref: str) -> str:
    """Why ``ref`` does not resolve in the repository at ``top``, and what to do."""
    remotes = _git(top, "remote").decode().split()
    remote = ref.split("/", 1)[0] if "/" in ref else None
    if remote is not None and not remotes:
        return (
            f"git ref {ref!r} not found: the repository has no remote (so no {remote}/...); "
            "pass a local branch, tag or commit (`git branch -a`), or add the remote and fetch it"
        )
    if remote is not None and remote in remotes:
        branch = ref.split("/", 1)[1]
        return (
            f"git ref {ref!r} not found: fetch it first (`git fetch {remote} {branch}:refs/remotes/{ref}`; "
            "CI checkouts are often shallow or single-branch), or pass an existing ref (`git branch -a`)"
        )
    known = f" (remotes: {', '.join(remotes)})" if remotes else ""
    return (
        f"git ref {ref!r} not found{known}: pass a branch, tag or commit of this repository "
        "(`git branch -a`, `git tag`)"
    )


@contextmanager
def git_tree(path: str | os.PathLike[str], ref: str) -> Iterator[tuple[Path, str]]:
    """The config tree at ``path`` as of git ``ref``, extracted into a temporary directory.

    Yields (the tree's path inside the temporary checkout, the full commit id)."""
    target = Path(path).resolve()
    start = target if target.is_dir() else target.parent
    if not start.is_dir():
        raise RenderError((RenderProblem(str(path), 0, f"{path} does not exist"),))

    def not_a_repo() -> str:
        return (
            f"{path} is not inside a git repository: --against {ref} names a git ref (branch, tag or "
            "commit) of the repository that holds the tree; commit the tree to git, or compare with "
            "a directory rendered before (--against DIR)"
        )

    top = Path(_git(start, "rev-parse", "--show-toplevel", failure=not_a_repo).decode().strip())
    resolve = ("rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}")
    commit = _git(top, *resolve, failure=lambda: _missing_ref(top, ref)).decode().strip()
    relative = target.relative_to(top.resolve())
    archive = _git(top, "archive", "--format=tar", commit)
    with tempfile.TemporaryDirectory(prefix="mpigate-diff-") as tmp:
        problem = _extract(archive, tmp)
        if problem is not None:
            raise RenderError((RenderProblem(str(path), 0, f"at {ref}: {problem}"),))
        yield Path(tmp) / relative, commit


def _extract(archive: bytes, dest: str) -> str | None:
    """``git archive``'s tar into ``dest``, admitting what tarfile's ``data`` filter admits
    (PEP 706): directories and regular files inside ``dest`` (written without their modes' setuid
    and write bits for others) and symbolic links whose target stays inside it; what else is
    there is the returned problem, and nothing is followed out of ``dest``. The tree at a ref can
    be a pull request's: a link to a CI runner's files must not be read into the diff. (The
    ``filter`` argument of ``extractall`` needs Python 3.11.4; the image's interpreter, Debian
    bookworm's 3.11.2, has none.)"""
    root = os.path.realpath(dest)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar:
            try:
                problem = _extract_member(tar, member, root)
            except OSError as exc:  # e.g. a name that is there twice: a clean error, no traceback
                problem = f"{member.name} could not be written ({exc.strerror or exc})"
            if problem is not None:
                return problem
    return None


def _inside(candidate: str, root: str) -> bool:
    return candidate == root or candidate.startswith(root + os.sep)


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, root: str) -> str | None:
    """One member of :func:`_extract`'s archive into ``root``, or why it is refused."""
    path = os.path.realpath(os.path.join(root, member.name))
    if os.path.isabs(member.name) or not _inside(path, root) or (path == root and not member.isdir()):
        return f"{member.name} is outside the tree"
    if member.isdir():
        os.makedirs(path, exist_ok=True)
    elif member.isfile():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = tar.extractfile(member)
        data = handle.read() if handle is not None else b""
        mode = 0o755 if member.mode & 0o100 else 0o644
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    elif member.issym():
        link = member.linkname
        pointed = os.path.realpath(os.path.join(os.path.dirname(path), link))
        if os.path.isabs(link) or not _inside(pointed, root):
            return (
                f"{member.name} is a symbolic link to {link}, outside the tree; mpigate does not "
                "follow links out of a tree at a git revision (replace it with the file)"
            )
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(link, path)
    else:
        return f"{member.name} is not a file, a directory or a symbolic link"
    return None


def render_at_ref(
    path: str | os.PathLike[str],
    ref: str,
    *,
    template_dirs: Sequence[str | os.PathLike[str]] = (),
    today: dt.date | None = None,
) -> Rendering:
    """Render the config tree at ``path`` as it was at git ``ref`` (its own templates/ included)."""
    with git_tree(path, ref) as (tree, commit):
        if not tree.exists():
            raise RenderError((RenderProblem(str(path), 0, f"{path} does not exist at {ref}"),))
        try:
            config = load(tree, revision=commit, today=today)
        except ConfigError as exc:
            problems = tuple(
                RenderProblem(f"{ref}:{p.location}", 0, f"{p.path}: {p.message}")
                for p in exc.problems
                if p.severity is Severity.ERROR
            )
            raise RenderError(problems) from None
        return render(config, template_dirs=template_dirs, today=today)


def baseline_objects(
    path: str | os.PathLike[str],
    against: str,
    *,
    template_dirs: Sequence[str | os.PathLike[str]] = (),
    today: dt.date | None = None,
) -> list[tuple[str, Mapping[str, Any]]]:
    """Objects to compare with: a rendered directory when ``against`` is one, else a git ref."""
    if Path(against).is_dir():
        return [(f, o) for f, o in read_objects(against)]
    return rendering_objects(render_at_ref(path, against, template_dirs=template_dirs, today=today))
