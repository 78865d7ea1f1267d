"""Audit trail benchmark: durable appends with group commit vs. one fsync per record, what
checkpoint cadence and signing method cost, and verification throughput on a large log.

    .venv/bin/python benchmarks/audit.py [--seconds 3] [--records 1000000] [--dir DIR]
        [--skip-appends] [--skip-checkpoints] [--skip-verify]

Appends go through the asyncio API the webhook uses (N concurrent tasks, each appending in a
loop and waiting for durability). Goals: >= 5,000 durable records/s at 50 writers; verify
>= 100,000 records/s. The checkpoint part runs the same load with checkpoints every 1000 / 100 /
10 / 1 records (HMAC and Ed25519), and a paced load (one record every 20 ms, as a quiet webhook)
with checkpointInterval 10 s / 1 s / 0.1 s, and reports the checkpoints' share of records and
bytes and the longest time a record waited for its signature (the unverifiable window). The
directory defaults to a temporary one on the same file system as the repository (fsync cost
depends on the disk: run it where the audit volume would live).
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

from mpigate.audit import AsyncAuditLog, AuditLog, Ed25519Signer, HmacSigner, Signer, WriterOptions
from mpigate.audit.reader import ChainReader, verify_chain

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
    directory: Path,
    writers: int,
    seconds: float,
    group_commit: bool,
    *,
    chain: str | None = None,
    signer: Signer | None = None,
    options: WriterOptions | None = None,
    pace: float = 0.0,
) -> tuple[int, list[float]]:
    log = await AsyncAuditLog.open(
        directory,
        chain=chain or f"bench-{writers}-{'group' if group_commit else 'single'}",
        signer=signer or HmacSigner(SECRET),
        options=options or WriterOptions(group_commit=group_commit),
    )
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def writer() -> None:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            await log.append(ENTRY)
            latencies.append(time.perf_counter() - started)
            if pace:
                await asyncio.sleep(pace)

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


def _checkpoint_share(chain_dir: Path) -> tuple[float, float, float]:
    """Checkpoints' share of the records and bytes, and the longest a record waited for the
    checkpoint that signed it (seconds, from the records' own times)."""
    records = checkpoints = 0
    size = checkpoint_bytes = 0
    waiting_since: float | None = None
    longest = 0.0
    for entry in ChainReader(chain_dir):
        records += 1
        size += len(entry.raw) + 1
        moment = (
            time.mktime(time.strptime(entry.time[:19], "%Y-%m-%dT%H:%M:%S")) + int(entry.time[20:23]) / 1000
        )
        if entry.stage == "checkpoint":
            checkpoints += 1
            checkpoint_bytes += len(entry.raw) + 1
            if waiting_since is not None:
                longest = max(longest, moment - waiting_since)
            waiting_since = None
        elif waiting_since is None:
            waiting_since = moment
    return checkpoints / records, checkpoint_bytes / size, longest


def bench_checkpoints(root: Path, seconds: float) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    hmac_signer: Signer = HmacSigner(SECRET)
    ed_signer: Signer = Ed25519Signer(Ed25519PrivateKey.generate())
    sample = b"x" * 400  # a checkpoint record's canonical bytes are ~400
    for name, signer in (("hmac-sha256", hmac_signer), ("ed25519", ed_signer)):
        rounds = 2000
        started = time.perf_counter()
        for _ in range(rounds):
            signer.sign(sample)
        print(f"\nsigning one checkpoint, {name}: {(time.perf_counter() - started) / rounds * 1e6:,.0f} µs")
    print(f"\ncheckpoint cadence, 10 concurrent writers ({seconds:g} s per run)")
    columns = f"{'rec/s':>8} {'p99 ms':>7} | {'checkpoints':>11} {'bytes':>6} | {'longest wait s':>14}"
    print(f"{'signer':>12} {'every':>6} | {columns}")
    for name, signer, every in (
        ("hmac-sha256", hmac_signer, 1000),
        ("ed25519", ed_signer, 1000),
        ("ed25519", ed_signer, 100),
        ("ed25519", ed_signer, 10),
        ("ed25519", ed_signer, 1),
    ):
        chain = f"cadence-{name}-{every}"
        rate, latencies = asyncio.run(
            _run_writers(
                root,
                10,
                seconds,
                True,
                chain=chain,
                signer=signer,
                options=WriterOptions(checkpoint_every=every),
            )
        )
        share, byte_share, longest = _checkpoint_share(root / chain)
        figures = f"{rate:>8,} {_p99(latencies):>7.2f} | {share:>10.1%} {byte_share:>6.1%}"
        print(f"{name:>12} {every:>6} | {figures} | {longest:>14.2f}")
    paced = max(seconds, 3)
    print(f"\ncheckpoint interval, one writer pacing a record every 20 ms ({paced:g} s per run, ed25519)")
    print(f"{'interval s':>10} | {'records':>8} | {'checkpoints':>11} {'bytes':>6} | {'longest wait s':>14}")
    for interval in (10.0, 1.0, 0.1):
        chain = f"interval-{interval:g}"
        options = WriterOptions(checkpoint_interval_seconds=interval)
        _, latencies = asyncio.run(
            _run_writers(
                root, 1, max(seconds, 3), True, chain=chain, signer=ed_signer, options=options, pace=0.02
            )
        )
        share, byte_share, longest = _checkpoint_share(root / chain)
        print(
            f"{interval:>10g} | {len(latencies):>8,} | {share:>10.1%} {byte_share:>6.1%} | {longest:>14.2f}"
        )


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
    parser.add_argument("--skip-checkpoints", action="store_true")
    args = parser.parse_args()
    base = args.dir or Path(__file__).resolve().parents[1] / "build"
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="audit-bench-", dir=base))
    try:
        if not args.skip_appends:
            bench_appends(root, args.seconds)
        if not args.skip_checkpoints:
            bench_checkpoints(root, args.seconds)
        if not args.skip_verify:
            bench_verify(root, args.records)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
