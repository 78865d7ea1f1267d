"""The effective pod spec of every replicated job of a TrainJob, as Kubeflow Trainer (v2.2+) builds it.

Order of construction (Trainer ``pkg/runtime/core/trainingruntime.go`` and the plugins):

1. the runtime's JobSet template (``spec.template.spec.replicatedJobs``);
2. every ``spec.runtimePatches[]`` entry in list order, strategic-merged into the matching
   replicated job's template (:mod:`mpigate.trainjob.smp`);
3. the MPI plugin (``mlPolicy.mpi``): SSH-auth Secret volume on ``launcher``/``node``, hostfile
   ConfigMap and the reserved ``OMPI_MCA_*`` env on the launcher's ``node`` container;
4. ``spec.initializer`` into the ``dataset-initializer``/``model-initializer`` containers
   (``STORAGE_URI`` env, user env, ``secretRef`` as envFrom);
5. ``spec.trainer``: image/command/args/env/resourcesPerNode into the ``node`` container of the
   replicated job labelled ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``; with
   ``mlPolicy.mpi.runLauncherAsNode`` env and resourcesPerNode also into the ``node`` job's
   ``node`` container.

Pod counts follow Trainer: a replicated job runs ``replicas × parallelism`` pods; the trainer
job's count is ``mlPolicy.numNodes``; for MPI a TrainJob ``numNodes: N`` sets the ``node`` job to
``max(N-1, 1)`` pods with ``runLauncherAsNode`` and ``N`` without it; for other policies the trainer
job gets ``N``. Initializer and trainer jobs always have one replica.

Every layer is kept, so that :meth:`EffectiveJob.origin` can say which document and field a value
of the effective pod came from. Nothing here raises on malformed input: wrong types are recorded
as :class:`Problem` values and treated as absent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from mpigate.config import parse_quantity

from .jsontypes import is_mapping
from .paths import Key, PathPart, format_path, get_path, keyed_path
from .smp import copy_json, merge_shared

log = logging.getLogger(__name__)

__all__ = [
    "ANCESTOR_LABEL",
    "MPIGATE_MANAGER",
    "EffectiveJob",
    "Layer",
    "MLPolicy",
    "PreparedRuntime",
    "Problem",
    "Resolution",
    "prepare_runtime",
    "resolve",
    "resolve_runtime",
]

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER = "trainer"
DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"
NODE = "node"
LAUNCHER = "launcher"
MPIGATE_MANAGER = "mpigate.io/admission"
RESERVED_ENV_CONTAINERS = frozenset({NODE, DATASET_INITIALIZER, MODEL_INITIALIZER})

# Trainer's MPI plugin constants (pkg/constants): volume names, hostfile location and the env it
# reserves on the launcher.
MPI_SSH_AUTH_VOLUME = "mpi-ssh-auth"
MPI_HOSTFILE_VOLUME = "mpi-hostfile"
MPI_HOSTFILE_DIR = "/etc/mpi"
OPENMPI_RESERVED_ENV = (
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots",
    "OMPI_MCA_plm_rsh_args",
)

LayerKind = Literal["runtime", "patch", "mpi", "initializer", "trainer"]


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
        if self.kind == "mpi":
            return f"{self.root}spec.mlPolicy.mpi (Trainer sets {format_path(keyed)})"
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


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if is_mapping(value) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Recorder:
    def __init__(self, in_runtime: bool = False) -> None:
        self.problems: list[Problem] = []
        self.in_runtime = in_runtime

    def typed(self, value: Any, expected: type | tuple[type, ...], path: tuple[PathPart, ...]) -> Any:
        """``value`` when it has the expected type (or is absent), else record and return None."""
        if value is None:
            return None
        ok = isinstance(value, expected) and not (isinstance(value, bool) and expected in (int, (int,)))
        if ok:
            return value
        names = {dict: "an object", list: "a list", str: "a string", int: "an integer", bool: "a boolean"}
        want = names.get(expected, str(expected)) if isinstance(expected, type) else "a valid value"
        self.problems.append(
            Problem(path, f"expected {want}, got {_type_name(value)}", True, self.in_runtime)
        )
        return None

    def add(self, path: tuple[PathPart, ...], message: str) -> None:
        self.problems.append(Problem(path, message, False, self.in_runtime))


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if is_mapping(value):
        return "object"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return f'string "{value[:40]}"'
    if value is None:
        return "null"
    return type(value).__name__


def parse_ml_policy(runtime_spec: Mapping[str, Any], rec: _Recorder) -> MLPolicy | None:
    """``spec.mlPolicy`` of a runtime with Trainer's API defaults."""
    raw = rec.typed(runtime_spec.get("mlPolicy"), Mapping, ("spec", "mlPolicy"))
    if raw is None:
        return None
    num_nodes = rec.typed(raw.get("numNodes"), int, ("spec", "mlPolicy", "numNodes"))
    mpi = raw.get("mpi")
    kind = next((k for k in ("mpi", "torch", "jax", "xgboost", "flux", "plainml") if k in raw), None)
    if is_mapping(mpi):
        base = ("spec", "mlPolicy", "mpi")
        nproc = rec.typed(mpi.get("numProcPerNode"), int, (*base, "numProcPerNode"))
        impl = rec.typed(mpi.get("mpiImplementation"), str, (*base, "mpiImplementation"))
        ssh = rec.typed(mpi.get("sshAuthMountPath"), str, (*base, "sshAuthMountPath"))
        rlan = rec.typed(mpi.get("runLauncherAsNode"), bool, (*base, "runLauncherAsNode"))
        return MLPolicy(
            num_nodes=num_nodes if num_nodes is not None else 1,
            kind="mpi",
            mpi=True,
            run_launcher_as_node=bool(rlan),
            num_proc_per_node=nproc if nproc is not None else 1,
            mpi_implementation=impl or "OpenMPI",
            ssh_auth_mount_path=ssh or "/root/.ssh",
        )
    return MLPolicy(
        num_nodes=num_nodes if num_nodes is not None else 1,
        kind=kind,
        mpi=False,
        run_launcher_as_node=False,
        num_proc_per_node=1,
        mpi_implementation="",
        ssh_auth_mount_path="",
    )


