"""A TrainJob's :class:`~mpigate.policy.decision.Demand` from its effective pods."""

from __future__ import annotations

from collections.abc import Collection
from fractions import Fraction
from typing import Final

from mpigate.config import Config
from mpigate.trainjob import Resolution, format_quantity, pod_resources
from mpigate.trainjob.resolve import LAUNCHER, NODE, EffectiveJob

from .decision import Demand, JobDemand

__all__ = ["WELL_KNOWN_GPUS", "build_demand", "gpu_resources", "is_gpu"]

# Device-plugin resources that are GPUs/accelerators even when no flavor names them.
WELL_KNOWN_GPUS = frozenset(
    {"nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe", "habana.ai/gaudi"}
)


def gpu_resources(config: Config) -> frozenset[str]:
    """GPU resource names: those of the configured flavors plus well-known device plugins."""
    return WELL_KNOWN_GPUS | {f.gpu_resource for f in config.flavors.values()}


def is_gpu(resource: str, known: Collection[str]) -> bool:
    return resource in known or resource.endswith("/gpu")


def _whole(value: Fraction) -> int:
    """``math.ceil(value)`` in integer arithmetic (speed: no Fraction dunder dispatch)."""
    return -(-value.numerator // value.denominator)


def _total(whole: int, rest: Fraction) -> Fraction:
    """``whole + rest``: Fraction's addition only when some quantity was fractional."""
    return Fraction(whole) if rest.numerator == 0 else whole + rest


_ZERO: Final = Fraction(0)


def _images(job: EffectiveJob) -> tuple[str, ...]:
    """The images of a job's containers (init, regular, ephemeral), sorted, without repeats."""
    found = {
        image for _, _, container in job.containers() if isinstance(image := container.get("image"), str)
    }
    return tuple(sorted(found))


def build_demand(resolution: Resolution, known_gpus: Collection[str], region: str | None) -> Demand:
    """Pods, GPUs (by resource), CPU and memory per replicated job and in total."""
    jobs: list[JobDemand] = []
    total_gpus: dict[str, int] = {}
    # Totals kept as an integer while the quantities are whole (the common case) and a Fraction of
    # the rest: one Fraction built at the end instead of two per job (Fraction's constructor and
    # arithmetic are interpreted Python); the sum is exact either way.
    cpu_whole = mem_whole = 0
    cpu_rest = mem_rest = _ZERO
    have_cpu = have_mem = False
    ml = resolution.ml_policy
    for job in resolution.jobs:
        requests = pod_resources(job).requests
        # v.numerator > 0: the sign without Fraction's rich comparison (hot path).
        gpus = {r: _whole(v) for r, v in requests.items() if v.numerator > 0 and is_gpu(r, known_gpus)}
        for resource, count in gpus.items():
            total_gpus[resource] = total_gpus.get(resource, 0) + count * job.pods
        cpu = requests.get("cpu")
        mem = requests.get("memory")
        if cpu is not None:
            if cpu.denominator == 1:
                cpu_whole += cpu.numerator * job.pods
            else:
                cpu_rest = cpu_rest + cpu * job.pods
            have_cpu = True
        if mem is not None:
            if mem.denominator == 1:
                mem_whole += mem.numerator * job.pods
            else:
                mem_rest = mem_rest + mem * job.pods
            have_mem = True
        hosts_ranks = (
            ml is not None
            and ml.mpi
            and (job.name == NODE or (job.name == LAUNCHER and ml.run_launcher_as_node))
        )
        jobs.append(
            JobDemand(
                name=job.name,
                pods=job.pods,
                gpus_per_pod=gpus,
                cpu_per_pod=format_quantity(cpu, "cpu"),
                memory_per_pod=format_quantity(mem, "memory"),
                slots_per_pod=resolution.slots if hosts_ranks else None,
                images=_images(job),
            )
        )
    return Demand(
        pods=sum(j.pods for j in resolution.jobs),
        gpus=dict(sorted(total_gpus.items())),
        cpu=format_quantity(_total(cpu_whole, cpu_rest), "cpu") if have_cpu else None,
        memory=format_quantity(_total(mem_whole, mem_rest), "memory") if have_mem else None,
        jobs=tuple(jobs),
        region=region,
    )
