"""Trainer's JobSet builder (``pkg/runtime/framework/plugins/jobset/builder.go``): the TrainJob's
``spec.initializer`` into the initializer containers (``(*Builder).Initializer``) and
``spec.trainer`` into the trainer's ``node`` container (``(*Builder).Trainer``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .jsontypes import is_mapping
from .model import NODE, Layer
from .paths import Key, PathPart
from .pods import container, upsert_env
from .reading import Recorder, valid_env

__all__ = ["apply_initializer", "apply_trainer"]


def apply_initializer(
    pod: dict[str, Any], container_name: str, key: str, source: Any, rec: Recorder
) -> Layer | None:
    base = ("spec", "initializer", key)
    if not is_mapping(source):
        rec.typed(source, Mapping, base)
        return None
    target = container(pod, container_name)
    if target is None:  # pragma: no cover - checked by the caller
        return None
    env: list[Mapping[str, Any]] = []
    uri = rec.typed(source.get("storageUri"), str, (*base, "storageUri"))
    if uri is not None:
        env.append({"name": "STORAGE_URI", "value": uri})
    env.extend(valid_env(source.get("env"), (*base, "env"), rec))
    upsert_env(target, env)
    contributed: dict[str, Any] = {"name": container_name, "env": [dict(e) for e in env]}
    secret_ref = rec.typed(source.get("secretRef"), Mapping, (*base, "secretRef"))
    if secret_ref is not None:
        env_from = list(target.get("envFrom") or []) if isinstance(target.get("envFrom"), list) else []
        env_from.append({"secretRef": {"name": secret_ref.get("name")}})
        target["envFrom"] = env_from
        contributed["envFrom"] = env_from
    pod_container = ("spec", "containers", Key("name", container_name))
    aliases: tuple[tuple[tuple[PathPart, ...], tuple[PathPart, ...]], ...] = (
        ((*pod_container, "env", Key("name", "STORAGE_URI")), (*base, "storageUri")),
        ((*pod_container, "env"), (*base, "env")),
        ((*pod_container, "envFrom"), (*base, "secretRef")),
        ((*pod_container,), base),
    )
    return Layer("initializer", {"spec": {"containers": [contributed]}}, (), "", aliases=aliases)


def apply_trainer(
    pod: dict[str, Any],
    trainer: Mapping[str, Any],
    full: bool,
    resources_per_node: Mapping[str, Any] | None,
    rec: Recorder,
) -> Layer | None:
    target = container(pod, NODE)
    if target is None:
        return None
    base = ("spec", "trainer")
    contributed: dict[str, Any] = {"name": NODE}
    if full:
        image = rec.typed(trainer.get("image"), str, (*base, "image"))
        if image is not None:
            target["image"] = contributed["image"] = image
        for list_field in ("command", "args"):
            value = rec.typed(trainer.get(list_field), list, (*base, list_field))
            if value is not None:
                target[list_field] = contributed[list_field] = value
    if resources_per_node is not None and (
        resources_per_node.get("limits") is not None or resources_per_node.get("requests") is not None
    ):
        resources = {k: resources_per_node[k] for k in ("limits", "requests") if k in resources_per_node}
        target["resources"] = contributed["resources"] = resources
    env = (
        valid_env(trainer.get("env"), (*base, "env"), rec)
        if full
        else valid_env(trainer.get("env"), (*base, "env"), Recorder())
    )
    if env:
        upsert_env(target, env)
        contributed["env"] = list(env)
    return Layer("trainer", {"spec": {"containers": [contributed]}}, (), "", aliases=_TRAINER_ALIASES)


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
