"""``mpigate init``: scaffold a config tree, add a team, or copy the example org."""

from __future__ import annotations

import datetime as dt
import re
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2

from ._resources import data_path
from .config import check_tree, is_config_tree
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
    team_files = add_team(directory, team, region=region, flavor=flavor, force=force, _fresh=True)
    return Written(tuple(written) + team_files.files)


def add_team(
    directory: Path,
    team: str,
    *,
    namespace: str | None = None,
    region: str | None = None,
    flavor: str | None = None,
    profile: str | None = None,
    force: bool = False,
    _fresh: bool = False,
) -> Written:
    """Add quota, access, network and a first TrainJob for ``team`` to an existing tree."""
    _check_name("team", team)
    namespace = namespace or team
    _check_name("namespace", namespace)
    cohort: str | None = None
    priority_classes: list[str] = ["standard"]
    personas = ["data-scientist", "mlops-engineer", "viewer"]
    image = f"{_STARTER_REGISTRY}/{team}/train:0.1.0"
    if not _fresh:
        result = check_tree(directory)
        config = result.config
        if config is None:
            if not is_config_tree(result.problems):
                raise ScaffoldError(f"{directory} has no OrgPolicy; run `mpigate init {directory}` first")
            raise ScaffoldError(
                f"{directory} has config errors; fix them first (`mpigate check {directory}`)"
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
        cohort = config.cohorts[0] if config.cohorts else None
        priority_classes = list(config.org.priority_classes)[:1]
        personas = [p for p in personas if p in config.personas] or list(config.personas)[:1]
        profile = profile or config.default_network_profile
        if config.org.images.allowed_registries:
            image = f"{config.org.images.allowed_registries[0]}/{team}/train:0.1.0"
    else:
        cohort = "shared-pool"
    env = _env()
    context = {
        "team": team,
        "namespace": namespace,
        "region": region,
        "flavor": flavor,
        "cohort": cohort,
        "priority_classes": priority_classes,
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
    previous = {path: path.read_bytes() for path in targets.values() if path.is_file()}
    written = [
        _write(path, env.get_template(name).render(**context), force) for name, path in targets.items()
    ]
    if _fresh:
        return Written(tuple(written))
    codeowners = directory / "CODEOWNERS"
    owners_before = codeowners.read_bytes() if codeowners.is_file() else None
    if owners_before is not None:
        lines = _codeowners_team_lines(env, owners_before.decode("utf-8", "replace"), team)
        if lines:
            codeowners.write_bytes(owners_before.rstrip(b"\n") + b"\n" + lines.encode("utf-8"))
            written.append(codeowners)
    # The org bounds what a team may say (namespaces, quota limits, ...): a team the tree would
    # refuse is not written at all.
    problems = [p for p in check_tree(directory).errors if p.location.file in _relative(directory, written)]
    if problems:
        for path in written:
            if path == codeowners and owners_before is not None:
                path.write_bytes(owners_before)
            elif path in previous:
                path.write_bytes(previous[path])
            else:
                path.unlink()
        raise ScaffoldError(
            f"the org does not allow team {team!r} as asked; nothing was written:\n"
            + "\n".join(f"  {p}" for p in problems)
        )
    return Written(tuple(written))


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
