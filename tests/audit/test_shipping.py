"""Shipping while serving, and retention (issue 23, item 2): records reach a real OTLP/HTTP sink
on loopback while the writer runs, a restart resumes where the sink acknowledged, sealed segments
are deleted once shipped (or past ``retention.maxAge``) and every deletion is recorded, and the
sink's copy rebuilt with ``mpigate audit restore`` verifies with ``mpigate audit verify``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from mpigate.audit import AuditLog, AuditMetrics, HmacSigner, WriterOptions
from mpigate.audit.layout import list_segments
from mpigate.audit.otlp import OtlpShipper
from mpigate.audit.reader import read_chains, verify_chain
from mpigate.audit.restore import restore_chains
from mpigate.audit.shipping import AuditShipping
from mpigate.cli import cli

from .conftest import HMAC_SECRET, entry
from .otlp_receiver import OtlpReceiver


@pytest.fixture
def receiver(tmp_path: Path):
    rx = OtlpReceiver(tmp_path).start()
    yield rx
    rx.stop()


def open_log(directory: Path, registry: CollectorRegistry | None = None) -> AuditLog:
    return AuditLog.open(
        directory,
        chain="ship",
        signer=HmacSigner(HMAC_SECRET),
        options=WriterOptions(rotate_max_bytes=4096),
        metrics=AuditMetrics(registry) if registry is not None else None,
    )


def shipping(
    directory: Path, log: AuditLog, rx: OtlpReceiver | None, registry: CollectorRegistry | None = None, **kw
) -> AuditShipping:  # type: ignore[no-untyped-def]
    metrics = AuditMetrics(registry) if registry is not None else None
    shipper = (
        OtlpShipper(directory, rx.url, certificate_file=rx.ca_file, timeout=30, metrics=metrics)
        if rx is not None
        else None
    )
    return AuditShipping(
        directory,
        lambda: log,
        shipper=shipper,
        max_age_seconds=kw.pop("max_age", None),
        metrics=metrics,
        **kw,
    )


def restored(rx: OtlpReceiver, tmp_path: Path) -> Path:
    sink = tmp_path / "sink.otlp.jsonl"
    rx.write_otlp_json(sink)
    out = tmp_path / "restored"
    result = restore_chains([sink], out)
    assert result.problems == []
    return out


def test_shipped_sealed_segments_are_deleted_and_the_deletion_is_recorded(tmp_path, receiver, keyring):
    directory = tmp_path / "audit"
    log = open_log(directory)
    for i in range(60):
        log.append(entry(i))
    sealed = list_segments(directory / "ship")[:-1]
    assert len(sealed) >= 3
    ship = shipping(directory, log, receiver)
    shipped, pruned = ship.run_once()
    assert shipped is not None and not shipped.failed
    assert pruned.deleted == tuple(s.name for s in sealed) and set(pruned.reasons) == {"shipped"}
    assert list_segments(directory / "ship")[0].name not in pruned.deleted
    _, again = ship.run_once()  # ships the retention records (and prunes what they filled)
    log.close()
    ship.stop()
    keys = keyring
    # what is left on disk verifies: a retention record accounts for the missing prefix
    local = verify_chain(directory / "ship", keys)
    assert local.ok, local.problems
    assert local.pruned_through is not None and local.pruned_through >= len(sealed)
    # the sink's copy is the whole chain from its genesis, with every deletion recorded
    out = restored(receiver, tmp_path)
    copy = verify_chain(out / "ship", keys)
    assert copy.ok, copy.problems
    assert copy.first_seq == 1 and copy.sealed
    retention = [e.record["retention"] for e in read_chains([out], keys) if e.stage == "retention"]
    assert [r["segment"] for r in retention] == [*pruned.deleted, *again.deleted]
    assert all(r["shipped"] and r["reason"] == "shipped" for r in retention)
    assert {e.record.get("i") for e in read_chains([out], keys) if "i" in e.record} == set(range(60))


def test_unshipped_segments_stay_until_max_age_then_go_recorded_as_unshipped(tmp_path, receiver, keyring):
    receiver.fail = lambda n: True  # the sink is down
    directory = tmp_path / "audit"
    registry = CollectorRegistry()
    log = open_log(directory)
    for i in range(40):
        log.append(entry(i))
    before = list_segments(directory / "ship")
    now = [time.time()]
    ship = shipping(directory, log, receiver, registry, max_age=3600, clock=lambda: now[0])
    shipped, pruned = ship.run_once()
    assert shipped is not None and shipped.failed and pruned.deleted == ()
    assert list_segments(directory / "ship") == before  # nothing unshipped is deleted
    assert registry.get_sample_value("mpigate_audit_records_ship_failed_total") > 0
    assert registry.get_sample_value("mpigate_audit_shipper_lag_records", {"chain": "ship"}) > 0
    now[0] += 3601
    _, pruned = ship.run_once()
    assert pruned.deleted == tuple(s.name for s in before[:-1]) and set(pruned.reasons) == {"max-age"}
    assert registry.get_sample_value("mpigate_audit_segments_deleted_total", {"reason": "max-age"}) == len(
        pruned.deleted
    )
    ship.stop(final_pass=False)
    log.close()
    keys = keyring
    retention = [e.record["retention"] for e in read_chains([directory], keys) if e.stage == "retention"]
    assert retention and not any(r["shipped"] for r in retention)
    assert verify_chain(directory / "ship", keys).ok


def test_without_a_retention_record_a_missing_prefix_is_still_a_deleted_segment(tmp_path, keyring):
    directory = tmp_path / "audit"
    log = open_log(directory)
    for i in range(40):
        log.append(entry(i))
    log.close()
    list_segments(directory / "ship")[0].unlink()
    report = verify_chain(directory / "ship", keyring)
    assert not report.ok and report.first("deleted-segment") is not None


def test_restore_keeps_one_copy_of_a_record_shipped_twice_and_reports_conflicts(tmp_path, receiver):
    directory = tmp_path / "audit"
    log = open_log(directory)
    for i in range(5):
        log.append(entry(i))
    log.close()
    OtlpShipper(directory, receiver.url, certificate_file=receiver.ca_file).ship_once()
    sink = tmp_path / "sink.jsonl"
    receiver.write_otlp_json(sink)
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_text(sink.read_text() * 2)
    result = restore_chains([doubled], tmp_path / "out")
    assert result.problems == [] and result.duplicates == result.chains["ship"]
    line = json.loads(sink.read_text().splitlines()[0])
    body = line["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["body"]
    record = json.loads(body["stringValue"])
    record["hash"] = "0" * 64
    body["stringValue"] = json.dumps(record)
    forged = tmp_path / "forged.jsonl"
    forged.write_text(sink.read_text() + json.dumps(line) + "\n")
    result = restore_chains([forged], tmp_path / "out2")
    assert any("different hashes" in p for p in result.problems)
    cli_result = CliRunner().invoke(cli, ["audit", "restore", str(sink), "--out", str(tmp_path / "out3")])
    assert cli_result.exit_code == 0, cli_result.output
    assert (tmp_path / "out3" / "ship").is_dir()


async def test_the_controller_ships_its_chain_while_running(tmp_path, receiver, hmac_key_file):
    import shutil

    import yaml

    from mpigate.admission.kube import KubeConfig
    from mpigate.audit import lifecycle_record
    from mpigate.config import load
    from mpigate.controller.metrics import ControllerMetrics
    from mpigate.controller.runner import ControllerOptions, _open_recorder, _signer
    from tests.conftest import FIXTURES

    org = tmp_path / "org"
    shutil.copytree(FIXTURES / "config" / "base", org)
    policy = org / "policies" / "org.yaml"
    doc = yaml.safe_load(policy.read_text())
    doc["spec"]["audit"] = {
        "otlp": {"endpoint": receiver.url, "caFile": receiver.ca_file},
        "signing": {"method": "hmac-sha256"},
    }
    policy.write_text(yaml.safe_dump(doc))
    options = ControllerOptions(
        config_path=org,
        kube=KubeConfig(server="https://127.0.0.1:1"),
        audit_dir=tmp_path / "audit",
        audit_key=hmac_key_file,
    )
    config = load(org)
    recorder, shipping = await _open_recorder(options, config, ControllerMetrics(), _signer(options, config))
    assert shipping is not None and shipping.shipper is not None
    await recorder.append(lifecycle_record("started", namespace="alpha", name="job", team="alpha"))
    shipping.run_once()
    stages = [json.loads(r.body)["stage"] for r in receiver.records]
    assert "lifecycle" in stages and stages[0] == "genesis"
    await recorder.close()
    shipping.stop()
    assert json.loads(receiver.records[-1].body)["checkpoint"]["reason"] == "shutdown"
