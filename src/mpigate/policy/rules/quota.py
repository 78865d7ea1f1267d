"""MPG-Q001..Q008: what the team can ever be admitted, node and GPU shapes, queues, priority,
concurrency and live usage."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fractions import Fraction
from types import MappingProxyType

from mpigate.config import Config
from mpigate.config.model import Team
from mpigate.policy.context import PRIORITY_LABEL, QUEUE_LABEL, JobContext, as_int
from mpigate.policy.decision import Demand
from mpigate.policy.demand import is_gpu
from mpigate.policy.findings import Finding
from mpigate.policy.prepared import memoized
from mpigate.policy.shapes import TRAINJOB
from mpigate.trainjob import EffectiveJob, Resolution, pod_resources
from mpigate.trainjob.resolve import NODE

__all__ = ["check_quota", "gpus_for_nodes"]


def _gpu_pods(resolution: Resolution, known: frozenset[str]) -> list[tuple[EffectiveJob, dict[str, int]]]:
    out: list[tuple[EffectiveJob, dict[str, int]]] = []
    for job in resolution.jobs:
        requests = pod_resources(job).requests
        gpus = {
            r: -(-v.numerator // v.denominator)
            for r, v in requests.items()
            if v.numerator > 0 and is_gpu(r, known)  # the sign without Fraction's comparison (speed)
        }
        if gpus:
            out.append((job, gpus))
    return out


def gpus_for_nodes(
    resolution: Resolution, known: frozenset[str], resource: str, nodes: int, *, node_job: str = NODE
) -> int:
    """GPUs of ``resource`` the job would ask with ``nodes`` nodes (Trainer's pod counts for
    ``spec.trainer.numNodes``: MPI ``node`` job ``max(N-1, 1)`` with runLauncherAsNode, else ``N``;
    other policies: the trainer job ``N``. An MPIJob's ``node_job`` is its Worker, ``N-1`` workers
    with runLauncherAsWorker)."""
    ml = resolution.ml_policy
    total = 0
    for job, gpus in _gpu_pods(resolution, known):
        pods = job.pods
        if ml is not None and ml.mpi and job.name == node_job:
            pods = job.replicas * (max(nodes - 1, 1) if ml.run_launcher_as_node else nodes)
        elif (ml is None or not ml.mpi) and job.name == resolution.trainer_job:
            pods = nodes
        total += pods * gpus.get(resource, 0)
    return total


def _breakdown(resolution: Resolution, known: frozenset[str], resource: str) -> str:
    parts = [(job, gpus[resource]) for job, gpus in _gpu_pods(resolution, known) if resource in gpus]
    per_pod = {g for _, g in parts}
    pods = sum(job.pods for job, _ in parts)
    if len(per_pod) == 1:
        (g,) = per_pod
        unit = "GPU" if g == 1 else "GPUs"
        if resolution.ml_policy is not None and pods == resolution.num_nodes:
            return f"{pods} nodes × {g} {unit}"
        detail = ", ".join(f"{job.name} {job.pods}" for job, _ in parts)
        return f"{pods} pods × {g} {unit}: {detail}"
    return " + ".join(f"{job.name} {job.pods} × {g}" for job, g in parts)


def check_quota(ctx: JobContext, demand: Demand | None) -> Iterator[Finding]:
    team = ctx.team
    if team is None:
        return
    config = ctx.config
    resolution = ctx.resolution
    known = ctx.gpu_resources

    # MPG-Q002: numNodes within maxNodesPerJob.
    shape = ctx.shape
    nodes = resolution.num_nodes if resolution else as_int(ctx.trainer.get("numNodes"))
    nodes_path = resolution.num_nodes_path if resolution else shape.nodes
    if nodes is not None and nodes > team.max_nodes_per_job:
        most = _node_setting(ctx, team.max_nodes_per_job)
        yield Finding(
            "MPG-Q002",
            nodes_path,
            f"numNodes {nodes} exceeds {team.name}'s maxNodesPerJob {team.max_nodes_per_job}.",
            f"Set {shape.nodes} to {most} or fewer (more GPUs per node through "
            f"{'resourcesPerNode' if shape is TRAINJOB else shape.per_pod}), or ask {ctx.contact} to raise "
            f"maxNodesPerJob in {ctx.team_file}.",
            f"numNodes {nodes} > maxNodesPerJob {team.max_nodes_per_job}",
        )

    # MPG-Q001: GPU demand within nominal + borrowing over the team's flavors.
    if demand is not None:
        for resource, asked in demand.gpus.items():
            ceiling = config.max_gpus(team.name, resource)
            if asked <= ceiling:
                continue
            flavors = [q for q in team.gpus.values() if config.flavors[q.flavor].gpu_resource == resource]
            if flavors:
                quota = ", ".join(
                    f"nominal {q.nominal} + borrowing {q.borrowing_limit} on {q.flavor}" for q in flavors
                )
                limit = f"{team.name} can use at most {ceiling} ({quota})"
            else:
                offered = sorted({config.flavors[q.flavor].gpu_resource for q in team.gpus.values()})
                offer = ", ".join(offered) or "no GPUs"
                limit = f"{team.name} has no quota for {resource} (its flavors offer {offer})"
            breakdown = _breakdown(resolution, known, resource) if resolution else ""
            fix = f"ask {ctx.contact} to raise {ctx.team_file}."
            if resolution is not None and ceiling > 0:
                fitting = [
                    n
                    for n in range(resolution.num_nodes - 1, 0, -1)
                    if gpus_for_nodes(resolution, known, resource, n, node_job=shape.node_job) <= ceiling
                ]
                if fitting:
                    fix = f"Set {shape.nodes} to {_node_setting(ctx, fitting[0])} or fewer, or " + fix
                else:
                    fix = f"Ask for fewer GPUs per pod in {shape.per_pod}, or " + fix
            else:
                fix = fix[0].upper() + fix[1:]
            yield Finding(
                "MPG-Q001",
                shape.demand,
                f"asks {asked} {resource}{f' ({breakdown})' if breakdown else ''} but {limit}.",
                fix,
                f"asks {asked} {resource}, {team.name} can get at most {ceiling}; the job could "
                "never be admitted",
            )

    # MPG-Q003: GPUs per pod fit a node; requests = limits; whole numbers.
    if resolution is not None:
        yield from _gpu_shape(ctx, resolution)

    # MPG-Q004 (advisory): MPI slots per worker consistent with GPUs per pod.
    if resolution is not None:
        yield from _slots(ctx, resolution)

    # MPG-Q005: queue label names one of the team's LocalQueues.
    queue = ctx.labels.get(QUEUE_LABEL)
    if queue is not None and queue not in team.queues:
        other = f"; {queue} is {queue}'s queue" if queue in config.teams and queue != team.name else ""
        yield Finding(
            "MPG-Q005",
            f'metadata.labels["{QUEUE_LABEL}"]',
            f"queue {queue} is not one of {team.name}'s LocalQueues ({', '.join(team.queues)}){other}.",
            f"Remove the label (mpigate sets {team.default_queue}) or use one of: {', '.join(team.queues)}.",
            f"queue {queue} is not one of {team.name}'s queues",
        )

    # MPG-Q005: created suspended, so that nothing runs before Kueue admits it (mpigate's mutation
    # sets it; a CREATE that reaches validation without it skipped or undid that mutation).
    if ctx.operation == "CREATE" and ctx.spec.get("suspend") is not True:
        yield Finding(
            "MPG-Q005",
            "spec.suspend",
            f"is not true: the job would start before Kueue admits it into {team.name}'s queue, "
            "outside the team's quota and flavors.",
            "Create the TrainJob with spec.suspend: true (mpigate's mutating webhook sets it); Kueue "
            "un-suspends it when its ClusterQueue admits it.",
            "created without spec.suspend: true",
        )

    # MPG-Q006: priority class the team may use.
    priority = ctx.labels.get(PRIORITY_LABEL)
    if priority is not None and priority not in team.priority_classes:
        allowed = ", ".join(team.priority_classes) or "none"
        known_class = priority in config.org.priority_classes
        why = "" if known_class else " (the org defines no such WorkloadPriorityClass)"
        default = team.default_priority_class
        yield Finding(
            "MPG-Q006",
            f'metadata.labels["{PRIORITY_LABEL}"]',
            f"priority class {priority} is not allowed for {team.name}{why}; allowed: {allowed}.",
            f"Remove the label{f' (mpigate sets {default})' if default else ''} or use one of: {allowed}.",
            f"priority class {priority} not allowed for {team.name} (allowed: {allowed})",
        )

    # MPG-Q007: concurrent TrainJobs (live count; CREATE only).
    live = ctx.live
    active = live.active_jobs if live is not None and ctx.operation == "CREATE" else None
    if live is not None and active is not None and active >= team.max_concurrent_jobs:
        yield Finding(
            "MPG-Q007",
            "metadata.namespace",
            f"{team.name} already has {live.active_jobs} active TrainJobs (maxConcurrentJobs "
            f"{team.max_concurrent_jobs}, counted from {live.source}).",
            f"Wait for a job to finish or delete one, or ask {ctx.contact} to raise maxConcurrentJobs "
            f"in {ctx.team_file}.",
            f"{team.name} has {live.active_jobs}/{team.max_concurrent_jobs} active TrainJobs",
        )

    # MPG-Q008 (advisory): does the job fit the free quota right now?
    if ctx.operation == "CREATE" and live is not None and live.gpus_in_use is not None and demand is not None:
        yield from _live_usage(ctx, demand)


def _node_setting(ctx: JobContext, nodes: int) -> int:
    """The value of the job's node-count field that gives ``nodes`` nodes (an MPIJob counts workers:
    one fewer when the launcher runs as a worker)."""
    ml = ctx.resolution.ml_policy if ctx.resolution is not None else None
    if ctx.shape is not TRAINJOB and ml is not None and ml.run_launcher_as_node:
        return max(nodes - 1, 1)
    return nodes


def _gpus_per_node(config: Config, team: Team) -> Mapping[str, tuple[int, str]]:
    """The largest node (GPUs, flavor) of each GPU resource among the team's flavors (depends on
    the config alone: computed once per config and team)."""
    per_node: dict[str, tuple[int, str]] = {}
    for quota in team.gpus.values():
        flavor = config.flavors[quota.flavor]
        if flavor.gpus_per_node > per_node.get(flavor.gpu_resource, (0, ""))[0]:
            per_node[flavor.gpu_resource] = (flavor.gpus_per_node, flavor.name)
    return MappingProxyType(per_node)


def _gpu_shape(ctx: JobContext, resolution: Resolution) -> Iterator[Finding]:
    team = ctx.team
    assert team is not None
    config = ctx.config
    per_node = memoized(
        config, ("policy.quota.gpus_per_node", team.name), lambda: _gpus_per_node(config, team)
    )
    for job in resolution.jobs:
        pod = pod_resources(job)
        for pod_path, problem in pod.invalid:
            plain = [p for p in pod_path if isinstance(p, str | int)]
            yield Finding(
                "MPG-Q003",
                job.origin(plain),
                problem + ".",
                "Write a Kubernetes quantity (8, 500m, 16Gi).",
            )
        for res in pod.containers:
            base = ("spec", res.list_field, res.index, "resources")
            for resource in sorted(set(res.requests) | set(res.limits)):
                if not is_gpu(resource, ctx.gpu_resources):
                    continue
                limit = res.limits.get(resource)
                request = res.explicit_requests.get(resource)
                if limit is None:
                    yield Finding(
                        "MPG-Q003",
                        job.origin((*base, "requests", resource)),
                        f"{resource} is requested without a limit; GPUs need limits (requests "
                        "default to them).",
                        f'Set resourcesPerNode.limits["{resource}"] to the same number.'
                        if ctx.shape is TRAINJOB
                        else f'Set limits["{resource}"] to the same number ({ctx.shape.per_pod}).',
                        f"{resource} requested without a limit",
                    )
                elif request is not None and request != limit:
                    yield Finding(
                        "MPG-Q003",
                        job.origin((*base, "limits", resource)),
                        f"{resource} requests ({_num(request)}) differ from limits ({_num(limit)}); "
                        "GPUs cannot be overcommitted.",
                        "Set requests equal to limits, or set only limits.",
                        f"{resource} requests {_num(request)} != limits {_num(limit)}",
                    )
                value = limit if limit is not None else res.requests.get(resource, Fraction(0))
                where = "limits" if limit is not None else "requests"
                if value.denominator != 1:
                    yield Finding(
                        "MPG-Q003",
                        job.origin((*base, where, resource)),
                        f"{resource} must be a whole number, got {_num(value)}.",
                        "Ask for whole GPUs.",
                        f"{resource} {_num(value)} is not a whole number",
                    )
                biggest = per_node.get(resource)
                if biggest is not None and value > biggest[0]:
                    yield Finding(
                        "MPG-Q003",
                        job.origin((*base, where, resource)),
                        f"{_num(value)} {resource} per pod, but the largest node of {team.name}'s flavors "
                        f"({biggest[1]}) has {biggest[0]}; the pod could never be scheduled.",
                        f"Ask for at most {biggest[0]} per pod and raise {ctx.shape.nodes} instead.",
                        f"{_num(value)} {resource} per pod > {biggest[0]} per node on {biggest[1]}",
                    )


def _num(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))


def _slots(ctx: JobContext, resolution: Resolution) -> Iterator[Finding]:
    ml = resolution.ml_policy
    if ml is None or not ml.mpi or resolution.slots is None:
        return
    shape = ctx.shape
    if shape is not TRAINJOB:
        path = shape.slots
    elif "numProcPerNode" in ctx.trainer:
        path = "spec.trainer.numProcPerNode"
    else:
        path = f"runtime {resolution.runtime_name}: spec.mlPolicy.mpi.numProcPerNode"
    slots = resolution.slots
    node = resolution.job(shape.node_job) or resolution.job(resolution.trainer_job or "")
    if node is None:
        return
    requests = pod_resources(node).requests
    gpus = sum(int(v) for r, v in requests.items() if v.numerator > 0 and is_gpu(r, ctx.gpu_resources))
    if gpus:
        if slots != gpus:
            effect = f"{gpus - slots} GPUs per pod stay idle" if slots < gpus else "ranks share GPUs"
            yield Finding(
                "MPG-Q004",
                path,
                f"{slots} MPI slots per worker but {gpus} GPUs per pod: {effect}.",
                f"Set {shape.slots} to {gpus} (one rank per GPU), or ask for {slots} GPUs per pod.",
                f"{slots} MPI slots per worker but {gpus} GPUs per pod",
            )
    else:
        cpu = requests.get("cpu")
        if cpu is not None and cpu > 0 and slots > cpu:
            yield Finding(
                "MPG-Q004",
                path,
                f"{slots} MPI slots per worker but only {_num(cpu)} CPUs requested per pod: ranks "
                "oversubscribe.",
                f"Request at least {slots} CPUs per pod, or lower {shape.slots}.",
                f"{slots} MPI slots per worker on {_num(cpu)} CPUs",
            )


def _live_usage(ctx: JobContext, demand: Demand) -> Iterator[Finding]:
    team = ctx.team
    live = ctx.live
    assert team is not None and live is not None and live.gpus_in_use is not None
    config = ctx.config
    for resource, asked in demand.gpus.items():
        flavors = [q for q in team.gpus.values() if config.flavors[q.flavor].gpu_resource == resource]
        if not flavors:
            continue
        nominal = live.nominal or {}
        borrowing = live.borrowing or {}
        limit = sum(
            nominal.get(q.flavor, q.nominal) + borrowing.get(q.flavor, q.borrowing_limit) for q in flavors
        )
        used = sum(live.gpus_in_use.get(q.flavor, 0) for q in flavors)
        if asked > limit or used + asked <= limit:
            continue
        wait = used + asked - limit
        names = "/".join(q.flavor for q in flavors)
        yield Finding(
            "MPG-Q008",
            ctx.shape.demand,
            f"{team.name} uses {used}/{limit} GPUs on {names}; this job asks {asked} and will wait for "
            f"{wait} to free (Kueue keeps it queued).",
            "Nothing to do: Kueue admits the job when GPUs free up; ask for fewer GPUs to start sooner.",
            f"{team.name} uses {used}/{limit} GPUs; this job asks {asked} and will wait for {wait} to free",
        )
