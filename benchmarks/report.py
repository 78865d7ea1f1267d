"""Compliance report benchmark: time and peak memory of `mpigate report` over 100,000 and
1,000,000 records, next to the time to merely read and parse the same files (the floor).

    .venv/bin/python benchmarks/report.py [--sizes 100000,1000000] [--dir DIR]

For each size it writes a realistic trail with the real writer (tests/report/sample.py: two webhook
chains, a controller chain, HMAC checkpoints, plus the matching API-server audit log), then
measures, each in a fresh interpreter so that peak RSS belongs to that measurement alone:

- parse: read every line of every segment and of the API-server log and parse it (orjson);
- report: build the report (chains verified while read, API-server log) and render it as HTML,
  with one worker per CPU (the default for large inputs) and in a single process.

Goals: the report costs at most 3x the parse floor; peak memory stays flat from 100,000 to
1,000,000 records. Times are the best of two runs; the load average is printed because the
figures depend on what else the machine does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SECRET = b"benchmark-secret-0123456789abcdef"
RECORDS_PER_JOB = 7.3  # what tests/report/sample.py writes per job, on average


def _measure(mode: str, root: Path, jobs: int) -> dict[str, float]:
    """Runs in the child process. Imports happen before the clock starts."""
    import orjson

    from mpigate.audit import KeyRing
    from mpigate.report import build_report, render

    started = time.perf_counter()
    if mode == "parse":
        lines = 0
        files = [*sorted((root / "audit").glob("*/*.jsonl")), root / "kube-apiserver-audit.log"]
        for path in files:
            with path.open("rb") as fh:
                for line in fh:
                    orjson.loads(line)
                    lines += 1
        count = float(lines)
    else:
        report = build_report(
            [root / "audit"],
            [root / "kube-apiserver-audit.log"],
            keys=KeyRing.load([root / "key"]),
            jobs=jobs,
        )
        html = render(report, "html")
        count = float(report["totals"]["recordsRead"])
        assert report["integrity"]["ok"], report["integrity"]
        assert len(html) > 10_000
    elapsed = time.perf_counter() - started
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"seconds": elapsed, "count": count, "rss_mib": own, "worker_rss_mib": children}


def _child(mode: str, root: Path, jobs: int) -> dict[str, float]:
    command = [sys.executable, __file__, "--measure", mode, "--dir", str(root), "--jobs", str(jobs)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def _best(mode: str, root: Path, jobs: int, runs: int = 2) -> dict[str, float]:
    results = [_child(mode, root, jobs) for _ in range(runs)]
    best = min(results, key=lambda r: r["seconds"])
    best["rss_mib"] = max(r["rss_mib"] for r in results)
    best["worker_rss_mib"] = max(r["worker_rss_mib"] for r in results)
    return best


def _generate(root: Path, records: int) -> tuple[int, float]:
    sys.path.insert(0, str(REPO))
    from tests.report.sample import write_sample

    from mpigate.audit import HmacSigner

    write_sample(root, HmacSigner(SECRET), jobs_count=int(records / RECORDS_PER_JOB), batch=500)
    (root / "key").write_bytes(SECRET)
    return _count(root)


def _count(root: Path) -> tuple[int, float]:
    segments = sorted((root / "audit").glob("*/*.jsonl"))
    lines = 0
    for path in segments:
        with path.open("rb") as fh:
            lines += sum(1 for _ in fh)
    size = sum(p.stat().st_size for p in segments) / 2**20
    return lines, size


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated record counts")
    parser.add_argument(
        "--dir", type=Path, help="keep the trails here and reuse them on the next run (default: a temp dir)"
    )
    parser.add_argument("--measure", choices=("parse", "report"), help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(_measure(args.measure, args.dir, args.jobs)))
        return 0
    keep = args.dir is not None
    if args.dir is not None:
        work = args.dir
        work.mkdir(parents=True, exist_ok=True)
    else:
        (REPO / "build").mkdir(exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="report-bench-", dir=REPO / "build"))
    cpus = os.cpu_count() or 1
    print(f"report benchmark: {cpus} CPU(s), load average {os.getloadavg()[0]:.1f}, best of 2 runs each")
    rows = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            root = work / str(size)
            started = time.monotonic()
            if (root / "key").exists():
                records, mib = _count(root)
                done = "reusing"
            else:
                root.mkdir()
                records, mib = _generate(root, size)
                done = f"wrote in {time.monotonic() - started:.0f} s:"
            api_lines = sum(1 for _ in (root / "kube-apiserver-audit.log").open("rb"))
            print(f"  {done} {records:,} audit records ({mib:,.0f} MiB) + {api_lines:,} API-server events")
            parse = _best("parse", root, 0)
            parallel = _best("report", root, 0)
            single = _best("report", root, 1)
            rows.append((records, mib, parse, parallel, single))
            if not keep:
                shutil.rmtree(root)
        print()
        print(
            f"{'records':>10} {'MiB':>5} | {'parse s':>8} | {'report s':>8} {'x parse':>7} {'MiB RSS':>8} "
            f"{'worker':>7} | {'1 process s':>11} {'x parse':>7} {'MiB RSS':>8}"
        )
        for records, mib, parse, parallel, single in rows:
            print(
                f"{records:>10,} {mib:>5,.0f} | {parse['seconds']:>8.2f} | {parallel['seconds']:>8.2f} "
                f"{parallel['seconds'] / parse['seconds']:>7.1f} {parallel['rss_mib']:>8.0f} "
                f"{parallel['worker_rss_mib']:>7.0f} | {single['seconds']:>11.2f} "
                f"{single['seconds'] / parse['seconds']:>7.1f} {single['rss_mib']:>8.0f}"
            )
        floors = ", ".join(f"{row[2]['rss_mib']:.0f}" for row in rows)
        print(f"(parse-only peak RSS: {floors} MiB)")
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
