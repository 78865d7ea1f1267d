"""Kubernetes API-server audit logs: the hand-written fixture, gzip, odd input, and the report
sections they feed."""

from __future__ import annotations

import datetime as dt
import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mpigate.audit._canonical import format_time
from mpigate.report import K8sAuditReader
from mpigate.report.k8saudit import actor_kind, exempt_from_webhook, normalize_time

Report = dict[str, Any]


def read(path: Path) -> tuple[list[Any], Any]:
    reader = K8sAuditReader(path)
    events = list(reader)
    return events, reader.stats


def test_fixture_events_and_counts(k8s_log: Path) -> None:
    events, stats = read(k8s_log)
    assert (stats.lines, stats.events, stats.used, stats.other, stats.other_stages, stats.malformed) == (
        15,
        11,
        8,
        2,
        1,
        3,
    )
    assert stats.first_malformed_line == 10
    assert stats.first_malformed_reason == "not a JSON object"
    assert [e.line for e in events] == [2, 3, 4, 5, 6, 7, 8, 13]
    by_line = {e.line: e for e in events}
    impersonated = by_line[3]
    assert impersonated.actor == "system:serviceaccount:nlp-team:pipeline"
    assert impersonated.username == "alice"
    assert impersonated.mpigate_decision == "denied"
    assert impersonated.code == 403
    # v1beta1: the time comes from "timestamp"
    assert by_line[5].time == "2026-11-21T10:00:00.000Z"
    assert by_line[5].mpigate == {}
    # no apiVersion at all is accepted
    assert by_line[6].verb == "patch"
    # RBAC denials, on a trainer resource and on a secret
    assert by_line[7].rbac_denied and by_line[7].is_trainer_write
    assert by_line[7].time == "2026-11-21T23:59:59.999Z"
    assert by_line[8].rbac_denied and not by_line[8].is_trainer_write
    # cluster-scoped runtime judged by validate.cluster.mpigate.io; offset time normalised
    assert by_line[13].kind == "ClusterTrainingRuntime"
    assert by_line[13].namespace is None
    assert by_line[13].mpigate_decision == "allowed"
    assert by_line[13].time == "2026-11-22T08:30:00.000Z"


def test_gzipped_log_reads_the_same(k8s_log: Path, tmp_path: Path) -> None:
    packed = tmp_path / "audit.log.1.gz"
    packed.write_bytes(gzip.compress(k8s_log.read_bytes()))
    events, stats = read(packed)
    plain, plain_stats = read(k8s_log)
    assert [(e.line, e.time, e.actor) for e in events] == [(e.line, e.time, e.actor) for e in plain]
    assert stats.malformed == plain_stats.malformed == 3


def test_truncated_gzip_is_reported_not_fatal(k8s_log: Path, tmp_path: Path) -> None:
    packed = gzip.compress(k8s_log.read_bytes())
    cut = tmp_path / "cut.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    events, stats = read(cut)
    assert stats.unreadable is not None and stats.unreadable.startswith("read error after line")
    assert len(events) < 8


def test_mpigate_annotations_prefer_the_validating_webhook(tmp_path: Path) -> None:
    line = (
        '{"kind":"Event","apiVersion":"audit.k8s.io/v1","stage":"ResponseComplete","verb":"create",'
        '"user":{"username":"u"},"objectRef":{"resource":"trainjobs","namespace":"n","name":"j",'
        '"apiGroup":"trainer.kubeflow.org"},"responseStatus":{"code":201},'
        '"requestReceivedTimestamp":"2026-11-20T00:00:00Z","annotations":{'
        '"validate.team.mpigate.io/decision":"allowed-with-warnings",'
        '"mutate.trainjobs.mpigate.io/mpigate.io/decision":"allowed",'
        '"mutate.trainjobs.mpigate.io/patch":"2 operations","other.example.com/decision":"x"}}\n'
    )
    path = tmp_path / "a.log"
    path.write_text(line)
    [event], _ = read(path)
    assert dict(event.mpigate) == {"decision": "allowed-with-warnings", "patch": "2 operations"}


def test_identities() -> None:
    assert actor_kind("system:serviceaccount:ns:sa") == "serviceaccount"
    assert actor_kind("system:node:gpu-1") == "node"
    assert actor_kind("system:kube-scheduler") == "system"
    assert actor_kind("maria@example.com") == "user"
    # the webhooks' matchConditions exempt these (webhooks/base/webhookconfigurations.yaml)
    assert exempt_from_webhook("system:serviceaccount:kueue-system:kueue-controller-manager", ())
    assert exempt_from_webhook("system:kube-controller-manager", ())
    assert exempt_from_webhook("x", ("system:nodes",))
    assert not exempt_from_webhook("system:serviceaccount:nlp-team:pipeline", ())
    assert not exempt_from_webhook("bob", ("system:authenticated",))


