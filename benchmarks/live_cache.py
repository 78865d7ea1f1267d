"""The webhook's live job caches at cluster scale (issue 25 item 3): admission latency while a cache
relists 10,000 or 100,000 TrainJobs, next to the same server idle, and the server's peak RSS.

A fake API server (aiohttp, its own process) holds N TrainJobs (the example job with a status and
the ``managedFields`` and last-applied annotation that ``kubectl apply`` leaves: about 6 KiB of JSON
each), serves LIST with and without ``limit``/``continue`` (a token names the list's
resourceVersion and offset) and WATCH with bookmarks, and on ``POST /_gone`` ends every open watch
with ``410 Gone`` so that each cache relists. ``mpigate serve`` runs with live context against it
(``--kubeconfig``); Kueue objects answer 404, so every review is judged with the "live quota context
unavailable" warning — the latency measured is the server's, not Kueue's.

Per target: a closed loop of ``/validate`` reviews at concurrency 4 for ``--seconds`` while the
caches are idle, then ``/_gone`` and the same load until every cache has listed again (the fake API
counts complete lists): p50/p99/max latency per phase, how long the relist took, and the largest gap
between two answers (the longest stall). Peak RSS is ``VmHWM`` of the server's processes.

    .venv/bin/python benchmarks/live_cache.py [--jobs 10000,100000] [--workers 1]
        [--baseline PYTHON] [--baseline-jobs 10000]

``--baseline PYTHON`` runs the same measurement with another interpreter (another checkout's venv:
the code before this change) for the job counts in ``--baseline-jobs``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
TJ_PATH = "/apis/trainer.kubeflow.org/v1alpha1/trainjobs"


# ---------------------------------------------------------------------------------- the fake API


def _item_template() -> bytes:
    obj = yaml.safe_load((REPO / "examples" / "trainjobs" / "llm-finetune.yaml").read_text())
    obj["metadata"].update(
        uid="00000000-0000-0000-0000-000000000000",
        resourceVersion="RV",
        creationTimestamp="2026-11-25T00:00:00Z",
        annotations={"kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj)},
        managedFields=[
            {
                "manager": "kubectl-client-side-apply",
                "operation": "Update",
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "time": "2026-11-25T00:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {f"f:field{i}": {} for i in range(150)}},
            }
        ],
    )
    obj["status"] = {
        "conditions": [
            {
                "type": "Suspended",
                "status": "False",
                "reason": "Resumed",
                "lastTransitionTime": "2026-11-25T00:00:00Z",
            }
        ],
        "jobsStatus": [
            {"name": n, "active": 1, "ready": 1, "succeeded": 0, "failed": 0} for n in ("node", "launcher")
        ],
    }
    obj["metadata"]["namespace"] = "@@NS@@"
    obj["metadata"]["name"] = "@@NAME@@"
    return json.dumps(obj, separators=(",", ":")).encode()


def run_fake_api(port_file: str, jobs: int) -> None:
    from aiohttp import web

    template = _item_template()
    rv = 1000
    state: dict[str, Any] = {"lists": 0, "pages": 0, "watchers": set()}

    def item(i: int) -> bytes:
        return template.replace(b"@@NS@@", b"team-%d" % (i % 50)).replace(b"@@NAME@@", b"job-%d" % i)

    async def trainjobs(request: web.Request) -> web.StreamResponse:
        params = request.query
        if params.get("watch") == "true":
            return await watch(request)
        limit = int(params.get("limit") or 0)
        token = params.get("continue") or ""
        start = int(token.split(":")[1]) if token else 0
        end = jobs if not limit else min(jobs, start + limit)
        state["pages"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        more = end < jobs
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if more:
            meta["continue"] = f"{rv}:{end}"
            meta["remainingItemCount"] = jobs - end
        await resp.write(
            b'{"apiVersion":"v1","kind":"List","metadata":' + json.dumps(meta).encode() + b',"items":['
        )
        for chunk in range(start, end, 500):
            items = b",".join(item(i) for i in range(chunk, min(end, chunk + 500)))
            await resp.write((b"," if chunk > start else b"") + items)
        await resp.write(b"]}")
        await resp.write_eof()
        if not more:
            state["lists"] += 1
        return resp

    async def watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        gone = asyncio.Event()
        state["watchers"].add(gone)
        try:
            while not gone.is_set() and request.transport is not None and not request.transport.is_closing():
                bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(rv)}}}
                await resp.write(json.dumps(bookmark).encode() + b"\n")
                try:
                    await asyncio.wait_for(gone.wait(), 1.0)
                except TimeoutError:
                    continue
            error = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
            await resp.write(json.dumps(error).encode() + b"\n")
        except ConnectionError:  # the client went away (its server stopped)
            return resp
        finally:
            state["watchers"].discard(gone)
        await resp.write_eof()
        return resp

    async def gone(request: web.Request) -> web.Response:
        for event in list(state["watchers"]):
            event.set()
        return web.json_response({"lists": state["lists"], "watchers": len(state["watchers"])})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(
            {"lists": state["lists"], "pages": state["pages"], "watchers": len(state["watchers"])}
        )

    async def not_found(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)

    async def main() -> None:
        app = web.Application()
        app.router.add_get(TJ_PATH, trainjobs)
        app.router.add_post("/_gone", gone)
        app.router.add_get("/_stats", stats)
        app.router.add_route("*", "/{tail:.*}", not_found)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        Path(port_file).write_text(str(runner.addresses[0][1]))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


# ------------------------------------------------------------------------------------ measuring


def _rss_peak(pid: int) -> int:
    """VmHWM of ``pid`` and its children (``--workers``), in KiB (the largest process's)."""
    peaks = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for p in (pid, *map(int, children)):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]))
        except OSError:
            continue
    return max(peaks, default=0)