_JOB_TO_POD: tuple[PathPart, ...] = ("template", "spec", "template")


def _runtime_jobs(runtime: Mapping[str, Any], rec: _Recorder) -> list[tuple[str, Mapping[str, Any]]]:
    spec = _mapping(runtime.get("spec"))
    template = rec.typed(spec.get("template"), Mapping, ("spec", "template")) or {}
    tspec = rec.typed(template.get("spec"), Mapping, ("spec", "template", "spec")) or {}
    raw_jobs = rec.typed(
        tspec.get("replicatedJobs"), (list, tuple), ("spec", "template", "spec", "replicatedJobs")
    )
    jobs: list[tuple[str, Mapping[str, Any]]] = []
    for i, raw in enumerate(raw_jobs or []):
        path = ("spec", "template", "spec", "replicatedJobs", i)
        if not is_mapping(raw) or not isinstance(raw.get("name"), str):
            rec.typed(raw, Mapping, path) if not is_mapping(raw) else rec.add(path, "has no name")
            continue
        jobs.append((raw["name"], raw))
    return jobs


def _labels(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_mapping(_mapping(job.get("template")).get("metadata")).get("labels"))


def _pod_template(job: Mapping[str, Any]) -> dict[str, Any]:
    # get_path(job, _JOB_TO_POD) spelled out: called for every job several times per resolution.
    value: Any = job
    for key in ("template", "spec", "template"):
        if type(value) is not dict and not is_mapping(value):
            return {}
        value = value.get(key)
    if type(value) is dict:
        return value
    return dict(value) if is_mapping(value) else {}


