"""``mpigate serve --workers N``: N real server processes on one port (SO_REUSEPORT) under a
supervisor — reviews spread over them, /metrics sums them, each writes its own audit chain, SIGTERM
drains them all, and a worker that dies takes the replica down (exit 1)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mpigate.admission.client import make_review
from mpigate.admission.eventloop import LOOPS
from mpigate.audit import generate_key
from mpigate.cli import cli

from .conftest import BASE_ORG, trainjob


class Supervisor:
    """``mpigate serve --workers 2 --loop LOOP`` on plain HTTP, its log lines parsed as they come."""

    def __init__(self, tmp: Path, loop: str, *extra: str) -> None:
        self.log_path = tmp / "serve.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "mpigate", "serve", "--config", str(BASE_ORG), "--insecure-dev",
                    "--host", "127.0.0.1", "--port", "0", "--no-live", "--workers", "2", "--loop", loop,
                    *extra,
                ],
                stderr=log,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: close() ends the workers too
                env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
            )  # fmt: skip

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.startswith("{")]

    # Deadlines only bound a failing test (a passing one returns at once): under a load of 20 on
    # two cores, starting the supervisor and its two workers (three imports of mpigate) took
    # longer than a minute.
    def wait_for(self, event: str, count: int = 1, timeout: float = 300.0) -> list[dict[str, Any]]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [line for line in self.lines() if line.get("event") == event]
            if len(found) >= count:
                return found
            if self.proc.poll() is not None and event not in ("stopped",):
                raise AssertionError(f"supervisor exited with {self.proc.returncode}: {self.lines()}")
            time.sleep(0.05)
        raise AssertionError(f"no {count} {event!r} within {timeout} s: {self.lines()}")

    def post(self, port: int, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        # A new connection per request: the kernel spreads connections, not requests.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def get(self, port: int, path: str) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request("GET", path)
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def close(self) -> None:
        """Kill the supervisor and its workers: killing only the supervisor of a failed test left
        its workers running, orphaned, for the rest of the run."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(60)


@pytest.fixture(params=LOOPS)
def supervisor(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Starts supervisors on the test's loop: each test runs once per loop ``--loop`` offers."""
    started: list[Supervisor] = []

    def start(*extra: str) -> Supervisor:
        started.append(Supervisor(tmp_path, request.param, *extra))
        return started[-1]

    yield start
    for sup in started:
        sup.close()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_workers_share_the_port_the_metrics_and_drain_together(supervisor: Any, tmp_path: Path) -> None:
    key = tmp_path / "audit.key"
    key.write_bytes(generate_key("ed25519")[0])  # the example org signs with ed25519
    sup = supervisor("--audit-dir", str(tmp_path / "audit"), "--audit-key", str(key))
    listening = sup.wait_for("listening")[0]
    workers = sup.wait_for("worker_listening", 2)
    assert listening["workers"] == 2 and {w["port"] for w in workers} == {listening["port"]}
    assert {w["worker"] for w in workers} == {0, 1} and len({w["pid"] for w in workers}) == 2
    port = listening["port"]
    job = trainjob()
    for i in range(40):
        status, body = sup.post(port, "/mutate", make_review(job, uid=f"m{i}"))
        assert status == 200 and body["response"]["allowed"] is True
        status, body = sup.post(port, "/validate", make_review(job, uid=f"v{i}"))
        assert status == 200 and body["response"]["uid"] == f"v{i}"
    reviews = sup.wait_for("review", 80)
    # both workers judged some (40 connections all hashed to one worker: odds 2^-39)
    assert {r["worker"] for r in reviews} == {0, 1}
    # any worker's /metrics reports the replica's totals: its own at once, the other worker's
    # within its flush interval (metrics.FLUSH_INTERVAL, 1 s; docs/webhook.md "Metrics")
    end = time.monotonic() + 60
    while True:
        total = sum(
            float(line.rsplit(" ", 1)[1])
            for line in sup.get(port, "/metrics").splitlines()
            if line.startswith("mpigate_admission_requests_total{")
        )
        assert total <= 80
        if total == 80 or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert total == 80
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(300) == 0
    assert all(gone(w["pid"]) for w in workers)
    assert len(sup.wait_for("stopped", 2)) == 2
    # each worker wrote its own audit chain, and every chain verifies
    chains = [p for p in (tmp_path / "audit").iterdir() if p.is_dir()]
    assert len(chains) == 2
    verify = CliRunner().invoke(cli, ["audit", "verify", str(tmp_path / "audit"), "--key", str(key)])
    assert verify.exit_code == 0 and "all verified" in verify.output, verify.output
    records = [
        json.loads(line)
        for chain in chains
        for segment in sorted(chain.glob("*.jsonl"))
        for line in segment.read_text().splitlines()
    ]
    assert sorted(r["request"]["uid"] for r in records if r.get("stage") == "validate") == sorted(
        f"v{i}" for i in range(40)
    )


def test_a_dead_worker_takes_the_replica_down(supervisor: Any) -> None:
    sup = supervisor()
    sup.wait_for("listening")
    workers = sup.wait_for("worker_listening", 2)
    os.kill(workers[0]["pid"], signal.SIGKILL)
    assert sup.proc.wait(300) == 1
    exited = sup.wait_for("worker_exited")
    assert exited[0]["worker"] == f"mpigate-worker-{workers[0]['worker']}"
    assert gone(workers[1]["pid"])
