"""MPG-Q001..Q008: what Kueue can ever admit for the team, node and GPU shapes, queues, priority,
concurrency and live usage.

MPG-Q001 and MPG-Q008 judge the job's Kueue workload (:mod:`mpigate.policy.workload`) with Kueue's
own arithmetic (:mod:`mpigate.kueue`) on the team's ClusterQueue as mpigate renders it
(:func:`mpigate.config.queueing.queue_view`): every covered resource, one flavor per resource group,
borrowing only as far as the cohort can lend. MPG-Q001 is Kueue's NoFit on an empty cluster (the job
can never be admitted); MPG-Q008 is what stands between the job and admission with the live usage.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from mpigate import kueue
from mpigate.config import Config, parse_quantity
from mpigate.config.model import Team
from mpigate.config.queueing import QueueView, kueue_amount, preemption_summary, queue_view
from mpigate.policy.context import PRIORITY_LABEL, QUEUE_LABEL, JobContext, as_int, as_mapping
from mpigate.policy.decision import Demand
from mpigate.policy.demand import is_gpu
from mpigate.policy.findings import Finding
from mpigate.policy.prepared import memoized
from mpigate.policy.shapes import TRAINJOB
from mpigate.policy.workload import workload_podsets
from mpigate.trainjob import EffectiveJob, Resolution, format_quantity, pod_resources

__all__ = ["check_quota"]


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

    # MPG-Q001: Kueue can ever admit the job into the team's ClusterQueue.
    view = queue_view(config)
    podsets = _podsets(ctx, demand, view)
    if podsets:
        static = kueue.assign(view.tree, team.name, podsets, view.flavors)
        yield from _never_admitted(ctx, view, static, podsets)
    else:
        static = None

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
    suspend_path = ctx.shape.suspend
    suspended: Any = ctx.obj
    for key in suspend_path:
        suspended = as_mapping(suspended).get(key)
    if ctx.operation == "CREATE" and suspended is not True:
        yield Finding(
            "MPG-Q005",
            ".".join(suspend_path),
            f"is not true: the job would start before Kueue admits it into {team.name}'s queue, "
            "outside the team's quota and flavors.",
            f"Create the {ctx.shape.kind} with {'.'.join(suspend_path)}: true (mpigate's mutating webhook "
            "sets it); Kueue un-suspends it when its ClusterQueue admits it.",
            f"created without {'.'.join(suspend_path)}: true",
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

    # MPG-Q007: concurrent jobs, TrainJobs and MPIJobs (live count; CREATE only).
    live = ctx.live
    active = live.active_jobs if live is not None and ctx.operation == "CREATE" else None
    if live is not None and active is not None and active >= team.max_concurrent_jobs:
        yield Finding(
            "MPG-Q007",
            "metadata.namespace",
            f"{team.name} already has {live.active_jobs} active TrainJobs and MPIJobs (maxConcurrentJobs "
            f"{team.max_concurrent_jobs}, counted from {live.source}).",
            f"Wait for a job to finish or delete one, or ask {ctx.contact} to raise maxConcurrentJobs "
            f"in {ctx.team_file}.",
            f"{team.name} has {live.active_jobs}/{team.max_concurrent_jobs} active TrainJobs and MPIJobs",
        )

    # MPG-Q008 (advisory): what stands between the job and admission right now.
    if ctx.operation == "CREATE" and live is not None and static is not None and static.admissible:
        yield from _live_usage(ctx, view, podsets)


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
                elif request is not None and not _same(request, limit):
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
                # value > biggest: in integers (Fraction's comparison with an int is interpreted
                # Python and an ABC check; the denominator is positive).
                if biggest is not None and value.numerator > biggest[0] * value.denominator:
                    yield Finding(
                        "MPG-Q003",
                        job.origin((*base, where, resource)),
                        f"{_num(value)} {resource} per pod, but the largest node of {team.name}'s flavors "
                        f"({biggest[1]}) has {biggest[0]}; the pod could never be scheduled.",
                        f"Ask for at most {biggest[0]} per pod and raise {ctx.shape.nodes} instead.",
                        f"{_num(value)} {resource} per pod > {biggest[0]} per node on {biggest[1]}",
                    )


def _same(a: Fraction, b: Fraction) -> bool:
    """``a == b`` (Fractions are kept in lowest terms), without Fraction's interpreted ``__eq__``."""
    return a.numerator == b.numerator and a.denominator == b.denominator


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
    # int(v) of a positive v is its floor: integer division instead of Fraction's interpreted __int__.
    gpus = sum(
        v.numerator // v.denominator
        for r, v in requests.items()
        if v.numerator > 0 and is_gpu(r, ctx.gpu_resources)
    )
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
        # cpu > 0 and slots > cpu, in integers (see _gpu_shape).
        if cpu is not None and cpu.numerator > 0 and slots * cpu.denominator > cpu.numerator:
            yield Finding(
                "MPG-Q004",
                path,
                f"{slots} MPI slots per worker but only {_num(cpu)} CPUs requested per pod: ranks "
                "oversubscribe.",
                f"Request at least {slots} CPUs per pod, or lower {shape.slots}.",
                f"{slots} MPI slots per worker on {_num(cpu)} CPUs",
            )


