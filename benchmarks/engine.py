"""Admission-engine latency per TrainJob: the example org (3 teams) next to a generated 1,000-team
org, with a baseline measured in the same run.

The baseline is decoding the AdmissionReview that carries the object (``json.loads``), which the
webhook pays anyway. Every example TrainJob is evaluated as a CREATE (mutation + validation on the
mutated object, the webhook's hot path); per example the script prints p50/p99 in microseconds for
both configs, then the overall rate. The configs take turns evaluation by evaluation, so that a
busy machine slows each of them alike. Lookups are prepared at config load, so the 1,000-team column
should match the 3-team one. Goal: p99 ≤ 2 ms per evaluation.

``--custom N`` adds a column: the example org with N CustomRules (issue 22: ten rule shapes of the
cookbook — owner label, runAsUser range, added capabilities, hostPort range, image repositories,
memory limit/request ratio, forbidden env names, replicas, a read-only root filesystem for PHI,
required pod labels — cycled with their own IDs and parameters, half on the job and half on every
effective pod), and prints the difference to the catalogue-only p99 and the cost per rule — and,
in the same run, the same N checks on the same objects (the job, each effective pod) evaluated by
peer engines (the ``bench`` extra): the pure-Python CEL ``cel-python`` (celpy) with the same
expressions, and Gatekeeper's Rego through ``regopy`` (OPA's language; ten Rego policies written
for the same checks, one input per rule and object as Gatekeeper queries a constraint), as the
ratio to mpigate's added time.

The cyclic garbage collector runs as `mpigate serve` sets it up (the loaded configs frozen, a young
generation of 10,000 allocations); ``--gc cpython`` keeps CPython's defaults, under which the
collector's passes (counted per column) land in the tail of whichever configuration allocates
most.

    .venv/bin/python benchmarks/engine.py [--rounds N] [--custom N] [--gc webhook|cpython]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from mpigate.cli.serve_commands import _GC_YOUNG
from mpigate.config import Config, load
from mpigate.policy import AdmissionInput, UserInfo, evaluate

REPO = Path(__file__).resolve().parents[1]
NOW = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)
TEAMS = 1000


def generated_org(target: Path, teams: int) -> Config:
    """The example org plus ``teams - 3`` generated teams (namespaces, quotas, access, networks)."""
    for folder in ("policies", "quotas", "rbac", "networkpolicies", "examples"):
        shutil.copytree(REPO / folder, target / folder)
    for i in range(teams - 3):
        name = f"team-{i:04d}"
        (target / "quotas" / f"{name}.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "mpigate.io/v1alpha1",
                    "kind": "TeamQuota",
                    "metadata": {"name": name},
                    "spec": {
                        "namespaces": [name, f"{name}-dev"],
                        "region": "eu" if i % 2 else "us",
                        "gpus": {("a100-eu" if i % 2 else "h100-us"): {"nominal": 0, "borrowingLimit": 8}},
                        "maxNodesPerJob": 4,
                        "priorityClasses": ["low"],
                        "contact": f"#{name}",
                    },
                }
            ),
            encoding="utf-8",
        )
        (target / "rbac" / f"{name}.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "mpigate.io/v1alpha1",
                    "kind": "TeamAccess",
                    "metadata": {"name": name},
                    "spec": {"team": name, "members": {"data-scientist": {"groups": [f"{name}-scientists"]}}},
                }
            ),
            encoding="utf-8",
        )
    return load(target, revision="bench")


# (target, params, validation expression) of the ten rule shapes --custom cycles through
RULE_SHAPES: list[tuple[str, dict[str, Any], str]] = [
    (
        "TrainJob",
        {"label": "acme.example/owner"},
        "params.label in object.metadata.?labels.orValue({}) || true",
    ),
    (
        "Pod",
        {"min": 0, "max": 65535},
        "object.spec.containers.all(c, !has(c.securityContext) || !has(c.securityContext.runAsUser) || "
        "(c.securityContext.runAsUser >= params.min && c.securityContext.runAsUser <= params.max))",
    ),
    (
        "Pod",
        {"allowed": ["NET_BIND_SERVICE", "IPC_LOCK", "SYS_RESOURCE"]},
        "object.spec.containers.all(c, "
        "c.?securityContext.?capabilities.?add.orValue([]).all(x, x in params.allowed))",
    ),
    (
        "Pod",
        {"min": 40000, "max": 41000},
        "object.spec.containers.all(c, c.?ports.orValue([]).all(p, !has(p.hostPort) || "
        "(p.hostPort >= params.min && p.hostPort <= params.max)))",
    ),
    (
        "Pod",
        {"prefixes": ["registry.acme.internal/", "docker.io/", "nvcr.io/", "ghcr.io/", "quay.io/"]},
        "object.spec.containers.all(c, params.prefixes.exists(p, c.image.startsWith(p)) || true)",
    ),
    (
        "Pod",
        {"ratio": 4.0},
        "object.spec.containers.all(c, !has(c.resources) || !has(c.resources.limits) || "
        "!has(c.resources.requests) || !('memory' in c.resources.limits) || "
        "!('memory' in c.resources.requests) || "
        "quantity(c.resources.limits.memory).asApproximateFloat() <= "
        "params.ratio * quantity(c.resources.requests.memory).asApproximateFloat())",
    ),
    (
        "Pod",
        {"forbidden": ["DEBUG", "LD_PRELOAD"]},
        "object.spec.containers.all(c, c.?env.orValue([]).all(e, !(e.name in params.forbidden)))",
    ),
    ("TrainJob", {"max": 1000}, "object.spec.?trainer.?numNodes.orValue(1) <= params.max"),
    (
        "TrainJob",
        {"classification": "phi"},
        "team == null || team.classification != params.classification || "
        "object.spec.?trainer.?image.orValue('') != ''",
    ),
    ("TrainJob", {"key": "app"}, "size(object.metadata.name) > 0 && params.key != ''"),
]


def with_custom_rules(target: Path, count: int) -> Config:
    """The example org plus ``count`` CustomRules in policies/rules/bench.yaml."""
    for folder in ("policies", "quotas", "rbac", "networkpolicies", "examples"):
        shutil.copytree(REPO / folder, target / folder)
    docs = []
    for i in range(count):
        kind, params, expression = RULE_SHAPES[i % len(RULE_SHAPES)]
        docs.append(
            {
                "apiVersion": "mpigate.io/v1alpha1",
                "kind": "CustomRule",
                "metadata": {"name": f"bench-{i}"},
                "spec": {
                    "id": f"ACME-BENCH-{i}",
                    "title": f"benchmark rule {i}",
                    "match": {"targets": [kind] if kind == "Pod" else ["TrainJob", "MPIJob"]},
                    "params": params,
                    "validations": [{"expression": expression, "message": f"rule {i}"}],
                },
            }
        )
    (target / "policies" / "rules").mkdir()
    (target / "policies" / "rules" / "bench.yaml").write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    return load(target, revision="bench-custom")


# The ten checks of RULE_SHAPES in Rego (rego.v1), for the peer figure: `allow` is the CEL's value.
REGO_SHAPES: list[str] = [
    "allow := true",
    """allow if not bad
