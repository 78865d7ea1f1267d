"""The controller at cluster scale (issue 25): peak RSS with 1,000 and 10,000 TrainJobs of 4 pods
each, against an in-process fake API (no kopf: the reconciler is driven with watch events as kopf
delivers them — every job listed, then every pod).

Each measurement runs in a fresh process (peak RSS is per process):

- ``idle``: the process with the example org loaded and no job (the floor);
- ``full bodies``: the reconciler keeping every body it is handed, as it did before issue 25 (the
  baseline: the same code with slimming turned off);
- ``slim``: the reconciler as shipped.

One job in ten is in a namespace of no team, and for every 20 TrainJobs a team runs a JobSet of its
own (4 pods, no TrainJob): what a shared cluster shows the controller's watches.

Then the background audit (``controller/background.py``) over the same jobs, each measurement in a
fresh process: one full pass (nothing violates), a pass after one rule changed (nlp-team's GPU quota
cut below every job's demand: every job now violates MPG-Q001), and a pass with nothing changed —
time, API requests by verb, reports written, audit records and the process's peak RSS.

Run: ``.venv/bin/python benchmarks/controller_scale.py [--jobs 1000,10000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime as dt
import json
import resource
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from mpigate.admission.kube import KubeError, ListPage

ROOT = Path(__file__).resolve().parent.parent
PODS_PER_JOB = 4
NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


def _job_template() -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "examples" / "trainjobs" / "minimal.yaml").read_text())
    job["spec"]["trainer"]["numNodes"] = PODS_PER_JOB
    job["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": 1}}
    return job


def job_body(template: Mapping[str, Any], i: int, namespace: str) -> dict[str, Any]:
    """A TrainJob as a watch delivers it: managedFields, kopf's last-handled-configuration, the
    status Trainer writes (conditions and a status per replicated job)."""
    job = copy.deepcopy(dict(template))
    meta = job["metadata"]
    meta.update(
        name=f"job-{i:06d}",
        namespace=namespace,
        uid=f"uid-{i:06d}",
        resourceVersion=str(1000 + i),
        creationTimestamp="2026-11-22T09:00:00Z",
        generation=1,
    )
    meta["annotations"] = {
        "mpigate.io/last-handled-configuration": json.dumps(
            {"spec": job["spec"], "metadata": {"labels": meta["labels"]}}
        ),
        "kueue.x-k8s.io/queue-name": "nlp-team",
    }
    meta["managedFields"] = [
        {
            "manager": manager,
            "operation": "Update",
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "time": "2026-11-22T09:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {f"f:{k}": {} for k in job["spec"]}, "f:status": {"f:conditions": {}}},
        }
        for manager in ("kubectl-client-side-apply", "trainer-controller-manager", "kueue-manager", "mpigate")
    ]
    job["spec"]["suspend"] = False
    job["status"] = {
        "conditions": [
            {
                "type": "Suspended",
                "status": "False",
                "reason": "Resumed",
                "message": "TrainJob is resumed",
                "lastTransitionTime": "2026-11-22T09:00:00Z",
            },
        ],
        "jobsStatus": [
            {"name": n, "ready": 1, "active": 1, "succeeded": 0, "failed": 0, "suspended": 0}
            for n in ("launcher", "node")
        ],
    }
    return job


def pod_body(job: Mapping[str, Any], k: int) -> dict[str, Any]:
    """A pod of the job as the kubelet shows it (a typical JobSet pod: env, mounts, tolerations,
    managedFields, statuses)."""
    meta = job["metadata"]
    name = meta["name"]
    env = [{"name": f"VAR_{n}", "value": f"value-{n}-" + "x" * 40} for n in range(20)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-node-0-{k}-abcde",
            "namespace": meta["namespace"],
            "uid": f"{meta['uid']}-pod-{k}",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-completion-index": str(k),
                "controller-uid": f"ctl-{meta['uid']}",
                "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
            },
            "annotations": {f"jobset.sigs.k8s.io/{a}": "x" * 30 for a in ("a", "b", "c", "d")},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": f"{name}-node-0", "uid": "o"}
            ],
            "managedFields": [
                {
                    "manager": m,
                    "operation": "Update",
                    "fieldsV1": {"f:status": {"f:conditions": {"x": "y" * 600}}},
                }
                for m in ("kube-controller-manager", "kubelet")
            ],
        },
        "spec": {
            "nodeName": "gpu-eu-1",
            "nodeSelector": {"topology.kubernetes.io/region": "eu-west-1"},
            "containers": [
                {
                    "name": "node",
                    "image": "registry.acme.internal/nlp/llm-train:1.4.2",
                    "command": ["mpirun", "--allow-run-as-root", "python", "/train.py"],
                    "env": env,
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                    "volumeMounts": [{"name": f"v{n}", "mountPath": f"/mnt/{n}"} for n in range(6)],
                }
            ],
            "volumes": [{"name": f"v{n}", "configMap": {"name": f"cm-{n}"}} for n in range(6)],
            "tolerations": [{"key": f"t{n}", "operator": "Exists", "effect": "NoSchedule"} for n in range(4)],
        },
        "status": {
            "phase": "Running",
            "startTime": "2026-11-22T09:00:02Z",
            "podIP": "10.0.0.1",
            "hostIP": "10.1.0.1",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-11-22T09:00:05Z"}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": "node",
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.acme.internal/nlp/llm-train:1.4.2",
                    "imageID": "registry.acme.internal/nlp/llm-train@sha256:" + "a" * 64,
                    "containerID": "containerd://" + "b" * 64,
                    "state": {"running": {"startedAt": "2026-11-22T09:00:05Z"}},
                }
            ],
        },
    }


class FakeApi:
    """The API server as the controller sees it: objects generated from their index on demand
    (nothing stored but the annotations the controller patches), every request counted."""

    def __init__(self, jobs: int, namespaces: list[str]) -> None:
        self.template = _job_template()
        self.count = jobs
        self.namespaces = namespaces
        self.annotations: dict[str, dict[str, Any]] = {}
        self.requests: Counter[str] = Counter()
        self.reports: dict[str, dict[str, Any]] = {}  # path -> the report as stored
        self.cluster_queue: dict[str, Any] = {
            "metadata": {"name": "nlp-team"},
            "spec": {
                "resourceGroups": [
                    {
                        "flavors": [
                            {"name": "a100-eu", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 16}]}
                        ]
                    }
                ]
            },
            "status": {
                "flavorsReservation": [
                    {"name": "a100-eu", "resources": [{"name": "nvidia.com/gpu", "total": 8}]}
                ]
            },
        }

    def namespace(self, i: int) -> str:
        """One job in ten is in a namespace of no team (a cluster runs more than mpigate's teams)."""
        return "default" if i % 10 == 9 else self.namespaces[i % len(self.namespaces)]

    def job(self, i: int) -> dict[str, Any]:
        job = job_body(self.template, i, self.namespace(i))
        job["metadata"]["annotations"].update(self.annotations.get(job["metadata"]["name"], {}))
        return job

    def _index(self, name: str) -> int:
        return int(name.rsplit("-", 1)[1])

    async def get(self, path: str) -> dict[str, Any] | None:
        self.requests["get"] += 1
        if path.endswith("/localqueues/nlp-team"):
            return {"spec": {"clusterQueue": "nlp-team"}}
        if path.endswith("/clusterqueues/nlp-team"):
            return self.cluster_queue
        if "/trainjobs/" in path:
            return self.job(self._index(path.rsplit("/", 1)[1]))
        return None  # NetworkPolicies, ConfigMaps: none yet

    async def list_items(
        self, path: str, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        self.requests["list"] += 1
        if path.endswith("/pods") and label_selector:
            name = dict(kv.split("=") for kv in label_selector.split(","))["jobset.sigs.k8s.io/jobset-name"]
            job = self.job(self._index(name))
            return [pod_body(job, k) for k in range(PODS_PER_JOB)]
        if path.endswith("/trainjobs"):
            return [self.job(i) for i in range(self.count)]
        return []

    async def pages(
        self, path: str, *, limit: int = 500, label_selector: str | None = None
    ) -> AsyncIterator[ListPage[list[dict[str, Any]]]]:
        if "report" in path:  # the reports stored (the audit compares them with what it found)
            self.requests["list"] += 1
            cluster = "/cluster" in path  # the cluster's reports, or every namespace's
            stored = [copy.deepcopy(r) for p, r in self.reports.items() if ("/cluster" in p) == cluster]
            yield ListPage(stored, "1", "")
            return
        if not path.endswith("/trainjobs"):  # runtimes: none
            self.requests["list"] += 1
            yield ListPage([], "1", "")
            return
        for start in range(0, self.count, limit):
            self.requests["list"] += 1
            yield ListPage([self.job(i) for i in range(start, min(self.count, start + limit))], "1", "")

    async def create(self, collection: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.requests["create"] += 1
        if "report" in collection:
            self.reports[f"{collection}/{body['metadata']['name']}"] = copy.deepcopy(dict(body))
        return dict(body)

    async def delete(self, path: str) -> None:
        self.requests["delete"] += 1

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.requests["patch"] += 1
        if "report" in path:
            if path not in self.reports:
                raise KubeError(f"PATCH {path}: HTTP 404", status=404)
            self.reports[path].update(copy.deepcopy(dict(patch)))  # every field is given
            return copy.deepcopy(self.reports[path])
        name = path.rsplit("/", 1)[1]
        if "/trainjobs/" in path:
            mine = self.annotations.setdefault(name, {})
            for k, v in patch["metadata"]["annotations"].items():
                if v is None:
                    mine.pop(k, None)
                else:
                    mine[k] = v
            return self.job(self._index(name))
        return dict(patch)

    async def write_configmap_data(self, namespace: str, name: str, binary_data: Mapping[str, str]) -> None:
        path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
        await self.merge_patch(path, {"binaryData": binary_data})

    async def namespace_labels(self, name: str) -> dict[str, str] | None:
        return {"mpigate.io/team": name} if name != "default" else {}

    async def node_labels(self, name: str) -> dict[str, str] | None:
        return {"topology.kubernetes.io/region": "eu-west-1", "nvidia.com/gpu.product": "A100-SXM4-80GB"}

    async def node_lost(self, name: str) -> bool:
        return False


class CountingRecorder:
    def __init__(self) -> None:
        self.records = 0

    async def append(self, entry: Mapping[str, Any]) -> None:
        self.records += 1

    @property
    def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        return None


async def _audit_child(jobs: int) -> dict[str, Any]:
    """Three background audit passes over ``jobs`` jobs (see the module docstring)."""
    import tempfile

    from mpigate.config import load
    from mpigate.controller.background import BackgroundAuditor
    from mpigate.controller.events import EventPoster
    from mpigate.controller.metrics import ControllerMetrics
    from mpigate.policy import AdmissionInput, apply_patch, evaluate

    org = Path(tempfile.mkdtemp(prefix="mpigate-bench-"))
    for part in ("policies", "quotas", "rbac", "networkpolicies"):
        shutil.copytree(ROOT / part, org / part, ignore=shutil.ignore_patterns("tests"))
    holder = {"config": load(org, today=NOW.date())}
    api = FakeApi(jobs, ["nlp-team"])
    # the jobs as admission stored them: mpigate's mutation applied
    template = api.template
    request = AdmissionInput(
        operation="CREATE", kind="TrainJob", namespace="nlp-team", name="t", obj=template
    )
    api.template = apply_patch(template, list(evaluate(holder["config"], request, None, NOW).patch))
    metrics = ControllerMetrics()
    recorder = CountingRecorder()
    auditor = BackgroundAuditor(
        config=lambda: holder["config"],
        api=api,  # type: ignore[arg-type]
        recorder=recorder,
        metrics=metrics,
        events=EventPoster(api, metrics, "bench"),  # type: ignore[arg-type]
        clock=lambda: NOW,
        state=("mpigate-system", "mpigate-controller-audit"),
    )
    out: dict[str, Any] = {"jobs": jobs}
    for step in ("first", "one rule changed", "nothing changed"):
        if step == "one rule changed":
            quota = org / "quotas" / "nlp-team.yaml"
            quota.write_text(
                quota.read_text().replace(
                    "a100-eu: {nominal: 16, borrowingLimit: 0, lendingLimit: 4}",
                    "a100-eu: {nominal: 2, borrowingLimit: 0, lendingLimit: 0}",
                    1,
                )
            )
            holder["config"] = load(org, today=NOW.date())
        api.requests.clear()
        records = recorder.records
        done = await auditor.run_pass(step)
        assert done is not None
        out[step] = {
            "seconds": round(done.seconds, 2),
            "judged": done.objects,
            "opened": done.opened,
            "reports": done.reports_written,
            "records": recorder.records - records,
            "requests": dict(api.requests),
        }
    out["rss_peak"] = round(maxrss_mib(), 1)
    shutil.rmtree(org)
    return out


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _child(mode: str, jobs: int) -> dict[str, Any]:
    from mpigate.config import load
    from mpigate.controller import reconciler as reconciler_module
    from mpigate.controller.events import EventPoster
    from mpigate.controller.metrics import ControllerMetrics
    from mpigate.controller.reconciler import Reconciler

    config = load(ROOT, today=NOW.date())
    namespaces = sorted(
        ns for team in config.teams.values() for ns in team.namespaces if team.name == "nlp-team"
    ) or ["nlp-team"]
    api = FakeApi(jobs, namespaces)
    if mode == "full bodies":
        # before issue 25: every body kept whole, in every namespace, and every pod of an unknown job
        reconciler_module.slim_job = lambda kind, job: job  # type: ignore[assignment,return-value]
        reconciler_module.slim_pod = lambda kind, pod: pod  # type: ignore[assignment]

        async def everything(job: Mapping[str, Any]) -> bool:
            return True

        r_watched = everything
        reconciler_module.Reconciler._team_namespace = lambda self, namespace: True  # type: ignore[method-assign]
    metrics = ControllerMetrics()
    recorder = CountingRecorder()
    r = Reconciler(
        config=lambda: config,
        api=api,  # type: ignore[arg-type]
        recorder=recorder,
        metrics=metrics,
        events=EventPoster(api, metrics, "bench"),  # type: ignore[arg-type]
        clock=lambda: NOW,
    )
    if mode == "full bodies":
        r._watched = r_watched  # type: ignore[method-assign]
    start_rss = maxrss_mib()
    started = time.perf_counter()
    if mode != "idle":
        for i in range(jobs):
            job = api.job(i)
            await r.on_trainjob_event(None, job)
            for k in range(PODS_PER_JOB):
                await r.on_pod_event(None, pod_body(job, k))
            if i % 20 == 0:  # a JobSet of no TrainJob in a team namespace (run by hand): 4 pods
                plain = copy.deepcopy(job)
                plain["metadata"]["name"] = f"plain-jobset-{i:06d}"
                plain["metadata"]["namespace"] = namespaces[0]
                for k in range(PODS_PER_JOB):
                    await r.on_pod_event(None, pod_body(plain, k))
    took = time.perf_counter() - started
    return {
        "mode": mode,
        "jobs": jobs if mode != "idle" else 0,
        "records": recorder.records,
        "seconds": round(took, 1),
        "rss_start": round(start_rss, 1),
        "rss_peak": round(maxrss_mib(), 1),
        "requests": dict(api.requests),
    }


def measure(mode: str, jobs: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(jobs)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", default="1000,10000", help="comma-separated job counts (4 pods each)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "JOBS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child[0] == "audit":
            print(json.dumps(asyncio.run(_audit_child(int(args.child[1])))))
        else:
            print(json.dumps(asyncio.run(_child(args.child[0], int(args.child[1])))))
        return
    sizes = [int(n) for n in args.jobs.split(",")]
    idle = measure("idle", 0)
    print(f"idle (example org loaded, no job): peak RSS {idle['rss_peak']:.0f} MiB")
    header = ("jobs", "pods", "mode", "peak RSS MiB", "over idle", "per job KiB", "s")
    print("{:>7} {:>7} {:<12} {:>13} {:>10} {:>12} {:>6}".format(*header))
    for n in sizes:
        for mode in ("full bodies", "slim"):
            m = measure(mode, n)
            over = m["rss_peak"] - idle["rss_peak"]
            print(
                f"{n:>7} {n * PODS_PER_JOB:>7} {mode:<12} {m['rss_peak']:>13.0f} {over:>10.0f} "
                f"{over * 1024 / n:>12.1f} {m['seconds']:>6}"
            )

    print()
    print("background audit: 9 of 10 jobs in nlp-team (judged), 1 in 10 in a namespace of no team (skipped)")
    header2 = ("jobs", "pass", "s", "judged", "new", "reports", "records", "API requests", "peak RSS MiB")
    print("{:>7} {:<17} {:>7} {:>7} {:>6} {:>8} {:>8}  {:<34} {:>12}".format(*header2))
    for n in sizes:
        m = measure("audit", n)
        for step in ("first", "one rule changed", "nothing changed"):
            p = m[step]
            calls = ", ".join(f"{k} {v}" for k, v in sorted(p["requests"].items()))
            print(
                f"{n:>7} {step:<17} {p['seconds']:>7} {p['judged']:>7} {p['opened']:>6} {p['reports']:>8} "
                f"{p['records']:>8}  {calls:<34} {m['rss_peak']:>12.0f}"
            )


if __name__ == "__main__":
    main()
