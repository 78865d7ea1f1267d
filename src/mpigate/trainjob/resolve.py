"""The effective pod spec of every replicated job of a TrainJob, as Kubeflow Trainer (v2.2+) builds it.

Order of construction (Trainer ``pkg/runtime/core/trainingruntime.go`` and the plugins):

1. the runtime's JobSet template (``spec.template.spec.replicatedJobs``);
2. every ``spec.runtimePatches[]`` entry in list order, strategic-merged into the matching
   replicated job's template (:mod:`mpigate.trainjob.patches`);
3. the MPI plugin (``mlPolicy.mpi``): SSH-auth Secret volume on ``launcher``/``node``, hostfile
   ConfigMap and the reserved ``OMPI_MCA_*`` env on the launcher's ``node`` container
   (:mod:`mpigate.trainjob.mpi`);
   With ``mlPolicy.flux``, Trainer's Flux plugin: the ``flux-installer`` init container (its image
   from ``FLUX_VIEW_IMAGE``) and volumes on the ``node`` job (:mod:`mpigate.trainjob.flux`);
4. ``spec.initializer`` into the ``dataset-initializer``/``model-initializer`` containers
   (``STORAGE_URI`` env, user env, ``secretRef`` as envFrom; :mod:`mpigate.trainjob.builder`);
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

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .builder import (
    TrainerFields,
    apply_initializer,
    apply_trainer,
    merge_resources_per_node,
    no_node_container,
    read_trainer,
)
from .flux import apply_flux, flux_view_image
from .jsontypes import is_mapping
from .model import (
    ANCESTOR_LABEL,
    DATASET_INITIALIZER,
    LAUNCHER,
    MODEL_INITIALIZER,
    MPIGATE_MANAGER,
    NODE,
    TRAINER,
    EffectiveJob,
    Layer,
    MLPolicy,
    Problem,
    Resolution,
)
from .mpi import OPENMPI_RESERVED_ENV, apply_mpi, gpu_count
from .patches import JOB_TEMPLATE_SHAPE, apply_runtime_patches
from .paths import Key
from .pods import JOB_TO_POD, container, job_labels, pod_template, private_pod
from .reading import Recorder, integer, listed, mapping
from .runtime import PreparedRuntime, prepare_runtime
from .shapes import checked
from .smp import merge_shared

__all__ = [
    "ANCESTOR_LABEL",
    "LAUNCHER",
    "MPIGATE_MANAGER",
    "NODE",
    "EffectiveJob",
    "Layer",
    "MLPolicy",
    "PreparedRuntime",
    "Problem",
    "Resolution",
    "prepare_runtime",
    "resolve",
    "resolve_runtime",
    "with_last_patch",
]

_INITIALIZERS = ((DATASET_INITIALIZER, "dataset"), (MODEL_INITIALIZER, "model"))


def resolve_runtime(runtime: Mapping[str, Any] | PreparedRuntime, *, root: str = "") -> Resolution:
    """A runtime evaluated on its own (CREATE/UPDATE of a (Cluster)TrainingRuntime): its replicated
    jobs with the MPI plugin's additions; counts from the template (``mlPolicy.numNodes`` for the
    trainer job)."""
    return resolve(None, runtime, root=root)


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
    ml = prepared.ml_policy

    rec = Recorder()
    tj_spec = mapping(trainjob.get("spec")) if trainjob is not None else {}
    trainer = rec.typed(tj_spec.get("trainer"), Mapping, ("spec", "trainer")) or {}
    initializer = rec.typed(tj_spec.get("initializer"), Mapping, ("spec", "initializer")) or {}
    patches = rec.typed(tj_spec.get("runtimePatches"), list, ("spec", "runtimePatches")) or []

    # 2. runtime patches, in list order, each merged copy-on-write over the job's document.
    docs: dict[str, Mapping[str, Any]] = dict(prepared.jobs)
    layers: dict[str, list[Layer]] = {
        name: [layer] for name, layer in zip(prepared.job_names, prepared.layers, strict=True)
    }
    apply_runtime_patches(docs, layers, patches, prepared.name, exclude_managers, rec)

    # Pod counts (after patches: a patch may relabel a job's template metadata).
    ancestors = {n: job_labels(d).get(ANCESTOR_LABEL) for n, d in docs.items()}
    trainer_job = next((n for n, ancestor in ancestors.items() if ancestor == TRAINER), None)
    # Trainer's CRD accepts numNodes 0 (minimum 0, v2.3+); mpigate refuses it with negative and
    # out-of-range values: 0 nodes start no training pods, so it is never what the author meant.
    num_nodes_raw = rec.count(
        trainer.get("numNodes"),
        ("spec", "trainer", "numNodes"),
        " (0 nodes would start no training pods)" if trainer.get("numNodes") == 0 else "",
    )
    counts = _pod_counts(docs, ancestors, ml, num_nodes_raw, trainer_job)
    if num_nodes_raw is not None:
        num_nodes, num_nodes_path = num_nodes_raw, "spec.trainer.numNodes"
    else:
        num_nodes = ml.num_nodes if ml is not None else 1
        num_nodes_path = f"{prepared.root}spec.mlPolicy.numNodes"

    fields = read_trainer(trainer, rec)
    # The CRD: int32, and numProcPerNode >= 1 (CEL) whatever the runtime.
    rec.count(trainer.get("numProcPerNode"), ("spec", "trainer", "numProcPerNode"))
    if ml is not None and ml.mpi:
        _check_mpi(trainer, fields, ml, docs, rec)
    slots = _slots(ml, trainer, fields.resources, docs, ancestors, rec)
    flux = ml is not None and ml.kind == "flux"
    flux_image = ("", False)
    if flux:
        flux_image, fields = _flux(fields, docs, ancestors, bool(trainer))

    # 3-5. resourcesPerNode (newRuntimeInfo), MPI plugin, initializers, trainer (JobSet builder).
    rlan = ml is not None and ml.mpi and ml.run_launcher_as_node
    jobs: list[EffectiveJob] = []
    initializer_seen = {DATASET_INITIALIZER: False, MODEL_INITIALIZER: False}
    reached: set[str] = set()
    for index, (name, doc) in enumerate(docs.items()):
        pod = private_pod(doc)
        ancestor = ancestors[name]
        job_layers = layers[name]
        # Trainer: trainingruntime.go (*TrainingRuntime).newRuntimeInfo — resourcesPerNode into a
        # trainer job (of a runtime with an mlPolicy) and, with runLauncherAsNode, the node job.
        if fields.resources is not None and (
            (ancestor == TRAINER and ml is not None) or (rlan and name == NODE)
        ):
            layer = merge_resources_per_node(pod, fields.resources)
            if layer is not None:
                job_layers.append(layer)
                reached.add("resourcesPerNode")
        if ml is not None and ml.mpi and name in (NODE, LAUNCHER):
            mpi_layer = apply_mpi(pod, prepared.mpi[name], slots or 1, job_layers[0].root)
            job_layers.append(mpi_layer)
        if flux and name == NODE:
            job_layers.extend(apply_flux(pod, *flux_image, job_layers[0].root))
        for init_kind, init_key in _INITIALIZERS:
            if ancestor == init_kind and container(pod, init_kind) is not None:
                initializer_seen[init_kind] = True
                source = initializer.get(init_key)
                if source is not None:
                    layer = apply_initializer(pod, init_kind, init_key, source, rec)
                    if layer is not None:
                        job_layers.append(layer)
        # Trainer: jobset/builder.go (*Builder).Trainer — image, command and args into every job
        # labelled trainer, env also into the node job with runLauncherAsNode.
        sets_image = ancestor == TRAINER
        sets_env = sets_image or (rlan and name == NODE)
        if fields.any_container_field and (sets_image or sets_env):
            layer = apply_trainer(pod, fields, image=sets_image, env=sets_env)
            if layer is not None:
                job_layers.append(layer)
                reached.update(("image", "command", "args", "env") if sets_image else ("env",))
        reps, count = counts[name]
        jobs.append(EffectiveJob(name, ancestor, reps, count, pod, tuple(job_layers), index))

    _unreached(initializer, initializer_seen, rec, prepared.name)
    if trainjob is None:
        _trainer_jobs_without_node(docs, ancestors, rec)
    elif trainer:
        _trainer_unreached(fields, reached, docs, ancestors, ml, rlan, prepared.name, rec)

    return Resolution(
        runtime_kind=prepared.kind,
        runtime_name=prepared.name,
        ml_policy=ml,
        num_nodes=num_nodes,
        num_nodes_path=num_nodes_path,
        jobs=tuple(jobs),
        slots=slots,
        problems=(*prepared.problems, *rec.problems),
        trainer_job=trainer_job,
    )


# What a last runtime patch may set for :func:`with_last_patch` to merge it after Trainer's plugins:
# fields no plugin reads or writes (the MPI and Flux plugins, the initializers and spec.trainer write
# env, volumes, volumeMounts, resources, image, command, args and init containers; pod counts read
# the job template's labels, which the pod template's labels are not).
_LATE_METADATA_KEYS = frozenset({"labels"})
_LATE_SPEC_KEYS = frozenset({"securityContext", "nodeSelector", "initContainers", "containers"})
_LATE_CONTAINER_KEYS = frozenset({"name", "securityContext"})


def with_last_patch(base: Resolution, trainjob: Mapping[str, Any], manager: str) -> Resolution | None:
    """``resolve(trainjob, runtime)`` computed from ``base``, the same job resolved with
    ``exclude_managers={manager}``: when ``manager``'s entry is the last of ``spec.runtimePatches``
    and sets only pod labels, ``nodeSelector`` and security contexts of containers the runtime has
    — as mpigate's own entry does; ``None`` otherwise (then resolve the job).

    Trainer merges the patches before its plugins run, but no plugin touches those fields, so
    merging the entry into the finished pods gives the same pods and layers (the entry's after the
    other patches) for the cost of the merge instead of a second resolution."""
    patches = mapping(trainjob.get("spec")).get("runtimePatches")
    if not isinstance(patches, list) or not patches:
        return None
    entry = patches[-1]
    if not is_mapping(entry) or entry.get("manager") != manager:
        return None
    if any(is_mapping(p) and p.get("manager") == manager for p in patches[:-1]):
        return None
    runtime_spec = mapping(entry.get("trainingRuntimeSpec"))
    template = mapping(runtime_spec.get("template"))
    jobs_spec = mapping(template.get("spec"))
    rjobs = jobs_spec.get("replicatedJobs")
    if (
        runtime_spec.keys() != {"template"}
        or template.keys() != {"spec"}
        or jobs_spec.keys() != {"replicatedJobs"}
    ):
        return None
    if not isinstance(rjobs, list):
        return None
    by_name = {job.name: job for job in base.jobs}
    pods: dict[str, Mapping[str, Any]] = {}
    for rjob in rjobs:
        if not is_mapping(rjob) or rjob.keys() != {"name", "template"}:
            return None
        name = rjob["name"]
        if not isinstance(name, str) or name not in by_name or name in pods:
            return None
        rec = Recorder()
        if checked(rjob["template"], JOB_TEMPLATE_SHAPE, (), rec) is None or rec.problems:
            return None
        job_template = mapping(rjob["template"])
        if job_template.keys() != {"spec"} or mapping(job_template["spec"]).keys() != {"template"}:
            return None
        pod = mapping(job_template["spec"]["template"])
        if not _late_pod_patch(pod, by_name[name].layers[0].template):
            return None
        pods[name] = pod
    spec_path = ("spec", "runtimePatches", Key("manager", manager), "trainingRuntimeSpec", "template", "spec")
    jobs: list[EffectiveJob] = []
    for job in base.jobs:
        late = pods.get(job.name)
        if late is None:
            jobs.append(job.with_template(job.template, job.layers))
            continue
        layer = Layer(
            "patch", late, (*spec_path, "replicatedJobs", Key("name", job.name), *JOB_TO_POD), "", manager
        )
        cut = next(
            (i for i, lay in enumerate(job.layers) if lay.kind not in ("runtime", "patch")), len(job.layers)
        )
        layers = (*job.layers[:cut], layer, *job.layers[cut:])
        jobs.append(job.with_template(merge_shared(job.template, late), layers))
    return base.with_jobs(tuple(jobs))


def _late_pod_patch(pod: Mapping[str, Any], runtime_pod: Mapping[str, Any]) -> bool:
    """Whether a (well-typed) pod template patch sets only what :func:`with_last_patch` may merge
    late, on containers the runtime's pod has, each once (a patch for another container is dropped
    at the patch stage, with a problem)."""
    if pod.keys() - {"metadata", "spec"} or mapping(pod.get("metadata")).keys() - _LATE_METADATA_KEYS:
        return False
    spec = mapping(pod.get("spec"))
    if spec.keys() - _LATE_SPEC_KEYS:
        return False
    runtime_spec = mapping(runtime_pod.get("spec"))
    for list_field in ("initContainers", "containers"):
        items = spec.get(list_field)
        if items is None:
            continue
        names = [mapping(c).get("name") for c in listed(items)]
        existing = {c.get("name") for c in listed(runtime_spec.get(list_field)) if is_mapping(c)}
        if len(set(names)) != len(names) or not set(names) <= existing:
            return False
        if any(mapping(c).keys() - _LATE_CONTAINER_KEYS for c in listed(items)):
            return False
    return True


def _pod_counts(
    docs: Mapping[str, Mapping[str, Any]],
    ancestors: Mapping[str, Any],
    ml: MLPolicy | None,
    num_nodes: int | None,
    trainer_job: str | None,
) -> dict[str, tuple[int, int]]:
    """``(replicas, parallelism)`` of every replicated job."""
    counts: dict[str, tuple[int, int]] = {}
    for name, doc in docs.items():
        ancestor = ancestors[name]
        parallelism = integer(mapping(mapping(doc.get("template")).get("spec")).get("parallelism"))
        count = parallelism if parallelism is not None and parallelism >= 0 else 1
        replicas = integer(doc.get("replicas"))
        reps = replicas if replicas is not None and replicas >= 0 else 1
        if ancestor in (TRAINER, DATASET_INITIALIZER, MODEL_INITIALIZER):
            reps = 1
        if ancestor == TRAINER and ml is not None:
            count = ml.num_nodes
        counts[name] = (reps, count)
    if num_nodes is not None:
        if ml is not None and ml.mpi:
            if NODE in counts:
                reps, _ = counts[NODE]
                n = max(num_nodes - 1, 1) if ml.run_launcher_as_node else num_nodes
                counts[NODE] = (reps, n)
        elif trainer_job is not None:
            counts[trainer_job] = (1, num_nodes)
    return counts


def _flux(
    fields: TrainerFields,
    docs: Mapping[str, Mapping[str, Any]],
    ancestors: Mapping[str, Any],
    has_trainer: bool,
) -> tuple[tuple[str, bool], TrainerFields]:
    """What Trainer's Flux plugin decides before the pods are built (flux.go
    ``(*Flux).EnforceMLPolicy``): the installer's image (``brokerSettingsFromEnvironment``, from the
    trainer container found by ``FindContainerByPodSetAncestorContainerName``), and the trainer's
    command wrapped by Flux's entrypoint (``getOriginalCommand``; the args go into it)."""
    runtime_node: Mapping[str, Any] = {}
    trainer_job = next((n for n, a in ancestors.items() if a == TRAINER), None)
    if trainer_job is not None:
        runtime_node = container(pod_template(docs[trainer_job]), NODE) or {}
    image = flux_view_image(fields.env, runtime_node.get("env"))
    if not has_trainer:
        return image, fields
    base = fields.command if fields.command is not None else listed(runtime_node.get("command"))
    original = " ".join(str(part) for part in (*base, *(fields.args or ()))).strip()
    entrypoint = ["/bin/bash", "/etc/flux-config/entrypoint.sh", original]
    return image, replace(fields, command=entrypoint, args=None)


