"""Loading a config tree: discover → parse → dispatch by apiVersion/kind → validate → defaults →
cross-file rules → immutable :class:`Config`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .admission import ADMISSION_API, ADMISSION_KINDS
from .build import build_config
from .bundle import BUNDLE_ARCHIVE, BundleArchiveError, unpack
from .crossfile import Entry, cross_file_problems
from .discovery import IGNORE_FILE, discover
from .model import Config
from .problems import ConfigError, Location, PathPart, Problem, Severity
from .queueing import Locate, queueing_problems
from .revision import tree_revision
from .schema import ADMISSION_SCHEMA_KINDS, API_VERSION, KINDS, apply_defaults, validate_document
from .yamlsource import Document, parse_documents, parse_file

__all__ = ["CheckResult", "check_tree", "is_config_tree", "load"]

TRAINER_API_GROUP = "trainer.kubeflow.org"
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
_DEFAULT_FILES = {"Personas": "personas.yaml", "NetworkProfiles": "profiles.yaml"}
# A config bundle (the ConfigMap the webhook mounts) carries the revision it was rendered from.
REVISION_FILE = ".mpigate-revision"


def _bundle_revision(root: Path) -> str | None:
    try:
        text = (root / REVISION_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


@dataclass(frozen=True)
class CheckResult:
    """Everything ``mpigate check`` reports about a tree."""

    root: str
    config: Config | None
    problems: tuple[Problem, ...]
    files: tuple[str, ...]
    documents: int
    ignored: tuple[str, ...] = field(default=())
    builtin_defaults: tuple[str, ...] = field(default=())

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity is Severity.ERROR)

    @property
    def warnings(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity is Severity.WARNING)

    @property
    def ok(self) -> bool:
        return not self.errors


def _display(path: Path, root: Path) -> str:
    base = root if root.is_dir() else root.parent
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


def _tree_of(file: str) -> str:
    """The tree an OrgPolicy file belongs to, by the convention ``TREE/policies/org.yaml`` (or
    ``TREE/org.yaml`` for a file right at the top): ``"."`` for the checked directory's own."""
    parts = file.split("/")
    return "/".join(parts[:-2]) if len(parts) > 2 else "."


def _nested_trees(orgs: list[Entry]) -> list[Problem]:
    """One problem per config tree found inside the checked one (its own OrgPolicy elsewhere)."""
    trees: dict[str, Entry] = {}
    for entry in orgs:
        if not entry.builtin:
            trees.setdefault(_tree_of(entry.doc.file), entry)
    if len(trees) < 2:
        return []  # one tree (two OrgPolicies in it are the cross-file check's "defined twice")
    first, *others = sorted(trees)
    problems = []
    for tree in others:
        entry = trees[tree]
        problems.append(
            Problem(
                entry.doc.locate(()),
                "(tree)",
                f"a second config tree: {tree}/ has its own OrgPolicy (so has "
                f"{trees[first].doc.file}); one directory holds one config tree",
                "nested.tree",
                hint=f"run mpigate inside one of them or pass its path (--config {tree}); to keep "
                f"{tree}/ where it is, list it in {IGNORE_FILE}",
            )
        )
    return problems


