"""Slow TLS clients against ``mpigate serve``, next to a probe that sends valid reviews.

Issue 23, item 3: slowloris-style clients (TLS handshake, then request headers or a body a few
bytes at a time, reconnecting at once when cut off) must not take admission down. Two phases in
one run, against one server: a **baseline** (the probe alone) and **under attack** (``--clients``
slow clients held for ``--seconds``). The probe opens a new TLS connection for every review (the
worst case: it has to get through the accept path the slow clients crowd) and counts a review
that takes longer than the API server's webhook timeout (10 s) as missed.

Printed per phase: probe reviews, misses, p50/p99/max latency; the server's peak RSS against the
install base's memory limit; the bytes it logged (and lines with a traceback); connections
refused and timed out (from /metrics); slow connections held at the end and cut off by the
server; the CPU seconds of the server and of the slow clients, and the machine's load average.

    .venv/bin/python benchmarks/slow_clients.py [--clients 3000] [--seconds 90] [--mode mixed]
        [--per-address 100 | --one-address] [--baseline-seconds 15] [--processes 2]
        [--attacker-nice 0] [--python .venv-compiled/bin/python] [--loop uvloop|asyncio]
        [--server-args --max-connections 1024 ...]

The slow clients model other machines, so they are cheap here: ``--processes`` processes, each
a selector loop over non-blocking sockets with one small state machine per client and the ssl
module's own (C) handshake — no task, thread or Python TLS layer per client — and they verify
no certificate. ``--attacker-nice N`` runs them at niceness N (19: they take only CPU the server
leaves; 0: they compete with it for the same cores, the hardest case on one machine).
The server's certificate is the one ``mpigate certs`` issues (ECDSA P-256, as the install guide's).

``--per-address`` spreads the slow clients over source addresses 127.0.x.y (all of 127/8 is
loopback), as a hostile tenant's pods would; the probe comes from 127.0.0.1, as the API server
comes from its own address. ``--one-address`` puts every slow client on the probe's address
(127.0.0.1): the server can then tell the API server from the attackers only by how they behave.
The server runs with the install base's arguments (``webhooks/base/webhook.yaml``: no connection
flags, so the defaults) unless ``--server-args`` adds some, and its peak RSS is compared with the
memory limit of the install base's webhook container, read from that file. The benchmark raises
its own open-file limit to fit the clients (the server raises its own).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import multiprocessing as mp
import os
import random
import re
import resource
import selectors
import socket
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from webhook_load import LOOPS, REPO, http_request, start_mpigate

from mpigate.admission.certs import issue_certificates
from mpigate.admission.client import make_review

WEBHOOK_TIMEOUT = 10.0  # the API server's default and maximum webhook timeoutSeconds
INSTALL_BASE = REPO / "webhooks" / "base" / "webhook.yaml"
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9, "": 1}


def memory_limit(path: Path = INSTALL_BASE) -> int:
    """The memory limit (bytes) of the webhook container in the install base."""
    import yaml

    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if not doc or doc.get("kind") not in ("StatefulSet", "Deployment"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "webhook":
                value = str(container["resources"]["limits"]["memory"])
                number, unit = re.fullmatch(r"(\d+)([KMG]i?)?", value).groups()  # type: ignore[union-attr]
                return int(number) * _UNITS[unit or ""]
    raise SystemExit(f"{path}: no webhook container with a memory limit")


@dataclass
class Phase:
    name: str
    latencies: list[float] = field(default_factory=list)
    misses: int = 0
    errors: list[str] = field(default_factory=list)
    peak_rss: int = 0
    server_cpu: float = 0.0  # CPU seconds the server used during the phase
    load: float = 0.0  # the machine's 1-minute load average at the end
    tracebacks: int = 0  # log lines of the phase that carry a traceback
    log_bytes: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    held_at_end: int = 0
    attacker_cpu: float = 0.0  # CPU seconds the slow clients' processes used
    cut: int = 0  # slow connections the server closed (each reconnected at once)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def source_address(index: int, per_address: int) -> str:
    if per_address == 0:  # --one-address: the probe's
        return "127.0.0.1"
    n = index // per_address
    return f"127.0.{1 + n // 250}.{1 + n % 250}"


class SlowClient:
    """One slow client: connect, then (unless it only holds TCP) a TLS handshake and a request
    dribbled a few bytes a second; whenever the server cuts it off it reconnects at once. A state
    machine on a non-blocking socket, driven by its process's selector: no task, no Python TLS
    layer (the ssl module's C handshake), so a process can hold thousands at little CPU, as the
    other machines of a real attack would."""

    __slots__ = ("held", "index", "kind", "sock", "source", "tls", "world")

    def __init__(self, world: Attack, index: int) -> None:
        self.world = world
        self.index = index
        self.source = source_address(index, world.per_address)
        self.kind = world.mode if world.mode != "mixed" else ("handshake", "headers", "body")[index % 3]
        self.sock: socket.socket | None = None
        self.tls: ssl.SSLSocket | None = None
        self.held = False

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.bind((self.source, 0))
            sock.connect_ex(("127.0.0.1", self.world.port))
        except OSError:
            sock.close()
            self.world.retry(self)
            return
        self.sock = sock
        self.world.sel.register(sock, selectors.EVENT_WRITE, self._connected)

    def _connected(self) -> None:
        assert self.sock is not None
        if self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self._fail()
            return
        if self.kind == "handshake":  # TCP only: never sends a ClientHello
            self._hold()
            return
        self.tls = self.world.ctx.wrap_socket(self.sock, do_handshake_on_connect=False)
        self.world.sel.modify(self.tls, selectors.EVENT_WRITE, self._handshake)
        self._handshake()

    def _handshake(self) -> None:
        assert self.tls is not None
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            self.world.sel.modify(self.tls, selectors.EVENT_READ, self._handshake)
            return
        except ssl.SSLWantWriteError:
            self.world.sel.modify(self.tls, selectors.EVENT_WRITE, self._handshake)
            return
        except (OSError, ValueError):
            self._fail()
            return
        first = _HEADERS if self.kind == "headers" else _BODY
        if self._send(first):
            self._hold()

    def _hold(self) -> None:
        conn = self.tls or self.sock
        assert conn is not None
        self.world.sel.modify(conn, selectors.EVENT_READ, self._readable)
        self.held = True
        self.world.held += 1
        if self.kind != "handshake":
            self.world.dribbling.add(self)

    def _readable(self) -> None:
        """Whatever the server sends (a 408) is read and dropped; its close ends the connection."""
        conn = self.tls or self.sock
        assert conn is not None
        try:
            while conn.recv(65536):
                pass
        except (ssl.SSLWantReadError, BlockingIOError):
            return
        except (OSError, ValueError):
            pass
        self._cut(again=True)

    def dribble(self) -> None:
        self._send(b"X-Slow: 1\r\n" if self.kind == "headers" else b" ")

    def _send(self, data: bytes) -> bool:
        assert self.tls is not None
        try:
            self.tls.send(data)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            pass  # the server reads nothing: the data waits in the kernel's buffers
        except (OSError, ValueError):
            self._cut(again=True)
            return False
        return True

    def _fail(self) -> None:
        self._cut(again=False)

    def _cut(self, *, again: bool) -> None:
        """The server closed the connection (``again``: reconnect at once) or it failed
        (retry shortly)."""
        conn = self.tls or self.sock
        if conn is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.world.sel.unregister(conn)
            conn.close()
        self.sock = self.tls = None
        if self.held:
            self.held = False
            self.world.held -= 1
            self.world.dribbling.discard(self)
        if again:
            self.world.cut += 1
            self.connect()
        else:
            self.world.retry(self)


_HEADERS = b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
_BODY = (
    b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100000\r\n\r\n{"
)


@dataclass
class Attack:
    """One attacker process's clients and what they share."""

    port: int
    mode: str
    per_address: int
    ctx: ssl.SSLContext
    sel: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    held: int = 0
    cut: int = 0
    dribbling: set[SlowClient] = field(default_factory=set)
    waiting: list[tuple[float, int, SlowClient]] = field(default_factory=list)

    def retry(self, client: SlowClient) -> None:
        heapq.heappush(self.waiting, (time.monotonic() + 0.2, client.index, client))

    def run(self, first: int, count: int, seconds: float, report: Any, slot: int) -> None:
        until = time.monotonic() + seconds
        for index in range(first, first + count):
            SlowClient(self, index).connect()
        tick = time.monotonic() + 1.0
        while (now := time.monotonic()) < until:
            wake = min(tick, until, self.waiting[0][0] if self.waiting else until)
            for key, _ in self.sel.select(max(0.0, wake - now)):
                key.data()
            now = time.monotonic()
            while self.waiting and self.waiting[0][0] <= now:
                heapq.heappop(self.waiting)[2].connect()
            if now >= tick:
                for client in list(self.dribbling):
                    client.dribble()
                tick = now + 1.0
                report.held[slot] = self.held
        report.held[slot] = self.held
        report.cut[slot] = self.cut
        usage = resource.getrusage(resource.RUSAGE_SELF)
        report.cpu[slot] = usage.ru_utime + usage.ru_stime


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (proc(5): fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def attackers(
    first: int,
    count: int,
    port: int,
    mode: str,
    per_address: int,
    seconds: float,
    report: Any,
    slot: int,
    nice: int,
) -> None:
    """One process of slow clients (its own selector loop: the probe's latency is not theirs)."""
    os.nice(nice)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # an attacker does not care whom it talks to
    ctx.verify_mode = ssl.CERT_NONE
    Attack(port, mode, per_address, ctx).run(first, count, seconds, report, slot)


async def probe(port: int, ctx: ssl.SSLContext, requests: list[bytes], until: float, phase: Phase) -> None:
    while time.monotonic() < until:
        request = random.choice(requests)
        started = time.monotonic()
        try:
            async with asyncio.timeout(WEBHOOK_TIMEOUT):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1", local_addr=("127.0.0.1", 0)
                )
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"Content-Length: (\d+)", head, re.I)[1])  # type: ignore[index]
                await reader.readexactly(length)
                writer.close()
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                phase.errors.append(f"HTTP {status}")
            phase.latencies.append(time.monotonic() - started)
        except TimeoutError:
            phase.misses += 1
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            phase.errors.append(type(exc).__name__)
        await asyncio.sleep(0.2)


