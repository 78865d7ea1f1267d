"""The background audit against the fake API (kmock): a policy tightened puts a running job in its
namespace's PolicyReport, raises the gauge and writes an "opened" record; relaxed again, the result
goes, the gauge drops and a "resolved" record follows; reports stay within their bound; a queued job
that would now be refused is kept from admission (its Workload deactivated), an admitted one never."""

from __future__ import annotations

import copy
import datetime as dt
import logging
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest
import pytest_asyncio
from tests.conftest import copy_org
from tests.controller.conftest import example_job
from tests.controller.kube import TJ, alive, declare, events
from tests.controller.test_reconciler import FlakyRecorder

from mpigate.admission.kube import KubeClient, KubeConfig, KubeError, ListPage
from mpigate.catalogue import all_rules
from mpigate.config import Config, load
from mpigate.controller.api import ControllerApi
from mpigate.controller.background import BackgroundAuditor, interval_wait, next_expiry
from mpigate.controller.events import EventPoster
from mpigate.controller.metrics import ControllerMetrics
from mpigate.policy import AdmissionInput, apply_patch, evaluate

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
REPORTS = "wgpolicyk8s.io/v1alpha2/policyreports"
CLUSTER_REPORTS = "wgpolicyk8s.io/v1alpha2/clusterpolicyreports"
WORKLOADS = "kueue.x-k8s.io/v1beta2/workloads"
STATE = ("mpigate-system", "mpigate-controller-audit")


class Org:
    """A copy of the example org that a test edits, loaded again after each edit."""

    def __init__(self, root: Path) -> None:
        self.root = copy_org(root)
        self.config: Config = load(self.root, today=NOW.date())

    def edit(self, relative: str, old: str, new: str) -> None:
        path = self.root / relative
        text = path.read_text()
        assert old in text, f"{old!r} not in {relative}"
        path.write_text(text.replace(old, new, 1))
        self.config = load(self.root, today=NOW.date())

    def background(self, text: str) -> None:
        """Set OrgPolicy spec.backgroundAudit."""
        path = self.root / "policies" / "org.yaml"
        body = path.read_text()
        body = re.sub(r"\n  backgroundAudit:\n(    .*\n)*", "\n", body)
        path.write_text(body.rstrip("\n") + "\n  backgroundAudit:\n" + text)
        self.config = load(self.root, today=NOW.date())


@pytest.fixture
def org(tmp_path: Path) -> Org:
    return Org(tmp_path)


