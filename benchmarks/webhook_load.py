"""Closed-loop load on the admission webhook over TLS on loopback, next to a no-op responder.

Targets, each a server in its own process on 127.0.0.1 with the same TLS settings:

- ``noop``: an aiohttp app that decodes the AdmissionReview and answers ``allowed`` (the
  floor: HTTP + TLS + JSON);
- ``raw``: the no-op without aiohttp — a bare protocol under the loop's TLS, the same JSON decode
  and answer (how much of the floor is the HTTP framework's; not a server to deploy);
- ``shell``: mpigate's server exactly as ``mpigate serve`` runs it (its HTTP fast path, review decoding,
  request ids, JSON log line, metrics, deadline) with the policy engine replaced by one that
  allows everything — the floor of mpigate's own HTTP path, which splits the gap to the no-op
  into server overhead and engine time;
- ``mpigate``: ``mpigate serve`` on the example org (every rule, JSON logs);
- ``mpigate+audit``: the same, writing the hash-chained audit trail (group-committed fsync).

The load: every example TrainJob, as the API server sends it — ``/mutate`` with the object, then
``/validate`` with the patched object (the pairs are prepared once through the server), each pair
in several copies with their own uid and name, as the API server sends them (no two consecutive
requests are identical). Client processes each hold keep-alive connections and run closed loops
(send, wait, send); the concurrency is split over them so that one Python client does not become
the bottleneck. Next to throughput and latency, the server's CPU time per request (from
/proc/<pid>/stat, all its processes) is printed: it does not depend on how the two cores are
shared with the load generator.

    .venv/bin/python benchmarks/webhook_load.py [--seconds 5] [--concurrency 1,10,50] [--workers 2]
        [--targets noop,shell,mpigate,mpigate+audit] [--python .venv-compiled/bin/python]
        [--baseline /work/main/.venv/bin/python]

``--loop uvloop|asyncio`` (default uvloop, as ``mpigate serve``) is the event loop of this
checkout's servers — the no-op's too, so that the floor is measured on the same loop; a target
name ending in ``@asyncio`` or ``@uvloop`` (``noop@asyncio``, ``shell@asyncio``,
``mpigate@asyncio``) runs that target on the other loop in the same run. The ``baseline`` targets
run as the other checkout runs them (``mpigate serve`` without ``--loop``; its shell on asyncio).

``--workers N`` runs mpigate with ``serve --workers N`` and the no-op as N processes on one port
(``SO_REUSEPORT``, like mpigate's workers), so that the two are compared on equal terms; the shell
always runs as one process. ``--python`` chooses the interpreter (and so the mpigate build) that
runs the servers. ``--baseline PYTHON`` adds the target ``baseline``: ``mpigate serve`` on the same
org run by another interpreter (another checkout's venv, e.g. main's, or another build), so that a
change's CPU per review is printed next to the figure before it, in the same run; with the target
``shell`` among the targets it adds ``baseline-shell`` too (the other interpreter's HTTP path).

The figures depend on the interpreter as much as on the build: the script prints which CPython ran
the servers (the image's is Debian's ``/usr/bin/python3.11``, built with PGO and LTO and libpython
linked in; a source build such as pyenv's costs 11–25 % more CPU per review). The Makefile's
venvs use that interpreter where it exists.

Prints throughput, latency percentiles and errors per target and concurrency, then the goals
(zero errors; p99 ≤ 15 ms at concurrency 10; mpigate ≥ 50 % of the no-op throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from mpigate.admission.certs import issue_certificates
from mpigate.admission.client import ReviewClient, apply_review_patch, make_review
from mpigate.audit import generate_key

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------- no-op responder


def run_on(loop: str, main: Any) -> None:
    """Run the coroutine ``main`` on ``loop`` ("uvloop" or "asyncio"): done here, not through
    mpigate, so that a baseline checkout's shell runs on the loop asked for too."""
    factory = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