def _podsets(ctx: JobContext, demand: Demand | None, view: QueueView) -> tuple[kueue.PodSet, ...]:
    """The job's Kueue pod sets: from its effective pods, or - runtime unknown - the lower bound
    ``numNodes × resourcesPerNode`` of its demand estimate."""
    if ctx.resolution is not None:
        return workload_podsets(ctx.resolution, view.limit_range_defaults, node_job=ctx.shape.node_job)
    if demand is None:
        return ()
    out: list[kueue.PodSet] = []
    for job in demand.jobs:
        requests: dict[str, int] = {r: g * job.pods for r, g in job.gpus_per_pod.items()}
        for resource, text in (("cpu", job.cpu_per_pod), ("memory", job.memory_per_pod)):
            if text is not None:
                requests[resource] = kueue_amount(resource, parse_quantity(text)) * job.pods
        out.append(kueue.PodSet(job.name, job.pods, MappingProxyType(requests)))
    return tuple(out)


def _count(resource: str, amount: int) -> str:
    """A Kueue amount as a quantity: ``8``, ``1500m`` (cpu), ``64Gi`` (memory)."""
    if resource == "cpu":
        return format_quantity(Fraction(amount, 1000), "cpu") or "0"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        return format_quantity(Fraction(amount), resource) or "0"
    return str(amount)


def _amount(resource: str, amount: int) -> str:
    """A Kueue amount with its resource: ``8 nvidia.com/gpu``, ``1500m cpu``, ``3 pods``."""
    if resource == "pods":
        return f"{amount} pod{'s' if amount != 1 else ''}"
    return f"{_count(resource, amount)} {resource}"


def _ceiling(view: QueueView, team: Team, fr: kueue.FlavorResource) -> str:
    """Why ``potentialAvailable`` is what it is, in the TeamQuota's terms."""
    tree = view.tree
    flavor, resource = fr
    quota = tree.queues[team.name].quotas.get(fr, kueue.Quota(0))
    maximum = tree.potential_available(team.name, fr)
    nominal = _count(resource, quota.nominal)
    if team.cohort is None:
        return f"{flavor}: nominal {nominal}, no cohort to borrow from"
    lent = maximum - quota.nominal
    if quota.borrowing_limit == 0:
        return f"{flavor}: nominal {nominal}, no borrowing"
    if quota.borrowing_limit is not None and lent >= quota.borrowing_limit:
        return f"{flavor}: nominal {nominal} + borrowing {_count(resource, quota.borrowing_limit)}"
    limit = ""
    if quota.borrowing_limit:
        limit = f"borrowingLimit {_count(resource, quota.borrowing_limit)}, but "
    if lent <= 0:
        return f"{flavor}: nominal {nominal}; {limit}no other team of cohort {team.cohort} lends {flavor}"
    lendable = _count(resource, lent)
    return f"{flavor}: nominal {nominal}; {limit}cohort {team.cohort} can lend at most {lendable}"


