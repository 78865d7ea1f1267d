"""Issue 18 items 5 and 6 through `mpigate audit verify`: a chain rewritten without the key is an
error, and the newest records cannot disappear without the chain being reported unverifiable.

Each test applies what a person with write access to the audit volume (but not the signing key)
can do to a real, cleanly closed chain, and checks what verify says and how it exits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from mpigate.audit import AuditLog, HmacSigner, KeyRing, load_signer
from mpigate.audit._canonical import canonical_bytes, record_hash
from mpigate.audit.layout import list_segments
from mpigate.audit.reader import verify_chain
from mpigate.cli import cli

from .conftest import HMAC_SECRET, entry, lines_of, write_chain


def _denial(i: int) -> dict[str, Any]:
    return entry(i, decision="denied", violations=[{"id": "MPG-SEC-001", "mode": "enforce"}])


def _write(root: Path, chain: str, records: int, **options: Any) -> Path:
    return write_chain(root, records, chain=chain, make=_denial, **options)


def _records(chain: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for seg in list_segments(chain) for line in lines_of(seg)]


def _rewrite(chain: Path, records: list[dict[str, Any]]) -> None:
    """Renumber, relink and rehash ``records`` into one segment — all that needs no key."""
    for seg in list_segments(chain):
        seg.unlink()
    head = "0" * 64
    out = []
    for seq, record in enumerate(records, start=1):
        record = {**record, "seq": seq, "prev": head}
        record.pop("hash", None)
        record["hash"] = record_hash(record)
        head = record["hash"]
        out.append(canonical_bytes(record) + b"\n")
    (chain / "00000000000000000001.jsonl").write_bytes(b"".join(out))


def _forge(chain: Path) -> None:
    """Issue 18 item 5: drop the checkpoints, flip every denial, recompute every link."""
    kept = []
    for record in _records(chain):
        if record["stage"] == "checkpoint":
            continue
        if record.get("decision") == "denied":
            record = {**record, "decision": "allowed", "violations": []}
        kept.append(record)
    _rewrite(chain, kept)


def _verify(*args: str) -> Result:
    return CliRunner().invoke(cli, ["audit", "verify", *args])


def _json(result: Result) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.output)
    return data


@pytest.fixture
def closed(tmp_path: Path) -> Path:
    """A cleanly closed chain: 40 denials over 3+ segments with interval checkpoints."""
    return _write(tmp_path / "audit", "webhook-0", 40, checkpoint_every=7, rotate_max_bytes=4000)


def test_a_pristine_closed_chain_is_verified(closed: Path, hmac_key_file: Path) -> None:
    result = _verify(str(closed.parent), "--key", str(hmac_key_file))
    assert result.exit_code == 0, result.output
    assert "verified through seq" in result.output and "sealed by its shutdown checkpoint" in result.output
    report = verify_chain(closed, KeyRing.load([hmac_key_file]))
    status = report.status()
    assert status.state == "verified" and status.unverifiable_records == 0
    assert report.signatures == "verified" and report.verified_checkpoints >= 3


# ---------------------------------------------------------------------- item 5: signatures


def test_a_chain_rewritten_without_its_checkpoints_is_an_error(tmp_path: Path, hmac_key_file: Path) -> None:
    chain = _write(tmp_path / "audit", "webhook-0", 12)
    genesis = _records(chain)[0]
    assert genesis["genesis"]["alg"] == "hmac-sha256" and genesis["genesis"]["keyId"]
    _forge(chain)
    assert all(r["stage"] != "checkpoint" and r.get("decision") != "denied" for r in _records(chain))
    result = _verify(str(chain.parent), "--key", str(hmac_key_file))
    assert result.exit_code == 1, result.output
    assert "signatures:      verified" not in result.output and "all verified" not in result.output
    assert "error no-valid-checkpoint" in result.output
    assert "names hmac-sha256 key" in result.output
    data = _json(_verify(str(chain.parent), "--key", str(hmac_key_file), "-o", "json"))
    [report] = data["chains"]
    assert report["ok"] is False and report["signatures"] == "missing"
    assert report["status"]["state"] == "broken"
    # without a key it is an error too: the genesis promises signed checkpoints, there are none
    unkeyed = _verify(str(chain.parent))
    assert unkeyed.exit_code == 1 and "error no-valid-checkpoint" in unkeyed.output


def test_a_rewrite_that_also_erases_the_key_from_the_genesis_fails_with_a_key(
    tmp_path: Path, hmac_key_file: Path
) -> None:
    chain = _write(tmp_path / "audit", "webhook-0", 12)
    records = _records(chain)
    records[0]["genesis"] = {**records[0]["genesis"], "alg": "none", "keyId": ""}
    _rewrite(chain, [r for r in records if r["stage"] != "checkpoint"])
    result = _verify(str(chain.parent), "--key", str(hmac_key_file))
    assert result.exit_code == 1, result.output
    assert "error no-valid-checkpoint" in result.output


def test_unsigned_checkpoints_are_an_error_when_a_key_is_given(tmp_path: Path, hmac_key_file: Path) -> None:
    """A forger may keep checkpoints but mark them unsigned (what a writer without a key writes)."""
    chain = _write(tmp_path / "audit", "webhook-0", 12)
    records = []
    for record in _records(chain):
        if record["stage"] == "checkpoint":
            record["checkpoint"] = {**record["checkpoint"], "alg": "none", "keyId": ""}
            record["checkpoint"].pop("sig")
        if record["stage"] == "genesis":
            record["genesis"] = {**record["genesis"], "alg": "none", "keyId": ""}
        records.append(record)
    _rewrite(chain, records)
    # the rewrite keeps headSeq/head consistent: fix them to the renumbered chain
    fixed = []
    for previous, record in zip([None, *_records(chain)], _records(chain), strict=False):
        if record["stage"] == "checkpoint" and previous is not None:
            record["checkpoint"] = {
                **record["checkpoint"],
                "headSeq": previous["seq"],
                "head": previous["hash"],
            }
        fixed.append(record)
    _rewrite(chain, fixed)
    result = _verify(str(chain.parent), "--key", str(hmac_key_file))
    assert result.exit_code == 1, result.output
    assert "error unsigned-checkpoints" in result.output


def test_verified_needs_a_verified_checkpoint_with_ed25519(
    tmp_path: Path, ed25519_files: tuple[Path, Path]
) -> None:
    private, public = ed25519_files
    chain = _write(tmp_path / "audit", "webhook-0", 5, signer=load_signer("ed25519", private))
    good = _verify(str(chain.parent), "--public-key", str(public))
    assert good.exit_code == 0, good.output
    _forge(chain)
    bad = _verify(str(chain.parent), "--public-key", str(public))
    assert bad.exit_code == 1 and "error no-valid-checkpoint" in bad.output
    assert "names ed25519 key" in bad.output


def test_a_fresh_chain_is_signed_from_its_genesis(tmp_path: Path, keyring: KeyRing) -> None:
    """The writer signs its genesis at once, so no intact chain is ever without a checkpoint."""
    log = AuditLog.open(tmp_path / "audit", chain="fresh", signer=HmacSigner(HMAC_SECRET))
    try:
        records = _records(tmp_path / "audit" / "fresh")
        assert [r["stage"] for r in records] == ["genesis", "checkpoint"]
        assert records[1]["checkpoint"]["reason"] == "genesis"
        report = verify_chain(tmp_path / "audit" / "fresh", keyring)
        assert report.ok and report.verified_checkpoints == 1
        assert report.status().state == "pending"  # the writer holds it: its end is still open
    finally:
        log.close()


# ---------------------------------------------------------------------- item 6: the newest records


def _cut_lines(segment: Path, count: int) -> None:
    lines = lines_of(segment)
    segment.write_bytes(b"".join(lines[:-count]))


@pytest.mark.parametrize("count", [1, 3, 6])
def test_removing_the_newest_lines_is_reported_unverifiable(
    closed: Path, hmac_key_file: Path, count: int
) -> None:
    newest = list_segments(closed)[-1]
    _cut_lines(newest, count)
    result = _verify(str(closed.parent), "--key", str(hmac_key_file))
    assert result.exit_code == 1, result.output
    assert "all intact" not in result.output and "all verified" not in result.output
    assert "unverifiable since" in result.output
    report = verify_chain(closed, KeyRing.load([hmac_key_file]))
    status = report.status()
    assert status.state == "unverifiable"
    assert status.since is not None and status.text().startswith(f"unverifiable since {status.since}, ")
    # the records after the last signed checkpoint are the unverifiable ones (none when the cut
    # ends exactly at a checkpoint: then the missing shutdown checkpoint is the reason)
    assert status.unverifiable_records == report.unsigned_records
    assert "shutdown checkpoint" in status.reason or status.unverifiable_records > 0


def test_removing_the_newest_segment_and_the_rotate_line_is_reported_unverifiable(
    closed: Path, hmac_key_file: Path
) -> None:
    segments = list_segments(closed)
    assert len(segments) >= 3
    segments[-1].unlink()
    previous = segments[-2]
    lines = lines_of(previous)
    assert json.loads(lines[-1])["checkpoint"]["reason"] == "rotate"
    previous.write_bytes(b"".join(lines[:-1]))
    result = _verify(str(closed.parent), "--key", str(hmac_key_file))
    assert result.exit_code == 1, result.output
    assert "unverifiable since" in result.output and "all verified" not in result.output


def test_removing_the_newest_segment_alone_is_an_error(closed: Path, hmac_key_file: Path) -> None:
    list_segments(closed)[-1].unlink()
    result = _verify(str(closed.parent), "--key", str(hmac_key_file))
    assert result.exit_code == 1 and "error deleted-segment" in result.output


def test_without_a_key_nothing_is_verified(closed: Path) -> None:
    result = _verify(str(closed.parent))
    assert result.exit_code == 1, result.output
    assert "unverifiable since" in result.output and "signatures not checked" in result.output


def test_a_deleted_chain_directory_is_named_as_unwitnessed(tmp_path: Path, hmac_key_file: Path) -> None:
    """Without a witness nobody can know a whole chain is gone: verify says so instead of 'all'."""
    root = tmp_path / "audit"
    _write(root, "webhook-0", 3)
    gone = _write(root, "webhook-1", 3)
    shutil.rmtree(gone)
    result = _verify(str(root), "--key", str(hmac_key_file))
    assert result.exit_code == 0, result.output
    assert "deleted chain directory" in result.output and "--k8s-audit" in result.output