def _dispatch(
    doc: Document, problems: list[Problem], ignored: list[str], objects: list[Entry]
) -> Entry | None:
    """The entry of a document of a kind the tree holds; any other document is ``ignored`` and,
    kept in ``objects``, may be a ValidatingAdmissionPolicyBinding's parameters."""
    data = doc.data
    where = f"{doc.file}#{doc.index}"
    if not isinstance(data, dict):
        problems.append(
            Problem(
                doc.locate(()),
                "(document)",
                "document is not a mapping; ignored",
                "document.not-object",
                Severity.WARNING,
                "config documents are mappings with apiVersion and kind",
            )
        )
        return None
    api_version = data.get("apiVersion")
    kind = data.get("kind")
    if isinstance(api_version, str) and api_version.split("/")[0] == "mpigate.io":
        if kind not in KINDS:
            close = difflib.get_close_matches(str(kind), KINDS, n=1)
            problems.append(
                Problem(
                    doc.locate(("kind",)),
                    "kind",
                    f"unknown mpigate kind {kind!r}",
                    "document.unknown-kind",
                    hint=f"did you mean {close[0]!r}?" if close else "kinds: " + ", ".join(KINDS),
                )
            )
            return None
        if api_version != API_VERSION:
            problems.append(
                Problem(
                    doc.locate(("apiVersion",)),
                    "apiVersion",
                    f"unsupported apiVersion {api_version!r} for {kind}",
                    "document.api-version",
                    hint=f"use apiVersion: {API_VERSION}",
                )
            )
            return None
        return Entry(kind=str(kind), doc=doc, data=data)
    if kind in KINDS:
        problems.append(
            Problem(
                doc.locate(("apiVersion",)),
                "apiVersion",
                f"{kind} needs apiVersion {API_VERSION}, got {api_version!r}",
                "document.api-version",
                hint=f"set apiVersion: {API_VERSION}",
            )
        )
        return None
    if (
        isinstance(api_version, str)
        and api_version.split("/")[0] == TRAINER_API_GROUP
        and kind in RUNTIME_KINDS
    ):
        return Entry(kind=str(kind), doc=doc, data=data)
    if (
        kind in ADMISSION_KINDS
        and isinstance(api_version, str)
        and api_version.startswith("admissionregistration.k8s.io/")
    ):
        if api_version == ADMISSION_API:
            return Entry(kind=str(kind), doc=doc, data=data)
        problems.append(
            Problem(
                doc.locate(("apiVersion",)),
                "apiVersion",
                f"mpigate reads {kind} as {ADMISSION_API}, got {api_version!r}",
                "document.api-version",
                hint=f"set apiVersion: {ADMISSION_API} (the fields are the same)",
            )
        )
        return None
    ignored.append(f"{where} ({kind or 'no kind'})")
    objects.append(Entry(kind=str(kind), doc=doc, data=data))
    return None


def _builtin_entry(kind: str) -> Entry:
    name = _DEFAULT_FILES[kind]
    text = resources.files(__package__).joinpath("defaults", name).read_text(encoding="utf-8")
    docs, problems = parse_documents(text, f"<built-in {name}>")
    assert docs and not problems, problems
    return Entry(kind=kind, doc=docs[0], data=apply_defaults(kind, docs[0].data), builtin=True)


def is_config_tree(problems: Iterable[Problem]) -> bool:
    """Whether the checked path is a config tree at all, judged by its problems.

    Every tree has exactly one OrgPolicy; a path without one (an empty or unrelated directory, the
    wrong working directory) is not an incomplete tree but no tree, and deserves that message
    rather than a list of every kind it lacks.
    """
    return not any(p.code == "missing.OrgPolicy" for p in problems)


