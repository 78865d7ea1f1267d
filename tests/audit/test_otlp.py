"""The OTLP shipper against a real OTLP/HTTP receiver over TLS: mapping, resume after restart,
failing requests, at-least-once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from mpigate.audit import AuditLog, AuditMetrics, HmacSigner, WriterOptions, record_from_decision
from mpigate.audit.otlp import POSITION_FILE, OtlpShipper
from mpigate.audit.reader import read_chains
from mpigate.policy.decision import AdmissionInput, Decision, UserInfo, Violation

from .conftest import HMAC_SECRET, entry
from .otlp_receiver import OtlpReceiver


@pytest.fixture
def receiver(tmp_path: Path):
    rx = OtlpReceiver(tmp_path).start()
    yield rx
    rx.stop()


def shipper(directory: Path, rx: OtlpReceiver, **kwargs) -> OtlpShipper:  # type: ignore[no-untyped-def]
    return OtlpShipper(directory, rx.url, certificate_file=rx.ca_file, timeout=30, **kwargs)


def write(directory: Path, chain: str, count: int, start: int = 0, **options) -> None:  # type: ignore[no-untyped-def]
    with AuditLog.open(
        directory, chain=chain, signer=HmacSigner(HMAC_SECRET), options=WriterOptions(**options)
    ) as log:
        for i in range(start, start + count):
            log.append(entry(i))


def stored(directory: Path, chain: str) -> dict[int, str]:
    return {e.seq: e.hash for e in read_chains([directory]) if e.chain == chain}


def test_records_map_to_log_records(tmp_path, receiver):
    directory = tmp_path / "audit"
    denied = Decision(
        allowed=False,
        operation="CREATE",
        kind="TrainJob",
        namespace="nlp-team",
        name="llm-ft",
        team="nlp-team",
        revision="r1",
        violations=(Violation("MPG-Q001", "enforce", "spec", "over quota", controls=("SOC2-CC6.1",)),),
        message="over quota",
    )
    request = AdmissionInput("CREATE", "TrainJob", "nlp-team", "llm-ft", {}, user=UserInfo("maria"), uid="u1")
    with AuditLog.open(directory, chain="c", signer=HmacSigner(HMAC_SECRET)) as log:
        written = log.append(record_from_decision(denied, request, "validate"))
    registry = CollectorRegistry()
    result = shipper(directory, receiver, metrics=AuditMetrics(registry)).ship_once()
    assert (result.shipped, result.failed, result.lag) == (4, False, 0)
    by_seq = {r.attributes["mpigate.audit.seq"]: r for r in receiver.records}
    rec = by_seq[written.seq]
    assert rec.attributes["mpigate.audit.hash"] == written.hash
    assert rec.attributes["mpigate.audit.chain"] == "c"
    assert rec.attributes["mpigate.audit.decision"] == "denied"
    assert rec.attributes["mpigate.audit.team"] == "nlp-team"
    assert rec.attributes["mpigate.audit.rules"] == ["MPG-Q001"]
    assert rec.attributes["mpigate.audit.controls"] == ["SOC2-CC6.1"]
    assert rec.attributes["k8s.namespace.name"] == "nlp-team"
    assert rec.severity_text == "WARN" and rec.event_name == "mpigate.audit.validate"
    assert json.loads(rec.body)["hash"] == written.hash  # the stored line, verifiable downstream
    assert rec.resource["service.name"] == "mpigate"
    assert rec.time_unix_nano // 1_000_000 % 1000 == int(written.time[-4:-1])
    assert registry.get_sample_value("mpigate_audit_records_shipped_total") == 4
    assert registry.get_sample_value("mpigate_audit_shipper_lag_records", {"chain": "c"}) == 0


def test_resume_after_restart_with_failing_requests(tmp_path, receiver):
    directory = tmp_path / "audit"
    write(directory, "a", 120, rotate_max_bytes=8192)
    write(directory, "b", 30)
    receiver.fail = lambda n: n in (3, 4)  # the third and fourth requests fail
    registry = CollectorRegistry()
    first = shipper(directory, receiver, batch_records=25, metrics=AuditMetrics(registry))
    total_a, total_b = len(stored(directory, "a")), len(stored(directory, "b"))
    result = first.ship_once()
    # two requests went through, the third failed: the pass stops there
    assert result.failed and result.shipped == len(receiver.records) > 0
    assert receiver.requests == 3 and result.lag == total_a + total_b - result.shipped
    assert registry.get_sample_value("mpigate_audit_ship_failures_total") == 1
    assert (
        registry.get_sample_value("mpigate_audit_shipper_lag_records", {"chain": "a"})
        == total_a - result.shipped
    )
    position = json.loads((directory / "a" / POSITION_FILE).read_text())  # next to the chain
    assert position["seq"] == max(receiver.seqs("a")) == result.shipped

    # the shipper restarts (a new process would read the same state file); the writer goes on
    write(directory, "a", 20, start=120, rotate_max_bytes=8192)
    second = shipper(directory, receiver, batch_records=25)
    assert second.ship_once().failed  # request 4 fails too
    final = second.ship_once()
    assert not final.failed and final.lag == 0
    for chain in ("a", "b"):
        seqs = receiver.seqs(chain)
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))  # in order, nothing twice here
        assert set(seqs) == set(stored(directory, chain))  # nothing lost
    assert receiver.failed == 2


def test_at_least_once_when_dying_between_ack_and_state(tmp_path, receiver, monkeypatch):
    directory = tmp_path / "audit"
    write(directory, "c", 40)
    dying = shipper(directory, receiver, batch_records=10)
    calls = {"n": 0}
    real_save = dying._save_state

    def crash_on_second_save(*args) -> None:  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed after the collector acknowledged batch 2")
        real_save(*args)

    monkeypatch.setattr(dying, "_save_state", crash_on_second_save)
    with pytest.raises(KeyboardInterrupt):
        dying.ship_once()
    assert len(receiver.records) == 20
    result = shipper(directory, receiver, batch_records=10).ship_once()
    assert not result.failed
    seqs = receiver.seqs("c")
    assert set(seqs) == set(stored(directory, "c"))
    duplicated = sorted({s for s in seqs if seqs.count(s) > 1})
    assert duplicated == list(range(11, 21))  # exactly the batch whose acknowledgement was not persisted


def test_background_loop_backs_off_and_catches_up(tmp_path, receiver):
    directory = tmp_path / "audit"
    write(directory, "c", 10)
    receiver.fail = lambda n: n <= 2
    running = shipper(directory, receiver)
    running.start(interval=0.05, max_backoff=0.2)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(receiver.records) < 12:
            time.sleep(0.02)
    finally:
        running.stop()
    assert sorted(receiver.seqs("c")) == sorted(stored(directory, "c"))
    assert receiver.failed == 2


def test_endpoint_without_path_gets_v1_logs(tmp_path, receiver):
    directory = tmp_path / "audit"
    write(directory, "c", 1)
    base = receiver.url.removesuffix("/v1/logs")
    result = OtlpShipper(directory, base, certificate_file=receiver.ca_file, timeout=30).ship_once()
    assert result.shipped == 4 and not result.failed


def test_cli_ship_once(tmp_path, receiver):
    from click.testing import CliRunner

    from mpigate.cli import cli

    directory = tmp_path / "audit"
    write(directory, "c", 2)
    args = ["audit", "ship", str(directory), "--endpoint", receiver.url, "--ca-file", receiver.ca_file]
    args.append("--once")
    result = CliRunner().invoke(cli, [*args, "--header", "x-tenant=acme"])
    assert result.exit_code == 0, result.output
    assert "shipped 5 record(s); 0 waiting" in result.output
    assert sorted(receiver.seqs("c")) == [1, 2, 3, 4, 5]
    receiver.fail = lambda n: True
    write(directory, "c", 1, start=5)
    failed = CliRunner().invoke(cli, args)
    assert failed.exit_code == 1 and "2 waiting" in failed.output