async def metrics(port: int, ctx: ssl.SSLContext) -> dict[str, float]:
    """The server's connection metrics (a few tries: with --one-address the request shares the
    slow clients' address and can be cut off like them)."""
    for _ in range(5):
        try:
            async with asyncio.timeout(WEBHOOK_TIMEOUT):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
                )
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                text = (await reader.read()).decode(errors="replace")
                writer.close()
        except (OSError, ssl.SSLError, TimeoutError):
            continue
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("mpigate_admission_connection") and "_created" not in line:
                name, _, value = line.rpartition(" ")
                found[name] = float(value)
        if found:
            return found
    return {}


async def run_phase(
    name: str,
    pid: int,
    log: Path,
    port: int,
    ctx: ssl.SSLContext,
    requests: list[bytes],
    args: argparse.Namespace,
    clients: int,
    seconds: float,
) -> Phase:
    phase = Phase(name)
    log_start = log.stat().st_size
    share = -(-clients // args.processes) if clients else 0
    firsts = list(range(0, clients, share)) if clients else []
    # per attacker process: connections held now, connections the server cut, its CPU seconds
    report = argparse.Namespace(
        held=mp.Array("i", len(firsts), lock=False),
        cut=mp.Array("i", len(firsts), lock=False),
        cpu=mp.Array("d", len(firsts), lock=False),
    )
    procs = [
        mp.Process(
            target=attackers,
            args=(
                first,
                min(share, clients - first),
                port,
                args.mode,
                args.per_address,
                seconds,
                report,
                slot,
                args.attacker_nice,
            ),
        )
        for slot, first in enumerate(firsts)
    ]
    for proc in procs:
        proc.start()
    until = time.monotonic() + seconds
    cpu_start = cpu_seconds(pid)
    probing = asyncio.create_task(probe(port, ctx, requests, until, phase))
    while time.monotonic() < until:
        phase.peak_rss = max(phase.peak_rss, rss(pid))
        await asyncio.sleep(0.5)
    phase.held_at_end = sum(report.held)
    phase.server_cpu = cpu_seconds(pid) - cpu_start
    phase.load = os.getloadavg()[0]
    phase.metrics = await metrics(port, ctx)
    await probing
    for proc in procs:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    phase.attacker_cpu = sum(report.cpu)
    phase.cut = sum(report.cut)
    phase.log_bytes = log.stat().st_size - log_start
    with log.open("rb") as lines:
        lines.seek(log_start)
        phase.tracebacks = sum(b'"exc":' in line for line in lines)
    return phase


def report(phase: Phase, baseline: Phase | None) -> None:
    lat = sorted(phase.latencies)
    p = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000) if lat else (lambda q: float("nan"))
    print(f"\n== {phase.name}")
    print(
        f"probe: {len(lat)} answered, {phase.misses} over {WEBHOOK_TIMEOUT:.0f} s, {len(phase.errors)} errors"
        f" {sorted(set(phase.errors))[:5]}"
    )
    print(f"probe latency ms: p50 {p(0.5):.1f}  p99 {p(0.99):.1f}  max {p(1.0):.1f}")
    if lat:
        print(f"  (mean {statistics.mean(lat) * 1000:.1f})")
    limit = memory_limit()
    print(
        f"server RSS peak {phase.peak_rss / 2**20:.0f} MiB (install base limit {limit / 2**20:.0f} MiB: "
        f"{'ok' if phase.peak_rss < limit else 'OVER'}); logged {phase.log_bytes} bytes"
        f" ({phase.tracebacks} lines with a traceback)"
    )
    print(f"slow connections held at the end: {phase.held_at_end}; cut off by the server: {phase.cut}")
    print(
        f"CPU in the phase: server {phase.server_cpu:.1f} s, slow clients {phase.attacker_cpu:.1f} s;"
        f" machine load average (1 min) {phase.load:.1f}"
    )
    for name, value in sorted(phase.metrics.items()):
        before = baseline.metrics.get(name, 0.0) if baseline else 0.0
        print(f"  {name} {value - before:g}" if "total" in name else f"  {name} {value:g}")