@settings(max_examples=200, deadline=None)
@given(st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(9999, 12, 31)))
def test_normalize_time_matches_the_record_format(moment: dt.datetime) -> None:
    moment = moment.replace(tzinfo=dt.UTC)
    api_server = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if moment.year >= 1000 else None
    if api_server is not None:
        assert normalize_time(api_server) == format_time(moment)
    assert normalize_time(moment.isoformat()) == format_time(moment)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=20))
def test_any_bytes_are_counted_never_fatal(tmp_path_factory: Any, lines: list[bytes]) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "audit.log"
    data = b"\n".join(lines)
    path.write_bytes(data)
    events, stats = read(path)
    if data.startswith(b"\x1f\x8b"):  # the gzip magic: a broken archive is reported, not fatal
        assert stats.unreadable is not None and stats.unreadable.startswith("read error after line 0")
        return
    assert stats.unreadable is None
    # every non-blank line is either an event or counted as malformed
    assert stats.events + stats.malformed == sum(1 for line in data.split(b"\n") if line.strip())
    assert len(events) == stats.used == 0


def test_report_sections_from_the_api_server(make_report: Callable[..., Report], k8s_log: Path) -> None:
    report = make_report(k8s=[k8s_log])
    [stats] = report["inputs"]["k8sAudit"]
    assert stats["firstMalformed"] == {"line": 10, "reason": "not a JSON object"}
    api = report["activity"]["apiServer"]
    assert api["given"] is True
    assert api["writes"] == 7
    assert {(r["verb"], r["result"]): r["count"] for r in api["byVerb"]} == {
        ("create", "admitted"): 2,
        ("create", "denied"): 1,
        ("create", "rbac-denied"): 1,
        ("delete", "admitted"): 1,
        ("patch", "admitted"): 1,
        ("update", "admitted"): 1,
    }
    # bob's update carries no mpigate decision; kueue's patch is exempt by design
    assert api["unjudgedWrites"] == 1
    [unjudged] = api["unjudgedExamples"]
    assert (unjudged["actor"], unjudged["verb"], unjudged["name"]) == ("bob", "update", "vision-2")
    assert unjudged["source"].endswith("k8s-audit.jsonl:5")
    actors = {(a["source"], a["actor"]): a for a in report["activity"]["actors"]}
    pipeline = actors[("k8s-audit", "system:serviceaccount:nlp-team:pipeline")]
    assert (pipeline["via"], pipeline["actorKind"], pipeline["refused"]) == ("alice", "serviceaccount", 1)
    rbac = report["rbacDenials"]
    assert rbac["total"] == 2
    assert {(x["actor"], x["verb"], x["resource"]) for x in rbac["byActor"]} == {
        ("eve", "create", "trainjobs"),
        ("eve", "get", "secrets"),
    }
    assert rbac["examples"][0]["resource"] == "secrets"  # most recent first
    # the evidence reaches the controls: writes without a decision need attention
    cc72 = next(c for f in report["controls"] for c in f["controls"] if c["fullId"] == "SOC2-CC7.2")
    assert cc72["evidence"]["k8s-activity"] == 7
    assert "1 API-server write(s) admitted without an mpigate decision" in cc72["reasons"]
    cc63 = next(c for f in report["controls"] for c in f["controls"] if c["fullId"] == "SOC2-CC6.3")
    assert cc63["evidence"]["k8s-rbac-denied"] == 2
    assert cc63["notes"] == []


def test_team_filter_uses_namespaces_learned_from_records(
    make_report: Callable[..., Report], k8s_log: Path
) -> None:
    report = make_report(k8s=[k8s_log], team="cv-team")
    api = report["activity"]["apiServer"]
    # cv-team's namespace holds bob's update and kueue's patch; the cluster-scoped runtime is left out
    assert api["writes"] == 2
    assert report["rbacDenials"]["total"] == 0


def test_period_bounds_apply_to_events(make_report: Callable[..., Report], k8s_log: Path) -> None:
    report = make_report(k8s=[k8s_log], since="2026-11-22T00:00:00.000Z")
    # eve's denied create at 23:59:59.999 on the 21st is outside; her secret read is inside
    assert report["rbacDenials"]["total"] == 1
    assert report["activity"]["apiServer"]["writes"] == 1  # the cluster runtime
