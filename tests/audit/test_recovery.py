"""Crash safety: torn tails are moved aside and recorded; kill -9 loses no acknowledged record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpigate.audit import AuditLog, HmacSigner
from mpigate.audit.layout import list_segments, torn_files
from mpigate.audit.reader import read_chains, verify_chain

from .conftest import HMAC_SECRET, entry, lines_of, write_chain

REPO = Path(__file__).resolve().parents[2]


def test_torn_last_line_is_moved_aside_and_recorded(tmp_path, keyring):
    chain = write_chain(tmp_path / "audit", 5, chain="c")
    segment = list_segments(chain)[-1]
    intact = segment.read_bytes()
    last = json.loads(intact.splitlines()[-1])
    torn = b'{"chain":"c","decision":"allowed","hash":"ab'
    with segment.open("ab") as fh:
        fh.write(torn)
    assert verify_chain(chain, keyring).first("truncated") is not None

    with AuditLog.open(tmp_path / "audit", chain="c", signer=HmacSigner(HMAC_SECRET)) as log:
        after = log.append(entry(99))
    [aside] = torn_files(chain)
    assert aside.read_bytes() == torn
    assert aside.name.startswith(f"{segment.name}.torn-")
    records = [json.loads(x) for x in segment.read_bytes().splitlines()]
    assert segment.read_bytes().startswith(intact)
    recovered = records[len(intact.splitlines())]
    assert recovered["stage"] == "recovered"
    assert recovered["recovered"]["movedTo"] == aside.name
    assert recovered["recovered"]["bytes"] == len(torn)
    assert recovered["prev"] == last["hash"] and recovered["seq"] == last["seq"] + 1
    checkpoint = records[len(intact.splitlines()) + 1]
    assert checkpoint["stage"] == "checkpoint" and checkpoint["checkpoint"]["reason"] == "recovered"
    assert after.seq == last["seq"] + 3
    report = verify_chain(chain, keyring)
    assert report.ok and report.recoveries == 1 and report.torn_fragments == [aside.name]


def test_garbage_after_a_power_loss_is_moved_aside(tmp_path, keyring):
    chain = write_chain(tmp_path / "audit", 3, chain="c")
    segment = list_segments(chain)[-1]
    size = segment.stat().st_size
    with segment.open("ab") as fh:
        fh.write(b"\x00" * 100 + b"\n" + b"\x00" * 50)
    with AuditLog.open(tmp_path / "audit", chain="c", signer=HmacSigner(HMAC_SECRET)):
        pass
    [aside] = torn_files(chain)
    assert aside.stat().st_size == 151
    # the recovery record, its checkpoint, and the shutdown checkpoint that seals the chain again
    tail = [json.loads(line) for line in lines_of(segment)[-3:]]
    assert [r["stage"] for r in tail] == ["recovered", "checkpoint", "checkpoint"]
    assert [r["checkpoint"]["reason"] for r in tail[1:]] == ["recovered", "shutdown"]
    assert segment.read_bytes()[:size].endswith(b"\n")
    report = verify_chain(chain, keyring)
    assert report.ok and report.sealed


def test_crash_right_after_a_rotate_checkpoint(tmp_path, keyring):
    chain = write_chain(tmp_path / "audit", 30, chain="c", rotate_max_bytes=2048)
    segments = list_segments(chain)
    last = segments[-1]
    # simulate a crash between the rotate checkpoint and the creation of the next segment
    previous_records = lines_of(segments[-2])
    assert json.loads(previous_records[-1])["checkpoint"]["next"] == last.name
    last.unlink()
    with AuditLog.open(tmp_path / "audit", chain="c", signer=HmacSigner(HMAC_SECRET)) as log:
        written = log.append(entry(1))
    assert written.segment == last.name
    assert verify_chain(chain, keyring).ok


@pytest.mark.slow
def test_kill_9_loses_no_acknowledged_record(tmp_path, keyring):
    directory = tmp_path / "audit"
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    runs = []
    for run in range(3):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.audit.crash_writer",
                str(directory),
                HMAC_SECRET.decode(),
                "200000",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env=env,
        )
        assert proc.stdout is not None
        acked: dict[int, str] = {}
        deadline = time.monotonic() + 120
        target = 150 + 50 * run
        while len(acked) < target and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            _, seq, digest = line.split()
            acked[int(seq)] = digest.decode()
        assert len(acked) >= target, proc.stderr.read().decode() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)  # mid-write: eight threads keep appending 200 kB records
        rest, _ = proc.communicate(timeout=60)
        for line in rest.splitlines():
            parts = line.split()
            if len(parts) == 3:
                acked[int(parts[1])] = parts[2].decode()
        assert proc.returncode == -signal.SIGKILL
        runs.append(acked)

        # restart: recovery runs on open and the chain continues
        with AuditLog.open(directory, chain="crash", signer=HmacSigner(HMAC_SECRET)) as log:
            log.append(entry(run))

    stored = {e.seq: e.hash for e in read_chains([directory], keyring)}
    for acked in runs:
        missing = [seq for seq, digest in acked.items() if stored.get(seq) != digest]
        assert missing == [], f"acknowledged records lost or changed: {missing[:10]}"
    report = verify_chain(directory / "crash", keyring)
    assert report.ok, [p.message for p in report.errors]
    # every torn fragment moved aside is named by a recovered record
    assert report.recoveries == len(report.torn_fragments)
