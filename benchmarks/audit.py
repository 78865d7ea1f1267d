"""Audit trail benchmark: durable appends with group commit vs. one fsync per record, and
verification throughput on a large log.

    .venv/bin/python benchmarks/audit.py [--seconds 3] [--records 1000000] [--dir DIR]

Appends go through the asyncio API the webhook uses (N concurrent tasks, each appending in a
loop and waiting for durability). Goals: >= 5,000 durable records/s at 50 writers; verify
>= 100,000 records/s. The directory defaults to a temporary one on the same file system as the
repository (fsync cost depends on the disk: run it where the audit volume would live).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mpigate.audit import AsyncAuditLog, AuditLog, HmacSigner, WriterOptions
from mpigate.audit.reader import verify_chain

SECRET = b"benchmark-secret-0123456789abcdef"
ENTRY = {
    "source": "webhook",
    "stage": "validate",
    "request": {
        "uid": "6f0c5a8e-1d1b-4c7e-9a55-0b9d8e6f1a2b",
        "operation": "CREATE",
        "dryRun": False,
        "user": {"username": "maria", "groups": ["nlp-team-scientists", "system:authenticated"]},
    },
    "object": {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "namespace": "nlp-team",
        "name": "llm-ft",
    },
    "team": "nlp-team",
    "decision": "denied",
    "violations": [
        {
            "id": "MPG-Q001",
            "mode": "enforce",
            "path": "spec.trainer.numNodes",
            "message": "the job asks for 32 GPUs; nlp-team may use at most 16 (nominal 16)",
            "controls": ["SOC2-CC6.1"],
        }
    ],
    "warnings": [],
    "message": "denied by MPG-Q001",
    "exceptions": [],
    "patch": [],
    "revision": "9fb03e4c1d2a",
    "demand": {"gpus": 32, "pods": 4, "region": "eu"},
}


async def _run_writers(
    directory: Path, writers: int, seconds: float, group_commit: bool
) -> tuple[int, list[float]]:
    log = await AsyncAuditLog.open(
        directory,
        chain=f"bench-{writers}-{'group' if group_commit else 'single'}",
        signer=HmacSigner(SECRET),
        options=WriterOptions(group_commit=group_commit),
    )
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def writer() -> None:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            await log.append(ENTRY)
            latencies.append(time.perf_counter() - started)

    started = time.monotonic()
    await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.monotonic() - started
    await log.aclose()
    return int(len(latencies) / elapsed), latencies


def _p99(latencies: list[float]) -> float:
    return (
        statistics.quantiles(latencies, n=100)[98] * 1000 if len(latencies) >= 100 else max(latencies) * 1000
    )


def bench_appends(root: Path, seconds: float) -> None:
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print(f"durable appends ({seconds:g} s per run, asyncio API, one record ~{len(str(ENTRY))} bytes)")
    head = f"{'group commit rec/s':>18} {'p99 ms':>8} | {'fsync per record rec/s':>22} {'p99 ms':>8}"
    print(f"{'writers':>8} | {head}")
    for writers in (1, 10, 50):
        group_rate, group_lat = asyncio.run(_run_writers(root, writers, seconds, True))
        single_rate, single_lat = asyncio.run(_run_writers(root, writers, seconds, False))
        group = f"{group_rate:>18,} {_p99(group_lat):>8.2f}"
        print(f"{writers:>8} | {group} | {single_rate:>22,} {_p99(single_lat):>8.2f}")


def bench_verify(root: Path, records: int) -> None:
    chain = "bench-verify"
    started = time.monotonic()
    log = AuditLog.open(root, chain=chain, signer=HmacSigner(SECRET))
    pending = []
    for i in range(records):
        pending.append(log.submit({**ENTRY, "i": i}))
        if len(pending) >= 20_000:
            for future in pending:
                future.result()
            pending.clear()
    for future in pending:
        future.result()
    log.close()
    written = time.monotonic() - started
    size = sum(p.stat().st_size for p in (root / chain).glob("*.jsonl"))
    print(
        f"\nverify: wrote {records:,} records ({size / 2**20:,.0f} MiB) in {written:.1f} s "
        f"({records / written:,.0f} rec/s with submit-without-waiting)"
    )
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    key_file = root / "key"
    key_file.write_bytes(SECRET)
    from mpigate.audit import KeyRing

    keys = KeyRing.load([key_file])
    # best of two runs: the figure should not depend on what else the machine does meanwhile
    elapsed = float("inf")
    for _ in range(2):
        started = time.monotonic()
        report = verify_chain(root / chain, keys)
        elapsed = min(elapsed, time.monotonic() - started)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # baseline in the same run: only reading and splitting the lines (the I/O floor)
    started = time.monotonic()
    lines = 0
    for segment in sorted((root / chain).glob("*.jsonl")):
        with segment.open("rb") as fh:
            for _ in fh:
                lines += 1
    floor = time.monotonic() - started
    print(
        f"verify: {report.records:,} records, {report.segments} segment(s), ok={report.ok}, "
        f"signatures={report.signatures}"
    )
    print(
        f"verify: {report.records / elapsed:,.0f} records/s ({elapsed:.1f} s, load average "
        f"{os.getloadavg()[0]:.1f}); reading lines alone: "
        f"{lines / floor:,.0f} lines/s; peak RSS grew by {(rss_after - rss_before) / 1024:,.1f} MiB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir under build/)"
    )
    parser.add_argument("--skip-verify", action="store_true")
    parser.add_argument("--skip-appends", action="store_true")
    args = parser.parse_args()
    base = args.dir or Path(__file__).resolve().parents[1] / "build"
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="audit-bench-", dir=base))
    try:
        if not args.skip_appends:
            bench_appends(root, args.seconds)
        if not args.skip_verify:
            bench_verify(root, args.records)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
