"""Completeness of the inputs: coverage of the period, gaps longer than the heartbeat, the
expected-chain inventory, inputs given twice, and the reconciliation of the API server's log
with the chains on the chain position the webhooks annotate (``<webhook>/record``)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mpigate.audit import AuditLog, HmacSigner, KeyRing, config_record
from mpigate.report import ReportOptions, build_report
from mpigate.report.build import ReportInputError

from .conftest import GENERATED, SECRET
from .scenario import FIXTURE_WRITER, MARIA, Clock, decision_record, scenario_config

Report = dict[str, Any]


def test_a_month_over_seconds_of_records_is_not_met(tmp_path: Path) -> None:
    # two decisions 0.8 s apart, reported for November
    clock = Clock().at("2026-11-20T09:00:00Z")
    log = AuditLog.open(
        tmp_path / "audit", chain="webhook-0", source="webhook", clock=clock, options=FIXTURE_WRITER
    )
    log.append(config_record(scenario_config()))
    log.append(decision_record("CREATE", "nlp-team", "a", MARIA))
    clock.at("2026-11-20T09:00:00.800Z")
    log.append(decision_record("CREATE", "nlp-team", "b", MARIA))
    log.close()
    report = build_report(
        [tmp_path / "audit"],
        options=ReportOptions(since="2026-11-01", until="2026-12-01", generated=GENERATED),
    )
    completeness = report["completeness"]
    assert completeness["periodSeconds"] == 30 * 86400
    assert completeness["coverage"] < 0.01
    assert [(g["from"], g["to"]) for g in completeness["gaps"]] == [
        ("2026-11-01T00:00:00.000Z", "2026-11-20T09:00:00.000Z"),
        ("2026-11-20T09:00:00.800Z", "2026-12-01T00:00:00.000Z"),
    ]
    assert report["controlSummary"]["met"] == 0
    assert report["crossCuttingReasons"]["all"][0].startswith(
        "the chains leave 2 gap(s) longer than the heartbeat (24.0 h), 30.0 days in all"
    )
    # without a period: the records' own span, 0.8 s — and it says so, not "1 day"
    own = build_report([tmp_path / "audit"], options=ReportOptions(generated=GENERATED))
    assert own["period"]["seconds"] == 0.8
    from mpigate.report.output import period_length

    assert period_length(own) == "0.8 s"


def test_gaps_longer_than_the_heartbeat(make_report: Callable[..., Report]) -> None:
    # the scenario's chains: webhook-0 falls silent on the 21st at 08:00; webhook-1 writes from
    # then on; the controller writes throughout, with 22.6 h between two records at most
    report = make_report(heartbeat=3600.0)
    chains = {c["chain"]: c for c in report["completeness"]["chains"]}
    assert chains["webhook-0"]["gapCount"] == 2
    assert chains["controller-0"]["longestSilenceSeconds"] == 81300.0
    gaps = report["completeness"]["gaps"]
    # nobody wrote from 2026-11-20 10:00 (vision-1) to 2026-11-21 08:00 (webhook-1's genesis)
    assert {"from": "2026-11-20T10:00:00.000Z", "to": "2026-11-21T08:00:00.000Z", "seconds": 79200.0} in gaps
    assert all(c["status"] != "met" for f in report["controls"] for c in f["controls"])
    # with the default heartbeat (24 h) the scenario is covered
    assert make_report()["completeness"]["gaps"] == []


def test_expected_chains(make_report: Callable[..., Report]) -> None:
    report = make_report(expect_chains=("webhook-0,webhook-2", "webhook=3", "controller=1"))
    expected = report["completeness"]["expectedChains"]
    assert expected["missing"] == ["webhook-2"]
    assert expected["bySource"] == [
        {"source": "controller", "expected": 1, "found": 1},
        {"source": "webhook", "expected": 3, "found": 2},
    ]
    reasons = report["crossCuttingReasons"]["all"]
    assert "expected chain(s) not among the inputs: webhook-2" in reasons
    assert "expected at least 3 chain(s) written by webhook, found 2" in reasons
    assert report["controlSummary"]["met"] == 0


def test_the_same_chain_or_log_given_twice_is_refused(trail: Path, k8s_log: Path, tmp_path: Path) -> None:
    audit = trail / "audit"
    with pytest.raises(ReportInputError, match="chain webhook-0 is given twice"):
        build_report([audit, audit / "webhook-0"])
    copy = tmp_path / "copy"
    shutil.copytree(audit / "webhook-1", copy / "webhook-1")
    with pytest.raises(ReportInputError, match=f"chain webhook-1 is given twice .* and {copy}"):
        build_report([audit, copy])
    with pytest.raises(ReportInputError, match="is given twice"):
        build_report([audit], [k8s_log, k8s_log])
    other = tmp_path / "renamed.log"
    other.write_bytes(k8s_log.read_bytes())
    with pytest.raises(ReportInputError, match="are the same file"):
        build_report([audit], [k8s_log, other])


# ---------------------------------------------------------------------- reconciliation


def write_witnessed(root: Path, drop_last: int = 0, extra_claim: str | None = None) -> tuple[Path, Path]:
    """A webhook chain of 100 requests, a minute apart (mutate + validate each), and the API
    server's log of them, each event annotated with both records' chain positions, as the
    webhooks do. ``drop_last`` cuts that many lines off the chain's end (and re-signs nothing):
    the truncation issue 18 makes visible."""
    clock = Clock().at("2026-11-20T09:00:00Z")
    signer = HmacSigner(SECRET)
    log = AuditLog.open(
        root / "audit",
        chain="webhook-0",
        source="webhook",
        signer=signer,
        clock=clock,
        options=FIXTURE_WRITER,
    )
    log.append(config_record(scenario_config()))
    events = []
    start = dt.datetime(2026, 11, 20, 9, 1, tzinfo=dt.UTC)
    for i in range(100):
        moment = start + dt.timedelta(minutes=i)
        clock.now = moment
        mutated = log.append(decision_record("CREATE", "nlp-team", f"job-{i}", MARIA, stage="mutate"))
        validated = log.append(decision_record("CREATE", "nlp-team", f"job-{i}", MARIA))
        events.append(
            {
                "kind": "Event",
                "apiVersion": "audit.k8s.io/v1",
                "level": "Metadata",
                "auditID": f"00000000-0000-4000-8000-{i:012d}",
                "stage": "ResponseComplete",
                "verb": "create",
                "user": {"username": "maria", "groups": ["system:authenticated"]},
                "sourceIPs": ["10.0.0.7"],
                "objectRef": {
                    "resource": "trainjobs",
                    "namespace": "nlp-team",
                    "name": f"job-{i}",
                    "apiGroup": "trainer.kubeflow.org",
                },
                "responseStatus": {"code": 201},
                "requestReceivedTimestamp": moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "annotations": {
                    "authorization.k8s.io/decision": "allow",
                    "mutate.trainjobs.mpigate.io/record": f"{mutated.chain}:{mutated.seq}:{mutated.hash}",
                    "validate.team.mpigate.io/decision": "allowed",
                    "validate.team.mpigate.io/record": f"{validated.chain}:{validated.seq}:{validated.hash}",
                },
            }
        )
    clock.at("2026-11-20T11:00:00Z")
    log.close()
    if extra_claim is not None:
        events[-1]["annotations"]["validate.team.mpigate.io/record"] = extra_claim
    api = root / "kube-apiserver-audit.log"
    api.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    if drop_last:
        [segment] = sorted((root / "audit" / "webhook-0").glob("*.jsonl"))
        lines = segment.read_bytes().splitlines(keepends=True)
        segment.write_bytes(b"".join(lines[: len(lines) - drop_last]))
    return root / "audit", api


def reconcile(audit: Path, api: Path) -> dict[str, Any]:
    return build_report(
        [audit],
        [api],
        keys=KeyRing.load([_key(audit)]),
        options=ReportOptions(until="2026-11-21", generated=GENERATED),
    )


def _key(audit: Path) -> Path:
    key = audit.parent / "key"
    key.write_bytes(SECRET)
    return key


def test_every_annotated_event_matches_its_record(tmp_path: Path) -> None:
    report = reconcile(*write_witnessed(tmp_path))
    result = report["completeness"]["reconciliation"]
    assert result["possible"] is True
    assert result["stages"] == ["mutate", "validate"]
    # the first and last minute are not compared (an event and its record may straddle an edge)
    # seq 4-63 (the genesis, its checkpoint and the config record are 1-3) straddle the log's
    # first minute
    assert result["recordsMatched"] == result["recordsCompared"] == 200 - 60
    assert result["mismatches"] == []
    assert report["integrity"]["status"]["text"] == "all verified"


def test_records_cut_off_the_end_of_a_chain_are_found(tmp_path: Path) -> None:
    # the last request's records and the shutdown checkpoint are gone: the chain alone cannot
    # tell (it ends after a checkpoint), the API server's log can
    audit, api = write_witnessed(tmp_path, drop_last=3)
    report = reconcile(audit, api)
    result = report["completeness"]["reconciliation"]
    assert result["mismatchCount"] == 2  # the mutate and the validate record of job-99
    mismatch = {m["stage"]: m for m in result["mismatches"]}
    assert (mismatch["validate"]["records"], mismatch["validate"]["annotatedEvents"]) == (
        mismatch["validate"]["annotatedEvents"] - 1,
        mismatch["validate"]["annotatedEvents"],
    )
    assert any("disagree" in r for r in report["crossCuttingReasons"]["all"])


def test_an_event_naming_a_chain_that_was_not_given(tmp_path: Path) -> None:
    # the witness (issue 18) reports the missing chain; every control needs attention
    ghost = "webhook-7:12:" + "ab" * 32
    report = reconcile(*write_witnessed(tmp_path, extra_claim=ghost))
    problem = report["integrity"]["firstProblem"]
    assert (problem["chain"], problem["kind"]) == ("webhook-7", "missing-chain")
    assert {c["status"] for f in report["controls"] for c in f["controls"]} == {"attention"}


def test_a_chain_whose_newest_records_nothing_vouches_for(tmp_path: Path) -> None:
    # the shutdown checkpoint is cut and no log witnesses the chain: its end is unverifiable
    audit, _ = write_witnessed(tmp_path, drop_last=1)
    report = build_report(
        [audit], keys=KeyRing.load([_key(audit)]), options=ReportOptions(generated=GENERATED)
    )
    shared = report["crossCuttingReasons"]["all"]
    assert any(r.startswith("chain webhook-0: unverifiable since") for r in shared)
    assert report["controlSummary"]["met"] == 0


def test_events_without_chain_positions_say_so(make_report: Callable[..., Report], k8s_log: Path) -> None:
    # the hand-written log is from webhooks before chain positions: nothing to compare
    result = make_report(k8s=[k8s_log])["completeness"]["reconciliation"]
    assert result["possible"] is False
    assert result["eventsWithoutChainPosition"] == 4