bad if {
    some c in input.object.spec.containers
    u := c.securityContext.runAsUser
    out(u)
}
out(u) if u < input.params.min
out(u) if u > input.params.max""",
    """allow if not bad
bad if {
    some c in input.object.spec.containers
    some x in c.securityContext.capabilities.add
    not x in input.params.allowed
}""",
    """allow if not bad
bad if {
    some c in input.object.spec.containers
    some p in c.ports
    out(p.hostPort)
}
out(u) if u < input.params.min
out(u) if u > input.params.max""",
    "allow := true",
    """allow if not bad
bad if {
    some c in input.object.spec.containers
    l := units.parse_bytes(c.resources.limits.memory)
    r := units.parse_bytes(c.resources.requests.memory)
    l > input.params.ratio * r
}""",
    """allow if not bad
bad if {
    some c in input.object.spec.containers
    some e in c.env
    e.name in input.params.forbidden
}""",
    'allow if object.get(input.object.spec, ["trainer", "numNodes"], 1) <= input.params.max',
    """allow if input.team == null
allow if input.team.classification != input.params.classification
allow if object.get(input.object.spec, [\"trainer\", \"image\"], \"\") != \"\"""",
    """allow if {
    count(input.object.metadata.name) > 0
    input.params.key != ""
}""",
]


# The ten checks of RULE_SHAPES for cel-python, which has no optional syntax (`.?`) and no
# quantity library: `has()` chains instead, and `quantity` as a function the benchmark gives it.
CELPY_SHAPES: list[str] = [
    "(has(object.metadata.labels) && params.label in object.metadata.labels) || true",
    RULE_SHAPES[1][2],
    "object.spec.containers.all(c, !has(c.securityContext) || !has(c.securityContext.capabilities) || "
    "!has(c.securityContext.capabilities.add) || "
    "c.securityContext.capabilities.add.all(x, x in params.allowed))",
    "object.spec.containers.all(c, !has(c.ports) || c.ports.all(p, !has(p.hostPort) || "
    "(p.hostPort >= params.min && p.hostPort <= params.max)))",
    RULE_SHAPES[4][2],
    "object.spec.containers.all(c, !has(c.resources) || !has(c.resources.limits) || "
    "!has(c.resources.requests) || !('memory' in c.resources.limits) || "
    "!('memory' in c.resources.requests) || "
    "quantity(c.resources.limits.memory) <= params.ratio * quantity(c.resources.requests.memory))",
    "object.spec.containers.all(c, !has(c.env) || c.env.all(e, !(e.name in params.forbidden)))",
    "!has(object.spec.trainer) || !has(object.spec.trainer.numNodes) || "
    "object.spec.trainer.numNodes <= params.max",
    "team == null || team.classification != params.classification || "
    "(has(object.spec.trainer) && has(object.spec.trainer.image) && object.spec.trainer.image != '')",
    RULE_SHAPES[9][2],
]


def _objects(config: Config, request: AdmissionInput) -> tuple[Any, list[Any]]:
    """The job and its effective pods as the engine's CustomRules read them."""
    from mpigate.config import thaw
    from mpigate.policy.custom import _pod
    from mpigate.trainjob import resolve

    job = request.obj
    name = ((job or {}).get("spec") or {}).get("runtimeRef", {}).get("name", "")
    runtime = config.runtime("ClusterTrainingRuntime", name) or config.runtime(
        "TrainingRuntime", name, request.namespace
    )
    if runtime is None:
        return job, []
    resolution = resolve(job, runtime.manifest)
    return thaw(job), [_pod(j, request.namespace or "") for j in resolution.jobs]


def peer_engines(config: Config, count: int, rounds: int) -> dict[str, float]:
    """µs per request for the ``count`` checks of --custom on every example's job and pods, per
    peer engine (an engine that is not installed is left out)."""
    checks = [RULE_SHAPES[i % len(RULE_SHAPES)] for i in range(count)]
    sources = [CELPY_SHAPES[i % len(CELPY_SHAPES)] for i in range(count)]
    work = [_objects(config, request) for _, request, _ in requests()]
    out: dict[str, float] = {}
    try:
        import celpy
    except ImportError:
        celpy = None
    if celpy is not None:
        from mpigate.config.units import parse_quantity

        env = celpy.Environment()

        def quantity(value: Any) -> Any:
            return celpy.celtypes.DoubleType(float(parse_quantity(str(value))))

        programs = [
            (
                kind,
                env.program(env.compile(source), functions={"quantity": quantity}),
                celpy.json_to_cel(params),
            )
            for (kind, params, _), source in zip(checks, sources, strict=True)
        ]

        def run_celpy() -> None:
            for job, pods in work:
                job_value = celpy.json_to_cel(job)  # converted once per object, shared by the rules
                pod_values = [celpy.json_to_cel(p) for p in pods]
                for kind, program, params in programs:
                    for value in pod_values if kind == "Pod" else [job_value]:
                        program.evaluate({"object": value, "params": params, "team": celpy.json_to_cel(None)})

        out["cel-python"] = statistics.median(timings(run_celpy, max(3, rounds // 40))) / len(work)
    try:
        import regopy
    except ImportError:
        regopy = None
    if regopy is not None:
        interpreter = regopy.Interpreter()
        for i, body in enumerate(REGO_SHAPES):
            interpreter.add_module(
                f"shape{i}", f"package shape{i}\nimport rego.v1\ndefault allow := false\n{body}\n"
            )
        team = {"classification": None}

        def run_rego() -> None:
            for job, pods in work:
                for i, (kind, params, _) in enumerate(checks):
                    for value in pods if kind == "Pod" else [job]:
                        interpreter.set_input_term(
                            json.dumps({"object": value, "params": params, "team": team})
                        )
                        interpreter.query(f"x = data.shape{i % len(REGO_SHAPES)}.allow")

        out["Rego (regopy)"] = statistics.median(timings(run_rego, 1)) / len(work)
    return out


def requests() -> list[tuple[str, AdmissionInput, str]]:
    out = []
    for path in sorted((REPO / "examples" / "trainjobs").glob("*.yaml")):
        obj = yaml.safe_load(path.read_text(encoding="utf-8"))
        meta = obj["metadata"]
        review = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"object": obj}}
        )
        request = AdmissionInput(
            "CREATE", "TrainJob", meta["namespace"], meta["name"], obj, user=UserInfo("bench")
        )
        out.append((path.stem, request, review))
    return out


def timings(fn: Any, rounds: int, cpu: list[float] | None = None) -> list[float]:
    """Wall-clock µs per call; with ``cpu``, also this thread's CPU µs per call (which excludes time
    the process spent preempted by others — on a shared 2-core machine that is most of the tail)."""
    samples = []
    for _ in range(rounds):
        start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
        if cpu is not None:
            cpu.append((time.thread_time_ns() - start_cpu) / 1000)
    return samples


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


_PASSES: dict[int, int] = {"column": -1}  # collector passes per config column being timed


def _count_passes(phase: str, info: dict[str, Any]) -> None:
    column = _PASSES["column"]
    if phase == "stop" and column >= 0:
        _PASSES[column] = _PASSES.get(column, 0) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400, help="evaluations per example and config")
    parser.add_argument(
        "--custom", type=int, default=0, help="also measure the example org with N CustomRules"
    )
    parser.add_argument(
        "--gc",
        choices=("webhook", "cpython"),
        default="webhook",
        help="the cyclic garbage collector as `mpigate serve` runs it (default) or CPython's defaults",
    )
    args = parser.parse_args()
    small = load(REPO, revision="bench")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        large = generated_org(Path(tmp) / "large", TEAMS)
        load_s = time.perf_counter() - started
        custom = with_custom_rules(Path(tmp) / "custom", args.custom) if args.custom else None
    print(
        f"configs: example org {len(small.teams)} teams; generated org {len(large.teams)} teams "
        f"(loaded in {load_s:.1f}s)"
    )
    if args.gc == "webhook":
        # the engine as the webhook runs it (cli/serve_commands.py, started()): what is loaded is
        # frozen out of the collector's passes and the young generation is collected every
        # _GC_YOUNG allocations, not CPython's 700 — under which a configuration that allocates a
        # little more per evaluation (50 CustomRules: the pods cut for CEL) starts a pass in ~2% of
        # its evaluations, 0.1-5 ms each, and its p99 measures the collector, not the engine
        gc.collect()
        gc.freeze()
        gc.set_threshold(_GC_YOUNG, 20, 10)
    print(f"garbage collector: {args.gc} (thresholds {gc.get_threshold()}, {gc.get_freeze_count()} frozen)")
    gc.callbacks.append(_count_passes)
    print(
        f"{'example (CREATE)':<30}{'decode µs':>10}{'3 teams p50':>13}{'p99':>8}"
        f"{'1000 teams p50':>16}{'p99':>8}  outcome"
    )
    all_small: list[float] = []
    all_large: list[float] = []
    all_custom: list[float] = []
    cpu_small: list[float] = []
    cpu_large: list[float] = []
    cpu_custom: list[float] = []
    for name, request, review in requests():
        base = timings(lambda review=review: json.loads(review), args.rounds)
        for _ in range(20):  # warm caches (catalogue, compiled regexes)
            evaluate(small, request, None, NOW)
            evaluate(large, request, None, NOW)
        configs = [small, large] if custom is None else [small, large, custom]
        if custom is not None:
            for _ in range(20):
                evaluate(custom, request, None, NOW)
        # the configs take turns, one evaluation each, so that the machine's load (shared, busy)
        # falls on each of them alike: the difference is the rules', not the neighbours'
        wall: list[list[float]] = [[] for _ in configs]
        cpu: list[list[float]] = [[] for _ in configs]
        for _ in range(args.rounds):
            for i, config in enumerate(configs):
                _PASSES["column"] = i
                wall[i] += timings(
                    lambda config=config, request=request: evaluate(config, request, None, NOW), 1, cpu[i]
                )
                _PASSES["column"] = -1
        s, g = wall[0], wall[1]
        all_small += s
        all_large += g
        cpu_small += cpu[0]
        cpu_large += cpu[1]
        extra = ""
        if custom is not None:
            c = wall[2]
            all_custom += c
            cpu_custom += cpu[2]
            extra = f"  +{args.custom} rules p50 {statistics.median(c):.0f} p99 {pct(c, 0.99):.0f}"
        outcome = evaluate(small, request, None, NOW).outcome
        print(
            f"{name:<30}{statistics.median(base):>10.1f}{statistics.median(s):>13.0f}{pct(s, 0.99):>8.0f}"
            f"{statistics.median(g):>16.0f}{pct(g, 0.99):>8.0f}  {outcome}{extra}"
        )
    rows = [("3 teams", all_small, cpu_small), (f"{TEAMS} teams", all_large, cpu_large)]
    if custom is not None:
        rows.append((f"+{args.custom} rules", all_custom, cpu_custom))
    for label, samples, cpu in rows:
        rate = len(samples) / (sum(samples) / 1e6)
        print(
            f"all examples, {label:<10}: {rate:6.0f} evaluations/s; "
            f"wall p50 {statistics.median(samples):5.0f} µs, "
            f"p99 {pct(samples, 0.99):5.0f} µs; CPU p50 {statistics.median(cpu):5.0f} µs, "
            f"p99 {pct(cpu, 0.99):5.0f} µs (goal p99 ≤ 2000 µs)"
        )
    if custom is not None:
        delta_p99 = pct(all_custom, 0.99) - pct(all_small, 0.99)
        delta_cpu = pct(cpu_custom, 0.99) - pct(cpu_small, 0.99)
        per_rule = (statistics.median(cpu_custom) - statistics.median(cpu_small)) / args.custom
        print(
            f"{args.custom} CustomRules: p99 +{delta_p99:.0f} µs wall, +{delta_cpu:.0f} µs CPU "
            f"(goal ≤ +1000 µs); {per_rule:.1f} µs CPU per rule and evaluation (median)"
        )
        added = statistics.median(all_custom) - statistics.median(all_small)
        for engine, micros in peer_engines(small, args.custom, args.rounds).items():
            print(
                f"the same {args.custom} checks by {engine}: {micros:.0f} µs per request (median), "
                f"{micros / max(added, 1.0):.0f}× mpigate's +{added:.0f} µs"
            )
    passes = ", ".join(f"{label} {_PASSES.get(i, 0)}" for i, (label, _, _) in enumerate(rows))
    print(f"garbage collector passes during the samples: {passes}")
    averages = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average while measuring: {averages} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
