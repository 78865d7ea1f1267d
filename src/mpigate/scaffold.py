"""``mpigate init``: scaffold a config tree, add a team, or copy the example org."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2

from ._resources import data_path
from .config import Config, Severity, check_tree, is_config_tree
from .render import MARKER_FILE

__all__ = ["ScaffoldError", "Written", "add_team", "copy_example", "copy_install_base", "init_tree"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_EXAMPLE_REGISTRY = "registry.acme.internal"
_STARTER_REGISTRY = "registry.example.internal"
EXAMPLE_FOLDERS = ("policies", "quotas", "rbac", "networkpolicies", "examples")


class ScaffoldError(Exception):
    """A scaffold request that cannot be carried out (message is for the user)."""


@dataclass(frozen=True)
class Written:
    files: tuple[Path, ...]
    chosen: str = ""  # what init decided for the admin (said after the files)


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_path("templates", "scaffold"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _check_name(kind: str, value: str) -> None:
    if not _DNS_LABEL.match(value) or len(value) > 63:
        raise ScaffoldError(
            f"{kind} {value!r} is not a DNS-1123 label (lower-case letters, digits, '-'; at most 63)"
        )


def _write(path: Path, text: str, force: bool) -> Path:
    if path.exists() and not force:
        raise ScaffoldError(f"{path} already exists (use --force to overwrite)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _default_text(name: str) -> str:
    return resources.files("mpigate.config").joinpath("defaults", name).read_text(encoding="utf-8")


def init_tree(
    directory: Path,
    *,
    org: str = "example",
    team: str = "ml-team",
    region: str = "eu",
    region_label: str = "eu-west-1",
    gpus: int | None = None,
    force: bool = False,
) -> Written:
    """Write a new config tree with a starter org and one team; ``check`` accepts it."""
    for kind, value in (("org", org), ("team", team), ("region", region)):
        _check_name(kind, value)
    if directory.is_dir() and any(directory.iterdir()) and not force:
        existing = check_tree(directory)
        if is_config_tree(existing.problems):
            raise ScaffoldError(
                f"{directory} already holds a config tree; use `mpigate init {directory} --team NAME` "
                "to add a team"
            )
    env = _env()
    flavor = f"a100-{region}"
    context = {
        "org": org,
        "team": team,
        "region": region,
        "region_label": region_label,
        "flavor": flavor,
        "today": dt.date.today().isoformat(),
    }
    written = []
    scaffold_root = data_path("templates", "scaffold", "org")
    for source in sorted(scaffold_root.rglob("*")):
        if not source.is_file():
            continue
        rel = source.relative_to(scaffold_root)
        if source.suffix == ".j2":
            text = env.get_template(f"org/{rel.as_posix()}").render(**context)
            target = directory / rel.with_suffix("")
        else:
            text = source.read_text(encoding="utf-8")
            target = directory / rel
        written.append(_write(target, text, force))
    written.append(_write(directory / "rbac" / "personas.yaml", _default_text("personas.yaml"), force))
    written.append(
        _write(directory / "networkpolicies" / "profiles.yaml", _default_text("profiles.yaml"), force)
    )
    runtime = data_path("policies", "runtimes", "mpi-openmpi-gpu.yaml").read_text(encoding="utf-8")
    written.append(
        _write(
            directory / "policies" / "runtimes" / "mpi-openmpi-gpu.yaml",
            runtime.replace(_EXAMPLE_REGISTRY, _STARTER_REGISTRY),
            force,
        )
    )
    team_files = add_team(directory, team, region=region, flavor=flavor, gpus=gpus, force=force, _fresh=True)
    return Written(tuple(written) + team_files.files, team_files.chosen)


def add_team(
    directory: Path,
    team: str,
    *,
    namespace: str | None = None,
    region: str | None = None,
    flavor: str | None = None,
    profile: str | None = None,
    gpus: int | None = None,
    cohort: str | None = None,
    priority_classes: tuple[str, ...] = (),
    force: bool = False,
    _fresh: bool = False,
) -> Written:
    """Add quota, access, network and a first TrainJob for ``team`` to an existing tree.

    The existing tree must pass ``check`` (its regions, flavors, cohorts and priority classes are
    read from it). The files are written only when the tree with them still passes ``check``;
    otherwise nothing is written and the error says why (e.g. the flavor's capacity). ``gpus``,
    ``cohort`` and ``priority_classes`` override what init would choose: one node's GPUs of the
    region's first GPU flavor (less when the flavor's capacity has less left), the tree's first
    cohort and first priority class. ``Written.chosen`` says what was chosen.
    """
    _check_name("team", team)
    namespace = namespace or team
    _check_name("namespace", namespace)
    chosen_cohort: str | None = None
    classes: list[str] = list(priority_classes) or ["standard"]
    personas = ["data-scientist", "mlops-engineer", "viewer"]
    team_gpus = 8 if gpus is None else gpus
    image = f"{_STARTER_REGISTRY}/{team}/train:0.1.0"
    if not _fresh:
        result = check_tree(directory)
        config = result.config
        if config is None:
            if not is_config_tree(result.problems):
                raise ScaffoldError(f"{directory} has no OrgPolicy; run `mpigate init {directory}` first")
            # Decided: no team is added to a tree with errors. init reads the regions, flavors,
            # cohorts and priority classes from the tree, and could not tell its own errors from
            # the tree's.
            errors = [str(p) for p in result.problems if p.severity is Severity.ERROR]
            shown = "; ".join(errors[:3]) + (f"; and {len(errors) - 3} more" if len(errors) > 3 else "")
            raise ScaffoldError(
                f"{directory} has {len(errors)} config error(s), and init adds a team only to a tree "
                f"that passes `mpigate check` (it reads regions, flavors and cohorts from it): {shown}"
            )
        if team in config.teams:
            raise ScaffoldError(f"team {team!r} already exists ({config.teams[team].source})")
        owner = config.team_for_namespace(namespace)
        if owner is not None:
            raise ScaffoldError(f"namespace {namespace!r} already belongs to team {owner.name!r}")
        region = region or next(iter(config.org.regions))
        if region not in config.org.regions:
            raise ScaffoldError(
                f"region {region!r} is not defined (known: {', '.join(config.org.regions)}); add it "
                f"under spec.regions in {config.org.source.file} and give it a GPU flavor in "
                "spec.flavors of the GPUFlavors file, then run this again"
            )
        in_region = [f.name for f in config.flavors.values() if f.region == region and f.gpus_per_node]
        if flavor is None:
            if not in_region:
                raise ScaffoldError(
                    f"region {region!r} has no GPU flavor, so the team would get no GPU quota; add "
                    f"one to spec.flavors of the GPUFlavors file (e.g. `a100-{region}: {{region: "
                    f"{region}, gpu: nvidia.com/gpu, gpusPerNode: 8}}`), then run this again"
                )
            flavor = in_region[0]
        elif flavor not in in_region:
            raise ScaffoldError(
                f"flavor {flavor!r} is not a GPU flavor of region {region!r}"
                + (f" (known: {', '.join(in_region)})" if in_region else "")
            )
        if gpus is None:
            team_gpus = _gpus_left(config, flavor)
        if cohort is not None and cohort not in config.cohorts:
            raise ScaffoldError(
                f"cohort {cohort!r} is not defined (known: {', '.join(config.cohorts) or 'none'}); add it "
                "to spec.cohorts of the GPUFlavors file"
            )
        chosen_cohort = cohort if cohort is not None else (config.cohorts[0] if config.cohorts else None)
        unknown = [c for c in priority_classes if c not in config.org.priority_classes]
        if unknown:
            raise ScaffoldError(
                f"priority class {unknown[0]!r} is not defined (known: "
                f"{', '.join(config.org.priority_classes)}); add it under spec.priorityClasses in "
                f"{config.org.source.file}"
            )
        classes = list(priority_classes) or list(config.org.priority_classes)[:1]
        personas = [p for p in personas if p in config.personas] or list(config.personas)[:1]
        profile = profile or config.default_network_profile
        if config.org.images.allowed_registries:
            image = f"{config.org.images.allowed_registries[0]}/{team}/train:0.1.0"
    else:
        chosen_cohort = cohort or "shared-pool"
    env = _env()
    context = {
        "team": team,
        "namespace": namespace,
        "region": region,
        "flavor": flavor,
        "gpus": team_gpus,
        "cohort": chosen_cohort,
        "priority_classes": classes,
        "personas": personas,
        "profile": profile or "isolated",
        "image": image,
    }
    targets = {
        "team/quotas.yaml.j2": directory / "quotas" / f"{team}.yaml",
        "team/rbac.yaml.j2": directory / "rbac" / f"{team}.yaml",
        "team/networkpolicies.yaml.j2": directory / "networkpolicies" / f"{team}.yaml",
        "team/trainjob.yaml.j2": directory / "examples" / "trainjobs" / f"hello-{team}.yaml",
        "team/policytest.yaml.j2": directory / "policies" / "tests" / f"{team}.yaml",
    }
    texts = {path: env.get_template(name).render(**context) for name, path in targets.items()}
    for path in texts:
        if path.exists() and not force:
            raise ScaffoldError(f"{path} already exists (use --force to overwrite)")
    # The team's admins approve their own files: CODEOWNERS gains the team's lines (judged with
    # the rest before anything is written).
    codeowners = directory / "CODEOWNERS"
    texts_after = dict(texts)
    if not _fresh and codeowners.is_file():
        before = codeowners.read_text(encoding="utf-8", errors="replace")
        lines = _codeowners_team_lines(env, before, team)
        if lines:
            texts_after = {**texts, codeowners: before.rstrip("\n") + "\n" + lines}
    if not _fresh:
        _check_would_be(directory, texts_after, team)
    written = [_write(path, text, force) for path, text in texts.items()]
    if codeowners in texts_after:
        codeowners.write_text(texts_after[codeowners], encoding="utf-8")
        written.append(codeowners)
    chosen = (
        f"team {team}: namespace {namespace}, region {region}, "
        + (f"{team_gpus} GPUs of {flavor}" if flavor else "no GPU quota")
        + f", cohort {chosen_cohort or 'none'}, priority classes {', '.join(classes) or 'none'}, "
        f"network profile {context['profile']} (change them in {targets['team/quotas.yaml.j2'].name} "
        "and the team's other files, or pass --gpus, --cohort, --priority-class)"
    )
    return Written(tuple(written), chosen)


def _gpus_left(config: Config, flavor: str | None) -> int:
    """One node's GPUs of ``flavor``, or what its capacity has left when that is less."""
    if flavor is None:
        return 0
    spec = config.flavors[flavor]
    wanted = spec.gpus_per_node or 8
    if spec.capacity is None:
        return wanted
    used = {
        name: quota.nominal
        for name, t in config.teams.items()
        for quota in t.gpus.values()
        if quota.flavor == flavor
    }
    left = spec.capacity - sum(used.values())
    if left <= 0:
        teams = ", ".join(f"{name} {n}" for name, n in sorted(used.items()))
        raise ScaffoldError(
            f"flavor {flavor} has no GPU capacity left: its capacity is {spec.capacity} and the teams' "
            f"nominal quotas take {sum(used.values())} ({teams}); raise spec.flavors.{flavor}.capacity in "
            f"{spec_file(config)}, lower a team's quota, or pass --gpus 0 (a team without GPU quota)"
        )
    return min(wanted, left)


