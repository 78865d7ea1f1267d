"""Issue 18, items 2-4 and the second person: what a team's admin may write in the team's own files
is bounded by the org (namespaces, personas and access, quota fields, exceptions). Each case is
edited into a copy of the example org exactly as a team admin would, then judged by ``check`` and,
where the issue saw its effect there, by ``render``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpigate.cli import cli
from mpigate.config import Problem, Severity, check_tree
from mpigate.scaffold import copy_example
from tests.conftest import TODAY


@pytest.fixture
def org(tmp_path: Path) -> Path:
    root = tmp_path / "org"
    copy_example(root)
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def errors(root: Path) -> list[Problem]:
    return [p for p in check_tree(root, today=TODAY).problems if p.severity is Severity.ERROR]


def codes(root: Path) -> list[tuple[str, str, str]]:
    return sorted((p.location.file, p.path, p.code) for p in errors(root))


def test_the_example_org_and_the_fixture_org_are_within_every_bound(org: Path) -> None:
    assert errors(org) == []


# --- item 2: namespaces ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "code"),
    [
        ("argocd", "value.reserved-namespace"),
        ("gpu-operator", "value.reserved-namespace"),
        ("kube-flannel", "value.system-namespace"),
        ("openshift-monitoring", "value.system-namespace"),
        ("payments", "value.namespace-not-allowed"),
        ("cv-team-x", "value.namespace-not-allowed"),  # another team's prefix
    ],
)
def test_a_team_claims_only_namespaces_the_org_allows(org: Path, namespace: str, code: str) -> None:
    edit(org / "quotas" / "nlp-team.yaml", "namespaces: [nlp-team]", f"namespaces: [nlp-team, {namespace}]")
    assert codes(org) == [("quotas/nlp-team.yaml", "spec.namespaces[1]", code)]


def test_claiming_argocd_no_longer_renders_the_teams_bindings_there(org: Path, tmp_path: Path) -> None:
    edit(org / "quotas" / "nlp-team.yaml", "namespaces: [nlp-team]", "namespaces: [nlp-team, argocd]")
    result = CliRunner().invoke(cli, ["render", str(org), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "quotas/nlp-team.yaml:7" in result.output and "'argocd' is reserved" in result.output


def test_team_prefixes_and_the_orgs_allow_list(org: Path) -> None:
    edit(org / "quotas" / "nlp-team.yaml", "namespaces: [nlp-team]", "namespaces: [nlp-team, nlp-team-eval]")
    assert errors(org) == []
    # research-team's `research` is allowed by the example OrgPolicy; without that entry it is not
    edit(org / "policies" / "org.yaml", "research-team: [research]", "nlp-team: [nlp-lab]")
    assert codes(org) == [("quotas/research-team.yaml", "spec.namespaces[0]", "value.namespace-not-allowed")]
    edit(org / "policies" / "org.yaml", "nlp-team: [nlp-lab]", "ghost-team: [ghost]")
    assert ("policies/org.yaml", "spec.teamNamespaces.teams.ghost-team", "ref.team") in codes(org)


def test_the_org_may_reserve_its_own_namespaces(org: Path) -> None:
    edit(
        org / "policies" / "org.yaml",
        "  teamNamespaces:                   # a team claims <team> and <team>-* ...\n",
        "  teamNamespaces:\n    reserved: [nlp-team-prod]\n",
    )
    edit(org / "quotas" / "nlp-team.yaml", "namespaces: [nlp-team]", "namespaces: [nlp-team, nlp-team-prod]")
    assert codes(org) == [("quotas/nlp-team.yaml", "spec.namespaces[1]", "value.reserved-namespace")]


# --- item 3: personas and access ------------------------------------------------------------------

PERSONA_RULES = [
    ('[""]', "[resourcequotas]", "[update]"),
    ('[""]', "[limitranges]", "[delete]"),
    ("[kueue.x-k8s.io]", "[localqueues]", "[create]"),
    ("[kueue.x-k8s.io]", "[workloads]", "[patch]"),
    ('[""]', "[pods]", "[create]"),
    ('[""]', "[pods/exec]", "[get]"),
    ('[""]', "[secrets]", "[get]"),
    ('[""]', "[secrets]", "[list]"),
    ('[""]', "[serviceaccounts/token]", "[create]"),
    ("[batch]", "[jobs]", "[create]"),
    ("[jobset.x-k8s.io]", "[jobsets]", "[create]"),
    ('[""]', "[users]", "[impersonate]"),
    ("[rbac.authorization.k8s.io]", "[clusterroles]", "[bind]"),
    ("[rbac.authorization.k8s.io]", "[clusterroles]", "[escalate]"),
    ("[trainer.kubeflow.org]", "[trainingruntimes]", "[update]"),
]


def grant_viewer(org: Path, groups: str, resources: str, verbs: str) -> None:
    """Give the example's viewer persona one more RBAC rule (flow-style lists), as its first rule
    (found by position: the persona's other keys may change)."""
    personas = org / "rbac" / "personas.yaml"
    text = personas.read_text(encoding="utf-8")
    viewer = text.index("    viewer:\n")
    rules = text.index("      rules:\n", viewer) + len("      rules:\n")
    rule = f"        - {{apiGroups: {groups}, resources: {resources}, verbs: {verbs}}}\n"
    personas.write_text(text[:rules] + rule + text[rules:], encoding="utf-8")


@pytest.mark.parametrize(("groups", "resources", "verbs"), PERSONA_RULES)
def test_no_persona_holds_what_the_rendered_objects_rely_on(
    org: Path, groups: str, resources: str, verbs: str
) -> None:
    grant_viewer(org, groups, resources, verbs)
    (problem,) = errors(org)
    assert (problem.code, problem.path) == ("rbac.forbidden", "spec.personas.viewer.rules[0]")
    assert f"{verbs.strip('[]')} on {resources.strip('[]')}" in problem.message


def test_wildcards_in_persona_rules_stay_refused(org: Path) -> None:
    edit(
        org / "rbac" / "personas.yaml",
        "verbs: [get, list, watch, create, update, patch, delete]",
        "verbs: ['*']",
    )
    assert "rbac.wildcard" in {p.code for p in errors(org)}


def test_reading_what_the_built_in_personas_read_is_fine(org: Path) -> None:
    (org / "rbac" / "personas.yaml").unlink()
    assert errors(org) == []


def test_the_org_replaces_the_forbidden_list(org: Path) -> None:
    edit(
        org / "policies" / "org.yaml",
        "  exceptions:\n",
        "  personas:\n    forbidden:\n"
        "      - {apiGroups: [''], resources: [configmaps], verbs: [create], reason: configs come from Git}\n"
        "  exceptions:\n",
    )
    assert errors(org) == []  # mlops-engineer reads configmaps; nobody creates them
    edit(
        org / "rbac" / "personas.yaml",
        "resources: [pods, pods/log, events, configmaps]\n          verbs: [get, list, watch]",
        "resources: [pods, pods/log, events, configmaps]\n          verbs: [get, list, watch, create]",
    )
    (problem,) = errors(org)
    assert "create on configmaps: configs come from Git" in problem.message


def test_mpijobs_stay_off_personas_by_default_and_the_reason_says_why(org: Path) -> None:
    """MPIJobs are judged and counted by the webhook and the quota backstop, and the controller
    looks after them as after TrainJobs: the default still keeps them forbidden and names why,
    instead of claiming the webhook never sees them, nothing counts them or the controller keeps
    no records of them."""
    grant_viewer(org, "[kubeflow.org]", "[mpijobs]", "[create]")
    (problem,) = errors(org)
    assert "create on mpijobs: MPIJobs are judged, counted and looked after like TrainJobs" in problem.message
    assert "approved runtime" in problem.message
    for stale in ("never sees", "does not count them", "keeps neither", "lifecycle records"):
        assert stale not in problem.message


@pytest.mark.parametrize(
    ("subject", "allowed"),
    [
        ("groups: [system:authenticated]", False),
        ("groups: [system:unauthenticated]", False),
        ("groups: [system:serviceaccounts]", False),
        ("groups: [system:serviceaccounts:kube-system]", False),
        ("groups: [system:masters]", False),
        ("users: [system:anonymous]", False),
        ("users: ['system:kube-controller-manager']", False),
        ("groups: [system:serviceaccounts:nlp-team]", True),
        ("users: ['system:serviceaccount:ci:deployer']", True),
    ],
)
def test_team_access_refuses_cluster_wide_subjects(org: Path, subject: str, allowed: bool) -> None:
    edit(
        org / "rbac" / "nlp-team.yaml",
        "    viewer:\n      groups: [nlp-team-stakeholders]",
        f"    viewer:\n      {subject}",
    )
    found = codes(org)
    assert found == (
        []
        if allowed
        else [
            ("rbac/nlp-team.yaml", re.sub(r"s: .*", "s[0]", f"spec.members.viewer.{subject}"), "rbac.subject")
        ]
    )


# --- item 4: bounded quotas -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "path"),
    [
        ("fairShareWeight: 1", "fairShareWeight: 1000", "spec.fairShareWeight"),
        ("borrowingLimit: 0", "borrowingLimit: 100000", "spec.gpus.a100-eu.borrowingLimit"),
        ("maxNodesPerJob: 4", "maxNodesPerJob: 1000", "spec.maxNodesPerJob"),
        ("maxConcurrentJobs: 5", "maxConcurrentJobs: 500", "spec.maxConcurrentJobs"),
        ('cpu: "256"', 'cpu: "100000"', "spec.cpu"),
        ("memory: 2Ti", "memory: 1Pi", "spec.memory"),
        ("nominal: 16,", "nominal: 600,", "spec.gpus.a100-eu.nominal"),
    ],
)
def test_quota_fields_a_team_sets_are_bounded(org: Path, old: str, new: str, path: str) -> None:
    edit(org / "quotas" / "nlp-team.yaml", old, new)
    found = [p for p in errors(org) if p.code == "limit.quota"]
    assert [(p.location.file, p.path) for p in found][:1] == [("quotas/nlp-team.yaml", path)]
    assert "above the org's limit" in found[0].message or "capacity" in found[0].message


