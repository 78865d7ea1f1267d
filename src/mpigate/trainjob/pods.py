"""Reading and writing the pod templates of replicated jobs, as Trainer's plugins do: the pod
template of a job, a private copy of its spine to write into, a container by name, and Trainer's
``apply.Upsert*`` helpers (``pkg/apply/apply.go``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .jsontypes import is_mapping
from .paths import PathPart
from .reading import listed, mapping

__all__ = [
    "JOB_TO_POD",
    "container",
    "job_labels",
    "pod_template",
    "private_pod",
    "upsert_env",
    "upserted_env",
    "upserted_named",
]

JOB_TO_POD: tuple[PathPart, ...] = ("template", "spec", "template")


def job_labels(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(mapping(job.get("template")).get("metadata")).get("labels"))


def pod_template(job: Mapping[str, Any]) -> dict[str, Any]:
    # get_path(job, JOB_TO_POD) spelled out: called for every job several times per resolution.
    value: Any = job
    for key in ("template", "spec", "template"):
        if type(value) is not dict and not is_mapping(value):
            return {}
        value = value.get(key)
    if type(value) is dict:
        return value
    return dict(value) if is_mapping(value) else {}


def private_pod(job: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the job's pod template that the Trainer plugins may write into: the pod, its spec,
    the containers list and each container are new; everything below them is shared (the plugins
    only ever replace those values, never modify them)."""
    pod = dict(pod_template(job))
    spec = pod.get("spec")
    if type(spec) is dict:
        spec = pod["spec"] = dict(spec)
        items = spec.get("containers")
        if type(items) is list:
            spec["containers"] = [dict(c) if type(c) is dict else c for c in items]
    return pod


def container(pod: dict[str, Any], name: str, list_field: str = "containers") -> dict[str, Any] | None:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    for item in listed(spec.get(list_field)):
        if isinstance(item, dict) and item.get("name") == name:
            return item
    return None


def upserted_env(current: Any, env: Sequence[Mapping[str, Any]]) -> list[Any]:
    """``current`` (a container's env) with ``env`` (entries with string names) set as Trainer's
    ``apply.UpsertEnvVars`` does: the first entry of the same name replaced, the others appended.
    The entries are shared, not copied (resolutions are read-only)."""
    items: list[Any] = list(current) if isinstance(current, list) else []
    first: dict[str, int] = {}
    for i, existing in enumerate(items):
        if is_mapping(existing):
            name = existing.get("name")
            if isinstance(name, str):
                first.setdefault(name, i)
    for var in env:
        name = var.get("name")
        index = first.get(name) if isinstance(name, str) else None
        if index is not None:
            items[index] = var
        else:
            if isinstance(name, str):
                first[name] = len(items)
            items.append(var)
    return items


def upsert_env(target: dict[str, Any], env: Sequence[Mapping[str, Any]]) -> None:
    """Trainer's ``apply.UpsertEnvVars`` on a container."""
    target["env"] = upserted_env(target.get("env"), env)


def upserted_named(current: Any, key: str, values: Sequence[Mapping[str, Any]]) -> list[Any]:
    """``current`` and the ``values`` whose (string) ``key`` no entry of it has yet (shared, not
    copied)."""
    items: list[Any] = list(current) if isinstance(current, list) else []
    present = {v.get(key) for v in items if is_mapping(v) and isinstance(v.get(key), str)}
    for value in values:
        if value[key] not in present:
            present.add(value[key])
            items.append(value)
    return items
