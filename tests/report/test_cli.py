"""``mpigate report`` on the command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpigate.cli import cli


def run(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["report", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def test_format_follows_the_output_suffix(trail: Path, tmp_path: Path) -> None:
    for name, start in (("r.html", "<!DOCTYPE html>"), ("r.md", "## mpigate compliance report"),
                        ("r.json", "{"), ("r.csv", "section,date,")):  # fmt: skip
        code, _, err = run("--audit", trail / "audit", "--key", trail / "key", "-o", tmp_path / name)
        assert code == 0, err
        assert (tmp_path / name).read_text(encoding="utf-8").startswith(start)
    assert (
        "3 chain(s) all verified, 31 record(s) in the period, 100.0 % of it covered; controls: 10 met, "
        "9 attention, 14 not evaluated, 0 no occasion, 0 not applicable" in err
    )


def test_output_that_would_write_the_wrong_thing_is_refused(
    trail: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    audit = ("--audit", trail / "audit")
    for args, message in (
        (("-o", "json"), "-o names the output file here, not the format; use --format (html, md, json, csv)"),
        (("-o", "r.pdf"), "cannot write a .pdf file: the formats are html, md, json, csv"),
        (("-o", "r.json", "--format", "html"), "--format html but -o r.json names a json file"),
    ):
        code, out, err = run(*audit, *args)
        assert code == 2, out + err
        assert message in out + err
    assert list(tmp_path.iterdir()) == []  # nothing written
    code, _, err = run(*audit, "-o", "r.json", "--format", "json")
    assert code == 0, err
    assert (tmp_path / "r.json").read_text(encoding="utf-8").startswith("{")


def test_stdout_json_with_every_option(trail: Path, k8s_log: Path, repo: Path) -> None:
    code, out, err = run(
        "--audit", trail / "audit", "--k8s-audit", k8s_log, "--key", trail / "key",
        "--from", "2026-11-20", "--to", "2026-11-22T00:00:00Z", "--team", "nlp-team",
        "--framework", "soc2", "--framework", "gdpr", "--format", "json", "--config", repo,
        "--max-events", "3", "--max-examples", "1",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["period"]["from"] == "2026-11-20T00:00:00.000Z"
    assert report["period"]["to"] == "2026-11-22T00:00:00.000Z"
    assert report["filters"] == {"team": "nlp-team", "frameworks": ["soc2", "gdpr"]}
    assert report["configRevision"]
    assert len(report["activity"]["recentEvents"]) == 3
    assert all(len(r["examples"]) <= 1 for r in report["denials"]["topReasons"])
    assert report["totals"]["decisions"] == {"allowed": 5, "allowed-with-warnings": 0, "denied": 1}
    # the example org puts nlp-team in eu: its two llm-ft-1 pods there are fine
    assert report["residency"]["outside"] == 0
    assert report["residency"]["byRegionAndTeam"][0]["allowedRegions"][0] == "eu"
    assert "k8s-audit.jsonl: 3 malformed line(s), first at line 10: not a JSON object" in err


def test_broken_chain_exits_1_and_still_writes(trail: Path, tmp_path: Path) -> None:
    copy = tmp_path / "audit"
    shutil.copytree(trail / "audit", copy)
    segment = copy / "webhook-1" / "00000000000000000001.jsonl"
    lines = segment.read_text().splitlines(keepends=True)
    del lines[2]  # a record removed
    segment.write_text("".join(lines))
    code, _, err = run("--audit", copy, "--key", trail / "key", "-o", tmp_path / "r.html")
    assert code == 1
    assert "1 NOT INTACT" in err
    assert f"integrity deleted-records: {segment}:3: 1 record(s) missing before this line (seq 3)" in err
    assert 'id="integrity-banner"' in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--framework", "soc3"], "unknown framework 'soc3'"),
        (["--from", "2026-11-22", "--to", "2026-11-21"], "--from 2026-11-22 is not before --to 2026-11-21"),
        (["--from", "last tuesday"], "'last tuesday' is not an RFC 3339 time or date"),
        (["--format", "pdf"], "'pdf' is not one of 'html', 'md', 'json', 'csv'"),
    ],
)
def test_usage_errors(trail: Path, args: list[str], message: str) -> None:
    code, _, err = run("--audit", trail / "audit", *args)
    assert code == 2
    assert message in " ".join(err.split())


def test_a_directory_without_chains(tmp_path: Path) -> None:
    code, _, err = run("--audit", tmp_path)
    assert code == 2
    assert f"no audit chains (directories with *.jsonl segments) under {tmp_path}" in err


def test_broken_config_is_a_usage_error(trail: Path, tmp_path: Path) -> None:
    (tmp_path / "org.yaml").write_text("apiVersion: mpigate.io/v1alpha1\nkind: OrgPolicy\nspec: {bogus: 1}\n")
    code, _, err = run("--audit", trail / "audit", "--config", tmp_path)
    assert code == 2
    assert "the config tree has" in err and "error(s)" in err


def test_help_shows_examples() -> None:
    result = CliRunner().invoke(cli, ["report", "--help"])
    assert result.exit_code == 0
    assert "mpigate report --audit /var/lib/mpigate/audit --public-key audit-key.pub" in result.output


def test_a_team_without_decisions_is_pointed_out(trail: Path) -> None:
    audit = ("--audit", trail / "audit", "--format", "json")
    code, _, err = run(*audit, "--team", "nlp-team")
    assert code == 0, err
    assert "warning: no decision" not in err
    code, out, err = run(*audit, "--team", "nlp-teem")
    assert code == 0, err
    assert "warning: no decision of team 'nlp-teem' in the period; check the name" in err
    assert json.loads(out)["totals"]["teams"] == []


def test_completeness_and_scope_options(trail: Path, repo: Path, tmp_path: Path) -> None:
    code, out, err = run(
        "--audit", trail / "audit", "--key", trail / "key", "--format", "json",
        "--install", repo / "webhooks", "--heartbeat", "30m", "--sample", "2", "--seed", "5",
        "--not-applicable", "PCI-DSS-1.3.1=no cardholder data in the training cluster",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    # the install base runs 3 webhook replicas: 2 webhook chains are one short
    assert {"source": "webhook", "expected": 3, "found": 2} in report["completeness"]["expectedChains"][
        "bySource"
    ]
    assert report["completeness"]["heartbeatSeconds"] == 1800.0
    assert len(report["sample"]["items"]) == 2
    pci131 = next(c for f in report["controls"] for c in f["controls"] if c["fullId"] == "PCI-DSS-1.3.1")
    assert (pci131["status"], pci131["notApplicable"]) == (
        "not applicable",
        "no cardholder data in the training cluster",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--not-applicable", "PCI-DSS-1.3.1"], "write CONTROL=WHY"),
        (["--not-applicable", "SOC2-CC9.9=why"], "'SOC2-CC9.9' is not a control of the chosen frameworks"),
        (["--expect-chains", "webhook=three"], "expected a chain id or SOURCE=N"),
        (["--heartbeat", "soon"], "is not a duration"),
    ],
)
def test_completeness_option_errors(trail: Path, args: list[str], message: str) -> None:
    code, _, err = run("--audit", trail / "audit", *args)
    assert code == 2
    assert message in err


def test_a_chain_given_twice_is_a_usage_error(trail: Path) -> None:
    code, _, err = run("--audit", trail / "audit", "--audit", trail / "audit" / "webhook-1")
    assert code == 2
    assert "chain webhook-1 is given twice" in err


def test_printable_paper_size(trail: Path, tmp_path: Path) -> None:
    code, _, err = run("--audit", trail / "audit", "--paper", "letter", "-o", tmp_path / "r.html")
    assert code == 0, err
    assert "size: letter;" in (tmp_path / "r.html").read_text(encoding="utf-8")