def test_a_limit_names_where_it_is_set(org: Path) -> None:
    edit(org / "quotas" / "nlp-team.yaml", "fairShareWeight: 1", "fairShareWeight: 5")
    (problem,) = errors(org)
    assert "OrgPolicy spec.teamQuotaLimits.fairShareWeight at policies/org.yaml:" in problem.message
    edit(org / "quotas" / "nlp-team.yaml", "fairShareWeight: 5", "fairShareWeight: 1\n  pods: 5000")
    (problem,) = errors(org)
    assert "the default of OrgPolicy spec.teamQuotaLimits.pods" in problem.message


def test_stored_jobs_default_is_bounded_too(org: Path) -> None:
    edit(
        org / "policies" / "org.yaml",
        "    maxConcurrentJobs: 20\n",
        "    maxConcurrentJobs: 20\n    maxStoredJobs: 15\n",
    )
    found = {(p.location.file, p.path) for p in errors(org) if p.code == "limit.quota"}
    # nlp-team: 5 concurrent → 20 stored by default, above 15; cv-team: 10 → 40
    assert ("quotas/nlp-team.yaml", "spec.maxConcurrentJobs") in found


def test_reserved_priority_classes(org: Path) -> None:
    edit(org / "quotas" / "research-team.yaml", "priorityClasses: [low]", "priorityClasses: [low, urgent]")
    assert codes(org) == [("quotas/research-team.yaml", "spec.priorityClasses[1]", "limit.priority-class")]