def _shape(ctx: JobContext, podsets: tuple[kueue.PodSet, ...], resource: str) -> str:
    if ctx.resolution is not None and is_gpu(resource, ctx.gpu_resources):
        return _breakdown(ctx.resolution, ctx.gpu_resources, resource)
    parts = [
        f"{ps.name} {ps.count} × {_amount(resource, ps.requests[resource] // ps.count)}"
        for ps in podsets
        if ps.requests.get(resource) and ps.count
    ]
    return " + ".join(parts)


def _fewer_nodes(ctx: JobContext, view: QueueView, team: Team) -> int | None:
    """The largest numNodes below the job's that Kueue could admit, if any."""
    resolution = ctx.resolution
    if resolution is None:
        return None
    for nodes in range(resolution.num_nodes - 1, 0, -1):
        podsets = workload_podsets(resolution, view.limit_range_defaults, nodes, node_job=ctx.shape.node_job)
        if kueue.assign(view.tree, team.name, podsets, view.flavors).admissible:
            return nodes
    return None


def _never_admitted(
    ctx: JobContext, view: QueueView, assignment: kueue.Assignment, podsets: tuple[kueue.PodSet, ...]
) -> Iterator[Finding]:
    team = ctx.team
    assert team is not None
    config = ctx.config
    queue = view.tree.queues[team.name]
    ask = f"ask {ctx.contact} to raise {ctx.team_file}."
    reported: set[tuple[str, ...]] = set()
    unmatched: set[str] = set()
    for failure in assignment.failures:
        if failure.resources in reported:
            continue
        reported.add(failure.resources)
        if failure.uncovered:
            (resource,) = failure.resources
            total = sum(ps.requests.get(resource, 0) for ps in podsets)
            asking = ", ".join(ps.name for ps in podsets if ps.requests.get(resource))
            if is_gpu(resource, ctx.gpu_resources):
                offered = sorted({config.flavors[q.flavor].gpu_resource for q in team.gpus.values()})
                offer = ", ".join(offered) or "no GPUs"
                why = f"{team.name} has no quota for {resource} (its flavors offer {offer})"
                fix = ask[0].upper() + ask[1:]
            else:
                covered = ", ".join(r for g in queue.resource_groups for r in g.covered)
                why = f"{team.name}'s ClusterQueue does not cover {resource} (it covers {covered})"
                fix = (
                    f"Remove the {resource} request from the pods ({ctx.shape.per_pod}, or where the runtime "
                    "or a runtime patch sets it); mpigate's ClusterQueues cover cpu, memory, pods and the "
                    "team's GPU resources."
                )
            yield Finding(
                "MPG-Q001",
                ctx.shape.demand,
                f"asks {_amount(resource, total)} ({asking}) but {why}; Kueue never admits a job that asks "
                "a resource its ClusterQueue does not cover.",
                fix,
                f"asks {resource}, which {team.name}'s ClusterQueue does not cover; never admitted",
            )
            continue
        quota_attempts = [a for a in failure.attempts if a.reason == "quota"]
        if not quota_attempts:
            if failure.podset in unmatched:
                continue
            unmatched.add(failure.podset)
            # Every group the pod set asks for: it is one story (its node selection), told once.
            names = sorted(
                {a.flavor for f in assignment.failures if f.podset == failure.podset for a in f.attempts}
            )
            flavors = "; ".join(
                f"{name}: {', '.join(f'{k}={v}' for k, v in sorted(view.flavors[name].node_labels.items()))}"
                for name in names
                if name in view.flavors
            )
            yield Finding(
                "MPG-Q001",
                ctx.shape.demand,
                f"the {failure.podset} pods select nodes (nodeSelector or required node affinity) that none "
                f"of {team.name}'s flavors has ({flavors}); Kueue would never admit the job.",
                "Remove or correct the node selection of those pods; Kueue places the pods on the flavor's "
                "nodes itself.",
                f"pods select nodes no flavor of {team.name} has; never admitted",
            )
            continue
        first = quota_attempts[0]
        resource = first.resource
        limits = "; ".join(_ceiling(view, team, (a.flavor, a.resource)) for a in quota_attempts)
        most = max(a.maximum for a in quota_attempts)
        shape = _shape(ctx, podsets, resource)
        if ctx.resolution is not None and most > 0:
            nodes = _fewer_nodes(ctx, view, team)
            if nodes is not None:
                fix = f"Set {ctx.shape.nodes} to {_node_setting(ctx, nodes)} or fewer, or " + ask
            else:
                fix = f"Ask for less {resource} per pod in {ctx.shape.per_pod}, or " + ask
        else:
            fix = ask[0].upper() + ask[1:]
        asked = sum(ps.requests.get(resource, 0) for ps in podsets)
        yield Finding(
            "MPG-Q001",
            ctx.shape.demand,
            f"asks {_amount(resource, asked)}{f' ({shape})' if shape else ''} but Kueue can admit at most "
            f"{_count(resource, most)} for {team.name} ({limits}); it would never admit the job.",
            fix,
            f"asks {_amount(resource, asked)}, {team.name} can get at most {_count(resource, most)}; "
            "the job could never be admitted",
        )


