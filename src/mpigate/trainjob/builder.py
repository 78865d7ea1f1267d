"""What a TrainJob's own fields do to the pods, step by step as Trainer does it:

* ``spec.trainer.resourcesPerNode`` merged into the ``node`` container's resources per resource key
  (``pkg/runtime/core/trainingruntime.go`` ``(*TrainingRuntime).newRuntimeInfo`` with
  ``pkg/util/trainingruntime`` ``MergeResourceRequirements``);
* ``spec.initializer`` into the initializer containers (``pkg/runtime/framework/plugins/jobset/
  builder.go`` ``(*Builder).Initializer``);
* ``spec.trainer`` image, command, args and env into the trainer's ``node`` containers
  (``(*Builder).Trainer``);
* env entries copied as ``pkg/apply/apply.go`` ``EnvVar`` copies them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .jsontypes import is_mapping
from .model import NODE, Layer, Problem
from .paths import Key, PathPart, format_path
from .pods import container, upsert_env, upserted_env
from .reading import Recorder, valid_env

__all__ = [
    "INITIALIZER_LOCATION_ENV",
    "STORAGE_URI",
    "TrainerFields",
    "apply_initializer",
    "apply_trainer",
    "merge_resources_per_node",
    "read_trainer",
    "trainer_env_var",
]

#: Trainer's ``jobsetplgconsts.InitializerEnvStorageUri``.
STORAGE_URI = "STORAGE_URI"

#: The env of Trainer's initializer images that decides where they read data from
#: (``pkg/initializers``): ``STORAGE_URI`` (``utils.STORAGE_URI_ENV``; the scheme picks the
#: provider), the S3 providers' ``ENDPOINT`` (``types.S3DatasetInitializer``/``S3ModelInitializer``
#: ``endpoint``, read by ``utils.get_config_from_env``), the cache provider's ``METADATA_LOC``
#: (``types.CacheDatasetInitializer.metadata_loc``) and ``HF_ENDPOINT``, the base URL
#: ``huggingface_hub`` (the HuggingFace providers) downloads from. ``get_config_from_env`` reads an
#: empty value as unset.
INITIALIZER_LOCATION_ENV = (STORAGE_URI, "ENDPOINT", "METADATA_LOC", "HF_ENDPOINT")

# apply.EnvVar: which sources of valueFrom Trainer copies, and which of their fields.
_VALUE_FROM: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fieldRef", ("fieldPath",)),
    ("resourceFieldRef", ("containerName", "resource", "divisor")),
    ("configMapKeyRef", ("key", "name", "optional")),
    ("secretKeyRef", ("key", "name", "optional")),
)


def trainer_env_var(var: Mapping[str, Any]) -> Mapping[str, Any]:
    """``var`` (a TrainJob env entry with a string name) as Trainer copies it into the pod
    (``apply.EnvVar``): ``valueFrom`` with only the sources and fields it knows, *or* the value —
    never both (a literal next to ``valueFrom`` is dropped)."""
    value_from = var.get("valueFrom")
    if value_from is None:
        return var
    source: dict[str, Any] = {}
    if is_mapping(value_from):
        for kind, fields in _VALUE_FROM:
            ref = value_from.get(kind)
            if is_mapping(ref):
                source[kind] = {f: ref[f] for f in fields if f in ref}
    return {"name": var["name"], "valueFrom": source}


def _trainer_env(raw: Any, path: tuple[PathPart, ...], rec: Recorder) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for var in valid_env(raw, path, rec):
        value, value_from = var.get("value"), var.get("valueFrom")
        if value is not None and type(value) is not str:
            rec.typed(value, str, (*path, Key("name", var["name"]), "value"))
        if value_from is not None and not is_mapping(value_from):
            rec.typed(value_from, Mapping, (*path, Key("name", var["name"]), "valueFrom"))
        out.append(var if value_from is None else trainer_env_var(var))
    return out


@dataclass(frozen=True, slots=True)
class TrainerFields:
    """``spec.trainer`` as Trainer's builder applies it, read (and type-checked) once."""

    image: str | None = None
    command: list[Any] | None = None
    args: list[Any] | None = None
    env: tuple[Mapping[str, Any], ...] = ()
    resources: Mapping[str, Any] | None = None

    @property
    def any_container_field(self) -> bool:
        return (
            self.image is not None
            or self.command is not None
            or self.args is not None
            or bool(self.env)
            or self.resources is not None
        )