def test_borrowing_above_capacity(org: Path) -> None:
    edit(org / "policies" / "org.yaml", "    borrowingLimit: 16\n", "    borrowingLimit: 10000\n")
    edit(org / "quotas" / "nlp-team.yaml", "borrowingLimit: 0", "borrowingLimit: 5000")
    (problem,) = errors(org)
    assert "above the capacity of a100-eu" in problem.message


# --- exceptions need a second person ---------------------------------------------------------------

EXCEPTION = org_exception = Path("policies") / "exceptions" / "cv-team-legacy-image.yaml"


def test_the_approver_is_not_in_the_benefiting_team(org: Path) -> None:
    for approver, member in (
        ("ines@acme.example", "user ines@acme.example (team-admin)"),
        ("INES@acme.example", "user ines@acme.example (team-admin)"),
        ("cv-team-scientists", "group cv-team-scientists (data-scientist)"),
        ("system:serviceaccount:cv-team:cv-pipeline", "service account cv-pipeline (mlops-engineer)"),
    ):
        path = org / EXCEPTION
        text = path.read_text(encoding="utf-8")
        path.write_text(re.sub(r"approver: .*", f"approver: {approver}", text), encoding="utf-8")
        found = {p.code: p for p in errors(org)}
        assert member in found["exception.self-approved"].message, approver
        # and none of these is one of the org's approvers either
        assert "exception.approver" in found


def test_an_approver_outside_the_team_but_not_the_orgs(org: Path) -> None:
    edit(org / EXCEPTION, "approver: ciso@acme.example", "approver: maria@acme.example")  # nlp-team's
    assert codes(org) == [(EXCEPTION.as_posix(), "spec.approver", "exception.approver")]
    edit(
        org / "policies" / "org.yaml",
        "    approvers: [ciso@acme.example, security-oncall@acme.example]\n",
        "",
    )
    assert errors(org) == []  # anyone outside cv-team, when the org names no approvers


