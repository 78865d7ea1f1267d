"""A training runtime as :func:`mpigate.trainjob.resolve` reads it: its ``mlPolicy`` with Trainer's
API defaults, its replicated jobs, prepared once (:class:`PreparedRuntime`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .jsontypes import is_mapping
from .model import LAUNCHER, NODE, Layer, MLPolicy, Problem
from .mpi import MPIPlugin, mpi_plugin
from .paths import Key
from .pods import JOB_TO_POD, pod_template
from .reading import Recorder, mapping
from .shapes import POD_TEMPLATE, checked
from .smp import copy_json

log = logging.getLogger(__name__)

__all__ = ["PreparedRuntime", "parse_ml_policy", "prepare_runtime", "runtime_jobs"]


def parse_ml_policy(runtime_spec: Mapping[str, Any], rec: Recorder) -> MLPolicy | None:
    """``spec.mlPolicy`` of a runtime with Trainer's API defaults."""
    raw = rec.typed(runtime_spec.get("mlPolicy"), Mapping, ("spec", "mlPolicy"))
    if raw is None:
        return None
    num_nodes = rec.typed(raw.get("numNodes"), int, ("spec", "mlPolicy", "numNodes"))
    mpi = raw.get("mpi")
    kind = next((k for k in ("mpi", "torch", "jax", "xgboost", "flux", "plainml") if k in raw), None)
    if is_mapping(mpi):
        base = ("spec", "mlPolicy", "mpi")
        nproc = rec.count(mpi.get("numProcPerNode"), (*base, "numProcPerNode"))
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


def runtime_jobs(runtime: Mapping[str, Any], rec: Recorder) -> list[tuple[str, Mapping[str, Any]]]:
    spec = mapping(runtime.get("spec"))
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
    rec = Recorder(in_runtime=True)
    meta = mapping(thawed.get("metadata"))
    name = str(meta.get("name", ""))
    if root is None:
        root = f"runtime {name}: "
    # Once per runtime and config when the engine works as designed; the test counting these
    # records holds on the pure and the compiled build alike (mypyc binds calls at compile time).
    log.debug("preparing runtime %s", name)
    ml = parse_ml_policy(mapping(thawed.get("spec")), rec)
    jobs = tuple(
        (job_name, _well_typed(job_name, dict(job), rec)) for job_name, job in runtime_jobs(thawed, rec)
    )
    layers = tuple(
        Layer(
            "runtime",
            pod_template(job),
            ("spec", "template", "spec", "replicatedJobs", Key("name", job_name), *JOB_TO_POD),
            root,
        )
        for job_name, job in jobs
    )
    mpi: dict[str, MPIPlugin] = {}
    if ml is not None and ml.mpi:
        mpi = {
            job_name: mpi_plugin(job_name, job, ml, root)
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


def _well_typed(name: str, job: dict[str, Any], rec: Recorder) -> dict[str, Any]:
    """``job`` (a thawed copy) with the malformed parts of its pod template left out and recorded
    (:mod:`mpigate.trainjob.shapes`), so that the rest of the pod is still judged."""
    pod = pod_template(job)
    path = ("spec", "template", "spec", "replicatedJobs", Key("name", name), *JOB_TO_POD)
    cleaned = checked(pod, POD_TEMPLATE, path, rec)
    if cleaned is pod:
        return job
    template = dict(mapping(job.get("template")))
    spec = dict(mapping(template.get("spec")))
    spec["template"] = cleaned if cleaned is not None else {}
    template["spec"] = spec
    job["template"] = template
    return job
