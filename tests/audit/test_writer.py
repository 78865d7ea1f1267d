"""The writer: record format, durability, group commit, checkpoints, rotation, restart, locking."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mpigate.audit import (
    AsyncAuditLog,
    AuditClosedError,
    AuditLockedError,
    AuditLog,
    AuditMetrics,
    AuditWriteError,
    HmacSigner,
    WriterOptions,
)
from mpigate.audit._canonical import GENESIS_PREV, canonical_bytes, record_hash
from mpigate.audit.layout import list_segments
from mpigate.audit.reader import verify_chain

from .conftest import HMAC_SECRET, entry


def records_of(chain_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for seg in list_segments(chain_dir) for line in seg.read_bytes().splitlines()]


def test_record_format_and_chain(make_log, tmp_path, keyring):
    log = make_log()
    written = log.append(entry(1))
    log.close()
    records = records_of(tmp_path / "audit" / "test-0")
    genesis, signed, first, shutdown = records
    assert genesis["stage"] == "genesis" and genesis["seq"] == 1 and genesis["prev"] == GENESIS_PREV
    # the genesis is signed at once: no intact chain is ever without a checkpoint
    assert signed["stage"] == "checkpoint" and signed["checkpoint"]["reason"] == "genesis"
    assert signed["checkpoint"]["headSeq"] == 1 and signed["checkpoint"]["head"] == genesis["hash"]
    assert first["seq"] == 3 and first["prev"] == signed["hash"] and first["chain"] == "test-0"
    assert first["v"] == 1 and first["source"] == "webhook" and first["i"] == 1
    assert first["time"].endswith("Z") and len(first["time"]) == len("2026-11-22T10:15:03.120Z")
    assert written.seq == 3 and written.hash == first["hash"] and written.line == 3
    assert written.segment == "00000000000000000001.jsonl"
    assert record_hash(first) == first["hash"]
    # every line is the canonical encoding of its record
    raw = (tmp_path / "audit" / "test-0" / written.segment).read_bytes().splitlines()[2]
    assert raw == canonical_bytes(first)
    assert shutdown["stage"] == "checkpoint" and shutdown["checkpoint"]["reason"] == "shutdown"
    assert shutdown["checkpoint"]["headSeq"] == 3 and shutdown["checkpoint"]["head"] == first["hash"]
    report = verify_chain(tmp_path / "audit" / "test-0", keyring)
    assert report.ok and report.signatures == "verified" and report.records == 4
    assert report.verified_checkpoints == 2 and report.sealed and report.status().state == "verified"


def test_append_is_durable_before_it_returns(make_log, monkeypatch):
    log = make_log()
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (real(fd), synced.append(fd))[0])
    log.append(entry(1))
    assert len(synced) == 1  # the append came back only after its fsync


def test_group_commit_shares_one_fsync(make_log, monkeypatch):
    registry = CollectorRegistry()
    metrics = AuditMetrics(registry)
    log = make_log(metrics=metrics)
    gate = threading.Event()
    entered = threading.Event()
    calls: list[int] = []
    real = os.fdatasync

    def slow_sync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            entered.set()
            assert gate.wait(60)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_sync)
    first = log.submit(entry(0))
    assert entered.wait(60)  # the writer is inside the first fsync
    rest = [log.submit(entry(i)) for i in range(1, 41)]
    gate.set()
    seqs = [f.result(10).seq for f in [first, *rest]]
    assert seqs == list(range(3, 44))
    assert len(calls) == 2  # 41 records, two fsyncs: the 40 queued meanwhile went in one commit
    batches = registry.get_sample_value("mpigate_audit_batch_records_count")
    assert batches == 3  # genesis and its checkpoint, the first record, the group of 40
    assert registry.get_sample_value("mpigate_audit_records_written_total", {"stage": "validate"}) == 41


def test_without_group_commit_every_record_has_its_own_fsync(make_log, monkeypatch):
    log = make_log(group_commit=False)
    calls: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd))[1])
    futures = [log.submit(entry(i)) for i in range(10)]
    for f in futures:
        f.result(10)
    assert len(calls) == 10


def test_checkpoint_every_n_records(make_log, tmp_path, keyring):
    log = make_log(checkpoint_every=3)
    for i in range(7):
        log.append(entry(i))
    log.close()
    records = records_of(tmp_path / "audit" / "test-0")
    stages = [r["stage"] for r in records]
    # genesis, signed at once; 3 → checkpoint; 3 → checkpoint; 1 → shutdown checkpoint
    block = ["validate"] * 3 + ["checkpoint"]
    assert stages == ["genesis", "checkpoint", *block, *block, "validate", "checkpoint"]
    reasons = [r["checkpoint"]["reason"] for r in records if r["stage"] == "checkpoint"]
    assert reasons == ["genesis", "interval", "interval", "shutdown"]
    assert verify_chain(tmp_path / "audit" / "test-0", keyring).ok


def test_rotation_by_size_chains_across_segments(make_log, tmp_path, keyring):
    log = make_log(rotate_max_bytes=4096)
    for i in range(60):
        log.append(entry(i, padding="x" * 200))
    log.close()
    chain = tmp_path / "audit" / "test-0"
    segments = list_segments(chain)
    assert len(segments) >= 3
    previous_last: dict[str, Any] | None = None
    for segment in segments:
        lines = [json.loads(x) for x in segment.read_bytes().splitlines()]
        assert segment.name == f"{lines[0]['seq']:020d}.jsonl"
        if previous_last is not None:
            # each segment starts from the previous segment's head
            assert lines[0]["prev"] == previous_last["hash"]
            assert previous_last["checkpoint"]["reason"] == "rotate"
            assert previous_last["checkpoint"]["next"] == segment.name
        previous_last = lines[-1]
        # rotation happens at the first commit after the limit: one record past it at most
        assert segment.stat().st_size < 4096 + 2 * 1024
    report = verify_chain(chain, keyring)
    assert report.ok and report.segments == len(segments)


def test_rotation_by_age(tmp_path, signer, keyring):
    now = [dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)]
    log = AuditLog.open(
        tmp_path / "audit",
        chain="aged",
        signer=signer,
        options=WriterOptions(rotate_max_age_seconds=3600),
        clock=lambda: now[0],
    )
    log.append(entry(1))
    now[0] += dt.timedelta(minutes=59)
    log.append(entry(2))
    assert len(list_segments(tmp_path / "audit" / "aged")) == 1
    now[0] += dt.timedelta(minutes=2)
    third = log.append(entry(3))
    log.close()
    segments = list_segments(tmp_path / "audit" / "aged")
    assert len(segments) == 2
    assert third.segment == segments[1].name and third.line == 1
    assert third.time == "2026-11-22T11:01:00.000Z"
    assert verify_chain(tmp_path / "audit" / "aged", keyring).ok


def test_a_quiet_head_is_signed_after_the_checkpoint_interval(make_log, tmp_path):
    log = make_log(checkpoint_interval_seconds=0.05)
    log.append(entry(1))
    chain = tmp_path / "audit" / "test-0"
    end = time.monotonic() + 60
    while time.monotonic() < end:
        last = json.loads(list_segments(chain)[-1].read_bytes().splitlines()[-1])
        if last["stage"] == "checkpoint":
            break
        time.sleep(0.01)
    assert last["stage"] == "checkpoint" and last["checkpoint"]["reason"] == "age"
    assert last["checkpoint"]["headSeq"] == 3


def test_a_chain_idle_past_the_checkpoint_interval_is_sealed_at_close(make_log, tmp_path, keyring):
    """A writer idle for checkpoint_interval_seconds before a clean close: its head was signed by an
    age checkpoint, and close wrote no shutdown checkpoint, so verify called the chain unverifiable
    (every server idle 10 s before a rollout; serve and controller tests whose last record was more
    than 10 s before their stop on a loaded machine)."""
    log = make_log(checkpoint_interval_seconds=0.05)
    log.append(entry(1))
    chain = tmp_path / "audit" / "test-0"
    end = time.monotonic() + 60
    while time.monotonic() < end and records_of(chain)[-1]["stage"] != "checkpoint":
        time.sleep(0.01)
    assert records_of(chain)[-1]["checkpoint"]["reason"] == "age"
    log.close()
    last = records_of(chain)[-1]
    assert last["checkpoint"]["reason"] == "shutdown" and last["checkpoint"]["headSeq"] == 4
    report = verify_chain(chain, keyring)
    assert report.sealed and report.status().state == "verified"
    # a sealed chain reopened and closed again without a record stays as it is
    make_log().close()
    assert records_of(chain)[-1] == last


def test_restart_continues_the_chain(tmp_path, signer, keyring):
    with AuditLog.open(tmp_path / "audit", chain="c", signer=signer) as log:
        log.append(entry(1))
    with AuditLog.open(tmp_path / "audit", chain="c", signer=signer) as log:
        again = log.append(entry(2))
    assert again.seq == 5  # genesis and its checkpoint, 1, shutdown checkpoint, then 2
    records = records_of(tmp_path / "audit" / "c")
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[4]["prev"] == records[3]["hash"]
    assert verify_chain(tmp_path / "audit" / "c", keyring).ok


def test_one_writer_per_chain(make_log):
    make_log("solo")
    with pytest.raises(AuditLockedError, match="solo"):
        make_log("solo")


def test_default_chain_is_host_named_and_resumed(tmp_path, signer):
    with AuditLog.open(tmp_path / "audit", signer=signer) as first:
        chain = first.chain
        first.append(entry(1))
    import socket

    assert chain.startswith(socket.gethostname().split(".")[0][:20])
    with AuditLog.open(tmp_path / "audit", signer=signer) as again:
        assert again.chain == chain  # no live writer held it: resumed
        with AuditLog.open(tmp_path / "audit", signer=signer) as other:
            assert other.chain != chain  # held: a new chain


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"source": "webhook", "stage": "checkpoint"}, "stage"),
        ({"source": "webhook", "stage": "validate", "seq": 5}, "seq"),
        ({"stage": "validate"}, "source"),
        ({"source": "webhook", "stage": "validate", "x": {1, 2}}, "not JSON"),
        ({"source": "webhook", "stage": "validate", "x": float("nan")}, "not JSON"),
    ],
)
def test_invalid_entries_are_refused(make_log, bad, message):
    log = make_log()
    with pytest.raises(ValueError, match=message):
        log.append(bad)
    assert log.append(entry(1)).seq == 3  # nothing was written for the refused one


def test_closed_log_refuses_appends(make_log):
    log = make_log()
    log.close()
    with pytest.raises(AuditClosedError):
        log.append(entry(1))


def test_async_api_concurrent_appends(tmp_path, keyring):
    async def main() -> list[int]:
        log = await AsyncAuditLog.open(tmp_path / "audit", chain="aio", signer=HmacSigner(HMAC_SECRET))
        async with log:
            written = await asyncio.gather(*(log.append(entry(i)) for i in range(50)))
        return sorted(w.seq for w in written)

    assert asyncio.run(main()) == list(range(3, 53))
    report = verify_chain(tmp_path / "audit" / "aio", keyring)
    assert report.ok and report.records == 53


def test_async_appends_of_one_commit_wake_the_loop_once(tmp_path, keyring):
    """The writer completes a commit's records together; the loop is woken once for all of them,
    not once per record (each wake costs the writer a round trip for the GIL)."""

    async def main() -> tuple[list[int], int]:
        log = await AsyncAuditLog.open(tmp_path / "audit", chain="aio", signer=HmacSigner(HMAC_SECRET))
        loop = asyncio.get_running_loop()
        wakes = [0]
        wake = loop.call_soon_threadsafe

        def counting(*args: Any, **kwargs: Any) -> Any:
            wakes[0] += 1
            return wake(*args, **kwargs)

        sources: list[concurrent.futures.Future[Any]] = []
        submit = log.log.submit

        def recording(item: Any) -> concurrent.futures.Future[Any]:
            sources.append(submit(item))
            return sources[-1]

        log.log.submit = recording  # type: ignore[method-assign]
        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        async with log:
            with log.log._cond:  # the writer waits here: all 50 are queued before it takes any
                tasks = [asyncio.ensure_future(log.append(entry(i))) for i in range(50)]
                await asyncio.sleep(0)
            # the loop runs nothing until the writer has completed the commit of all 50
            concurrent.futures.wait(sources, timeout=30)
            written = await asyncio.gather(*tasks)
            loop.call_soon_threadsafe = wake  # type: ignore[method-assign]
        return sorted(w.seq for w in written), wakes[0]

    seqs, wakes = asyncio.run(main())
    assert seqs == list(range(3, 53))
    assert wakes == 1
    assert verify_chain(tmp_path / "audit" / "aio", keyring).ok


def test_a_cancelled_async_append_is_dropped_when_not_yet_taken(tmp_path, keyring):
    """Cancelling the waiting task before the writer took its record drops the record (no answer
    was given); the others are written and delivered, and the chain stays intact."""

    async def main() -> list[int]:
        log = await AsyncAuditLog.open(tmp_path / "audit", chain="aio", signer=HmacSigner(HMAC_SECRET))
        async with log:
            with log.log._cond:
                tasks = [asyncio.ensure_future(log.append(entry(i))) for i in range(5)]
                await asyncio.sleep(0)
                tasks[2].cancel()
                await asyncio.sleep(0)
            results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[2], asyncio.CancelledError)
        return [r.seq for r in results if not isinstance(r, BaseException)]

    assert asyncio.run(main()) == [3, 4, 5, 6]
    report = verify_chain(tmp_path / "audit" / "aio", keyring)
    assert report.ok and report.records == 7  # genesis and its checkpoint, the four, the shutdown one
    lines = (tmp_path / "audit" / "aio").glob("*.jsonl")
    names = [
        json.loads(line).get("object", {}).get("name")
        for path in lines
        for line in path.read_text().splitlines()
    ]
    assert [n for n in names if n] == ["job-0", "job-1", "job-3", "job-4"]


def test_ed25519_checkpoints_verify_with_the_public_key_only(tmp_path, ed25519_files):
    from mpigate.audit import KeyRing, load_signer

    private, public = ed25519_files
    with AuditLog.open(tmp_path / "audit", chain="ed", signer=load_signer("ed25519", private)) as log:
        log.append(entry(1))
    good = verify_chain(tmp_path / "audit" / "ed", KeyRing.load(public_key_files=[public]))
    assert good.ok and good.signatures == "verified"
    wrong = verify_chain(tmp_path / "audit" / "ed", KeyRing.load([Path(__file__)]))
    assert not wrong.ok and wrong.first("forged") is not None


def test_an_internal_error_fails_the_batch_not_the_writer(tmp_path, signer, keyring):
    broken = [False]

    def flaky_clock() -> dt.datetime:
        if broken[0]:
            broken[0] = False
            raise RuntimeError("clock broke")
        return dt.datetime.now(dt.UTC)

    with AuditLog.open(tmp_path / "audit", chain="c", signer=signer, clock=flaky_clock) as log:
        log.append(entry(1))
        broken[0] = True
        with pytest.raises(AuditWriteError) as failure:
            log.append(entry(2))
        assert failure.value.reason == "internal"
        assert log.append(entry(3)).seq == 4
    assert verify_chain(tmp_path / "audit" / "c", keyring).ok