def run_noop(port_file: str, cert: str, key: str, port: int = 0, loop: str = "asyncio") -> None:
    """The baseline server: decode, answer allowed (same TLS context as mpigate). Binds with
    ``SO_REUSEPORT``, as ``mpigate serve --workers`` does, so that ``--workers N`` runs N of them.
    On uvloop aiohttp's site serves through uvloop's TLS transport, as mpigate's does there."""
    from aiohttp import web

    from mpigate.admission.tls import server_context

    async def review(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        uid = body["request"]["uid"]
        answer = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": True},
        }
        return web.json_response(answer)

    async def main() -> None:
        app = web.Application(client_max_size=3 * 1024 * 1024)
        app.router.add_post("/mutate", review)
        app.router.add_post("/validate", review)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(
            runner, "127.0.0.1", port, ssl_context=server_context(Path(cert), Path(key)), reuse_port=True
        )
        await site.start()
        Path(port_file).write_text(str(runner.addresses[0][1]))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    run_on(loop, main())


def run_raw(port_file: str, cert: str, key: str, port: int = 0, loop: str = "asyncio") -> None:
    """The no-op without an HTTP framework: the loop's TLS under a bare ``asyncio.Protocol`` that
    reads requests by their ``Content-Length`` (keep-alive, no chunking, no header checks), decodes
    the JSON as the no-op does and writes the same answer — how much of the no-op's floor is
    aiohttp's web layer. A measuring device, not a server: it trusts its client."""
    from mpigate.admission.tls import server_context

    class Raw(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
                head = self.buffer[:end].lower()
                at = head.find(b"content-length:") + 15
                stop = head.find(b"\r\n", at)
                length = int(head[at : stop if stop >= 0 else len(head)])
                if len(self.buffer) < end + 4 + length:
                    return
                body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
                uid = json.loads(body)["request"]["uid"]
                answer = json.dumps({
                    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": {"uid": uid, "allowed": True},
                }).encode()  # fmt: skip
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer)
                )

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(
            Raw, "127.0.0.1", port, ssl=server_context(Path(cert), Path(key)), reuse_port=True
        )
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        server.close()

    run_on(loop, main())


def run_shell(port_file: str, cert: str, key: str, loop: str = "asyncio") -> None:
    """mpigate's own server with a policy engine that allows everything (see the docstring)."""
    from mpigate.admission.server import ServeOptions, WebhookServer
    from mpigate.cli.serve_commands import _configure_logging
    from mpigate.config import Config
    from mpigate.policy.decision import AdmissionInput, Decision, LiveContext

    def allow(config: Config, request: AdmissionInput, live: LiveContext | None, now: object) -> Decision:
        return Decision.bare(request, config.revision)

    _configure_logging("json", "info")  # as ``mpigate serve`` logs: one JSON line per review
    options = ServeOptions(
        config=REPO, tls_cert=Path(cert), tls_key=Path(key), host="127.0.0.1", port=0, worker=None
    )

    async def main() -> None:
        server = WebhookServer(options, evaluator=allow, mutator=allow)
        await server.run_until_signalled(lambda: Path(port_file).write_text(str(server.port)))

    run_on(loop, main())


# ---------------------------------------------------------------------------------- load client


async def _worker(port: int, ctx: ssl.SSLContext, requests: list[bytes], start: int, until: float,
                  warmup_until: float, out: list[float], errors: list[str],
                  done: list[int]) -> None:  # fmt: skip
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    i = start
    loop = asyncio.get_running_loop()
    while True:
        now = loop.time()
        if now >= until:
            break
        payload = requests[i % len(requests)]
        i += 1
        t0 = time.perf_counter()
        try:
            writer.write(payload)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            writer.close()
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
            )
            continue
        elapsed = time.perf_counter() - t0
        if status != 200 or b'"response"' not in body:
            errors.append(f"HTTP {status}: {body[:200]!r}")
            continue
        done[0] += 1
        if now >= warmup_until:
            out.append(elapsed)
    writer.close()


