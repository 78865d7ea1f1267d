"""`verify` finds and locates (file + line) every kind of tampering on a real log."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mpigate.audit._canonical import canonical_bytes, record_hash
from mpigate.audit.layout import list_segments
from mpigate.audit.reader import PROBLEM_KINDS, read_chains, verify_chain
from mpigate.cli import cli

from .conftest import entry, lines_of


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed chain of 4+ segments with interval checkpoints."""
    root = tmp_path_factory.mktemp("pristine") / "audit"
    from mpigate.audit import AuditLog, HmacSigner, WriterOptions

    from .conftest import HMAC_SECRET

    options = WriterOptions(checkpoint_every=10, rotate_max_bytes=6000)
    with AuditLog.open(
        root, chain="chain-a", source="webhook", signer=HmacSigner(HMAC_SECRET), options=options
    ) as log:
        for i in range(60):
            log.append(entry(i, padding="p" * 150))
    return root / "chain-a"


@pytest.fixture
def chain(pristine: Path, tmp_path: Path) -> Path:
    target = tmp_path / "audit" / "chain-a"
    shutil.copytree(pristine, target)
    return target


def segments(chain: Path) -> list[Path]:
    return list_segments(chain)


def set_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def record_line(path: Path, lineno: int) -> dict[str, Any]:
    return json.loads(lines_of(path)[lineno - 1])


def only_errors(report) -> set[str]:  # type: ignore[no-untyped-def]
    return {p.kind for p in report.errors}


def test_pristine_chain_verifies(chain, keyring):
    report = verify_chain(chain, keyring)
    assert report.ok, report.problems
    assert report.problems == []
    assert report.segments >= 4
    assert report.records == report.last_seq
    assert report.last_checkpoint is not None and report.last_checkpoint.reason == "shutdown"
    assert report.last_checkpoint.verified is True
    assert report.first_time is not None and report.first_time <= report.last_time


def test_edited_field(chain, keyring):
    seg = segments(chain)[1]
    lines = lines_of(seg)
    assert b'"decision":"allowed"' in lines[4]
    lines[4] = lines[4].replace(b'"decision":"allowed"', b'"decision":"denied"')
    set_lines(seg, lines)
    report = verify_chain(chain, keyring)
    assert only_errors(report) == {"edited"}
    problem = report.first("edited")
    assert (Path(problem.file).name, problem.line) == (seg.name, 5)


def test_deleted_record(chain, keyring):
    seg = segments(chain)[1]
    lines = lines_of(seg)
    gone = json.loads(lines[3])
    assert gone["stage"] == "validate"
    del lines[3]
    set_lines(seg, lines)
    report = verify_chain(chain, keyring)
    problem = report.first("deleted-records")
    assert problem is not None and (Path(problem.file).name, problem.line) == (seg.name, 4)
    assert f"seq {gone['seq']}" in problem.message
    assert only_errors(report) <= {"deleted-records", "forged"}


def test_reordered_records(chain, keyring):
    seg = segments(chain)[2]
    lines = lines_of(seg)
    lines[2], lines[3] = lines[3], lines[2]
    set_lines(seg, lines)
    report = verify_chain(chain, keyring)
    assert only_errors(report) == {"reordered"}
    problem = report.first("reordered")
    assert (Path(problem.file).name, problem.line) == (seg.name, 3)


def test_truncated_segment_mid_line(chain, keyring):
    seg = segments(chain)[1]
    data = seg.read_bytes()
    cut = data[: len(data) - 40]
    seg.write_bytes(cut)
    report = verify_chain(chain, keyring)
    problem = report.first("truncated")
    assert problem is not None
    assert (Path(problem.file).name, problem.line) == (seg.name, cut.count(b"\n") + 1)
    assert "incomplete last line" in problem.message


def test_truncated_segment_at_a_line_boundary(chain, keyring):
    seg = segments(chain)[1]
    lines = lines_of(seg)
    kept = len(lines) - 3
    set_lines(seg, lines[:kept])
    report = verify_chain(chain, keyring)
    assert only_errors(report) == {"truncated"}
    problem = report.first("truncated")
    assert (Path(problem.file).name, problem.line) == (seg.name, kept + 1)


