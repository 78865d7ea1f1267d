"""A rollout of the real ``mpigate serve`` with ``spec.audit.otlp`` set (issue 23, item 2): the
records reach a real OTLP/HTTP sink on loopback while serving; a SIGTERM'ed replica's successor
resumes its chain on the same volume, and a replica that starts on an empty volume starts a new
one while the old records are in the sink. The sink's copy, rebuilt with ``mpigate audit
restore``, verifies and holds every answered decision."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import trustme
import yaml
from click.testing import CliRunner

from mpigate.admission.client import make_review
from mpigate.audit import generate_key
from mpigate.cli import cli
from tests.audit.otlp_receiver import OtlpReceiver

from .conftest import BASE_ORG, trainjob, wait_for
from .serve_process import ServeProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[OtlpReceiver]:
    rx = OtlpReceiver(tmp_path).start()
    yield rx
    rx.stop()


def shipping_org(tmp_path: Path, sink: OtlpReceiver) -> Path:
    org = tmp_path / "org"
    shutil.copytree(BASE_ORG, org)
    path = org / "policies" / "org.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["audit"] = {
        "otlp": {"endpoint": sink.url, "caFile": sink.ca_file},
        "rotate": {"maxBytes": 8192},  # several sealed segments, so that retention has work
    }
    path.write_text(yaml.safe_dump(doc))
    return org


async def review(server: ServeProcess, uid: str) -> None:
    body = json.dumps(make_review(trainjob(), uid=uid))
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=server.client_ssl)) as http,
        http.post(server.url + "/validate", data=body, headers={"Content-Type": "application/json"}) as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["response"]["uid"] == uid


def sink_uids(sink: OtlpReceiver) -> set[str]:
    found = set()
    for record in list(sink.records):
        data = json.loads(record.body)
        if data.get("stage") == "validate":
            found.add(data["request"]["uid"])
    return found


async def test_a_rollout_loses_no_answered_decision(
    ca: trustme.CA, tmp_path: Path, sink: OtlpReceiver, serving: list[ServeProcess]
) -> None:
    org = shipping_org(tmp_path, sink)
    key = tmp_path / "audit.key"
    key.write_bytes(generate_key("ed25519")[0])
    volume, empty_volume = tmp_path / "pvc-0", tmp_path / "pvc-1"

    def replica(directory: Path, name: str) -> ServeProcess:
        return ServeProcess(
            ca, tmp_path / name, "--config", str(org), "--audit-dir", str(directory), "--audit-key", str(key)
        )

    answered: list[str] = []
    old = await replica(volume, "old").start()
    serving.append(old)
    for i in range(30):
        await review(old, f"old-{i}")
        answered.append(f"old-{i}")
    # shipped while serving, not only at shutdown
    await wait_for(lambda: {f"old-{i}" for i in range(30)} <= sink_uids(sink))
    assert await old.stop() == 0

    successor = await replica(volume, "successor").start()  # the same volume: resumes the chain
    fresh = await replica(empty_volume, "fresh").start()  # a new volume while the old records are in the sink
    serving.extend([successor, fresh])
    for i in range(30):
        await asyncio.gather(review(successor, f"successor-{i}"), review(fresh, f"fresh-{i}"))
        answered += [f"successor-{i}", f"fresh-{i}"]
    assert await successor.stop() == 0 and await fresh.stop() == 0
    for proc in (old, successor, fresh):
        assert proc.tracebacks() == []

    # retention: shipped sealed segments are gone from the volumes, and what is left verifies
    verify_local = CliRunner().invoke(
        cli, ["audit", "verify", str(volume), str(empty_volume), "--key", str(key), "-o", "json"]
    )
    assert verify_local.exit_code == 0, verify_local.output
    local = json.loads(verify_local.output)
    assert any(c["prunedThroughSeq"] for c in local["chains"]), "no segment was deleted after shipping"

    dump = tmp_path / "sink.otlp.jsonl"
    sink.write_otlp_json(dump)
    restored = tmp_path / "restored"
    result = CliRunner().invoke(cli, ["audit", "restore", str(dump), "--out", str(restored)])
    assert result.exit_code == 0, result.output
    verify = CliRunner().invoke(cli, ["audit", "verify", str(restored), "--key", str(key), "-o", "json"])
    assert verify.exit_code == 0, verify.output
    report = json.loads(verify.output)
    chains = report["chains"]
    assert len(chains) == 2  # the resumed chain and the fresh one
    assert all(c["ok"] and c["firstSeq"] == 1 and c["sealed"] for c in chains), chains
    records = [
        json.loads(line) for seg in sorted(restored.rglob("*.jsonl")) for line in seg.read_text().splitlines()
    ]
    decided = [r["request"]["uid"] for r in records if r.get("stage") == "validate"]
    assert sorted(decided) == sorted(answered)  # 0 answered decisions missing, none twice