async def _load(
    port: int, ctx: ssl.SSLContext, body: bytes, until: asyncio.Event, out: list[tuple[float, float]]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    head = (
        f"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    while not until.is_set():
        t0 = time.perf_counter()
        writer.write(head + body)
        headers = await reader.readuntil(b"\r\n\r\n")
        length = next(int(h[15:]) for h in headers.split(b"\r\n") if h[:15].lower() == b"content-length:")
        await reader.readexactly(length)
        out.append((t0, time.perf_counter() - t0))
    writer.close()


async def _api(port: int, method: str, path: str) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
    )
    data = await reader.read()
    writer.close()
    result: dict[str, Any] = json.loads(data.split(b"\r\n\r\n", 1)[1])
    return result


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000 if ordered else float("nan")


async def measure(
    port: int, api: int, ca: str, seconds: float, lists_before: int, caches: int
) -> dict[str, Any]:
    from mpigate.admission.client import make_review

    ctx = ssl.create_default_context(cafile=ca)
    obj = yaml.safe_load((REPO / "examples" / "trainjobs" / "minimal.yaml").read_text())
    body = json.dumps(make_review(obj, uid="bench")).encode()
    results: dict[str, Any] = {}
    for phase in ("idle", "relist"):
        samples: list[tuple[float, float]] = []
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_load(port, ctx, body, stop, samples)) for _ in range(4)]
        started = time.perf_counter()
        if phase == "idle":
            await asyncio.sleep(seconds)
        else:
            await _api(api, "POST", "/_gone")
            deadline = time.monotonic() + 600
            while (await _api(api, "GET", "/_stats"))["lists"] < lists_before + caches:
                if time.monotonic() > deadline:
                    raise RuntimeError("the caches did not relist within 600 s")
                await asyncio.sleep(0.05)
            results["relist_s"] = time.perf_counter() - started
            await asyncio.sleep(0.5)  # the watches restart
        stop.set()
        await asyncio.gather(*tasks)
        latencies = [lat for _, lat in samples]
        ends = sorted(t + lat for t, lat in samples)
        gaps = [b - a for a, b in itertools.pairwise(ends)]
        results[phase] = {
            "n": len(samples),
            "p50": _pct(latencies, 0.5),
            "p99": _pct(latencies, 0.99),
            "max": max(latencies, default=0) * 1000,
            "stall": max(gaps, default=0) * 1000,
        }
        lists_before = (await _api(api, "GET", "/_stats"))["lists"]
    return results