def test_deleted_middle_segment(chain, keyring):
    segs = segments(chain)
    segs[2].unlink()
    report = verify_chain(chain, keyring)
    assert only_errors(report) == {"deleted-segment"}
    problem = report.first("deleted-segment")
    assert (Path(problem.file).name, problem.line) == (segs[1].name, len(lines_of(segs[1])))
    assert segs[2].name in problem.message


def test_deleted_last_segment(chain, keyring):
    segs = segments(chain)
    segs[-1].unlink()
    report = verify_chain(chain, keyring)
    problem = report.first("deleted-segment")
    assert problem is not None and segs[-1].name in problem.message
    assert (Path(problem.file).name, problem.line) == (segs[-2].name, len(lines_of(segs[-2])))


def test_deleted_first_segment(chain, keyring):
    segs = segments(chain)
    segs[0].unlink()
    report = verify_chain(chain, keyring)
    problem = report.first("deleted-segment")
    assert problem is not None and (Path(problem.file).name, problem.line) == (segs[1].name, 1)


def _rehash_from(chain: Path, seg_index: int, lineno: int, edit: bytes, replacement: bytes) -> None:
    """Edit one record and recompute every later hash and link — a forgery without the key."""
    head: str | None = None
    started = False
    for i, seg in enumerate(segments(chain)):
        out = []
        for n, raw in enumerate(lines_of(seg), start=1):
            record = json.loads(raw)
            if i == seg_index and n == lineno:
                record = json.loads(raw.replace(edit, replacement))
                started = True
            if started:
                if head is not None:
                    record["prev"] = head
                    if record["stage"] == "checkpoint":
                        record["checkpoint"]["head"] = head
                record["hash"] = record_hash(record)
            head = record["hash"]
            out.append(canonical_bytes(record) + b"\n")
        set_lines(seg, out)


def test_forged_chain_without_the_key(chain, keyring):
    seg = segments(chain)[0]
    target = next(n for n, raw in enumerate(lines_of(seg), 1) if b'"name":"job-3"' in raw)
    _rehash_from(chain, 0, target, b'"decision":"allowed"', b'"decision":"denied"')
    report = verify_chain(chain, keyring)
    assert only_errors(report) == {"forged"}  # every hash and link is consistent again
    problem = report.first("forged")
    first_checkpoint_after = next(
        n for n, raw in enumerate(lines_of(seg), 1) if n > target and b'"stage":"checkpoint"' in raw
    )
    assert (Path(problem.file).name, problem.line) == (seg.name, first_checkpoint_after)
    # without the key the forgery is invisible: that is why verifiers need --key/--public-key
    # (and why a chain read without one is never called verified)
    unkeyed = verify_chain(chain, None)
    assert unkeyed.ok and unkeyed.status().state == "unverifiable"


def test_missing_tail_after_last_checkpoint_is_a_warning(chain, keyring):
    last = segments(chain)[-1]
    lines = lines_of(last)
    assert json.loads(lines[-1])["stage"] == "checkpoint"
    set_lines(last, lines[:-1])
    report = verify_chain(chain, keyring)
    assert report.ok
    warning = report.first("unsigned-tail")
    assert warning is not None and warning.severity == "warning"
    tail_lines = lines[:-1][-report.unsigned_records :]
    assert report.unsigned_bytes == sum(len(x) for x in tail_lines)
    assert f"({report.unsigned_bytes} bytes)" in warning.message


def test_every_problem_kind_is_documented():
    doc = (Path(__file__).parents[2] / "docs" / "audit.md").read_text()
    for kind in PROBLEM_KINDS:
        assert f"`{kind}`" in doc, kind


def test_every_json_field_of_a_chain_is_documented(chain, hmac_key_file):
    # The `-o json` field list in audit.md names every key a chain's report carries.
    doc = (Path(__file__).parents[2] / "docs" / "audit.md").read_text()
    section = doc[doc.index("`-o json` / `-o yaml` give") :]
    section = section[: section.index("\n\n")]
    fields = verify_chain(chain, None).to_dict().keys()
    missing = [key for key in fields if f"`{key}`" not in section and key != "chain"]
    assert not missing, f"docs/audit.md's -o json field list lacks {missing}"


