"""Write failures: a real full disk (tmpfs), a real file size limit, and a failed rollback.

The writer must raise AuditWriteError (not acknowledge), count the failure in its metrics, log
why, leave the log intact and recover once the disk does."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from mpigate.audit import AuditLog, AuditMetrics, AuditWriteError, HmacSigner
from mpigate.audit.layout import list_segments
from mpigate.audit.reader import read_chains, verify_chain
from tests.conftest import fill_disk

from .conftest import HMAC_SECRET, entry

REPO = Path(__file__).resolve().parents[2]


def test_full_disk_fails_appends_and_recovers(tiny_tmpfs, keyring, caplog):
    registry = CollectorRegistry()
    metrics = AuditMetrics(registry)
    directory = tiny_tmpfs / "audit"
    log = AuditLog.open(directory, chain="full", signer=HmacSigner(HMAC_SECRET), metrics=metrics)
    acked = [log.append(entry(i)).hash for i in range(3)]
    segment = list_segments(directory / "full")[0]
    before = segment.stat().st_size
    filler = tiny_tmpfs / "filler"
    with pytest.raises(OSError, match="No space left") as full:
        fill_disk(filler)
    assert full.value.errno == errno.ENOSPC
    caplog.set_level(logging.ERROR, logger="mpigate.audit.writer")
    big = entry(100, blob="z" * 8192)
    with pytest.raises(AuditWriteError) as failure:
        log.append(big)
    assert failure.value.reason == "ENOSPC"
    assert "No space left on device" in str(failure.value)
    assert any("ENOSPC" in r.getMessage() for r in caplog.records)
    assert registry.get_sample_value("mpigate_audit_write_failures_total", {"reason": "ENOSPC"}) == 1
    assert registry.get_sample_value("mpigate_audit_writer_healthy") == 0
    assert segment.stat().st_size == before  # the partial write was rolled back
    assert not log.healthy

    filler.unlink()  # the disk recovers
    recovered = log.append(big)
    assert log.healthy and registry.get_sample_value("mpigate_audit_writer_healthy") == 1
    log.close()
    stored = {e.hash: e for e in read_chains([directory], keyring)}
    assert all(h in stored for h in acked) and recovered.hash in stored
    assert sum(1 for e in stored.values() if e.record.get("i") == 100) == 1  # only the acknowledged one
    report = verify_chain(directory / "full", keyring)
    assert report.ok, report.problems


def test_an_idle_writer_heals_itself_when_the_disk_recovers(tiny_tmpfs, keyring, caplog):
    # A server that is not ready gets no traffic: the writer must notice the disk is back without
    # an append, and say why it was unhealthy meanwhile.
    registry = CollectorRegistry()
    directory = tiny_tmpfs / "audit"
    log = AuditLog.open(
        directory, chain="idle", signer=HmacSigner(HMAC_SECRET), metrics=AuditMetrics(registry)
    )
    log.append(entry(1))
    filler = tiny_tmpfs / "filler"
    with pytest.raises(OSError, match="No space left"):
        fill_disk(filler)

    def fill_the_last_page() -> None:  # small records take what is left of the segment's page
        for i in range(2, 10_000):
            log.append(entry(i))

    with pytest.raises(AuditWriteError):
        fill_the_last_page()
    assert not log.healthy and "ENOSPC" in (log.problem or "")
    caplog.set_level(logging.DEBUG, logger="mpigate.audit.writer")
    caplog.clear()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("ENOSPC" in r.getMessage() for r in caplog.records):
        time.sleep(0.05)  # the writer probed the still-full disk at least once
    assert not log.healthy
    assert all(r.levelno == logging.DEBUG for r in caplog.records if "ENOSPC" in r.getMessage())
    assert registry.get_sample_value("mpigate_audit_write_failures_total", {"reason": "ENOSPC"}) == 1
    filler.unlink()
    while time.monotonic() < deadline and not log.healthy:
        time.sleep(0.05)
    assert log.healthy and log.problem is None
    assert registry.get_sample_value("mpigate_audit_writer_healthy") == 1
    log.close()
    records = [e.record for e in read_chains([directory], keyring)]
    resumed = [r for r in records if r.get("stage") == "checkpoint" and r["checkpoint"]["reason"] == "resume"]
    assert len(resumed) == 1
    assert verify_chain(directory / "idle", keyring).ok


def test_file_size_limit_fails_appends_and_recovers(tmp_path, keyring):
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.audit.fsize_writer", str(tmp_path / "audit"), HMAC_SECRET.decode()],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failures"] == ["EFBIG", "EFBIG", "EFBIG"]
    chain = tmp_path / "audit" / "fsize"
    assert summary["size_after_failures"] < list_segments(chain)[0].stat().st_size
    report = verify_chain(chain, keyring)
    assert report.ok, report.problems
    seqs = [e.seq for e in read_chains([chain], keyring) if e.stage == "validate"]
    assert seqs == summary["acked"]  # the refused records are not in the log; the chain has no gap
    assert "EFBIG" in result.stderr  # the writer logged why


def test_failed_rollback_reloads_from_disk(make_log, tmp_path, keyring, monkeypatch):
    log = make_log()
    log.append(entry(1))
    real_sync, real_truncate = os.fdatasync, os.ftruncate
    state = {"sync": 0, "truncate": 0}

    def failing_sync(fd: int) -> None:
        state["sync"] += 1
        if state["sync"] == 1:
            raise OSError(errno.EIO, "Input/output error")
        real_sync(fd)

    def failing_truncate(fd: int, size: int) -> None:
        state["truncate"] += 1
        if state["truncate"] == 1:
            raise OSError(errno.EIO, "Input/output error")
        real_truncate(fd, size)

    monkeypatch.setattr(os, "fdatasync", failing_sync)
    monkeypatch.setattr(os, "ftruncate", failing_truncate)
    with pytest.raises(AuditWriteError) as failure:
        log.append(entry(2))
    assert failure.value.reason == "EIO"
    # the record reached the file although fsync failed; the writer re-reads the disk and
    # continues after it (an extra record never hurts; a missing one would)
    third = log.append(entry(3))
    assert third.seq == 5
    log.close()
    report = verify_chain(tmp_path / "audit" / "test-0", keyring)
    assert report.ok, report.problems