@pytest_asyncio.fixture
async def client(kmock: kmock_lib.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    declare(kmock)
    rw = ["get", "list", "watch", "create", "patch", "update", "delete"]
    for resource, kind, namespaced in (
        ("trainer.kubeflow.org/v1alpha1/trainingruntimes", "TrainingRuntime", True),
        ("trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", "ClusterTrainingRuntime", False),
        (REPORTS, "PolicyReport", True),
        (CLUSTER_REPORTS, "ClusterPolicyReport", False),
        (WORKLOADS, "Workload", True),
        ("kueue.x-k8s.io/v1beta2/localqueues", "LocalQueue", True),
        ("kueue.x-k8s.io/v1beta2/clusterqueues", "ClusterQueue", False),
    ):
        kmock.resources[resource] = {"kind": kind, "namespaced": namespaced, "verbs": rw}
    c = KubeClient(KubeConfig(server=str(kmock.url).rstrip("/")))
    yield c
    await c.close()


def auditor(org: Org, client: KubeClient, recorder: FlakyRecorder, **kw: Any) -> BackgroundAuditor:
    api = ControllerApi(client)
    metrics = ControllerMetrics()
    return BackgroundAuditor(
        config=lambda: org.config,
        api=api,
        recorder=recorder,
        metrics=metrics,
        events=EventPoster(api, metrics, "test"),
        clock=kw.pop("clock", lambda: NOW),
        state=STATE,
        **kw,
    )


def a_job(
    kmock: kmock_lib.KubernetesEmulator, org: Org, name: str, *, nodes: int = 4, suspend: bool = False
) -> dict[str, Any]:
    """A TrainJob of nlp-team asking ``nodes`` × 4 GPUs, stored as admission left it (mutated)."""
    job = example_job("minimal", uid=f"uid-{name}")
    job["metadata"]["name"] = name
    job["spec"]["trainer"]["numNodes"] = nodes
    request = AdmissionInput(operation="CREATE", kind="TrainJob", namespace="nlp-team", name=name, obj=job)
    decision = evaluate(org.config, request, None, NOW)
    assert decision.allowed, decision.message
    job = apply_patch(job, list(decision.patch))
    job["spec"]["suspend"] = suspend
    kmock.objects[TJ, "nlp-team", name] = job
    return job


def report(kmock: kmock_lib.KubernetesEmulator, namespace: str = "nlp-team") -> Any:
    return alive(kmock, REPORTS, namespace, "mpigate")


def standing_records(recorder: FlakyRecorder, event: str) -> list[Mapping[str, Any]]:
    return [
        r["evidence"]["details"]
        for r in recorder.records
        if r.get("evidence", {}).get("kind") == "standing-violation"
        and r["evidence"]["details"]["event"] == event
    ]


def gauge(a: BackgroundAuditor, rule: str, team: str = "nlp-team", action: str = "report") -> float | None:
    return a.metrics.registry.get_sample_value(
        "mpigate_controller_standing_violations", {"rule": rule, "team": team, "action": action}
    )


# nlp-team may use 16 A100s (quotas/nlp-team.yaml): a job of 4 nodes × 4 GPUs fits; cut to 8, it
# could never be admitted again (MPG-Q001)
CUT = ("quotas/nlp-team.yaml", "a100-eu: {nominal: 16,", "a100-eu: {nominal: 8,")


async def test_a_tightened_policy_reports_the_job_and_relaxing_resolves_it(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    recorder = FlakyRecorder()
    a = auditor(org, client, recorder)
    a_job(kmock, org, "big")
    first = await a.run_pass("start")
    assert first is not None and first.objects >= 1
    assert report(kmock)["summary"]["fail"] == 0 and report(kmock)["results"] == []
    assert report(kmock)["summary"]["pass"] >= 1

    org.edit(*CUT)
    tightened = await a.run_pass("config")
    assert tightened is not None and tightened.opened == 1
    [result] = report(kmock)["results"]
    assert result["policy"] == "MPG-Q001" and result["result"] == "fail"
    assert result["resources"][0]["name"] == "big" and result["resources"][0]["uid"] == "uid-big"
    assert "at most 8" in result["message"]
    assert report(kmock)["metadata"]["annotations"]["mpigate.io/config-revision"] == org.config.revision
    assert gauge(a, "MPG-Q001") == 1
    [opened] = standing_records(recorder, "opened")
    assert (
        opened["rule"] == "MPG-Q001"
        and opened["uid"] == "uid-big"
        and opened["revision"] == org.config.revision
    )

    # another pass with nothing changed: nothing written, nothing recorded again
    patches = len(
        list(kmock["patch", "/apis/wgpolicyk8s.io/v1alpha2/namespaces/nlp-team/policyreports/mpigate"])
    )
    again = await a.run_pass("interval")
    assert again is not None and again.opened == 0 and again.reports_written == 0
    assert len(standing_records(recorder, "opened")) == 1
    assert (
        len(list(kmock["patch", "/apis/wgpolicyk8s.io/v1alpha2/namespaces/nlp-team/policyreports/mpigate"]))
        == patches
    )

    org.edit(CUT[0], CUT[2], CUT[1])
    relaxed = await a.run_pass("config")
    assert relaxed is not None and relaxed.resolved == 1
    assert report(kmock)["results"] == [] and report(kmock)["summary"]["fail"] == 0
    assert not gauge(a, "MPG-Q001")
    [resolved] = standing_records(recorder, "resolved")
    assert resolved["rule"] == "MPG-Q001" and resolved["since"] == opened["since"]


async def test_a_restarted_controller_neither_repeats_nor_loses_standing_violations(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    recorder = FlakyRecorder()
    a_job(kmock, org, "big")
    org.edit(*CUT)
    await auditor(org, client, recorder).run_pass("start")
    assert len(standing_records(recorder, "opened")) == 1
    state = alive(kmock, "v1/configmaps", *STATE)
    assert state["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "mpigate"
    restarted = auditor(org, client, recorder)
    await restarted.run_pass("start")
    assert len(standing_records(recorder, "opened")) == 1  # known from the state ConfigMap
    assert gauge(restarted, "MPG-Q001") == 1
    kmock.objects[TJ, "nlp-team", "big"].delete()  # type: ignore[attr-defined]
    await auditor(org, client, recorder).run_pass("interval")
    [resolved] = standing_records(recorder, "resolved")
    assert resolved["uid"] == "uid-big"


async def test_report_size_stays_bounded_with_many_violations(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    org.background("    maxResultsPerReport: 3\n")
    for i in range(12):
        a_job(kmock, org, f"big-{i:02d}")
    org.edit(*CUT)
    recorder = FlakyRecorder()
    done = await auditor(org, client, recorder).run_pass("config")
    assert done is not None and done.opened == 12
    body = report(kmock)
    assert len(body["results"]) == 3
    assert body["summary"]["fail"] == 12
    assert body["metadata"]["annotations"]["mpigate.io/results-omitted"] == "9"
    assert '"MPG-Q001": 9' in body["metadata"]["annotations"]["mpigate.io/results-omitted-by-rule"]
    assert len(standing_records(recorder, "opened")) == 12  # the audit trail keeps every one


async def test_suspend_keeps_a_queued_job_from_admission_and_leaves_a_running_one(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    org.background("    actions: {MPG-Q001: suspend}\n")
    queued = a_job(kmock, org, "queued", suspend=True)
    a_job(kmock, org, "running", suspend=False)
    for job in ("queued", "running"):
        kmock.objects[WORKLOADS, "nlp-team", f"trainjob-{job}"] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": f"trainjob-{job}",
                "namespace": "nlp-team",
                "labels": {"kueue.x-k8s.io/job-uid": f"uid-{job}"},
            },
            "spec": {"active": True, "queueName": "nlp-team"},
        }
    org.edit(*CUT)
    recorder = FlakyRecorder()
    a = auditor(org, client, recorder)
    done = await a.run_pass("config")
    assert done is not None and done.suspended == 1
    assert alive(kmock, WORKLOADS, "nlp-team", "trainjob-queued")["spec"]["active"] is False
    assert alive(kmock, WORKLOADS, "nlp-team", "trainjob-running")["spec"]["active"] is True
    assert alive(kmock, TJ, "nlp-team", "queued") == queued  # never deleted nor changed
    [suspended] = standing_records(recorder, "suspended")
    assert suspended["workloads"] == ["trainjob-queued"]
    reasons = [reason for _, reason, _ in events(kmock, "nlp-team", "queued")]
    assert reasons == ["PolicyViolation", "PolicySuspended"]
    assert [reason for _, reason, _ in events(kmock, "nlp-team", "running")] == ["PolicyViolation"]
    assert gauge(a, "MPG-Q001", action="suspend") == 2


async def test_a_job_under_an_expired_exception_is_reported_with_its_id(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    (org.root / "policies" / "exceptions" / "nlp-big.yaml").write_text(
        "apiVersion: mpigate.io/v1alpha1\nkind: PolicyException\nmetadata:\n  name: nlp-big-run\n"
        "spec:\n  team: nlp-team\n  rules: [MPG-Q001]\n  match:\n    trainJobNames: [big]\n"
        "    requestedBy: {users: [alice]}\n  justification: one large run.\n"
        "  approver: ciso@acme.example\n  ticket: OPS-1\n  expires: 2026-11-30\n"
    )
    a_job(kmock, org, "big")
    org.edit(*CUT)
    recorder = FlakyRecorder()
    clock = {"now": NOW}
    a = auditor(org, client, recorder, clock=lambda: clock["now"])
    assert next_expiry(org.config, NOW) == dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    await a.run_pass("start")
    assert report(kmock)["results"] == []  # waived while the exception applies
    clock["now"] = dt.datetime(2026, 12, 1, 0, 0, 1, tzinfo=dt.UTC)
    await a.run_pass("exception-expired")
    [result] = report(kmock)["results"]
    assert result["properties"]["expiredException"] == "nlp-big-run"
    assert standing_records(recorder, "opened")[0]["expiredException"] == "nlp-big-run"


def test_the_next_pass_waits_for_the_interval_or_an_expiry(org: Org) -> None:
    org.background("    interval: 2h\n")
    assert interval_wait(org.config, NOW) == (7200.0, "interval")
    # cv-team's legacy-image exception expires on 2027-03-31: a pass at the start of 2027-04-01
    late = dt.datetime(2027, 3, 31, 23, 0, tzinfo=dt.UTC)
    wait, reason = interval_wait(org.config, late)
    assert reason == "exception-expired" and 3600 <= wait <= 3602


async def test_reports_of_namespaces_with_nothing_left_are_deleted(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    recorder = FlakyRecorder()
    a = auditor(org, client, recorder)
    a_job(kmock, org, "big")
    await a.run_pass("start")
    assert report(kmock) is not None
    kmock.objects[TJ, "nlp-team", "big"].delete()  # type: ignore[attr-defined]
    done = await a.run_pass("interval")
    assert done is not None and done.reports_deleted == 1
    assert report(kmock) is None


def test_the_install_base_grants_what_the_audit_calls_and_deletes_only_its_reports() -> None:
    from tests.controller.test_install import one, rules

    from mpigate.cli.controller_commands import controller_command

    role = one("ClusterRole", "mpigate-controller-audit")
    granted = rules(role)
    needed = {
        ("trainer.kubeflow.org", "trainingruntimes", "list"),
        ("trainer.kubeflow.org", "clustertrainingruntimes", "list"),
        ("kueue.x-k8s.io", "localqueues", "get"),
        ("kueue.x-k8s.io", "clusterqueues", "get"),
        ("kueue.x-k8s.io", "workloads", "list"),
        ("kueue.x-k8s.io", "workloads", "patch"),
    }
    for group, plural in (("wgpolicyk8s.io", "policyreports"), ("openreports.io", "reports")):
        for resource in (plural, "cluster" + plural):
            needed |= {(group, resource, v) for v in ("list", "create", "get", "patch", "delete")}
    assert needed <= granted, needed - granted
    for rule in role["rules"]:  # get, patch and delete of the reports named mpigate only
        if {"get", "patch", "delete"} & set(rule["verbs"]) and rule["apiGroups"] != ["kueue.x-k8s.io"]:
            assert rule["resourceNames"] == ["mpigate"]
    state = one("Role", "mpigate-controller-audit-state", "mpigate-system")
    assert rules(state) == {("", "configmaps", v) for v in ("get", "patch", "create")}
    assert [r.get("resourceNames") for r in state["rules"]] == [[STATE[1]], None]
    ctx = controller_command.make_context(
        "controller", ["--config", "x", "--lease-namespace", "mpigate-system"]
    )
    assert ctx.params["audit_state"] is None  # → mpigate-system/mpigate-controller-audit


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("    actions: {MPG-NOPE: event}\n", "'MPG-NOPE' names no rule"),
        ("    interval: 30s\n", "shorter than 1m"),
        ("    actions: {MPG-Q001: delete}\n", "delete"),
    ],
)
def test_bad_settings_are_reported_at_their_location(org: Org, setting: str, message: str) -> None:
    from mpigate.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        org.background(setting)
    text = str(caught.value)
    assert "policies/org.yaml" in text and "backgroundAudit" in text and message in text


def test_the_most_specific_action_pattern_wins(org: Org) -> None:
    org.background("    actions: {'MPG-Q*': event, MPG-Q001: suspend, MPG-SEC: event}\n")
    settings = org.config.org.background_audit
    assert settings.action_for("MPG-Q001") == "suspend"  # exact beats glob
    assert settings.action_for("MPG-Q002") == "event"
    sec = next(r for r in all_rules() if r.startswith("MPG-SEC-"))
    assert settings.action_for(sec) == "event"
    assert settings.action_for("MPG-IMG-001") == "report"


async def test_the_report_shows_standing_violations_at_period_end_and_when_resolved(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    from mpigate.audit import AuditEntry
    from mpigate.report import ReportBuilder, ReportOptions

    recorder = FlakyRecorder()
    clock = {"now": NOW}
    a = auditor(org, client, recorder, clock=lambda: clock["now"])
    a_job(kmock, org, "big")
    org.edit(*CUT)
    await a.run_pass("config")  # found on the 22nd
    clock["now"] = NOW + dt.timedelta(days=3)
    org.edit(CUT[0], CUT[2], CUT[1])
    await a.run_pass("config")  # resolved on the 25th

    def section(since: str | None, until: str | None) -> Any:
        builder = ReportBuilder(ReportOptions(since=since, until=until))
        for seq, entry in enumerate(recorder.records):
            at = entry["evidence"]["details"]["at"].replace("Z", ".000Z")
            builder.add_entry(AuditEntry("controller", seq, at, entry["stage"], "f", seq, entry, b""))
        return builder.finish()["standingViolations"]

    # a period ending on the 24th: found before it began, standing at its end
    mid = section("2026-11-23T00:00:00.000Z", "2026-11-24T00:00:00.000Z")
    assert mid["atPeriodEnd"] == 1 and mid["openedInPeriod"] == 0 and mid["resolvedInPeriod"] == 0
    [standing] = mid["standing"]
    assert (standing["name"], standing["rule"], standing["opened"]) == (
        "big",
        "MPG-Q001",
        "2026-11-22T12:00:00.000Z",
    )
    # the whole time: resolved on the 25th, nothing standing
    whole = section(None, None)
    assert whole["atPeriodEnd"] == 0 and whole["resolvedInPeriod"] == 1
    assert whole["resolved"][0]["resolved"] == "2026-11-25T12:00:00.000Z"


async def test_a_report_edited_or_deleted_by_someone_else_is_rewritten_at_the_next_pass(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    """The pass compares with what is stored, not with what it last wrote: an edit or a deletion
    by someone else is put right although nothing in the policy or the cluster changed."""
    a = auditor(org, client, FlakyRecorder())
    a_job(kmock, org, "big")
    org.edit(*CUT)
    await a.run_pass("config")
    written = report(kmock)
    [result] = written["results"]
    assert result["policy"] == "MPG-Q001"

    edited_body = copy.deepcopy(written)
    edited_body["results"], edited_body["summary"]["fail"] = [], 0
    kmock.objects[REPORTS, "nlp-team", "mpigate"] = edited_body  # someone else's edit
    assert report(kmock)["results"] == []
    edited = await a.run_pass("interval")
    assert edited is not None and edited.reports_written == 1 and edited.opened == 0
    assert report(kmock)["results"] == written["results"]
    assert report(kmock)["summary"] == written["summary"]

    kmock.objects[REPORTS, "nlp-team", "mpigate"].delete()  # type: ignore[attr-defined]
    assert report(kmock) is None
    deleted = await a.run_pass("interval")
    assert deleted is not None and deleted.reports_written == 1
    assert report(kmock)["results"] == written["results"]

    unchanged = await a.run_pass("interval")
    assert unchanged is not None and unchanged.reports_written == 0


async def test_a_report_of_mpigates_name_that_mpigate_does_not_own_is_never_overwritten(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    foreign = {
        "apiVersion": "wgpolicyk8s.io/v1alpha2",
        "kind": "PolicyReport",
        "metadata": {
            "name": "mpigate",
            "namespace": "nlp-team",
            "labels": {"app.kubernetes.io/managed-by": "someone-else"},
        },
        "summary": {"pass": 7},
        "results": [{"policy": "theirs", "result": "pass"}],
    }
    kmock.objects[REPORTS, "nlp-team", "mpigate"] = copy.deepcopy(foreign)
    a = auditor(org, client, FlakyRecorder())
    a_job(kmock, org, "big")
    org.edit(*CUT)
    with caplog.at_level(logging.WARNING, logger="mpigate.controller.background"):
        done = await a.run_pass("config")
    assert done is not None and done.opened == 1 and done.reports_written == 0
    assert report(kmock) == foreign  # neither patched nor taken for mpigate's
    assert any("is not mpigate's" in r.getMessage() and "nlp-team" in r.getMessage() for r in caplog.records)
    writes = a.metrics.registry.get_sample_value(
        "mpigate_controller_report_writes_total", {"api": "wgpolicyk8s.io/v1alpha2", "result": "foreign"}
    )
    assert writes == 1
    # the job gone: nothing to report in nlp-team, and still the foreign object is not deleted
    kmock.objects[TJ, "nlp-team", "big"].delete()  # type: ignore[attr-defined]
    again = await a.run_pass("interval")
    assert again is not None and again.reports_deleted == 0
    assert report(kmock) == foreign


async def test_a_field_the_api_server_drops_does_not_rewrite_the_report_at_every_pass(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    """What the API server stored of the last write counts as written: a server that prunes a field
    the report carries (an older CRD) is not sent the same report again at each pass."""
    a = auditor(org, client, FlakyRecorder())
    create = a.api.create

    async def pruning_create(collection: str, body: Mapping[str, Any]) -> dict[str, Any]:
        pruned = copy.deepcopy(dict(body))
        del pruned["summary"]["skip"]
        return await create(collection, pruned)

    a.api.create = pruning_create  # type: ignore[method-assign]
    a_job(kmock, org, "big")
    first = await a.run_pass("start")
    assert first is not None and first.reports_written == 1
    assert "skip" not in report(kmock)["summary"]
    second = await a.run_pass("interval")
    assert second is not None and second.reports_written == 0


async def test_a_restarted_list_judges_each_job_once(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    """An expired continue token restarts the list from a fresh snapshot (ControllerApi.pages): the
    jobs of the abandoned snapshot's pages come again and are judged, counted and reported once."""
    for i in range(3):
        a_job(kmock, org, f"big-{i}")
    org.edit(*CUT)
    a = auditor(org, client, FlakyRecorder())
    listed = a.api.pages

    def pages(path: str, **kw: Any) -> AsyncIterator[ListPage[list[dict[str, Any]]]]:
        if not path.endswith("/trainjobs"):
            return listed(path, **kw)

        async def restarted() -> AsyncIterator[ListPage[list[dict[str, Any]]]]:
            every = [j async for p in listed(path, **kw) for j in p.items]  # one page (kmock)
            yield ListPage(every[:2], "1", "c1")
            yield ListPage([], "", "", restarted=True)
            yield ListPage(every, "2", "")

        return restarted()

    a.api.pages = pages  # type: ignore[method-assign]
    done = await a.run_pass("config")
    assert done is not None and done.objects == 3 and done.opened == 3
    assert report(kmock)["summary"]["fail"] == 3 and len(report(kmock)["results"]) == 3
    assert gauge(a, "MPG-Q001") == 3


async def test_a_report_that_conflicts_and_is_gone_is_an_error_not_someone_elses(
    org: Org, client: KubeClient, kmock: kmock_lib.KubernetesEmulator
) -> None:
    """Create answers 409 but the object is gone when read: a failed write (tried again at the next
    pass), not a report mpigate does not own."""
    a = auditor(org, client, FlakyRecorder())

    async def conflicting(collection: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise KubeError(f"POST {collection}: HTTP 409", status=409)

    a.api.create = conflicting  # type: ignore[method-assign]
    a_job(kmock, org, "big")
    done = await a.run_pass("start")
    assert done is not None and done.reports_written == 0

    def writes(result: str) -> float | None:
        return a.metrics.registry.get_sample_value(
            "mpigate_controller_report_writes_total", {"api": "wgpolicyk8s.io/v1alpha2", "result": result}
        )

    assert writes("error") == 1 and writes("foreign") is None