def _check_mpi(
    trainer: Mapping[str, Any],
    fields: TrainerFields,
    ml: MLPolicy,
    docs: Mapping[str, Mapping[str, Any]],
    rec: Recorder,
) -> None:
    """What Trainer's MPI plugin rejects (mpi.go ``(*MPI).Validate``): reserved OpenMPI env in
    spec.trainer.env, and numNodes >= 2 with runLauncherAsNode on a runtime without both a
    launcher and a node job."""
    reserved = sorted({str(var.get("name")) for var in fields.env} & set(OPENMPI_RESERVED_ENV))
    if reserved:
        rec.add(
            ("spec", "trainer", "env"),
            f"must not set the MPI plugin's reserved env {', '.join(reserved)}; Trainer rejects it",
        )
    num_nodes = integer(trainer.get("numNodes"))
    if (
        ml.run_launcher_as_node
        and num_nodes is not None
        and num_nodes >= 2
        and not (LAUNCHER in docs and NODE in docs)
    ):
        rec.add(
            ("spec", "trainer", "numNodes"),
            "must be 1: the runtime runs the launcher as a node but lacks a launcher or a node job; "
            "Trainer rejects this",
        )


def _slots(
    ml: MLPolicy | None,
    trainer: Mapping[str, Any],
    resources_per_node: Mapping[str, Any] | None,
    docs: Mapping[str, Mapping[str, Any]],
    ancestors: Mapping[str, Any],
    rec: Recorder,
) -> int | None:
    """Slots per MPI host (Trainer: mpi.go ``(*MPI).EnforceMLPolicy``); None for other policies."""
    if ml is None or not ml.mpi:
        return None
    nproc = trainer.get("numProcPerNode")
    if nproc is not None:
        return parsed if (parsed := integer(nproc)) is not None and parsed >= 1 else ml.num_proc_per_node
    slots = ml.num_proc_per_node
    if slots == 1:
        # The TrainJob's resourcesPerNode when it has one, else the runtime's
        # (runtime.go ExtractResourcePerNodeFromRuntime), counted by GetNumGPUPerNode.
        resources = resources_per_node
        if resources is None:
            resources = _runtime_resources_per_node(docs, ancestors)
        gpus = gpu_count(resources)
        if gpus > 1:
            slots = gpus
    return slots