def test_cli_verify_reports_and_exit_codes(chain, hmac_key_file):
    runner = CliRunner()
    ok = runner.invoke(cli, ["audit", "verify", str(chain.parent), "--key", str(hmac_key_file)])
    assert ok.exit_code == 0, ok.output
    assert "chain chain-a" in ok.output and "signature verified" in ok.output and "all verified" in ok.output

    seg = segments(chain)[1]
    lines = lines_of(seg)
    lines[1] = lines[1].replace(b'"decision":"allowed"', b'"decision":"denied"')
    set_lines(seg, lines)
    bad = runner.invoke(cli, ["audit", "verify", str(chain.parent), "--key", str(hmac_key_file)])
    assert bad.exit_code == 1
    assert f"{seg.name}:2" in bad.output and "error edited" in bad.output

    as_json = runner.invoke(
        cli, ["audit", "verify", str(chain.parent), "--key", str(hmac_key_file), "-o", "json"]
    )
    data = json.loads(as_json.output)
    assert data["ok"] is False
    [report] = data["chains"]
    assert report["problems"][0]["kind"] == "edited" and report["problems"][0]["line"] == 2
    assert report["problems"][0]["file"].endswith(seg.name)


def test_cli_verify_without_key_warns_and_verifies_nothing(chain):
    result = CliRunner().invoke(cli, ["audit", "verify", str(chain)])
    assert result.exit_code == 1  # consistent, but nothing is authenticated: unverifiable
    assert "unchecked-signatures" in result.output and "1 unverifiable" in result.output


def test_cli_verify_no_chains(tmp_path):
    result = CliRunner().invoke(cli, ["audit", "verify", str(tmp_path)])
    assert result.exit_code == 2 and "no audit chains" in result.output


def test_read_chains_merges_by_time(tmp_path, keyring):
    import datetime as dt

    from mpigate.audit import AuditLog, HmacSigner

    from .conftest import HMAC_SECRET

    base = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
    for name, offset in (("a", 0), ("b", 500)):
        moments = iter(base + dt.timedelta(milliseconds=offset + 1000 * i) for i in range(100))
        with AuditLog.open(
            tmp_path / "audit", chain=name, signer=HmacSigner(HMAC_SECRET), clock=lambda m=moments: next(m)
        ) as log:
            for i in range(5):
                log.append(entry(i))
    reading = read_chains([tmp_path / "audit"], keyring)
    entries = list(reading)
    times = [e.time for e in entries]
    assert times == sorted(times)
    assert {e.chain for e in entries} == {"a", "b"}
    chains_in_order = [e.chain for e in entries if e.stage == "validate"]
    assert chains_in_order[:4] == ["a", "b", "a", "b"]
    assert reading.ok and len(reading.reports) == 2 and all(r.complete for r in reading.reports)
    assert all(e.intact and record_hash(e.record) == e.hash for e in entries)


def test_a_partial_line_of_a_live_writer_is_in_progress(tmp_path, keyring):
    from mpigate.audit import AuditLog, HmacSigner

    from .conftest import HMAC_SECRET

    chain = tmp_path / "audit" / "live"
    partial = b'{"chain":"live","decision":"al'
    log = AuditLog.open(tmp_path / "audit", chain="live", signer=HmacSigner(HMAC_SECRET))
    try:
        log.append(entry(1))
        segment = segments(chain)[-1]
        size = segment.stat().st_size
        with segment.open("ab") as fh:  # what a reader can see in the middle of a write
            fh.write(partial)
        live = verify_chain(chain, keyring)
        assert live.ok and live.first("in-progress") is not None and live.first("truncated") is None
        with segment.open("r+b") as fh:
            fh.truncate(size)
    finally:
        log.close()
    with segment.open("ab") as fh:
        fh.write(partial)
    dead = verify_chain(chain, keyring)  # no writer holds the chain: a cut, not a write in progress
    assert not dead.ok and dead.first("truncated") is not None
