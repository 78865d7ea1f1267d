"""Inputs aggregated in worker processes and merged give the report one process gives; a job whose
lifecycle continues in another chain is charged once."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mpigate.audit import Ed25519Signer, HmacSigner, KeyRing, generate_key, lifecycle_record
from mpigate.report import ReportOptions, build_report

from .conftest import GENERATED, SECRET
from .scenario import Clock, decision_record, open_log, write_scenario

Report = dict[str, Any]


_CHILD = "MPIGATE_TEST_FRESH_INTERPRETER"


@pytest.fixture(scope="module")
def apart_outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Every test of this module that takes ``ran_apart``, run together in ONE fresh interpreter:
    node id → its outcome there (passed, failed, error or skipped). One child pytest instead of one
    per test — each child starts an interpreter, imports mpigate and writes the scenario (22-52 s
    each at load ~5 in a `make test`, three of them)."""
    if os.environ.get(_CHILD):
        pytest.fail(f"a fresh interpreter runs {threading.active_count()} threads: reports would not fork")
    nodeids = [
        item.nodeid
        for item in request.session.items
        if item.parent is request.node and "ran_apart" in getattr(item, "fixturenames", ())
    ]
    junit = tmp_path_factory.mktemp("apart") / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *nodeids],
        cwd=request.config.rootpath,
        env={**os.environ, _CHILD: "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    outcomes: dict[str, str] = {}
    if junit.exists():
        for case in ET.parse(junit).iter("testcase"):
            nodeid = _nodeid(case.get("classname", ""), case.get("name", ""))
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            outcomes[nodeid] = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
    # what the child printed, for a test whose outcome is missing or wrong
    outcomes["<output>"] = proc.stdout[-4000:] + proc.stderr[-2000:]
    return outcomes


def _nodeid(classname: str, name: str) -> str:
    """A junit testcase's pytest node id (classname: the module's dotted path, for module-level tests)."""
    return f"{classname.replace('.', '/')}.py::{name}"


@pytest.fixture
def ran_apart(request: pytest.FixtureRequest) -> bool:
    """True when the test was run, and passed, in a fresh interpreter instead of this one.

    The report forks its worker processes only from a single-threaded process (it falls back to one
    process otherwise); an earlier test of this pytest worker may have left threads (executors,
    writer threads), depending on how the suite was distributed. The test then runs in a new
    interpreter (apart_outcomes: with the module's other such tests), where its assertions hold or
    fail — never a skip that hides it.
    """
    if threading.active_count() == 1:
        return False
    outcomes: dict[str, str] = request.getfixturevalue("apart_outcomes")
    assert outcomes.get(request.node.nodeid) == "passed", (
        f"in a fresh interpreter: {outcomes.get(request.node.nodeid, 'not run')}\n{outcomes['<output>']}"
    )
    return True


@pytest.mark.parametrize("team", [None, "nlp-team"])
def test_workers_give_the_same_report(
    make_report: Callable[..., Report],
    k8s_log: Path,
    caplog: pytest.LogCaptureFixture,
    team: str | None,
    ran_apart: bool,
) -> None:
    if ran_apart:
        return
    with caplog.at_level(logging.INFO, logger="mpigate.report.build"):
        parallel = make_report(k8s=[k8s_log], jobs=2, team=team)
    # the chains in worker processes, then the API server's log (judged with what they say)
    assert "aggregated 3 input(s) in 2 worker process(es)" in caplog.text
    single = make_report(k8s=[k8s_log], jobs=1, team=team)
    assert parallel == single


def test_ed25519_keys_reach_the_workers(tmp_path: Path, ran_apart: bool) -> None:
    if ran_apart:
        return
    private, public = generate_key("ed25519")
    assert public is not None
    (tmp_path / "ed.pem").write_bytes(private)
    (tmp_path / "ed.pub").write_bytes(public)
    from mpigate.audit import load_signer

    signer = load_signer("ed25519", str(tmp_path / "ed.pem"))
    assert isinstance(signer, Ed25519Signer)
    write_scenario(tmp_path / "audit", signer)
    keys = KeyRing.load(public_key_files=[tmp_path / "ed.pub"])
    report = build_report([tmp_path / "audit"], keys=keys, jobs=3, options=ReportOptions(generated=GENERATED))
    assert report["integrity"]["signatures"]["verified"] == 3
    assert report["integrity"]["ok"] is True


def test_a_job_continued_in_another_chain(tmp_path: Path) -> None:
    """The controller moved to another pod (a new chain) while job u7 was suspended."""
    signer = HmacSigner(SECRET)
    clock = Clock().at("2026-11-20T08:00:00Z")
    job = {"namespace": "nlp-team", "name": "long-run", "team": "nlp-team", "uid": "u7", "gpus": 8}
    with open_log(tmp_path / "audit", "controller-a", signer, clock, "controller") as log:
        log.append(decision_record("CREATE", "nlp-team", "long-run", _user()))
        clock.at("2026-11-20T09:00:00Z")
        log.append(lifecycle_record("started", **job))  # type: ignore[arg-type]
        clock.at("2026-11-20T10:00:00Z")
        log.append(lifecycle_record("suspended", gpu_seconds=28800, **job))  # type: ignore[arg-type]
        clock.at("2026-11-20T10:30:00Z")
        log.append(
            lifecycle_record(
                "succeeded", namespace="nlp-team", name="short", team="nlp-team", uid="u8", gpu_seconds=3600
            )
        )
    clock.at("2026-11-21T00:00:00Z")
    with open_log(tmp_path / "audit", "controller-b", signer, clock, "controller") as log:
        clock.at("2026-11-21T01:00:00Z")
        log.append(lifecycle_record("succeeded", gpu_seconds=43200, **job))  # type: ignore[arg-type]
        clock.at("2026-11-21T02:00:00Z")
        log.append(lifecycle_record("deleted", gpu_seconds=0.0, **job))  # type: ignore[arg-type]
    (tmp_path / "key").write_bytes(SECRET)
    keys = KeyRing.load([tmp_path / "key"])
    for jobs in (1, 2):
        report = build_report(
            [tmp_path / "audit"], keys=keys, jobs=jobs, options=ReportOptions(generated=GENERATED)
        )
        chargeback = report["chargeback"]
        # u7: 8 h before the suspension + 12 h after = 20 GPU-hours; u8: 1
        assert chargeback["gpuHours"] == 21.0, jobs
        assert chargeback["byTeamAndCostCenter"][0]["jobs"] == 2
        assert {d["date"]: d["gpuHours"] for d in chargeback["byDay"]} == {
            "2026-11-20": 9.0,
            "2026-11-21": 12.0,
        }
    # from the 21st on: only the segment that closed then
    late = build_report(
        [tmp_path / "audit"],
        keys=keys,
        jobs=1,
        options=ReportOptions(since="2026-11-21", generated=GENERATED),
    )
    assert late["chargeback"]["gpuHours"] == 12.0


def _user() -> Any:
    from mpigate.policy.decision import UserInfo

    return UserInfo("maria", ("nlp-team-scientists",))


def test_placements_as_the_controller_writes_them(repo: Path, tmp_path: Path) -> None:
    """Evidence built by the controller's own residency code: the report takes its verdict."""
    from mpigate.audit import evidence_record
    from mpigate.config import load
    from mpigate.controller.residency import placement

    config = load(repo)
    team = config.teams["nlp-team"]
    signer = HmacSigner(SECRET)
    clock = Clock().at("2026-11-20T08:00:00Z")
    with open_log(tmp_path / "audit", "controller-0", signer, clock, "controller") as log:
        for pod, node_region in (("p0", "eu-west-1"), ("p1", "us-east-1"), ("p2", None)):
            labels = {"topology.kubernetes.io/region": node_region} if node_region else {}
            found = placement(config, team, {}, pod, f"node-{pod}", labels)
            log.append(
                evidence_record(
                    "placement",
                    namespace="nlp-team",
                    name="llm",
                    team="nlp-team",
                    pod=pod,
                    node=f"node-{pod}",
                    region=found.region,
                    details=found.details(),
                )
            )
    report = build_report([tmp_path / "audit"], options=ReportOptions(generated=GENERATED))
    residency = report["residency"]
    # no config given: the regions come from the controller's records (nlp-team: eu)
    assert (residency["placements"], residency["outside"], residency["unverified"]) == (3, 2, 0)
    assert {e["pod"]: e["region"] for e in residency["outsideExamples"]} == {"p1": "us", "p2": "(unknown)"}
    assert {r["region"]: r["allowedRegions"] for r in residency["byRegionAndTeam"]} == {
        "(unknown)": ["eu"],
        "eu": ["eu"],
        "us": ["eu"],
    }