def _runtime_resources_per_node(
    docs: Mapping[str, Mapping[str, Any]], ancestors: Mapping[str, Any]
) -> Mapping[str, Any]:
    """Trainer's ``ExtractResourcePerNodeFromRuntime``: the resources of the first container named
    ``node`` that has any, in the first job named ``node`` or labelled trainer that has one."""
    for name, doc in docs.items():
        if name != NODE and ancestors[name] != TRAINER:
            continue
        spec = mapping(pod_template(doc).get("spec"))
        items = spec.get("containers")
        for item in items if isinstance(items, list) else ():
            if is_mapping(item) and item.get("name") == NODE and item.get("resources") is not None:
                return mapping(item.get("resources"))
    return {}


def _unreached(
    initializer: Mapping[str, Any], initializer_seen: Mapping[str, bool], rec: Recorder, runtime_name: str
) -> None:
    """Initializers the TrainJob configures but the runtime does not run (Trainer rejects them:
    jobset.go ``(*JobSet).Validate``)."""
    for init_kind, init_key in _INITIALIZERS:
        if initializer.get(init_key) is not None and not initializer_seen[init_kind]:
            rec.add(
                ("spec", "initializer", init_key),
                f"runtime {runtime_name} has no {init_kind} job with a {init_kind} container; "
                "Trainer rejects a TrainJob that configures it",
            )