def _string_list(value: Any, path: tuple[PathPart, ...], rec: Recorder) -> list[Any] | None:
    items: list[Any] | None = rec.typed(value, list, path)
    if items is None:
        return None
    bad = next((i for i, item in enumerate(items) if not isinstance(item, str)), None)
    if bad is not None:
        rec.typed(items[bad], str, (*path, bad))
        return None
    return items


def _resources(value: Any, path: tuple[PathPart, ...], rec: Recorder) -> Mapping[str, Any] | None:
    resources = rec.typed(value, Mapping, path)
    if resources is None:
        return None
    ok = True
    for section in ("limits", "requests"):
        if (
            resources.get(section) is not None
            and rec.typed(resources[section], Mapping, (*path, section)) is None
        ):
            ok = False
    claims = resources.get("claims")
    if claims is not None:
        items = rec.typed(claims, list, (*path, "claims"))
        for i, claim in enumerate(items or []):
            if not is_mapping(claim) or not isinstance(claim.get("name"), str):
                rec.malformed((*path, "claims", i), "resource claims need a string name")
        ok = ok and items is not None
    return resources if ok else None


def read_trainer(trainer: Mapping[str, Any], rec: Recorder) -> TrainerFields:
    """The container fields of ``spec.trainer``; wrong types are problems and read as absent."""
    base: tuple[PathPart, ...] = ("spec", "trainer")
    return TrainerFields(
        image=rec.typed(trainer.get("image"), str, (*base, "image")),
        command=_string_list(trainer.get("command"), (*base, "command"), rec),
        args=_string_list(trainer.get("args"), (*base, "args"), rec),
        env=tuple(_trainer_env(trainer.get("env"), (*base, "env"), rec)),
        resources=_resources(trainer.get("resourcesPerNode"), (*base, "resourcesPerNode"), rec),
    )


