"""Render a generated config with many teams; print the time to load the config alone (baseline),
the time to render and to write the tree, files and objects written, and peak memory.

    .venv/bin/python benchmarks/render.py [--teams 1000]

Each measurement runs in a fresh interpreter so that peak RSS (ru_maxrss) belongs to it alone.
CPU times are printed too: on a shared machine they vary less than wall-clock times.
Goal: a 1,000-team config renders in under 10 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REGIONS = {"eu": "eu-west-1", "us": "us-east-1", "ap": "ap-southeast-1"}


def generate(root: Path, teams: int) -> None:
    """A config tree like the example org, with ``teams`` teams spread over 3 regions."""
    org = yaml.safe_load((Path(__file__).resolve().parents[1] / "policies" / "org.yaml").read_text())
    org["spec"]["regions"] = {
        r: {"nodeLabels": {"topology.kubernetes.io/region": v}, "dataLocations": [f"s3://acme-{r}-"]}
        for r, v in REGIONS.items()
    }
    org["spec"]["runtimes"] = {"allowed": [{"name": "mpi-openmpi-gpu", "external": True}]}
    org["spec"]["dataClassifications"] = {"public": {}, "internal": {}}
    flavors = {
        f"{gpu}-{r}": {
            "region": r,
            "gpu": "nvidia.com/gpu",
            "gpusPerNode": 8,
            "nodeLabels": {"nvidia.com/gpu.product": gpu.upper()},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        }
        for r in REGIONS
        for gpu in ("a100", "h100")
    }

    def write(rel: str, doc: dict[str, Any]) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")

    write("policies/org.yaml", org)
    write(
        "quotas/flavors.yaml",
        {
            "apiVersion": "mpigate.io/v1alpha1",
            "kind": "GPUFlavors",
            "metadata": {"name": "flavors"},
            "spec": {"flavors": flavors, "cohorts": [f"pool-{r}" for r in REGIONS]},
        },
    )
    regions = list(REGIONS)
    for i in range(teams):
        name, region = f"team-{i:04d}", regions[i % len(regions)]
        namespaces = [name] if i % 3 else [name, f"{name}-dev"]
        write(
            f"quotas/{name}.yaml",
            {
                "apiVersion": "mpigate.io/v1alpha1",
                "kind": "TeamQuota",
                "metadata": {"name": name},
                "spec": {
                    "namespaces": namespaces,
                    "region": region,
                    "cohort": f"pool-{region}",
                    "gpus": {
                        f"a100-{region}": {"nominal": 8, "borrowingLimit": 8},
                        f"h100-{region}": {"nominal": 4},
                    },
                    "cpu": "128",
                    "memory": "1Ti",
                    "maxConcurrentJobs": 4,
                    "maxNodesPerJob": 4,
                    "priorityClasses": ["standard", "low"],
                    "contact": f"#{name}",
                },
            },
        )
        write(
            f"rbac/{name}.yaml",
            {
                "apiVersion": "mpigate.io/v1alpha1",
                "kind": "TeamAccess",
                "metadata": {"name": name},
                "spec": {
                    "team": name,
                    "members": {
                        "data-scientist": {
                            "groups": [f"{name}-scientists"],
                            "users": [f"lead@{name}.example"],
                        },
                        "mlops-engineer": {"serviceAccounts": [f"{name}-pipeline"]},
                        "viewer": {"groups": [f"{name}-viewers"]},
                    },
                },
            },
        )
        write(
            f"networkpolicies/{name}.yaml",
            {
                "apiVersion": "mpigate.io/v1alpha1",
                "kind": "TeamNetwork",
                "metadata": {"name": name},
                "spec": {
                    "team": name,
                    "profile": "isolated",
                    "egress": [{"cidr": f"10.{i // 250}.{i % 250}.0/24", "ports": [443]}],
                },
            },
        )


_CHILD = """
import json, resource, sys, time, datetime as dt
t0, c0 = time.perf_counter(), time.process_time()
from mpigate.config import load
config = load(sys.argv[1], revision="bench", today=dt.date(2026, 11, 22))
t1, c1 = time.perf_counter(), time.process_time()
out = {"teams": len(config.teams), "load": t1 - t0, "load_cpu": c1 - c0}
if sys.argv[2] == "render":
    from mpigate.render import render, write_tree
    rendering = render(config, today=dt.date(2026, 11, 22))
    t2 = time.perf_counter()
    out["render_cpu"] = time.process_time() - c1
    stats = write_tree(rendering, sys.argv[3])
    t3 = time.perf_counter()
    out.update(render=t2 - t1, write=t3 - t2, files=len(stats.written), objects=len(rendering.objects))
    out["bytes"] = sum(len(t.encode()) for t in rendering.files.values())
    out["warnings"] = list(rendering.warnings)
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def _run(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mpigate-bench-") as tmp:
        tree, out = Path(tmp) / "org", Path(tmp) / "deploy"
        started = time.perf_counter()
        generate(tree, args.teams)
        files = sum(1 for _ in tree.rglob("*.yaml"))
        print(f"generated {args.teams} teams ({files} config files) in {time.perf_counter() - started:.1f} s")
        baseline = _run(str(tree), "load")
        full = _run(str(tree), "render", str(out))
    print(f"{'':28}{'load only (baseline)':>22}{'load + render + write':>24}")
    print(f"{'load config':28}{baseline['load']:>20.2f} s{full['load']:>22.2f} s")
    print(f"{'  CPU time of load':28}{baseline['load_cpu']:>20.2f} s{full['load_cpu']:>22.2f} s")
    print(f"{'render (templates, YAML)':28}{'':>22}{full['render']:>22.2f} s")
    print(f"{'  CPU time of render':28}{'':>22}{full['render_cpu']:>22.2f} s")
    print(f"{'write tree':28}{'':>22}{full['write']:>22.2f} s")
    total = full["load"] + full["render"] + full["write"]
    print(f"{'total':28}{baseline['load']:>20.2f} s{total:>22.2f} s")
    print(f"{'peak memory (RSS)':28}{baseline['peak_rss_mib']:>18.0f} MiB{full['peak_rss_mib']:>20.0f} MiB")
    print(
        f"files written: {full['files']}, objects: {full['objects']}, output: {full['bytes'] / 2**20:.1f} MiB"
    )
    for warning in full["warnings"]:
        print(f"warning: {warning}")
    render_time = full["render"] + full["write"]
    verdict = "met" if render_time < 10 else "NOT met"
    print(f"goal: render + write under 10 s for 1,000 teams -> {verdict} ({render_time:.2f} s wall clock)")


if __name__ == "__main__":
    main()