def run_target(
    python: str, jobs: int, workers: int, seconds: float, tmp: Path, issued: Any
) -> dict[str, Any]:
    api_port_file = tmp / f"api-{jobs}.port"
    api_port_file.unlink(missing_ok=True)
    api = subprocess.Popen([sys.executable, __file__, "--fake-api", str(api_port_file), str(jobs)])
    try:
        while not api_port_file.exists() or not api_port_file.read_text():
            if api.poll() is not None:
                raise RuntimeError("fake API exited")
            time.sleep(0.05)
        api_port = int(api_port_file.read_text())
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{api_port}"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
                    "current-context": "fake",
                }
            )
        )
        log = tmp / f"serve-{jobs}.log"
        args = [
            python, "-m", "mpigate", "serve", "--config", str(REPO), "--tls-cert", str(issued.tls_cert),
            "--tls-key", str(issued.tls_key), "--host", "127.0.0.1", "--port", "0",
            "--kubeconfig", str(kubeconfig), "--workers", str(workers),
        ]  # fmt: skip
        with log.open("wb") as out:
            server = subprocess.Popen(args, stderr=out, stdout=subprocess.DEVNULL)
        try:
            port = 0
            deadline = time.monotonic() + 60
            while not port:
                for line in log.read_text(errors="replace").splitlines():
                    if '"event":"listening"' in line:
                        port = int(json.loads(line)["port"])
                if server.poll() is not None:
                    raise RuntimeError(f"mpigate exited: {log.read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError("mpigate did not start")
                time.sleep(0.05)
            # every worker's caches listed once (TrainJobs; other kinds answer 404)
            deadline = time.monotonic() + 900
            caches = workers
            while asyncio.run(_api(api_port, "GET", "/_stats"))["lists"] < caches:
                if time.monotonic() > deadline:
                    raise RuntimeError("the caches did not list within 900 s")
                time.sleep(0.2)
            time.sleep(1.0)
            stats = asyncio.run(_api(api_port, "GET", "/_stats"))
            result = asyncio.run(
                measure(port, api_port, str(issued.ca_cert), seconds, stats["lists"], caches)
            )
            result["pages_per_list"] = asyncio.run(_api(api_port, "GET", "/_stats"))["pages"] / max(
                1, asyncio.run(_api(api_port, "GET", "/_stats"))["lists"]
            )
            result["rss_mib"] = _rss_peak(server.pid) / 1024
            return result
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    finally:
        api.send_signal(signal.SIGTERM)
        api.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="10000,100000")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0, help="idle phase length")
    parser.add_argument("--baseline", metavar="PYTHON", help="also run another checkout's mpigate")
    parser.add_argument("--baseline-jobs", default="10000")
    args = parser.parse_args()
    from mpigate.admission.certs import issue_certificates

    tmp = Path(tempfile.mkdtemp(prefix="mpigate-live-"))
    issued = issue_certificates(tmp / "certs", service="bench", namespace="bench", extra_names=("localhost",))
    print(
        f"machine: {os.cpu_count()} CPUs; {len(_item_template())} bytes of JSON per TrainJob; "
        f"mpigate serve --workers {args.workers}; /validate at concurrency 4"
    )
    runs: list[tuple[str, int, dict[str, Any]]] = []
    for jobs in (int(j) for j in args.jobs.split(",")):
        if args.baseline and str(jobs) in args.baseline_jobs.split(","):
            runs.append(
                ("baseline", jobs, run_target(args.baseline, jobs, args.workers, args.seconds, tmp, issued))
            )
        runs.append(
            ("mpigate", jobs, run_target(sys.executable, jobs, args.workers, args.seconds, tmp, issued))
        )
    print()
    print(
        f"{'target':<9} {'jobs':>7} {'pages':>6} {'relist s':>9} {'idle p50':>9} {'idle p99':>9} "
        f"{'relist p50':>11} {'relist p99':>11} {'ratio':>6} {'max ms':>8} {'stall ms':>9} {'RSS MiB':>8}"
    )
    for target, jobs, r in runs:
        idle, relist = r["idle"], r["relist"]
        print(
            f"{target:<9} {jobs:>7} {r['pages_per_list']:>6.0f} {r['relist_s']:>9.1f} {idle['p50']:>9.2f} "
            f"{idle['p99']:>9.2f} {relist['p50']:>11.2f} {relist['p99']:>11.2f} "
            f"{relist['p99'] / idle['p99']:>6.1f} {relist['max']:>8.1f} {relist['stall']:>9.1f} "
            f"{r['rss_mib']:>8.0f}"
        )
    print("goal: p99 during a relist <= 2x the idle p99; latencies in ms")
    print(f"load average after the run: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--fake-api":
        run_fake_api(sys.argv[2], int(sys.argv[3]))
    else:
        main()