def check_tree(path: str | Path, *, revision: str | None = None, today: dt.date | None = None) -> CheckResult:
    """Load and check a tree, collecting every problem instead of raising.

    ``revision`` overrides the computed one; otherwise a directory with a ``.mpigate-revision``
    file (a rendered config bundle) uses the revision written there. ``today`` pins the
    date used for exception expiry (default: today in UTC).
    """
    root = Path(path)
    if not root.exists():
        problem = Problem(Location(str(path)), "(tree)", "no such file or directory", "io")
        return CheckResult(str(path), None, (problem,), (), 0)
    if root.is_dir() and (root / BUNDLE_ARCHIVE).is_file():
        return _check_archive(root, revision=revision, today=today)
    files = discover(root)
    problems: list[Problem] = []
    ignored: list[str] = []
    entries: list[Entry] = []
    objects: list[Entry] = []
    documents = 0
    for file in files:
        docs, parse_problems = parse_file(str(file), _display(file, root))
        problems.extend(parse_problems)
        for doc in docs:
            documents += 1
            entry = _dispatch(doc, problems, ignored, objects)
            if entry is None:
                continue
            if entry.kind in KINDS or entry.kind in ADMISSION_SCHEMA_KINDS:
                schema_problems = validate_document(entry.kind, doc)
                problems.extend(schema_problems)
                if schema_problems:
                    entry = Entry(entry.kind, doc, entry.data, valid=False)
                else:
                    entry = Entry(entry.kind, doc, apply_defaults(entry.kind, doc.data))
            entries.append(entry)

    by_kind: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_kind[entry.kind].append(entry)
    builtins = []
    for kind in _DEFAULT_FILES:
        if not by_kind.get(kind):
            by_kind[kind].append(_builtin_entry(kind))
            builtins.append(kind)

    nested = _nested_trees(by_kind.get("OrgPolicy", []))
    if nested:
        # Not one tree but several: every kind of each would be "defined twice" (93 errors from a
        # checkout's parent). Say that instead, and nothing else.
        return CheckResult(
            str(root),
            None,
            tuple(problems + nested),
            tuple(_display(f, root) for f in files),
            documents,
            tuple(ignored),
            (),
        )
    problems.extend(cross_file_problems(by_kind, root, today, objects))
    display_files = tuple(_display(f, root) for f in files)
    has_errors = any(p.severity is Severity.ERROR for p in problems)
    config = None
    if not has_errors:
        config = build_config(
            by_kind,
            root=str(root),
            revision=revision
            or (_bundle_revision(root) if root.is_dir() else None)
            or tree_revision(root, files),
            files=display_files,
            warnings=(),
            objects=objects,
        )
        # Checks that need Kueue's arithmetic run on the built model (config.queueing).
        problems.extend(queueing_problems(config, _locator(by_kind)))
        built = config
        config = dataclasses.replace(
            config, warnings=tuple(p for p in problems if p.severity is Severity.WARNING)
        )
        config.memo.update(built.memo)  # the same content: keep what the checks derived (the queues)
    return CheckResult(
        root=str(root),
        config=config,
        problems=tuple(sorted(problems, key=Problem.sort_key)),
        files=display_files,
        documents=documents,
        ignored=tuple(ignored),
        builtin_defaults=tuple(builtins),
    )


def _locator(by_kind: Mapping[str, list[Entry]]) -> Locate:
    """Where a JSON path of a (kind, name) document is; "" names the kind's one document."""

    def locate(kind: str, name: str, path: Sequence[PathPart]) -> Location:
        for entry in by_kind.get(kind, ()):
            meta = entry.data.get("metadata") if isinstance(entry.data, dict) else None
            if not name or (isinstance(meta, dict) and meta.get("name") == name):
                return entry.doc.locate(tuple(path))
        return Location(kind)

    return locate


def _check_archive(root: Path, *, revision: str | None, today: dt.date | None) -> CheckResult:
    """A mounted compressed bundle (:mod:`mpigate.config.bundle`): its files are checked as the
    tree they were rendered from, extracted into a private directory for the time of the check;
    the result names the mounted directory as its root."""
    archive = root / BUNDLE_ARCHIVE
    beside = discover(root)
    if beside:
        problem = Problem(
            Location(_display(beside[0], root)),
            "(tree)",
            f"a config bundle holds either {BUNDLE_ARCHIVE} or config files, not both",
            "bundle",
            hint="mount the ConfigMap that mpigate render wrote, unchanged",
        )
        return CheckResult(str(root), None, (problem,), (), 0)
    with tempfile.TemporaryDirectory(prefix="mpigate-bundle-") as tmp:
        try:
            unpack(archive, Path(tmp))
        except BundleArchiveError as exc:
            problem = Problem(
                Location(BUNDLE_ARCHIVE),
                "(tree)",
                f"the config bundle archive cannot be read: {exc}",
                "bundle",
                hint="mount the ConfigMap that mpigate render wrote, unchanged",
            )
            return CheckResult(str(root), None, (problem,), (), 0)
        result = check_tree(tmp, revision=revision, today=today)
    config = dataclasses.replace(result.config, root=str(root)) if result.config is not None else None
    return dataclasses.replace(result, root=str(root), config=config)


def load(path: str | Path, *, revision: str | None = None, today: dt.date | None = None) -> Config:
    """Load the config tree at ``path`` (a directory or a single multi-document file).

    Returns an immutable :class:`~mpigate.config.model.Config`; raises
    :class:`~mpigate.config.problems.ConfigError` carrying every problem when the tree has errors.
    Warnings (e.g. expired exceptions) are kept in ``Config.warnings``.
    """
    result = check_tree(path, revision=revision, today=today)
    if result.config is None:
        raise ConfigError(result.problems)
    return result.config