def _node_containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container named ``node`` (the builder loops over all of them, as Trainer does)."""
    spec = pod.get("spec")
    items = spec.get("containers") if isinstance(spec, dict) else None
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and item.get("name") == NODE:
                yield item


def merged_resources(base: Any, override: Mapping[str, Any]) -> dict[str, Any]:
    """``MergeResourceRequirements(base, override)`` as ``newRuntimeInfo`` uses it: limits and
    requests merged per resource key (the TrainJob's value wins); the result keeps only limits and
    requests (Trainer builds the container's resources from those two, so claims do not survive)."""
    base_map = base if is_mapping(base) else {}
    out: dict[str, Any] = {}
    for section in ("limits", "requests"):
        merged: dict[str, Any] = {}
        current = base_map.get(section)
        if is_mapping(current):
            merged.update(current)
        extra = override.get(section)
        if is_mapping(extra):
            merged.update(extra)
        if merged:
            out[section] = merged
    return out


def merge_resources_per_node(pod: dict[str, Any], resources: Mapping[str, Any]) -> Layer | None:
    """``spec.trainer.resourcesPerNode`` merged into the first container named ``node`` (Trainer:
    ``newRuntimeInfo`` breaks after it); None when the pod has none."""
    target = next(_node_containers(pod), None)
    if target is None:
        return None
    target["resources"] = merged_resources(target.get("resources"), resources)
    contributed = {k: resources[k] for k in ("limits", "requests") if is_mapping(resources.get(k))}
    return Layer(
        "trainer",
        {"spec": {"containers": [{"name": NODE, "resources": contributed}]}},
        (),
        "",
        aliases=_TRAINER_ALIASES,
    )


def apply_trainer(pod: dict[str, Any], fields: TrainerFields, *, image: bool, env: bool) -> Layer | None:
    """``(*Builder).Trainer`` on one pod: ``image`` (a job labelled trainer) sets image, command
    and args, ``env`` (that, or the ``node`` job with runLauncherAsNode) upserts the env, into every
    container named ``node``. None when the pod has none."""
    contributed: dict[str, Any] = {"name": NODE}
    if image:
        for key, value in (("image", fields.image), ("command", fields.command), ("args", fields.args)):
            if value is not None:
                contributed[key] = value
    if env and fields.env:
        contributed["env"] = list(fields.env)
    found = False
    for target in _node_containers(pod):
        found = True
        for key in ("image", "command", "args"):
            if key in contributed:
                target[key] = contributed[key]
        if "env" in contributed:
            upsert_env(target, fields.env)
    if not found:
        return None
    return Layer("trainer", {"spec": {"containers": [contributed]}}, (), "", aliases=_TRAINER_ALIASES)


def apply_initializer(
    pod: dict[str, Any], container_name: str, key: str, source: Any, rec: Recorder
) -> Layer | None:
    """``(*Builder).Initializer`` on one pod: ``STORAGE_URI`` from ``storageUri``, then the
    TrainJob's env (so an env ``STORAGE_URI`` overrides ``storageUri``), then ``secretRef`` as an
    envFrom source, into the container named like the initializer."""
    base: tuple[PathPart, ...] = ("spec", "initializer", key)
    if not is_mapping(source):
        rec.typed(source, Mapping, base)
        return None
    target = container(pod, container_name)
    if target is None:  # pragma: no cover - checked by the caller
        return None
    env: list[Mapping[str, Any]] = []
    uri = rec.typed(source.get("storageUri"), str, (*base, "storageUri"))
    from_storage_uri: Mapping[str, Any] | None = None
    if uri is not None:
        from_storage_uri = {"name": STORAGE_URI, "value": uri}
        env.append(from_storage_uri)
    env.extend(_trainer_env(source.get("env"), (*base, "env"), rec))
    upsert_env(target, env)
    # What the TrainJob contributes, each name once with the entry that won (as UpsertEnvVars
    # leaves it): an env STORAGE_URI replaces the one from storageUri, and is named as such.
    effective = upserted_env([], env)
    contributed: dict[str, Any] = {"name": container_name, "env": effective}
    secret_ref = rec.typed(source.get("secretRef"), Mapping, (*base, "secretRef"))
    if secret_ref is not None:
        current = target.get("envFrom")
        env_from = list(current) if isinstance(current, list) else []
        env_from.append({"secretRef": {"name": secret_ref.get("name")}})
        target["envFrom"] = env_from
        contributed["envFrom"] = env_from
        _unseen_locations(target, secret_ref, base, rec)
    pod_container: tuple[PathPart, ...] = ("spec", "containers", Key("name", container_name))
    aliases: tuple[tuple[tuple[PathPart, ...], tuple[PathPart, ...]], ...] = (
        ((*pod_container, "env"), (*base, "env")),
        ((*pod_container, "envFrom"), (*base, "secretRef")),
        ((*pod_container,), base),
    )
    if from_storage_uri is not None and any(var is from_storage_uri for var in effective):
        aliases = (((*pod_container, "env", Key("name", STORAGE_URI)), (*base, "storageUri")), *aliases)
    return Layer("initializer", {"spec": {"containers": [contributed]}}, (), "", aliases=aliases)


def _unseen_locations(
    target: Mapping[str, Any], secret_ref: Mapping[str, Any], base: tuple[PathPart, ...], rec: Recorder
) -> None:
    """A note when the Secret of ``secretRef`` may set data-location env that the container does
    not set itself (env takes precedence over envFrom): admission cannot see a Secret's values."""
    env = target.get("env")
    named = {var.get("name") for var in env if is_mapping(var)} if isinstance(env, list) else set()
    unseen = [name for name in INITIALIZER_LOCATION_ENV if name not in named]
    if unseen:
        rec.problems.append(
            Problem(
                (*base, "secretRef"),
                f"{format_path(base)}.secretRef: Secret {secret_ref.get('name')} may also set "
                f"{', '.join(unseen)}, which decide where the initializer reads data; mpigate cannot see a "
                f"Secret's values (set them in {format_path(base)}.env, empty for the default, to have "
                "them checked)",
                advisory=True,
            )
        )


def no_node_container(job: str, pod: Mapping[str, Any]) -> str:
    """``launcher (containers: trainer)``: a job whose pod has no container named ``node``."""
    spec = pod.get("spec")
    items = spec.get("containers") if is_mapping(spec) else None
    names = [str(c.get("name")) for c in items if is_mapping(c)] if isinstance(items, list) else []
    return f"{job} (containers: {', '.join(names) or 'none'})"


_Aliases = tuple[tuple[tuple[PathPart, ...], tuple[PathPart, ...]], ...]
_TRAINER_POD_CONTAINER: tuple[PathPart, ...] = ("spec", "containers", Key("name", NODE))
_TRAINER_ALIASES: _Aliases = (
    ((*_TRAINER_POD_CONTAINER, "image"), ("spec", "trainer", "image")),
    ((*_TRAINER_POD_CONTAINER, "command"), ("spec", "trainer", "command")),
    ((*_TRAINER_POD_CONTAINER, "args"), ("spec", "trainer", "args")),
    ((*_TRAINER_POD_CONTAINER, "env"), ("spec", "trainer", "env")),
    ((*_TRAINER_POD_CONTAINER, "resources"), ("spec", "trainer", "resourcesPerNode")),
    ((*_TRAINER_POD_CONTAINER,), ("spec", "trainer")),
)