def _usage(ctx: JobContext, view: QueueView) -> kueue.Usage | None:
    """The cohort tree's usage from the live context: every ClusterQueue's reservations
    (``LiveContext.queue_usage``) and/or the team's GPUs in use per flavor (``gpus_in_use``)."""
    live = ctx.live
    team = ctx.team
    assert live is not None and team is not None
    per_queue: dict[str, dict[kueue.FlavorResource, int]] = {}
    if live.queue_usage is not None:
        for queue, flavors in live.queue_usage.items():
            per_queue[queue] = {(f, r): v for f, used in flavors.items() for r, v in used.items()}
    if live.gpus_in_use is not None and team.name not in per_queue:
        own: dict[kueue.FlavorResource, int] = {}
        for flavor, used in live.gpus_in_use.items():
            known = ctx.config.flavors.get(flavor)
            if known is not None:
                own[(flavor, known.gpu_resource)] = used
        per_queue[team.name] = own
    if not per_queue:
        return None
    return view.tree.usage(per_queue)


def _live_usage(ctx: JobContext, view: QueueView, podsets: tuple[kueue.PodSet, ...]) -> Iterator[Finding]:
    team = ctx.team
    assert team is not None
    usage = _usage(ctx, view)
    if usage is None:
        return
    now = kueue.assign(view.tree, team.name, podsets, view.flavors, usage)
    # Kueue compares each pod set with what the earlier ones took: the last is the job's total.
    worst: dict[kueue.FlavorResource, kueue.Shortfall] = {}
    for short in now.shortfalls:
        fr = (short.flavor, short.resource)
        if fr not in worst or short.requested > worst[fr].requested:
            worst[fr] = short
    for (flavor, resource), short in worst.items():
        gpus = is_gpu(resource, ctx.gpu_resources)
        what = "GPUs" if gpus else resource
        needed = f"{_count(resource, short.needed)} more free {what}"
        free = _count(resource, short.available)
        asked = _count(resource, short.requested)
        verb = "is" if short.available == 1 and gpus else "are"
        lend = f" and what cohort {team.cohort} can lend" if team.cohort else ""
        yield Finding(
            "MPG-Q008",
            ctx.shape.demand,
            f"{team.name} needs {needed} of flavor {flavor}: the job asks {asked} and {free} {verb} free "
            f"for it now (its own quota{lend}); borrowing, preemption and queue order can change this.",
            "Nothing to do: Kueue keeps the job queued and admits it when quota frees up. "
            + preemption_summary(team.name, ctx.config.kueue.fair_sharing)
            + f" Ask for fewer {what} to start sooner.",
            f"{team.name} needs {needed} of flavor {flavor}; borrowing, preemption and queue order can "
            "change this",
        )