def spec_file(config: Config) -> str:
    """The GPUFlavors file of the tree (for messages)."""
    return next((f for f in config.files if "flavor" in Path(f).name), "the GPUFlavors file")


_NOT_COPIED = frozenset({".git", "build", "dist", "deploy", "node_modules", ".venv", "venv"})


def _check_would_be(directory: Path, texts: dict[Path, str], team: str) -> None:
    """Refuse, writing nothing, when ``directory`` with ``texts`` written would fail ``check``."""
    with tempfile.TemporaryDirectory(prefix="mpigate-init-") as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(
            directory,
            copy,
            symlinks=True,
            ignore=lambda _dir, names: [n for n in names if n in _NOT_COPIED],
        )
        for path, text in texts.items():
            target = copy / path.relative_to(directory)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        errors = [p for p in check_tree(copy).problems if p.severity is Severity.ERROR]
    if errors and {p.location.file for p in errors} <= _relative(directory, list(texts)):
        # only the team's own files: the org bounds what a team may say (namespaces, limits, ...)
        raise ScaffoldError(
            f"the org does not allow team {team!r} as asked; nothing was written:\n"
            + "\n".join(f"  {p}" for p in errors)
        )
    if errors:
        raise ScaffoldError(
            f"adding team {team!r} would leave a tree that fails `mpigate check`, so nothing was "
            "written: " + "; ".join(str(p) for p in errors)
        )