def run_client(port: int, ca: str, requests: list[bytes], workers: int, offset: int, seconds: float,
               warmup: float, queue: Any) -> None:  # fmt: skip
    ctx = ssl.create_default_context(cafile=ca)

    async def main() -> tuple[list[float], list[str], int]:
        loop = asyncio.get_running_loop()
        warmup_until = loop.time() + warmup
        until = warmup_until + seconds
        latencies: list[float] = []
        errors: list[str] = []
        done = [0]
        await asyncio.gather(
            *(
                _worker(port, ctx, requests, offset + w * 7, until, warmup_until, latencies, errors, done)
                for w in range(workers)
            )
        )
        return latencies, errors, done[0]

    queue.put(asyncio.run(main()))


def http_request(path: str, review: dict[str, Any]) -> bytes:
    body = json.dumps(review).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def prepare_requests(url: str, ca: str, copies: int = 8) -> list[bytes]:
    """/mutate + /validate pairs for every example TrainJob, as the API server would send them:
    ``copies`` of each, with their own uid and job name (the patch does not depend on either)."""
    client = ReviewClient(url, ca_file=ca)
    out: list[bytes] = []
    try:
        for copy in range(copies):
            for path in sorted((REPO / "examples" / "trainjobs").glob("*.yaml")):
                obj = yaml.safe_load(path.read_text())
                obj["metadata"]["name"] = f"{obj['metadata']['name'][:50]}-{copy}"
                mutate = make_review(obj, uid=f"bench-{copy}-{path.stem}-m")
                status, answer = client.post("/mutate", mutate)
                assert status == 200, answer
                patched = apply_review_patch(mutate["request"]["object"], answer["response"])
                out.append(http_request("/mutate", mutate))
                out.append(http_request("/validate", make_review(patched, uid=f"bench-{copy}-{path.stem}-v")))
    finally:
        client.close()
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of ``pids`` and their child processes (``--workers``), from /proc."""
    return sum(_cpu_seconds(pid) for pid in pids)


def _cpu_seconds(pid: int) -> float:
    total = 0.0
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for p in (pid, *map(int, children)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def measure(port: int, ca: str, requests: list[bytes], concurrency: int, procs: int, seconds: float,
            warmup: float, server_pids: list[int]) -> dict[str, Any]:  # fmt: skip
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    nproc = max(1, min(procs, concurrency))
    shares = [concurrency // nproc + (1 if i < concurrency % nproc else 0) for i in range(nproc)]
    children = [
        ctx.Process(target=run_client, args=(port, ca, requests, share, i * 101, seconds, warmup, queue))
        for i, share in enumerate(shares)
    ]
    cpu_before = cpu_seconds(server_pids)
    for child in children:
        child.start()
    latencies: list[float] = []
    errors: list[str] = []
    answered = 0
    for _ in children:
        lat, err, count = queue.get(timeout=seconds + warmup + 60)
        latencies.extend(lat)
        errors.extend(err)
        answered += count
    cpu = cpu_seconds(server_pids) - cpu_before
    for child in children:
        child.join()
    latencies.sort()

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1000
            if latencies
            else float("nan")
        )

    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "rps": len(latencies) / seconds,
        "p50": pct(50),
        "p95": pct(95),
        "p99": pct(99),
        "mean": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        # The clients start and stop within the sampled window (warm-up requests included).
        "cpu_us": cpu / answered * 1e6 if answered else float("nan"),
    }


# ----------------------------------------------------------------------------------- the servers


def wait_port(port_file: Path, proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError("server did not start")


LOOPS = ("uvloop", "asyncio")


def interpreter(python: str) -> str:
    """Which CPython runs the servers: its version, its real path, and whether it loads libpython as
    a shared library. The figures depend on it: this machine's pyenv build (``--enable-shared``,
    no PGO or LTO) costs 11–25 % more CPU per review than Debian's ``/usr/bin/python3.11``,
    the interpreter the image ships (built with PGO and LTO, libpython linked in)."""
    probe = (
        "import os, sys; maps = open('/proc/self/maps').read(); "
        "print(sys.version.split()[0], os.path.realpath(sys.executable), "
        "'libpython shared' if 'libpython3' in maps else 'libpython linked in')"
    )
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    version, path, linkage = done.stdout.strip().split(" ", 2)
    return f"Python {version} at {path} ({linkage})"


def split_target(target: str, default_loop: str) -> tuple[str, str]:
    """``noop@asyncio`` -> ("noop", "asyncio"); a target without ``@`` runs on ``default_loop``
    (the baseline targets: on asyncio, as the other checkout runs them)."""
    name, _, loop = target.partition("@")
    if not loop:
        loop = "asyncio" if name.startswith("baseline") else default_loop
    if loop not in LOOPS:
        raise SystemExit(f"{target}: the loop after @ must be one of {', '.join(LOOPS)}")
    return name, loop


def start_baseline(
    tmp: Path, target: str, cert: Path, key: Path, count: int, python: str, loop: str = "asyncio"
) -> list[tuple[subprocess.Popen[bytes], int]]:
    """``count`` processes of the no-op or shell server on one port (the first picks it)."""
    started: list[tuple[subprocess.Popen[bytes], int]] = []
    port = 0
    name = target.partition("@")[0]
    server = "shell" if name.endswith("shell") else name
    for i in range(count):
        port_file = tmp / f"{target}-{i}.port"
        argv = [python, __file__, f"--{server}-server", str(port_file), str(cert), str(key), str(port), loop]
        with (tmp / f"{target}-{i}.log").open("wb") as log:
            proc: subprocess.Popen[bytes] = subprocess.Popen(argv, stderr=log)
        port = wait_port(port_file, proc)
        started.append((proc, port))
    return started


def start_mpigate(
    tmp: Path,
    cert: Path,
    key: Path,
    audit: bool,
    workers: int = 1,
    python: str = sys.executable,
    extra: list[str] | tuple[str, ...] = (),
    loop: str | None = None,
) -> tuple[subprocess.Popen[bytes], int, bool | None]:
    """``mpigate serve`` (with ``--loop loop`` unless None: a baseline checkout may not know it);
    returns the process, its port and whether its build is compiled (from its ``starting``
    record; None when it does not say)."""
    log_path = tmp / f"mpigate{'-audit' if audit else ''}{'-' + loop if loop else ''}.log"
    args = [
        python, "-m", "mpigate", "serve", "--config", str(REPO), "--tls-cert", str(cert),
        "--tls-key", str(key), "--host", "127.0.0.1", "--port", "0", "--no-live",
        "--workers", str(workers),
    ]  # fmt: skip
    if audit:
        keyfile = tmp / "audit.key"
        keyfile.write_bytes(generate_key("ed25519")[0])  # the example org signs with ed25519
        args += ["--audit-dir", str(tmp / "audit"), "--audit-key", str(keyfile)]
    if loop is not None:
        args += ["--loop", loop]
    args += list(extra)
    with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(args, stderr=log, stdout=subprocess.DEVNULL)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        text = log_path.read_text(errors="replace")
        lines = text.splitlines()
        for line in lines:
            if '"event":"listening"' in line:
                starting = [json.loads(s) for s in lines if '"event":"starting"' in s]
                compiled = starting[0].get("compiled") if starting else None
                return proc, int(json.loads(line)["port"]), compiled
        if proc.poll() is not None:
            raise RuntimeError(f"mpigate exited with {proc.returncode}: {text[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError("mpigate did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per level")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", default="1,10,50")
    parser.add_argument("--client-procs", type=int, default=2, help="load generator processes")
    parser.add_argument("--targets", default="noop,shell,mpigate,mpigate+audit")
    parser.add_argument("--workers", type=int, default=1, help="mpigate serve --workers (processes)")
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default="uvloop",
        help="event loop of this checkout's servers (the no-op's too); a target@loop overrides it",
    )
    parser.add_argument(
        "--baseline",
        metavar="PYTHON",
        help="also run mpigate (target 'baseline') with this interpreter, e.g. another checkout's venv",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter that runs the servers (e.g. .venv-compiled/bin/python for the compiled build)",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    targets = args.targets.split(",")
    if args.baseline and "baseline" not in targets:
        targets.insert(targets.index("mpigate") if "mpigate" in targets else len(targets), "baseline")
    if args.baseline and "shell" in targets and "baseline-shell" not in targets:
        targets.insert(targets.index("shell"), "baseline-shell")

    tmp = Path(tempfile.mkdtemp(prefix="mpigate-bench-"))
    issued = issue_certificates(tmp / "certs", service="bench", namespace="bench", extra_names=("localhost",))
    ca = str(issued.ca_cert)
    results: dict[str, list[dict[str, Any]]] = {}
    requests: list[bytes] | None = None
    builds: dict[str, str] = {}  # the mpigate build each mpigate target ran (from its startup log)
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; {args.seconds:g} s per level "
          f"after {args.warmup:g} s warm-up; {args.client_procs} client processes; "
          f"mpigate serve --workers {args.workers}; servers run by {args.python} on {args.loop} "
          "(baseline targets: asyncio)")  # fmt: skip
    print(f"servers' interpreter: {interpreter(args.python)}")
    if args.baseline:
        print(f"baseline's interpreter: {interpreter(args.baseline)}")
    try:
        for target in targets:
            name, loop = split_target(target, args.loop)
            if name in ("noop", "raw", "shell", "baseline-shell"):
                # The no-op runs as many processes as mpigate has workers (the shell: one).
                count = args.workers if name in ("noop", "raw") else 1
                python = args.baseline if name == "baseline-shell" else args.python
                procs = start_baseline(tmp, target, issued.tls_cert, issued.tls_key, count, python, loop)
                proc, port = procs[0]
                extra = [p for p, _ in procs[1:]]
            else:
                extra = []
                proc, port, compiled = start_mpigate(
                    tmp,
                    issued.tls_cert,
                    issued.tls_key,
                    audit=name.endswith("audit"),
                    workers=args.workers,
                    python=args.baseline if name == "baseline" else args.python,
                    loop=None if name == "baseline" else loop,
                )
                if compiled is not None and target not in builds:
                    builds[target] = "compiled" if compiled else "pure Python"
            try:
                if requests is None:
                    if name in ("noop", "raw", "shell", "baseline-shell"):  # prepared through mpigate itself
                        helper, hport, _ = start_mpigate(tmp, issued.tls_cert, issued.tls_key, audit=False)
                        requests = prepare_requests(f"https://localhost:{hport}", ca)
                        helper.send_signal(signal.SIGTERM)
                        helper.wait(30)
                    else:
                        requests = prepare_requests(f"https://localhost:{port}", ca)
                    print(f"load: {len(requests)} requests (/mutate + /validate of "
                          f"{len(requests) // 2} TrainJobs: the examples in copies with their own uid "
                          "and name), cycled")  # fmt: skip
                pids = [proc.pid, *(p.pid for p in extra)]
                results[target] = [
                    measure(port, ca, requests, c, args.client_procs, args.seconds, args.warmup, pids)
                    for c in levels
                ]
            finally:
                for server in (proc, *extra):
                    server.send_signal(signal.SIGTERM)
                    server.wait(30)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    head = f"{'target':<16} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'errors':>7}"
    print(f"{head} {'server CPU µs/req':>18}")
    for target, rows in results.items():
        for row in rows:
            figures = f"{row['rps']:>8.0f} {row['p50']:>8.2f} {row['p95']:>8.2f} {row['p99']:>8.2f}"
            print(f"{target:<16} {row['concurrency']:>4} {figures} {row['errors']:>7} {row['cpu_us']:>18.0f}")
            if row["first_error"]:
                print(f"{'':<16} first error: {row['first_error']}")
    if builds:
        print("mpigate build: " + ", ".join(f"{target} {build}" for target, build in builds.items()))
    averages = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"load average after the run: {averages} (other processes share the CPUs: compare runs at low load)"
    )
    if "baseline" in results and "mpigate" in results:
        print()
        for before, after in zip(results["baseline"], results["mpigate"], strict=True):
            print(
                f"server CPU per review at c={after['concurrency']}: {after['cpu_us']:.0f} µs "
                f"(baseline {before['cpu_us']:.0f} µs, {after['cpu_us'] / before['cpu_us'] - 1:+.0%}); "
                f"goal <= 300 µs: {'met' if after['cpu_us'] <= 300 else 'NOT met'}"
            )
    if "baseline-shell" in results and "shell" in results:
        for before, after in zip(results["baseline-shell"], results["shell"], strict=True):
            print(
                f"the HTTP path (shell) at c={after['concurrency']}: {after['cpu_us']:.0f} µs "
                f"(baseline {before['cpu_us']:.0f} µs, {after['cpu_us'] / before['cpu_us'] - 1:+.0%})"
            )
    pairs = [
        (t, f"{t.split('@')[0]}@asyncio") for t in results if "@" not in t and not t.startswith("baseline")
    ]
    pairs = [(t, other) for t, other in pairs if other in results and args.loop == "uvloop"]
    if pairs:
        print()
        for target, other in pairs:
            for fast, slow in zip(results[target], results[other], strict=True):
                print(
                    f"{target} at c={fast['concurrency']}: {fast['cpu_us']:.0f} µs on uvloop, "
                    f"{slow['cpu_us']:.0f} µs on asyncio ({fast['cpu_us'] / slow['cpu_us'] - 1:+.0%})"
                )
    if "noop" in results and "mpigate" in results:
        print()
        print("goals:")
        errors = sum(r["errors"] for rows in results.values() for r in rows)
        print(f"  zero errors:                           {'met' if errors == 0 else 'NOT met'} ({errors})")
        by_c = {r["concurrency"]: r for r in results["mpigate"]}
        noop_c = {r["concurrency"]: r for r in results["noop"]}
        if 10 in by_c:
            p99 = by_c[10]["p99"]
            print(
                f"  p99 <= 15 ms at concurrency 10:        {'met' if p99 <= 15 else 'NOT met'} ({p99:.2f} ms)"
            )
        for c in levels:
            ratio = by_c[c]["rps"] / noop_c[c]["rps"] if noop_c[c]["rps"] else float("nan")
            verdict = "met" if ratio >= 0.5 else "NOT met"
            print(f"  throughput >= 50% of no-op at c={c:<3}:   {verdict} ({ratio:.0%})")
        if "shell" in results:
            shell_c = {r["concurrency"]: r for r in results["shell"]}
            print()
            print("where the server's CPU goes per request (µs; c = concurrency):")
            for c in levels:
                floor, shell, full = noop_c[c]["cpu_us"], shell_c[c]["cpu_us"], by_c[c]["cpu_us"]
                print(
                    f"  c={c:<3} no-op {floor:4.0f} | mpigate's HTTP path +{shell - floor:4.0f} | "
                    f"policy engine +{full - shell:4.0f} | total {full:4.0f} "
                    f"(the shell alone reaches {shell_c[c]['rps'] / noop_c[c]['rps']:.0%} of the no-op)"
                )


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--noop-server":
        run_noop(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
    elif len(sys.argv) == 7 and sys.argv[1] == "--raw-server":
        run_raw(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
    elif len(sys.argv) == 7 and sys.argv[1] == "--shell-server":
        run_shell(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[6])
    else:
        main()