def test_rule_patterns_and_team_wide_matches_need_the_orgs_flag(org: Path) -> None:
    edit(org / EXCEPTION, "rules: [MPG-IMG-001]", "rules: [MPG-IMG-001, MPG-SEC, 'MPG-*']")
    edit(
        org / EXCEPTION,
        '  match:\n    trainJobNames: ["legacy-*"]\n    requestedBy: {personas: [mlops-engineer]}\n',
        "  match:\n    trainJobNames: ['*']\n",
    )
    assert codes(org) == [
        (EXCEPTION.as_posix(), "spec.match", "exception.team-wide"),
        (EXCEPTION.as_posix(), "spec.rules[1]", "exception.rule-pattern"),
        (EXCEPTION.as_posix(), "spec.rules[2]", "exception.rule-pattern"),
    ]
    edit(
        org / "policies" / "org.yaml",
        "  exceptions:\n",
        "  exceptions:\n    allowRulePatterns: true\n    allowTeamWide: true\n",
    )
    assert errors(org) == []


MATCH = '  match:\n    trainJobNames: ["legacy-*"]\n    requestedBy: {personas: [mlops-engineer]}\n'


@pytest.mark.parametrize(
    "match",
    [
        "namespaces: [cv-team, cv-team-dev]",  # every namespace cv-team has
        "namespaces: [cv-team-dev, cv-team]\n    trainJobNames: ['*']",
        "requestedBy: {personas: [data-scientist, mlops-engineer, team-admin]}",  # all cv-team gives
        "requestedBy: {personas: [viewer, team-admin, mlops-engineer, data-scientist]}\n"
        "    namespaces: [cv-team, cv-team-dev]",
        # requestedBy is met by any of its entries: a user does not narrow what the personas cover
        "requestedBy: {users: [omar@acme.example], personas: [data-scientist, mlops-engineer, team-admin]}",
    ],
)
def test_conditions_every_job_of_the_team_meets_are_team_wide(org: Path, match: str) -> None:
    """An empty match is refused without the org's flag; so is one that only looks narrower."""
    edit(org / EXCEPTION, MATCH, f"  match:\n    {match}\n")
    assert codes(org) == [(EXCEPTION.as_posix(), "spec.match", "exception.team-wide")]
    edit(org / "policies" / "org.yaml", "  exceptions:\n", "  exceptions:\n    allowTeamWide: true\n")
    assert errors(org) == []


@pytest.mark.parametrize(
    "match",
    [
        "namespaces: [cv-team-dev]",
        "requestedBy: {personas: [data-scientist, mlops-engineer]}",
        "requestedBy: {users: [omar@acme.example], groups: [cv-team-scientists]}",
    ],
)
def test_part_of_the_team_is_not_team_wide(org: Path, match: str) -> None:
    edit(org / EXCEPTION, MATCH, f"  match:\n    {match}\n")
    assert errors(org) == []


def test_expiry_is_bounded_by_the_org(org: Path) -> None:
    edit(org / EXCEPTION, "expires: 2027-03-31", "expires: 2027-06-01")  # 191 days after TODAY
    (problem,) = errors(org)
    assert problem.code == "exception.expiry" and "2027-05-21 at the latest" in problem.message
    edit(org / "policies" / "org.yaml", "    maxDuration: 180d ", "    maxDuration: 200d ")
    assert errors(org) == []


def test_the_issues_waiver_is_refused_on_every_count(org: Path) -> None:
    """quotas/ is covered by test_ownership; here the same waiver sits in policies/ (where a
    security reviewer would see it) and is still refused for what it says."""
    (org / "policies" / "exceptions" / "waive-all.yaml").write_text(
        "apiVersion: mpigate.io/v1alpha1\nkind: PolicyException\nmetadata: {name: waive-all}\n"
        "spec:\n  team: nlp-team\n  rules: ['MPG-*']\n  match: {}\n  justification: x\n"
        "  approver: lena@acme.example\n  expires: '2027-12-31'\n",
        encoding="utf-8",
    )
    assert {p.code for p in errors(org)} == {
        "exception.self-approved",
        "exception.approver",
        "exception.rule-pattern",
        "exception.team-wide",
        "exception.expiry",
    }


def test_a_lending_floor(org: Path) -> None:
    edit(
        org / "policies" / "org.yaml",
        "    borrowingLimit: 16\n",
        "    borrowingLimit: 16\n    minLendingLimit: 8\n",
    )
    (problem,) = errors(org)  # nlp-team lends at most 4 of its 16
    assert (problem.location.file, problem.path) == ("quotas/nlp-team.yaml", "spec.gpus.a100-eu.lendingLimit")
    assert "below the org's floor 8" in problem.message
    edit(org / "quotas" / "nlp-team.yaml", "lendingLimit: 4", "lendingLimit: 8")
    assert errors(org) == []