def _relative(directory: Path, paths: list[Path]) -> set[str]:
    return {path.relative_to(directory).as_posix() for path in paths}


_CATCH_ALL_OWNER = re.compile(r"^\*\s+@([^/\s]+)/", re.MULTILINE)


def _codeowners_team_lines(env: jinja2.Environment, text: str, team: str) -> str:
    """CODEOWNERS lines that let ``team``'s admins approve its own files, for the org named by the
    catch-all line (``* @acme/platform``); nothing when there is none or the team has its lines."""
    found = _CATCH_ALL_OWNER.search(text)
    if found is None or f"/quotas/{team}.yaml " in text:
        return ""
    return env.get_template("team/codeowners.j2").render(org=found.group(1), team=team)


def _copy_folders(directory: Path, folders: tuple[str, ...], force: bool) -> Written:
    sources = [
        (path, directory / folder / path.relative_to(data_path(folder)))
        for folder in folders
        for path in sorted(data_path(folder).rglob("*"))
        if path.is_file()
    ]
    clashes = [target for _, target in sources if target.exists()]
    if clashes and not force:  # refuse before writing anything
        raise ScaffoldError(f"{clashes[0]} already exists (use --force to overwrite)")
    for source, target in sources:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return Written(tuple(target for _, target in sources))


def copy_example(directory: Path, *, force: bool = False) -> Written:
    """Copy the bundled example org (three teams, runtimes, exceptions, tests, example jobs)."""
    return _copy_folders(directory, EXAMPLE_FOLDERS, force)


def copy_install_base(directory: Path, *, force: bool = False) -> Written:
    """Copy the kustomize install base for the webhook and controller to ``directory/webhooks``
    (`kubectl apply -k DIR/webhooks` with cert-manager, `DIR/webhooks/base` without)."""
    if (directory / MARKER_FILE).is_file():
        raise ScaffoldError(
            f"{directory} is a `mpigate render` output, and the next render removes every file it "
            "did not write: put the install base next to it (e.g. the deploy repository's root)"
        )
    return _copy_folders(directory, ("webhooks",), force)