def _private_pod(job: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the job's pod template that the Trainer plugins may write into: the pod, its spec,
    the containers list and each container are new; everything below them is shared (the plugins
    only ever replace those values, never modify them)."""
    pod = dict(_pod_template(job))
    spec = pod.get("spec")
    if type(spec) is dict:
        spec = pod["spec"] = dict(spec)
        items = spec.get("containers")
        if type(items) is list:
            spec["containers"] = [dict(c) if type(c) is dict else c for c in items]
    return pod


def _set_pod_template(job: dict[str, Any], pod: dict[str, Any]) -> None:
    template = job.setdefault("template", {})
    if not isinstance(template, dict):
        template = job["template"] = {}
    spec = template.setdefault("spec", {})
    if not isinstance(spec, dict):
        spec = template["spec"] = {}
    spec["template"] = pod


def _container(pod: dict[str, Any], name: str, list_field: str = "containers") -> dict[str, Any] | None:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    for item in _list(spec.get(list_field)):
        if isinstance(item, dict) and item.get("name") == name:
            return item
    return None


def _upserted_env(current: Any, env: Sequence[Mapping[str, Any]]) -> list[Any]:
    """``current`` (a container's env) with ``env`` (entries with string names) set: the first entry
    of the same name replaced, the others appended. The entries are shared, not copied
    (resolutions are read-only)."""
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


def _upsert_env(container: dict[str, Any], env: Sequence[Mapping[str, Any]]) -> None:
    container["env"] = _upserted_env(container.get("env"), env)


def _upserted_named(current: Any, key: str, values: Sequence[Mapping[str, Any]]) -> list[Any]:
    """``current`` and the ``values`` whose (string) ``key`` no entry of it has yet (shared, not
    copied)."""
    items: list[Any] = list(current) if isinstance(current, list) else []
    present = {v.get(key) for v in items if is_mapping(v) and isinstance(v.get(key), str)}
    for value in values:
        if value[key] not in present:
            present.add(value[key])
            items.append(value)
    return items


def _valid_env(raw: Any, path: tuple[PathPart, ...], rec: _Recorder) -> list[Mapping[str, Any]]:
    items = rec.typed(raw, list, path) or []
    out: list[Mapping[str, Any]] = []
    for i, var in enumerate(items):
        if not is_mapping(var) or not isinstance(var.get("name"), str):
            rec.problems.append(Problem((*path, i), "env entries need a string name", True, rec.in_runtime))
            continue
        out.append(var)
    return out


def resolve_runtime(runtime: Mapping[str, Any] | PreparedRuntime, *, root: str = "") -> Resolution:
    """A runtime evaluated on its own (CREATE/UPDATE of a (Cluster)TrainingRuntime): its replicated
    jobs with the MPI plugin's additions; counts from the template (``mlPolicy.numNodes`` for the
    trainer job)."""
    return resolve(None, runtime, root=root)


@dataclass(frozen=True, slots=True)
class PreparedRuntime:
    """What :func:`resolve` reads from a runtime, computed once: a plain (thawed) copy of its
    replicated jobs, its ``mlPolicy`` and its own problems.

    Resolutions built from it *share* the runtime's unchanged subtrees (copy-on-write), so
    everything here is read-only by contract: nothing in mpigate modifies a prepared runtime or
    an effective pod template. The engine keeps one per config runtime (``Config.memo``), which
    makes a TrainJob's resolution cost what its own fields touch, not the runtime's size.
    """

    manifest: Mapping[str, Any]
    kind: str
    name: str
    root: str
    ml_policy: MLPolicy | None
    jobs: tuple[tuple[str, dict[str, Any]], ...]
    problems: tuple[Problem, ...]
    #: The ``runtime`` layer of each job (its pod template), in job order.
    layers: tuple[Layer, ...]
    #: What Trainer's MPI plugin adds to the ``node`` and ``launcher`` jobs (MPI runtimes only).
    mpi: Mapping[str, MPIPlugin] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def job_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.jobs)


def prepare_runtime(runtime: Mapping[str, Any], *, root: str | None = None) -> PreparedRuntime:
    """A runtime manifest (plain or frozen) prepared for :func:`resolve`; ``root`` prefixes its
    paths (default ``"runtime NAME: "``)."""
    thawed = copy_json(runtime) if is_mapping(runtime) else {}
    rec = _Recorder(in_runtime=True)
    meta = _mapping(thawed.get("metadata"))
    name = str(meta.get("name", ""))
    if root is None:
        root = f"runtime {name}: "
    # Once per runtime and config when the engine works as designed; the test counting these
    # records holds on the pure and the compiled build alike (mypyc binds calls at compile time).
    log.debug("preparing runtime %s", name)
    ml = parse_ml_policy(_mapping(thawed.get("spec")), rec)
    jobs = tuple((job_name, dict(job)) for job_name, job in _runtime_jobs(thawed, rec))
    layers = tuple(
        Layer(
            "runtime",
            _pod_template(job),
            ("spec", "template", "spec", "replicatedJobs", Key("name", job_name), *_JOB_TO_POD),
            root,
        )
        for job_name, job in jobs
    )
    mpi: dict[str, MPIPlugin] = {}
    if ml is not None and ml.mpi:
        mpi = {
            job_name: _mpi_plugin(job_name, job, ml, root)
            for job_name, job in jobs
            if job_name in (NODE, LAUNCHER)
        }
    return PreparedRuntime(
        manifest=runtime,
        kind=str(thawed.get("kind", "ClusterTrainingRuntime")),
        name=name,
        root=root,
        ml_policy=ml,
        jobs=jobs,
        problems=tuple(
            Problem(p.field, f"{root}{p.path}: {p.message}", p.malformed, True) for p in rec.problems
        ),
        layers=layers,
        mpi=MappingProxyType(mpi),
    )


def resolve(
    trainjob: Mapping[str, Any] | None,
    runtime: Mapping[str, Any] | PreparedRuntime,
    *,
    root: str | None = None,
    exclude_managers: frozenset[str] = frozenset(),
) -> Resolution:
    """Effective pod templates of ``trainjob`` on ``runtime`` (a runtime manifest, plain or frozen,
    or a :class:`PreparedRuntime` — the effective templates then share its unchanged subtrees).

    ``exclude_managers`` leaves out runtime patches by those managers (mpigate computes its own
    entry from the job without it). ``root`` prefixes runtime paths (default ``"runtime NAME: "``).
    """
    # Neither document is modified. Patches merge copy-on-write (smp.merge_shared) and the Trainer
    # plugins write only into a private copy of each pod's spine (pod, spec, containers), so that
    # the effective templates share every untouched subtree with the prepared runtime and the
    # values that reach them from the TrainJob are copied where they are applied.
    if not isinstance(runtime, PreparedRuntime):
        prepared = prepare_runtime(runtime, root=root)
    elif root is not None and root != runtime.root:
        prepared = prepare_runtime(runtime.manifest, root=root)
    else:
        prepared = runtime
    root = prepared.root
    runtime_name = prepared.name
    runtime_kind = prepared.kind
    ml = prepared.ml_policy
    job_docs = prepared.jobs
    runtime_problems = prepared.problems

    tj_rec = _Recorder()
    tj_spec = _mapping(trainjob.get("spec")) if trainjob is not None else {}
    trainer = tj_rec.typed(tj_spec.get("trainer"), Mapping, ("spec", "trainer")) or {}
    initializer = tj_rec.typed(tj_spec.get("initializer"), Mapping, ("spec", "initializer")) or {}
    patches = tj_rec.typed(tj_spec.get("runtimePatches"), list, ("spec", "runtimePatches")) or []

    names = prepared.job_names
    layers: dict[str, list[Layer]] = {
        name: [layer] for name, layer in zip(names, prepared.layers, strict=True)
    }

    # 2. runtime patches, in list order, each merged copy-on-write over the job's document.
    docs: dict[str, Mapping[str, Any]] = dict(job_docs)
    for index, entry in enumerate(patches):
        base: tuple[PathPart, ...] = ("spec", "runtimePatches", index)
        if not is_mapping(entry):
            tj_rec.typed(entry, Mapping, base)
            continue
        manager = entry.get("manager")
        if not isinstance(manager, str) or not manager:
            tj_rec.add((*base, "manager"), "every runtime patch needs a manager (domain-prefixed path)")
            continue
        if manager in exclude_managers:
            continue
        base = ("spec", "runtimePatches", Key("manager", manager))
        spec_path = (*base, "trainingRuntimeSpec", "template", "spec")
        found, rjobs = get_path(entry, ("trainingRuntimeSpec", "template", "spec", "replicatedJobs"))
        if not found:
            continue
        for rjob in tj_rec.typed(rjobs, list, (*spec_path, "replicatedJobs")) or []:
            if not is_mapping(rjob) or not isinstance(rjob.get("name"), str):
                tj_rec.add((*spec_path, "replicatedJobs"), "each replicated job patch needs a name")
                continue
            job_name = rjob["name"]
            job_path = (*spec_path, "replicatedJobs", Key("name", job_name))
            if job_name not in docs:
                tj_rec.add(
                    job_path,
                    f"runtime {runtime_name} has no replicated job {job_name!r} "
                    f"(it has {', '.join(names) or 'none'}); Trainer rejects this patch",
                )
                continue
            template = rjob.get("template")
            if template is None:
                continue
            if not is_mapping(template):
                tj_rec.typed(template, Mapping, (*job_path, "template"))
                continue
            pod_patch = _pod_template({"template": template})
            current = _pod_template(docs[job_name])
            _check_patch_containers(pod_patch, current, (*job_path, *_JOB_TO_POD), tj_rec)
            template = _without_unknown_containers(template, current)
            docs[job_name] = merge_shared(docs[job_name], {"template": template})
            layers[job_name].append(Layer("patch", pod_patch, (*job_path, *_JOB_TO_POD), "", manager))

    # Pod counts (after patches: a patch may relabel a job's template metadata).
    ancestors = {n: _labels(d).get(ANCESTOR_LABEL) for n, d in docs.items()}
    trainer_job = next((n for n, ancestor in ancestors.items() if ancestor == TRAINER), None)
    num_nodes_raw = tj_rec.typed(trainer.get("numNodes"), int, ("spec", "trainer", "numNodes"))
    counts: dict[str, tuple[int, int]] = {}
    for name, doc in docs.items():
        ancestor = ancestors[name]
        parallelism = _int(_mapping(_mapping(doc.get("template")).get("spec")).get("parallelism"))
        count = parallelism if parallelism is not None and parallelism >= 0 else 1
        replicas = _int(doc.get("replicas"))
        reps = replicas if replicas is not None and replicas >= 0 else 1
        if ancestor in (TRAINER, DATASET_INITIALIZER, MODEL_INITIALIZER):
            reps = 1
        if ancestor == TRAINER and ml is not None:
            count = ml.num_nodes
        counts[name] = (reps, count)
    if num_nodes_raw is not None:
        if ml is not None and ml.mpi:
            if NODE in counts:
                reps, _ = counts[NODE]
                n = max(num_nodes_raw - 1, 1) if ml.run_launcher_as_node else num_nodes_raw
                counts[NODE] = (reps, n)
        elif trainer_job is not None:
            counts[trainer_job] = (1, num_nodes_raw)
    if num_nodes_raw is not None:
        num_nodes, num_nodes_path = num_nodes_raw, "spec.trainer.numNodes"
    else:
        num_nodes = ml.num_nodes if ml is not None else 1
        num_nodes_path = f"{root}spec.mlPolicy.numNodes"

    # Slots per MPI host (Trainer's MPI plugin EnforceMLPolicy).
    slots: int | None = None
    resources_per_node = tj_rec.typed(
        trainer.get("resourcesPerNode"), Mapping, ("spec", "trainer", "resourcesPerNode")
    )
    if ml is not None and ml.mpi:
        nproc = trainer.get("numProcPerNode")
        if nproc is not None:
            parsed = _int(nproc)
            if parsed is None and isinstance(nproc, str) and nproc.isdigit():
                parsed = None  # Trainer: "must have an int value for MPI TrainJob"
            if parsed is None:
                tj_rec.add(
                    ("spec", "trainer", "numProcPerNode"),
                    f"must be an integer for an MPI runtime, got {_type_name(nproc)}",
                )
            slots = parsed if parsed is not None else ml.num_proc_per_node
        else:
            slots = ml.num_proc_per_node
            if slots == 1:
                resources = resources_per_node
                if resources is None and trainer_job is not None:
                    node_c = _container(_pod_template(docs[trainer_job]), NODE)
                    resources = _mapping(node_c.get("resources")) if node_c else {}
                gpus = _gpu_count(_mapping(resources))
                if gpus > 1:
                    slots = gpus

    # 3-5. MPI plugin, initializers, trainer.
    jobs: list[EffectiveJob] = []
    initializer_seen = {DATASET_INITIALIZER: False, MODEL_INITIALIZER: False}
    for index, (name, doc) in enumerate(docs.items()):
        pod = _private_pod(doc)
        ancestor = ancestors[name]
        job_layers = layers[name]
        if ml is not None and ml.mpi and name in (NODE, LAUNCHER):
            mpi_layer = _apply_mpi(pod, prepared.mpi[name], slots or 1, job_layers[0].root)
            job_layers.append(mpi_layer)
        for init_kind, init_key in ((DATASET_INITIALIZER, "dataset"), (MODEL_INITIALIZER, "model")):
            if ancestor == init_kind and _container(pod, init_kind) is not None:
                initializer_seen[init_kind] = True
                source = initializer.get(init_key)
                if source is not None:
                    layer = _apply_initializer(pod, init_kind, init_key, source, tj_rec)
                    if layer is not None:
                        job_layers.append(layer)
        route_full = name == trainer_job
        route_partial = (
            not route_full
            and ml is not None
            and ml.mpi
            and ml.run_launcher_as_node
            and name == NODE
            and trainer_job is not None
        )
        if (route_full or route_partial) and trainer:
            layer = _apply_trainer(pod, trainer, route_full, resources_per_node, tj_rec)
            if layer is not None:
                job_layers.append(layer)
        reps, count = counts[name]
        jobs.append(EffectiveJob(name, ancestor, reps, count, pod, tuple(job_layers), index))

    for init_kind, init_key in ((DATASET_INITIALIZER, "dataset"), (MODEL_INITIALIZER, "model")):
        if initializer.get(init_key) is not None and not initializer_seen[init_kind]:
            tj_rec.add(
                ("spec", "initializer", init_key),
                f"runtime {runtime_name} has no {init_kind} job with a {init_kind} container; "
                "Trainer rejects a TrainJob that configures it",
            )
    if trainer and trainer_job is None and job_docs:
        tj_rec.problems.append(
            Problem(
                ("spec", "trainer"),
                f"runtime {runtime_name} has no job labelled trainer, so spec.trainer reaches no pod",
                advisory=True,
            )
        )

    return Resolution(
        runtime_kind=runtime_kind,
        runtime_name=runtime_name,
        ml_policy=ml,
        num_nodes=num_nodes,
        num_nodes_path=num_nodes_path,
        jobs=tuple(jobs),
        slots=slots,
        problems=(*runtime_problems, *tj_rec.problems),
        trainer_job=trainer_job,
    )


def _check_patch_containers(
    pod_patch: Mapping[str, Any], runtime_pod: Mapping[str, Any], base: tuple[PathPart, ...], rec: _Recorder
) -> None:
    spec = _mapping(pod_patch.get("spec"))
    runtime_spec = _mapping(runtime_pod.get("spec"))
    for list_field in ("initContainers", "containers"):
        items = spec.get(list_field)
        if not isinstance(items, list):  # most patches touch no containers
            continue
        existing = {c.get("name") for c in _list(runtime_spec.get(list_field)) if is_mapping(c)}
        for item in items:
            if not is_mapping(item) or not isinstance(item.get("name"), str):
                continue
            path = (*base, "spec", list_field, Key("name", item["name"]))
            if item["name"] not in existing:
                rec.add(
                    path, f"the runtime's job has no {list_field[:-1]} {item['name']!r}; Trainer rejects this"
                )
            elif item.get("env") and item["name"] in RESERVED_ENV_CONTAINERS:
                rec.add(
                    (*path, "env"),
                    f"Trainer rejects env patches on the {item['name']} container; "
                    "use spec.trainer.env or spec.initializer.*.env",
                )


def _without_unknown_containers(
    template: Mapping[str, Any], runtime_pod: Mapping[str, Any]
) -> Mapping[str, Any]:
    """The patch without containers the job lacks: Trainer rejects those patches, so they never apply
    (merging them would invent image-less containers). Only the path to the pod spec is new."""
    found, pod_spec = get_path(template, ("spec", "template", "spec"))
    if not found or not is_mapping(pod_spec):
        return template
    if not isinstance(pod_spec.get("initContainers"), list) and not isinstance(
        pod_spec.get("containers"), list
    ):
        return template  # nothing to clean (most patches): no copy
    runtime_spec = _mapping(runtime_pod.get("spec"))
    cleaned = dict(pod_spec)
    for list_field in ("initContainers", "containers"):
        items = pod_spec.get(list_field)
        if not isinstance(items, list):
            continue
        existing = {c.get("name") for c in _list(runtime_spec.get(list_field)) if is_mapping(c)}
        cleaned[list_field] = [c for c in items if is_mapping(c) and c.get("name") in existing]
    # get_path found mappings all the way down: rebuild that path around the cleaned spec.
    job_spec = dict(template["spec"])
    pod = dict(job_spec["template"])
    pod["spec"] = cleaned
    job_spec["template"] = pod
    out = dict(template)
    out["spec"] = job_spec
    return out


def _gpu_count(resources: Mapping[str, Any]) -> int:
    """Trainer's ``GetNumGPUPerNode``: GPUs in the limits (``nvidia.com/gpu`` and friends)."""
    for section in ("limits", "requests"):
        values = _mapping(resources.get(section))
        for name, value in values.items():
            if isinstance(name, str) and name.endswith("/gpu"):
                try:
                    return int(parse_quantity(value))
                except (ValueError, TypeError, ZeroDivisionError):
                    return 0
    return 0


@dataclass(frozen=True, slots=True)
class MPIPlugin:
    """What Trainer's MPI plugin adds to one job (``node`` or ``launcher``) of an MPI runtime, built
    once per prepared runtime: everything but the slots value depends only on the runtime.

    The plugin *upserts* into lists of the job's pod (its volumes, the ``node`` container's env and
    volumeMounts). Each ``*_from``/``*_to`` pair is that upsert done once on the runtime's own list:
    when a job's list is still the runtime's object (no runtime patch replaced it — resolutions
    share untouched subtrees), the result is reused instead of recomputed (speed).
    """

    #: The plugin's volumes, the node container's mounts and (launcher) reserved env, whose
    #: slots entry (index 2) is a placeholder.
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    env: list[dict[str, Any]]
    volumes_from: Any
    volumes_to: list[Any]
    mounts_from: Any
    mounts_to: list[Any]
    env_from: Any
    env_to: list[Any]
    #: Where the slots entry sits in ``env_to`` (-1: no env).
    env_slots_index: int
    #: The layer when the pod has no ``node`` container, and (node job) when it has one.
    layer_without_node: Layer
    layer_with_node: Layer | None


def _mpi_plugin(job: str, doc: Mapping[str, Any], ml: MLPolicy, root: str) -> MPIPlugin:
    volumes: list[dict[str, Any]] = [
        {
            "name": MPI_SSH_AUTH_VOLUME,
            "secret": {"secretName": "<trainjob>-mpi-ssh-auth", "defaultMode": 0o640},
        }
    ]
    mounts: list[dict[str, Any]] = [{"name": MPI_SSH_AUTH_VOLUME, "mountPath": ml.ssh_auth_mount_path}]
    env: list[dict[str, Any]] = []
    # Stands for the slots entry in the precomputed env lists; replaced before a list is used.
    slots_placeholder = {"name": OPENMPI_RESERVED_ENV[2], "value": ""}
    if job == LAUNCHER:
        volumes.append({"name": MPI_HOSTFILE_VOLUME, "configMap": {"name": "<trainjob>-mpi-hostfile"}})
        mounts.append({"name": MPI_HOSTFILE_VOLUME, "mountPath": MPI_HOSTFILE_DIR})
        env = [
            {"name": OPENMPI_RESERVED_ENV[0], "value": f"{MPI_HOSTFILE_DIR}/hostfile"},
            {"name": OPENMPI_RESERVED_ENV[1], "value": "true"},
            slots_placeholder,
            {"name": OPENMPI_RESERVED_ENV[3], "value": "-o ConnectionAttempts=10"},
        ]
    pod = _pod_template(doc)
    spec = _mapping(pod.get("spec"))
    node = _container(pod, NODE) or {}
    volumes_from, mounts_from, env_from = spec.get("volumes"), node.get("volumeMounts"), node.get("env")
    env_to = _upserted_env(env_from, env) if env else []
    return MPIPlugin(
        volumes=volumes,
        mounts=mounts,
        env=env,
        volumes_from=volumes_from,
        volumes_to=_upserted_named(volumes_from, "name", volumes),
        mounts_from=mounts_from,
        mounts_to=_upserted_named(mounts_from, "mountPath", mounts),
        env_from=env_from,
        env_to=env_to,
        env_slots_index=next((i for i, var in enumerate(env_to) if var is slots_placeholder), -1),
        layer_without_node=_mpi_layer(volumes, {"name": NODE}, root),
        layer_with_node=None if env else _mpi_layer(volumes, {"name": NODE, "volumeMounts": mounts}, root),
    )


def _mpi_layer(volumes: list[dict[str, Any]], container: dict[str, Any], root: str) -> Layer:
    return Layer("mpi", {"spec": {"volumes": volumes, "containers": [container]}}, (), root)


def _apply_mpi(pod: dict[str, Any], plugin: MPIPlugin, slots: int, root: str) -> Layer:
    """Trainer's MPI plugin: SSH auth Secret volume, hostfile, and the reserved OpenMPI env
    (``plugin``: its parts prepared for the job's runtime)."""
    spec = pod.setdefault("spec", {}) if isinstance(pod.get("spec", {}), dict) else {}
    current = spec.get("volumes")
    spec["volumes"] = (
        plugin.volumes_to
        if current is plugin.volumes_from
        else _upserted_named(current, "name", plugin.volumes)
    )
    node = _container(pod, NODE)
    if node is None:
        return plugin.layer_without_node
    env: list[dict[str, Any]] = []
    if plugin.env:  # launcher: the reserved env first (as Trainer sets it)
        slots_var = {"name": OPENMPI_RESERVED_ENV[2], "value": str(slots)}
        env = list(plugin.env)
        env[2] = slots_var
        current = node.get("env")
        if current is plugin.env_from:
            node_env = list(plugin.env_to)
            node_env[plugin.env_slots_index] = slots_var
        else:
            node_env = _upserted_env(current, env)
        node["env"] = node_env
    current = node.get("volumeMounts")
    node["volumeMounts"] = (
        plugin.mounts_to
        if current is plugin.mounts_from
        else _upserted_named(current, "mountPath", plugin.mounts)
    )
    if plugin.layer_with_node is not None:  # node job: the same layer for every job
        return plugin.layer_with_node
    return _mpi_layer(plugin.volumes, {"name": NODE, "volumeMounts": plugin.mounts, "env": env}, root)


def _apply_initializer(
    pod: dict[str, Any], container_name: str, key: str, source: Any, rec: _Recorder
) -> Layer | None:
    base = ("spec", "initializer", key)
    if not is_mapping(source):
        rec.typed(source, Mapping, base)
        return None
    container = _container(pod, container_name)
    if container is None:  # pragma: no cover - checked by the caller
        return None
    env: list[Mapping[str, Any]] = []
    uri = rec.typed(source.get("storageUri"), str, (*base, "storageUri"))
    if uri is not None:
        env.append({"name": "STORAGE_URI", "value": uri})
    env.extend(_valid_env(source.get("env"), (*base, "env"), rec))
    _upsert_env(container, env)
    contributed: dict[str, Any] = {"name": container_name, "env": [dict(e) for e in env]}
    secret_ref = rec.typed(source.get("secretRef"), Mapping, (*base, "secretRef"))
    if secret_ref is not None:
        env_from = list(container.get("envFrom") or []) if isinstance(container.get("envFrom"), list) else []
        env_from.append({"secretRef": {"name": secret_ref.get("name")}})
        container["envFrom"] = env_from
        contributed["envFrom"] = env_from
    pod_container = ("spec", "containers", Key("name", container_name))
    aliases: tuple[tuple[tuple[PathPart, ...], tuple[PathPart, ...]], ...] = (
        ((*pod_container, "env", Key("name", "STORAGE_URI")), (*base, "storageUri")),
        ((*pod_container, "env"), (*base, "env")),
        ((*pod_container, "envFrom"), (*base, "secretRef")),
        ((*pod_container,), base),
    )
    return Layer("initializer", {"spec": {"containers": [contributed]}}, (), "", aliases=aliases)


def _apply_trainer(
    pod: dict[str, Any],
    trainer: Mapping[str, Any],
    full: bool,
    resources_per_node: Mapping[str, Any] | None,
    rec: _Recorder,
) -> Layer | None:
    container = _container(pod, NODE)
    if container is None:
        return None
    base = ("spec", "trainer")
    contributed: dict[str, Any] = {"name": NODE}
    if full:
        image = rec.typed(trainer.get("image"), str, (*base, "image"))
        if image is not None:
            container["image"] = contributed["image"] = image
        for list_field in ("command", "args"):
            value = rec.typed(trainer.get(list_field), list, (*base, list_field))
            if value is not None:
                container[list_field] = contributed[list_field] = value
    if resources_per_node is not None and (
        resources_per_node.get("limits") is not None or resources_per_node.get("requests") is not None
    ):
        resources = {k: resources_per_node[k] for k in ("limits", "requests") if k in resources_per_node}
        container["resources"] = contributed["resources"] = resources
    env = (
        _valid_env(trainer.get("env"), (*base, "env"), rec)
        if full
        else _valid_env(trainer.get("env"), (*base, "env"), _Recorder())
    )
    if env:
        _upsert_env(container, env)
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