async def main_async(args: argparse.Namespace) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.clients + 1024
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    tmp = Path(tempfile.mkdtemp(prefix="mpigate-slow-"))
    # the serving certificate of the install guide (`mpigate certs`: ECDSA P-256)
    issued = issue_certificates(tmp / "certs", service="bench", namespace="bench", extra_names=("127.0.0.1",))
    ctx = ssl.create_default_context(cafile=str(issued.ca_cert))
    proc, port, _ = start_mpigate(
        tmp, issued.tls_cert, issued.tls_key, audit=True, python=args.python, extra=args.server_args,
        loop=args.loop,
    )  # fmt: skip
    log = tmp / f"mpigate-audit-{args.loop}.log"
    try:
        job = json.loads(json.dumps(__import__("yaml").safe_load(
            (REPO / "examples" / "trainjobs" / "llm-finetune.yaml").read_text())))  # fmt: skip
        requests = [http_request("/validate", make_review(job, uid=f"probe-{i}")) for i in range(50)]
        baseline = await run_phase("baseline (probe only)", proc.pid, log, port, ctx, requests, args, 0,
                                   args.baseline_seconds)  # fmt: skip
        spread = "all on the probe's address" if args.one_address else f"{args.per_address} per address"
        attacked = await run_phase(
            f"under attack ({args.clients} slow {args.mode} clients, {spread}, {args.seconds:g} s)",
            proc.pid, log, port, ctx, requests, args, args.clients, args.seconds,
        )  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(60)
    print(f"server: mpigate serve --loop {args.loop} {' '.join(args.server_args)}".rstrip())
    report(baseline, None)
    report(attacked, baseline)
    if attacked.held_at_end:
        # what a held connection costs: the peak's growth over the baseline's, per connection held
        grown = attacked.peak_rss - baseline.peak_rss
        per = grown / attacked.held_at_end / 1024
        print(f"RSS above the baseline per slow connection held at the end: {per:.0f} KiB")
    lat = sorted(attacked.latencies)
    ok = attacked.misses == 0 and not attacked.errors and attacked.peak_rss < memory_limit()
    ok = ok and attacked.tracebacks == 0
    ok = ok and bool(lat) and lat[min(len(lat) - 1, int(0.99 * len(lat)))] < WEBHOOK_TIMEOUT
    print(f"\ngoal (every probe answered within {WEBHOOK_TIMEOUT:.0f} s, RSS under the limit): "
          f"{'met' if ok else 'NOT met'}")  # fmt: skip
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--baseline-seconds", type=float, default=15.0)
    parser.add_argument("--mode", choices=["handshake", "headers", "body", "mixed"], default="mixed")
    parser.add_argument("--per-address", type=int, default=100, help="Slow clients per source address.")
    parser.add_argument(
        "--one-address", action="store_true", help="Every slow client on the probe's address (127.0.0.1)."
    )
    parser.add_argument("--processes", type=int, default=2, help="Processes running the slow clients.")
    parser.add_argument(
        "--attacker-nice",
        type=int,
        default=0,
        help="Niceness of the slow clients' processes (in a cluster they run on other machines).",
    )
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--loop", choices=LOOPS, default="uvloop", help="mpigate serve --loop")
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], help="Extra serve flags.")
    args = parser.parse_args()
    if args.one_address:
        args.per_address = 0
    elif args.per_address < 1:
        parser.error("--per-address must be at least 1")
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