def _trainer_unreached(
    fields: TrainerFields,
    reached: set[str],
    docs: Mapping[str, Mapping[str, Any]],
    ancestors: Mapping[str, Any],
    ml: MLPolicy | None,
    rlan: bool,
    runtime_name: str,
    rec: Recorder,
) -> None:
    """A warning for each spec.trainer field that reaches no container: Trainer accepts the
    TrainJob and silently ignores the field, so the pods (and their demand) are the runtime's."""
    trainer_jobs = [n for n, a in ancestors.items() if a == TRAINER]
    if not trainer_jobs and not (rlan and NODE in docs):
        if docs:
            rec.problems.append(
                Problem(
                    ("spec", "trainer"),
                    f"runtime {runtime_name} has no job labelled trainer, so spec.trainer reaches no pod",
                    advisory=True,
                )
            )
        return
    given = {
        "image": fields.image is not None,
        "command": fields.command is not None,
        "args": fields.args is not None,
        "env": bool(fields.env),
        "resourcesPerNode": fields.resources is not None,
    }
    for key, is_given in given.items():
        if not is_given or key in reached:
            continue
        via_node_job = key in ("env", "resourcesPerNode") and rlan and NODE in docs
        targets = trainer_jobs + ([NODE] if via_node_job and NODE not in trainer_jobs else [])
        if not targets:
            why = f"runtime {runtime_name} has no job labelled trainer"
        elif key == "resourcesPerNode" and ml is None:
            why = (
                f"runtime {runtime_name} has no mlPolicy, and Trainer applies resourcesPerNode only with one"
            )
        else:
            jobs = "; ".join(no_node_container(n, pod_template(docs[n])) for n in targets)
            why = (
                f"no container named node in runtime {runtime_name}'s {jobs}; Trainer sets spec.trainer "
                "only on containers named node, so the pods keep the runtime's"
            )
        rec.problems.append(
            Problem(
                ("spec", "trainer", key), f"spec.trainer.{key} reaches no container: {why}", advisory=True
            )
        )


def _trainer_jobs_without_node(
    docs: Mapping[str, Mapping[str, Any]], ancestors: Mapping[str, Any], rec: Recorder
) -> None:
    """For a runtime on its own: a job labelled trainer without a container named node, where a
    TrainJob's spec.trainer would reach nothing."""
    for name, doc in docs.items():
        if ancestors[name] != TRAINER:
            continue
        pod = pod_template(doc)
        if not any(
            is_mapping(c) and c.get("name") == NODE
            for c in listed(mapping(pod.get("spec")).get("containers"))
        ):
            rec.problems.append(
                Problem(
                    ("spec", "template", "spec", "replicatedJobs", Key("name", name)),
                    f"replicated job {no_node_container(name, pod)} is labelled trainer but has no "
                    "container named node: a TrainJob's spec.trainer image, command, args, env and "
                    "resourcesPerNode would reach no container (Trainer sets them only on one named node)",
                    advisory=True,
                )
            )
