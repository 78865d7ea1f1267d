"""Reports over the scenario trail (real chains, real builders): every number is known."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .scenario import DECISIONS, DECISIONS_BY_DAY, DENIALS_BY_RULE, GPU_HOURS, Q001, Q001_CI, SCRIPT_MESSAGE

Report = dict[str, Any]


def control(report: Report, full_id: str) -> dict[str, Any]:
    return next(c for f in report["controls"] for c in f["controls"] if c["fullId"] == full_id)


def test_period_inputs_and_integrity(report: Report) -> None:
    assert report["period"] == {
        "from": None,
        "to": None,
        "firstRecord": "2026-11-20T09:00:00.000Z",
        "lastRecord": "2026-11-22T08:05:00.000Z",
        "days": 3,
        "seconds": 169500.0,  # the span of the records: 47.1 h, not "3 days"
    }
    chains = {c["chain"]: c for c in report["inputs"]["chains"]}
    assert sorted(chains) == ["controller-0", "webhook-0", "webhook-1"]
    # webhook-0: genesis and its checkpoint, the config it serves, 6 decisions, shutdown checkpoint
    assert chains["webhook-0"]["records"] == 10
    assert all(c["ok"] and c["signatures"] == "verified" for c in chains.values())
    assert all(c["status"]["state"] == "verified" for c in chains.values())
    integrity = report["integrity"]
    assert integrity["ok"] is True
    assert integrity["status"]["text"] == "all verified" and integrity["status"]["ok"] is True
    assert integrity["firstProblem"] is None
    assert integrity["signatures"]["verified"] == 3
    assert report["totals"]["byStage"]["validate"] == 10
    assert report["totals"]["byStage"]["mutate"] == 1
    assert report["totals"]["byStage"]["lifecycle"] == 4
    assert report["totals"]["byStage"]["evidence"] == 5  # 3 placements, 2 config records


def test_decisions_by_outcome_day_and_team(report: Report) -> None:
    assert report["totals"]["decisions"] == DECISIONS
    by_day = {d["date"]: {k: d[k] for k in DECISIONS} for d in report["decisions"]["byDay"]}
    assert by_day == DECISIONS_BY_DAY
    by_team = {t["team"]: t for t in report["decisions"]["byTeam"]}
    assert by_team["nlp-team"]["total"] == 8
    assert by_team["nlp-team"]["denied"] == 2
    assert by_team["cv-team"] == {
        "team": "cv-team",
        "allowed": 0,
        "allowed-with-warnings": 1,
        "denied": 1,
        "total": 2,
    }


def test_cube_counts_a_decision_once_per_rule_it_hit(report: Report) -> None:
    cube = {
        (r["date"], r["team"], r["outcome"], r["rule"]): r["decisions"] for r in report["decisions"]["cube"]
    }
    # vision-1 was denied by two rules: one row each
    assert cube[("2026-11-20", "cv-team", "denied", "MPG-SEC-PRIVILEGED")] == 1
    assert cube[("2026-11-20", "cv-team", "denied", "MPG-IMG-002")] == 1
    # three clean creates on the first day
    assert cube[("2026-11-20", "nlp-team", "allowed", None)] == 3
    assert sum(cube.values()) == 11


def test_top_denial_reasons_with_recent_examples(report: Report) -> None:
    reasons = report["denials"]["topReasons"]
    assert {r["rule"]: r["violations"] for r in reasons} == DENIALS_BY_RULE
    assert reasons[0]["rule"] == "MPG-Q001"  # most frequent first
    examples = reasons[0]["examples"]
    assert [e["message"] for e in examples] == [Q001_CI, Q001]  # most recent first
    assert examples[0]["user"] == "system:serviceaccount:nlp-team:ci"
    assert examples[0]["name"] == "llm-ft-5"
    assert report["denials"]["decisions"] == 3


def test_rule_effects(report: Report) -> None:
    rules = {r["rule"]: r for r in report["rules"]}
    assert rules["MPG-SEC-RUNASNONROOT"]["warned"] == 1
    assert rules["MPG-SEC-HOSTPATHVOLUMES"]["waived"] == 1
    assert rules["MPG-LIFE-002"]["waived"] == 1
    assert rules["MPG-Q001"]["denied"] == 2
    assert rules["MPG-Q001"]["controls"] == ["SOC2-A1.1"]  # capacity, not access (issue 19)


def test_privileged_and_unsafe_attempts(report: Report) -> None:
    security = report["security"]
    assert security["attempts"] == 3
    by_rule = {r["rule"]: (r["denied"], r["warned"], r["waived"]) for r in security["byRule"]}
    assert by_rule == {
        "MPG-SEC-PRIVILEGED": (1, 0, 0),
        "MPG-SEC-RUNASNONROOT": (0, 1, 0),
        "MPG-SEC-HOSTPATHVOLUMES": (0, 0, 1),
    }
    assert [r["message"] for r in security["recent"]][1] == SCRIPT_MESSAGE  # kept verbatim in JSON
    assert {(x["team"], x["rule"], x["effect"]) for x in security["byTeamAndRule"]} == {
        ("cv-team", "MPG-SEC-PRIVILEGED", "denied"),
        ("cv-team", "MPG-SEC-RUNASNONROOT", "warned"),
        ("nlp-team", "MPG-SEC-HOSTPATHVOLUMES", "waived"),
    }


def test_exceptions_used(report: Report) -> None:
    exceptions = {x["name"]: x for x in report["exceptions"]}
    hostpath = exceptions["nlp-hostpath-scratch"]
    assert (hostpath["approver"], hostpath["ticket"], hostpath["expires"]) == (
        "ciso@example.com",
        "SEC-1234",
        "2026-12-31",
    )
    assert hostpath["uses"] == 1
    assert hostpath["usesAfterExpiry"] == 0
    assert hostpath["waived"] == [{"rule": "MPG-SEC-HOSTPATHVOLUMES", "violations": 1}]
    assert hostpath["teams"] == ["nlp-team"]
    assert hostpath["firstUsed"] == "2026-11-21T09:00:01.000Z"
    grace = exceptions["nlp-labels-grace"]
    assert grace["usesAfterExpiry"] == 1  # used on 2026-11-22, expired 2026-11-21


def test_who_created_changed_and_deleted(report: Report) -> None:
    actors = {(a["source"], a["actor"]): a for a in report["activity"]["actors"]}
    maria = actors[("mpigate", "maria")]
    assert (maria["create"], maria["delete"], maria["refused"]) == (6, 1, 1)
    ci = actors[("mpigate", "system:serviceaccount:nlp-team:ci")]
    assert ci["actorKind"] == "serviceaccount"
    assert (ci["create"], ci["refused"]) == (1, 1)
    events = report["activity"]["recentEvents"]
    assert events[0]["time"] == "2026-11-22T08:00:00.000Z"  # most recent first
    deletes = [e for e in events if e["verb"] == "delete"]
    assert [(e["actor"], e["namespace"], e["name"], e["result"]) for e in deletes] == [
        ("maria", "nlp-team", "llm-ft-1", "admitted")
    ]
    assert report["activity"]["objects"] == 9


def test_residency_learned_from_admitted_regions(report: Report) -> None:
    residency = report["residency"]
    assert residency["placements"] == 3
    assert residency["outside"] == 1
    assert residency["unverified"] == 0
    assert residency["byRegion"] == [{"region": "eu", "placements": 3}]
    [example] = residency["outsideExamples"]
    assert (example["team"], example["name"], example["node"], example["region"]) == (
        "cv-team",
        "vision-2",
        "gpu-eu-7",
        "eu",
    )
    assert example["allowedRegions"] == ["us"]


def test_residency_from_the_config_regions(make_report: Callable[..., Report]) -> None:
    # the config says nlp-team may only run in "us": both llm-ft-1 pods are now outside; cv-team
    # may use eu and us (a data classification): vision-2 is fine
    report = make_report(team_regions={"nlp-team": ("us",), "cv-team": ("eu", "us")})
    assert report["residency"]["outside"] == 2
    assert {e["name"] for e in report["residency"]["outsideExamples"]} == {"llm-ft-1"}


def test_gpu_hours_per_team_and_cost_center(report: Report) -> None:
    chargeback = report["chargeback"]
    assert {t["team"]: t["gpuHours"] for t in chargeback["byTeam"]} == GPU_HOURS
    assert chargeback["gpuHours"] == 5.0
    rows = {
        (r["team"], r["costCenter"]): (r["gpuHours"], r["jobs"]) for r in chargeback["byTeamAndCostCenter"]
    }
    # llm-ft-1's deletion after it succeeded closes nothing: 2 GPU-hours, one job ended
    assert rows == {("nlp-team", "cc-nlp"): (2.0, 1), ("cv-team", "(none recorded)"): (3.0, 1)}
    assert chargeback["byTeam"][0] == {"team": "cv-team", "gpuHours": 3.0, "share": 0.6}
    assert chargeback["lifecycleEvents"] == {"deleted": 1, "started": 1, "succeeded": 2}
    assert chargeback["lifecycleWithoutGpuSeconds"] == 0
    by_day = {d["date"]: d["gpuHours"] for d in chargeback["byDay"]}
    assert by_day == {"2026-11-20": 0.0, "2026-11-21": 2.0, "2026-11-22": 3.0}


def test_control_statuses_and_reasons(report: Report) -> None:
    # runAsNonRoot was in warn mode under the revision in force, and it admitted vision-2
    cc68 = control(report, "SOC2-CC6.8")
    assert cc68["status"] == "attention"
    assert cc68["reasons"] == [
        "MPG-SEC-RUNASNONROOT: warn under revision(s) 9fb03e4c1d2a",
        "findings admitted without enforcement (warn/audit mode): MPG-SEC-RUNASNONROOT (1)",
    ]
    # the mutate record is the same request as its validate record: shown, not added
    assert cc68["evidence"] == {"validate": 10, "mutate": 1, "k8s-workload": 0}
    assert cc68["evidenceTotal"] == 10
    # MPG-SEC-PRIVILEGED denied; MPG-IMG-002 maps to CC8.1, not CC6.8
    assert cc68["violations"] == {"denied": 1, "warned": 1, "audited": 0, "waived": 1}
    # the expired exception waived MPG-LIFE-002
    assert control(report, "SOC2-CC2.1")["reasons"] == [
        "waived by an exception after it had expired: MPG-LIFE-002 (1 finding(s))"
    ]
    # placement outside the region
    art44 = control(report, "GDPR-Art44")
    assert art44["status"] == "attention"
    assert art44["reasons"] == ["1 pod placement(s) outside the team's region"]
    assert art44["evidence"] == {"validate": 10, "evidence": 3}
    # nothing wrong, every source read: met, with the population and the modes shown
    cc66 = control(report, "SOC2-CC6.6")
    assert (cc66["status"], cc66["reasons"], cc66["notEvaluated"]) == ("met", [], [])
    assert cc66["population"]["validate"] == {"count": 10, "unit": "requests"}
    assert {m["rule"]: m["byRevision"] for m in cc66["modes"]}["MPG-NET-001"] == {"9fb03e4c1d2a": "enforce"}
    # without the API server's log, the controls that rest on it are not evaluated
    cc61 = control(report, "SOC2-CC6.1")
    assert cc61["status"] == "not evaluated"
    assert cc61["notEvaluated"] == ["no API-server audit log was given (--k8s-audit)"]
    assert "MPG-Q001" not in cc61["rules"]
    audit_controls = control(report, "HIPAA-164.312(b)")
    assert audit_controls["status"] == "not evaluated"
    # checkpoints: three genesis, three at shutdown, two where a chain rotated after 24 h
    # (webhook-1, controller-0)
    assert audit_controls["evidence"] == {
        "chain": 31,
        "validate": 10,
        "lifecycle": 4,
        "checkpoint": 8,
        "k8s-activity": 0,
    }
    # the trail's own protection needs no API server: met
    assert control(report, "PCI-DSS-10.3.2")["status"] == "met"
    assert control(report, "SOC2-CC8.1")["population"]["config"] == {"count": 1, "unit": "revisions"}
    assert report["controlSummary"] == {
        "met": 10,
        "attention": 9,
        "not evaluated": 14,
        "no occasion": 0,
        "not applicable": 0,
    }


def test_unverified_signatures_are_not_evaluated(make_report: Callable[..., Report]) -> None:
    report = make_report(keys=None, frameworks=("pci",))
    assert [f["framework"] for f in report["controls"]] == ["pci"]
    assert report["integrity"]["ok"] is True  # warnings only
    assert report["integrity"]["status"]["counts"]["unverifiable"] == 3  # but nothing authenticated
    protected = control(report, "PCI-DSS-10.3.2")
    assert protected["status"] == "not evaluated"
    assert protected["notEvaluated"] == [
        "checkpoint signatures of chain(s) controller-0, webhook-0, webhook-1 not checked "
        "(pass --key or --public-key)"
    ]
    assert control(report, "PCI-DSS-7.2.5")["status"] == "met"  # no checkpoint evidence involved


def test_period_filter(make_report: Callable[..., Report]) -> None:
    report = make_report(since="2026-11-21T00:00:00.000Z", until="2026-11-22T00:00:00.000Z")
    assert report["period"]["days"] == 1
    assert report["totals"]["decisions"] == {"allowed": 2, "allowed-with-warnings": 1, "denied": 0}
    assert report["denials"]["topReasons"] == []
    # llm-ft-1 finished on the 21st (2 GPU-hours); vision-2 finished on the 22nd: outside
    assert report["chargeback"]["gpuHours"] == 2.0
    assert report["integrity"]["records"] == 31  # verification still covers every record


def test_period_without_any_record_is_a_gap(make_report: Callable[..., Report]) -> None:
    report = make_report(since="2027-01-01T00:00:00.000Z", until="2027-01-03T00:00:00.000Z")
    assert report["period"]["days"] == 2
    assert report["totals"]["recordsInPeriod"] == 0
    # no record for two days, longer than the heartbeat: no control can be met
    summary = report["controlSummary"]
    assert summary["met"] == summary["no occasion"] == 0
    assert report["completeness"]["coverage"] == 0.0
    assert {d["total"] for d in report["decisions"]["byDay"]} == {0}


def test_team_filter(make_report: Callable[..., Report]) -> None:
    report = make_report(team="cv-team")
    assert report["filters"]["team"] == "cv-team"
    assert report["totals"]["decisions"] == {"allowed": 0, "allowed-with-warnings": 1, "denied": 1}
    assert report["totals"]["teams"] == ["cv-team"]
    assert {t["team"] for t in report["chargeback"]["byTeam"]} == {"cv-team"}
    assert report["exceptions"] == []
    assert {a["actor"] for a in report["activity"]["actors"]} == {"bob"}
