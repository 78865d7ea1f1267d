"""What a resolution is made of: the effective replicated jobs, the layers their values came from,
the runtime's ``mlPolicy`` and the problems found on the way (:mod:`mpigate.trainjob.resolve`
builds them).

Names follow Trainer's constants (``pkg/constants/constants.go``): the ancestor label that ties a
replicated job to a TrainJob field, the job and container names Trainer looks for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from .jsontypes import is_mapping
from .paths import PathPart, format_path, get_path, keyed_path

__all__ = [
    "ANCESTOR_LABEL",
    "DATASET_INITIALIZER",
    "LAUNCHER",
    "MODEL_INITIALIZER",
    "MPIGATE_MANAGER",
    "NODE",
    "RESERVED_ENV_CONTAINERS",
    "TRAINER",
    "EffectiveJob",
    "Layer",
    "LayerKind",
    "MLPolicy",
    "Problem",
    "Resolution",
]

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER = "trainer"
DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"
NODE = "node"
LAUNCHER = "launcher"
MPIGATE_MANAGER = "mpigate.io/admission"
RESERVED_ENV_CONTAINERS = frozenset({NODE, DATASET_INITIALIZER, MODEL_INITIALIZER})

# ``operator``: what the MPI Operator adds to an MPIJob's pods (trainjob/mpijob.py).
LayerKind = Literal["runtime", "patch", "mpi", "flux", "initializer", "trainer", "operator"]


@dataclass(frozen=True, slots=True)
class Problem:
    """Something in the objects that Trainer or the API server would reject, or that mpigate cannot
    read. ``field`` is the TrainJob (or runtime) path; ``malformed`` marks a wrong type."""

    field: tuple[PathPart, ...]
    message: str
    malformed: bool = False
    in_runtime: bool = False
    #: Trainer accepts it, but it is probably not what the author meant (a note, not an error).
    advisory: bool = False

    @property
    def path(self) -> str:
        return format_path(self.field)


@dataclass(frozen=True, slots=True)
class Layer:
    """One contribution to a replicated job's pod template, and how to name its fields.

    ``template`` is pod-template shaped (``{"metadata": ..., "spec": ...}``). ``prefix`` is where
    that pod template sits in its own document; ``root`` names the document (``"runtime x: "`` or
    ``""`` for the TrainJob). ``aliases`` map a pod path prefix to a differently named field (the
    trainer's ``resources`` is ``spec.trainer.resourcesPerNode``).
    """

    kind: LayerKind
    template: Mapping[str, Any]
    prefix: tuple[PathPart, ...]
    root: str = ""
    manager: str | None = None
    aliases: tuple[tuple[tuple[PathPart, ...], tuple[PathPart, ...]], ...] = ()

    def depth(self, keyed: Sequence[PathPart]) -> int:
        """How many leading parts of ``keyed`` this layer defines."""
        node: Any = self.template
        for depth, part in enumerate(keyed):
            if type(part) is str:
                if not is_mapping(node) or part not in node:
                    return depth
                node = node[part]
                continue
            found, node = get_path(node, (part,))
            if not found:
                return depth
        return len(keyed)

    def display(self, keyed: Sequence[PathPart]) -> str:
        """The user-facing path of ``keyed`` (pod-relative) in this layer's document."""
        if self.kind in ("mpi", "flux"):  # what Trainer's plugin for that mlPolicy adds
            return f"{self.root}spec.mlPolicy.{self.kind} (Trainer sets {format_path(keyed)})"
        if self.kind == "operator":
            return f"{self.root}(the MPI Operator sets {format_path(keyed)})"
        for pod_prefix, target in self.aliases:
            if tuple(keyed[: len(pod_prefix)]) == pod_prefix:
                return self.root + format_path((*target, *keyed[len(pod_prefix) :]))
        if self.aliases:
            return self.root + format_path(self.aliases[0][1][:2])
        return self.root + format_path((*self.prefix, *keyed))


@dataclass(frozen=True, slots=True)
class EffectiveJob:
    """One replicated job after runtime + patches + Trainer routing."""

    name: str
    ancestor: str | None
    replicas: int
    parallelism: int
    template: Mapping[str, Any]
    layers: tuple[Layer, ...]
    index: int
    # Memo of derived values (origins, pod resources): the job is immutable once built, and rules
    # ask for the same facts repeatedly. Per object, so no state outlives a request.
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def pods(self) -> int:
        return self.replicas * self.parallelism

    @property
    def metadata(self) -> Mapping[str, Any]:
        value = self.template.get("metadata")
        return value if is_mapping(value) else {}

    @property
    def spec(self) -> Mapping[str, Any]:
        value = self.template.get("spec")
        return value if is_mapping(value) else {}

    def containers(self) -> tuple[tuple[str, int, Mapping[str, Any]], ...]:
        """``(list field, index, container)`` for init, regular and ephemeral containers."""
        found = self.memo.get("containers")  # most rules walk the containers: list them once
        if found is None:
            out: list[tuple[str, int, Mapping[str, Any]]] = []
            spec = self.spec
            for list_field in ("initContainers", "containers", "ephemeralContainers"):
                items = spec.get(list_field)
                if isinstance(items, list):
                    out.extend((list_field, i, c) for i, c in enumerate(items) if is_mapping(c))
            found = self.memo["containers"] = tuple(out)
        return found

    def env(self) -> tuple[tuple[str, int, int, Mapping[str, Any]], ...]:
        """``(list field, container index, env index, entry)`` for every env entry of every
        container (entries that are not mappings read as ``{}``), in container order."""
        found = self.memo.get("env")  # three rule families walk every env entry: list them once
        if found is None:
            found = self.memo["env"] = tuple(
                (list_field, index, e_index, var if is_mapping(var) else {})
                for list_field, index, container in self.containers()
                if isinstance(items := container.get("env"), list)
                for e_index, var in enumerate(items)
            )
        return found

    def origin(self, pod_path: Sequence[str | int]) -> str:
        """Where the value at ``pod_path`` (relative to the pod template, with list indexes) was set,
        as a user-facing path. For a missing field: where it belongs, in the runtime or patch that
        comes closest to defining it."""
        key = ("origin", tuple(pod_path))
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = self._origin(pod_path)
        return str(found)

    def _origin(self, pod_path: Sequence[str | int]) -> str:
        keyed = keyed_path(self.template, pod_path)
        best: Layer | None = None
        best_depth = -1
        for layer in reversed(self.layers):
            depth = layer.depth(keyed)
            if depth == len(keyed):
                return layer.display(keyed)
            if layer.kind in ("runtime", "patch") and depth > best_depth:
                best, best_depth = layer, depth
        if best is None:  # pragma: no cover - the runtime layer always exists
            return format_path(keyed)
        return best.display(keyed)


@dataclass(frozen=True, slots=True)
class MLPolicy:
    """The runtime's ``spec.mlPolicy`` as Trainer reads it (API defaults applied)."""

    num_nodes: int
    kind: str | None
    mpi: bool
    run_launcher_as_node: bool
    num_proc_per_node: int
    mpi_implementation: str
    ssh_auth_mount_path: str


@dataclass(frozen=True, slots=True)
class Resolution:
    """The effective view of a TrainJob on its runtime."""

    runtime_kind: str
    runtime_name: str
    ml_policy: MLPolicy | None
    num_nodes: int
    num_nodes_path: str
    jobs: tuple[EffectiveJob, ...]
    slots: int | None
    problems: tuple[Problem, ...] = ()
    trainer_job: str | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def job(self, name: str) -> EffectiveJob | None:
        return next((j for j in self.jobs if j.name == name), None)
