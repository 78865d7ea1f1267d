"""Every row names its record; a reproducible random sample; the digests of the inputs; a signed
manifest that `mpigate audit verify` checks."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from mpigate.audit import generate_key
from mpigate.cli import cli
from mpigate.report.output import short_ref

Report = dict[str, Any]


def records_by_position(trail: Path) -> dict[str, dict[str, Any]]:
    """Every record of the scenario by its chain:seq:hash."""
    found = {}
    for segment in sorted((trail / "audit").glob("*/*.jsonl")):
        for line in segment.read_bytes().splitlines():
            record = json.loads(line)
            found[f"{record['chain']}:{record['seq']}:{record['hash']}"] = record
    return found


def test_every_row_names_its_record(report: Report, trail: Path) -> None:
    records = records_by_position(trail)
    rows = [
        *report["activity"]["recentEvents"],
        *(e for r in report["denials"]["topReasons"] for e in r["examples"]),
        *report["security"]["recent"],
        *report["residency"]["outsideExamples"],
    ]
    assert len(rows) > 10
    for row in rows:
        position = row.get("record") or row.get("ref")
        record = records[position]  # exists, with that hash
        assert record["time"] == row["time"]
        if "requestUID" in row and record.get("request"):
            assert row["requestUID"] == (record["request"]["uid"] or None)
    assert short_ref("webhook-0:3:" + "a" * 64) == "webhook-0:3:" + "a" * 16 + "…"


def test_api_server_rows_name_file_line_and_audit_id(
    make_report: Callable[..., Report], k8s_log: Path
) -> None:
    report = make_report(k8s=[k8s_log])
    [unjudged] = report["activity"]["apiServer"]["unjudgedExamples"]
    assert unjudged["source"].endswith("k8s-audit.jsonl:5")
    assert unjudged["auditID"]
    rows = [e for e in report["activity"]["recentEvents"] if e["source"] == "k8s-audit"]
    assert rows and all(e["ref"].rsplit(":", 1)[1].isdigit() and e["requestUID"] for e in rows)


def test_the_sample_is_random_and_reproducible(make_report: Callable[..., Report]) -> None:
    first = make_report(sample=4, seed=11)["sample"]
    again = make_report(sample=4, seed=11, jobs=2)["sample"]  # other processes, other merge order
    other = make_report(sample=4, seed=12)["sample"]
    assert first == again
    assert (first["size"], first["seed"], first["population"]) == (4, 11, 10)
    assert len(first["items"]) == 4
    assert [i["record"] for i in first["items"]] != [i["record"] for i in other["items"]]
    everything = make_report(sample=50, seed=11)["sample"]["items"]
    assert len(everything) == 10  # the whole population, each request once
    assert len({i["record"] for i in everything}) == 10
    assert {i["record"] for i in first["items"]} <= {i["record"] for i in everything}
    assert make_report()["sample"] == {
        "size": 0,
        "seed": None,
        "population": 0,
        "unit": "requests (validate records in the period)",
        "items": [],
    }


def test_the_report_lists_the_digests_of_its_inputs(
    make_report: Callable[..., Report], trail: Path, k8s_log: Path
) -> None:
    report = make_report(k8s=[k8s_log])
    segments = sorted((trail / "audit").glob("*/*.jsonl"))
    listed = {d["path"]: d["sha256"] for c in report["inputs"]["chains"] for d in c["segmentDigests"]}
    assert listed == {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in segments}
    [log] = report["inputs"]["k8sAudit"]
    assert log["sha256"] == hashlib.sha256(k8s_log.read_bytes()).hexdigest()
    assert len(report["reportId"]) == 20
    # the id follows from the inputs: the same inputs and time give the same id
    assert make_report(k8s=[k8s_log])["reportId"] == report["reportId"]
    assert make_report()["reportId"] != report["reportId"]


def run(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [*map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def test_a_signed_report_is_verified_by_audit_verify(trail: Path, tmp_path: Path) -> None:
    private, public = generate_key("ed25519")
    assert public is not None
    (tmp_path / "report.pem").write_bytes(private)
    (tmp_path / "report.pub").write_bytes(public)
    out = tmp_path / "november.html"
    code, _, err = run(
        "report", "--audit", trail / "audit", "--key", trail / "key", "-o", out,
        "--sign-key", tmp_path / "report.pem",
    )  # fmt: skip
    assert code == 0, err
    manifest_file = tmp_path / "november.html.manifest.json"
    manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    assert manifest["report"]["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert manifest["reportId"] in out.read_text(encoding="utf-8")
    assert len([i for i in manifest["inputs"] if i["kind"] == "chain-segment"]) == 5
    assert manifest["signature"]["alg"] == "ed25519"
    code, _, err = run(
        "audit", "verify", "--report-manifest", manifest_file, "--public-key", tmp_path / "report.pub"
    )
    assert code == 0, err
    assert "OK — its SHA-256 and 5 input digest(s) match the signed manifest" in err
    # chains and report together
    code, _, err = run(
        "audit", "verify", trail / "audit", "--key", trail / "key",
        "--report-manifest", manifest_file, "--public-key", tmp_path / "report.pub",
    )  # fmt: skip
    assert code == 0, err
    # an edited report fails, and so does another key or an unsigned manifest
    out.write_text(out.read_text(encoding="utf-8").replace("attention", "met"), encoding="utf-8")
    code, _, err = run(
        "audit", "verify", "--report-manifest", manifest_file, "--public-key", tmp_path / "report.pub"
    )
    assert code == 1
    assert "the report's SHA-256 is" in err
    _, other_public = generate_key("ed25519")
    assert other_public is not None
    (tmp_path / "other.pub").write_bytes(other_public)
    code, _, err = run(
        "audit", "verify", "--report-manifest", manifest_file, "--public-key", tmp_path / "other.pub"
    )
    assert code == 1
    assert "no Ed25519 public key with id" in err
    unsigned = dict(manifest)
    del unsigned["signature"]
    manifest_file.write_text(json.dumps(unsigned), encoding="utf-8")
    code, _, err = run("audit", "verify", "--report-manifest", manifest_file)
    assert code == 1
    assert "the manifest is not signed" in err


def test_a_manifest_needs_an_output_file(trail: Path, tmp_path: Path) -> None:
    private, _ = generate_key("hmac-sha256")
    (tmp_path / "k").write_bytes(private)
    code, _, err = run("report", "--audit", trail / "audit", "--sign-key", tmp_path / "k",
                       "--sign-method", "hmac-sha256")  # fmt: skip
    assert code == 2
    assert "a signed manifest needs an output file" in err
    code, _, err = run("audit", "verify")
    assert code == 2
    assert "name audit DIRECTORIES, or a report with --report-manifest" in err
