"""Rendering the example org: layout, determinism, the config bundle, overrides, template errors,
writing the output directory, and the golden files."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
import yaml

from mpigate.config import Config, load
from mpigate.config.loader import REVISION_FILE
from mpigate.config.queueing import STORED_JOB_COUNTS, queue_view
from mpigate.render import MARKER_FILE, RenderError, Rendering, render, write_tree
from tests.conftest import FIXTURES, REPO, TODAY

from .conftest import PINNED_REVISION

GOLDEN = FIXTURES / "render" / "golden"
BAD = FIXTURES / "render" / "bad-templates"


def _objects(rendering: Rendering, kind: str) -> list[dict]:
    return [o.data for o in rendering.objects if o.key.kind == kind]


def _one(rendering: Rendering, kind: str, name: str, namespace: str = "") -> dict:
    found = [
        o.data
        for o in rendering.objects
        if o.key.kind == kind and o.key.name == name and o.key.namespace == namespace
    ]
    assert len(found) == 1, (kind, name, namespace)
    return found[0]


def test_layout_is_a_kustomize_tree(example_rendering: Rendering) -> None:
    files = example_rendering.files
    root = yaml.safe_load(files["kustomization.yaml"])
    assert root["resources"] == [
        "cluster",
        "mpigate",
        "teams/cv-team",
        "teams/nlp-team",
        "teams/research-team",
    ]
    for directory in root["resources"]:
        listed = yaml.safe_load(files[f"{directory}/kustomization.yaml"])["resources"]
        present = sorted(
            p.rpartition("/")[2]
            for p in files
            if p.startswith(directory + "/") and not p.endswith("kustomization.yaml") and "/smoke/" not in p
        )
        assert listed == present  # the on-demand smoke/ TrainJob stays outside
    assert sorted(p for p in files if p.startswith("teams/nlp-team/")) == [
        "teams/nlp-team/alerts.yaml",
        "teams/nlp-team/kustomization.yaml",
        "teams/nlp-team/namespaces.yaml",
        "teams/nlp-team/networkpolicies.yaml",
        "teams/nlp-team/queues.yaml",
        "teams/nlp-team/quota.yaml",
        "teams/nlp-team/rbac.yaml",
        "teams/nlp-team/smoke/preflight-trainjob.yaml",
    ]
    assert {o.file.partition("/")[0] for o in example_rendering.objects} == {"cluster", "teams", "mpigate"}


def test_every_object_carries_the_managed_by_label_and_team_objects_their_team(
    example_rendering: Rendering,
) -> None:
    for obj in example_rendering.objects:
        labels = obj.data["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "mpigate"
        if obj.file.startswith("teams/"):
            assert labels["mpigate.io/team"] == obj.file.split("/")[1]


def test_resource_flavors_carry_region_and_flavor_labels(example_rendering: Rendering) -> None:
    a100 = _one(example_rendering, "ResourceFlavor", "a100-eu")
    assert a100["spec"]["nodeLabels"] == {
        "nvidia.com/gpu.product": "A100-SXM4-80GB",
        "topology.kubernetes.io/region": "eu-west-1",
    }
    assert a100["spec"]["tolerations"] == [
        {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}
    ]
    region = _one(example_rendering, "ResourceFlavor", "region-us")
    assert region["spec"] == {"nodeLabels": {"topology.kubernetes.io/region": "us-east-1"}}


def test_cluster_queue_of_a_team(example_rendering: Rendering) -> None:
    cq = _one(example_rendering, "ClusterQueue", "nlp-team")
    spec = cq["spec"]
    assert spec["cohortName"] == "research-pool"
    assert spec["namespaceSelector"] == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["nlp-team"]}]
    }
    assert spec["fairSharing"] == {"weight": 1}
    assert spec["queueingStrategy"] == "BestEffortFIFO"
    cpu_group, gpu_group = spec["resourceGroups"]
    assert cpu_group["coveredResources"] == ["cpu", "memory", "pods"]
    assert cpu_group["flavors"] == [
        {
            "name": "region-eu",
            "resources": [
                {"name": "cpu", "borrowingLimit": 0, "nominalQuota": "256"},
                {"name": "memory", "borrowingLimit": 0, "nominalQuota": "2Ti"},
                # maxConcurrentJobs 5 * (maxNodesPerJob 4 + launcher + 2 initializers)
                {"name": "pods", "borrowingLimit": 0, "nominalQuota": 35},
            ],
        }
    ]
    assert gpu_group == {
        "coveredResources": ["nvidia.com/gpu"],
        "flavors": [
            {
                "name": "a100-eu",
                "resources": [
                    {"name": "nvidia.com/gpu", "borrowingLimit": 0, "lendingLimit": 4, "nominalQuota": 16}
                ],
            }
        ],
    }
    cv = _one(example_rendering, "ClusterQueue", "cv-team")["spec"]
    assert cv["namespaceSelector"]["matchExpressions"][0]["values"] == ["cv-team", "cv-team-dev"]
    assert cv["fairSharing"] == {"weight": 2}
    # no other team of research-pool has h100-us quota to lend: cv-team does not borrow
    assert cv["resourceGroups"][1]["flavors"][0]["resources"] == [
        {"name": "nvidia.com/gpu", "borrowingLimit": 0, "nominalQuota": 32}
    ]
    assert cv["preemption"] == {
        "borrowWithinCohort": {"policy": "Never"},
        "reclaimWithinCohort": "Any",
        "withinClusterQueue": "LowerPriority",
    }


def test_cluster_level_kueue_objects(example_rendering: Rendering) -> None:
    assert [c["metadata"]["name"] for c in _objects(example_rendering, "Cohort")] == ["research-pool"]
    classes = {
        c["metadata"]["name"]: c["value"] for c in _objects(example_rendering, "WorkloadPriorityClass")
    }
    assert classes == {"low": 10, "standard": 100, "urgent": 1000}


def test_persona_cluster_roles_are_not_aggregated_into_kueues(example_rendering: Rendering) -> None:
    roles = {r["metadata"]["name"]: r for r in _objects(example_rendering, "ClusterRole")}
    assert sorted(roles) == [
        "mpigate:persona:data-scientist",
        "mpigate:persona:data-scientist:cluster-read",
        "mpigate:persona:mlops-engineer",
        "mpigate:persona:mlops-engineer:cluster-read",
        "mpigate:persona:team-admin",
        "mpigate:persona:team-admin:cluster-read",
        "mpigate:persona:viewer",
        "mpigate:persona:viewer:cluster-read",
    ]
    for role in roles.values():
        # Kueue's kueue-batch-user-role would hand the persona's rules to whoever holds it
        assert not [k for k in role["metadata"]["labels"] if k.startswith("rbac.kueue.x-k8s.io/")]
    assert roles["mpigate:persona:data-scientist:cluster-read"]["rules"] == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["resourceflavors", "workloadpriorityclasses"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["trainer.kubeflow.org"],
            "resources": ["clustertrainingruntimes"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    # the kubeflow SDK reads the ClusterTrainingRuntime of every job it shows, viewers' too
    assert roles["mpigate:persona:viewer:cluster-read"]["rules"] == [
        {
            "apiGroups": ["trainer.kubeflow.org"],
            "resources": ["clustertrainingruntimes"],
            "verbs": ["get", "list", "watch"],
        }
    ]


def test_a_persona_opting_into_kueue_aggregation_gets_the_label(tmp_path: Path) -> None:
    tree = tmp_path / "org"
    shutil.copytree(
        REPO, tree, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "tests", "docs", "src")
    )
    personas = tree / "rbac" / "personas.yaml"
    personas.write_text(
        personas.read_text(encoding="utf-8").replace(
            "    viewer:\n", "    viewer:\n      kueue: batch-user\n"
        ),
        encoding="utf-8",
    )
    rendering = render(load(tree, today=TODAY), today=TODAY)
    roles = {r["metadata"]["name"]: r for r in _objects(rendering, "ClusterRole")}
    assert roles["mpigate:persona:viewer"]["metadata"]["labels"]["rbac.kueue.x-k8s.io/batch-user"] == "true"
    assert (
        "rbac.kueue.x-k8s.io/batch-user"
        not in roles["mpigate:persona:viewer:cluster-read"]["metadata"]["labels"]
    )


def test_namespace_labels_are_what_render_writes(
    example_config: Config, example_rendering: Rendering
) -> None:
    """The engine's namespaceSelectors read namespace_labels: it must stay the rendered labels
    (plus the name label the API server sets)."""
    from mpigate.config.admission import NAMESPACE_NAME_LABEL
    from mpigate.render.context import namespace_labels

    namespaces = [o.data for o in example_rendering.objects if o.key.kind == "Namespace"]
    assert namespaces
    for ns in namespaces:
        name = ns["metadata"]["name"]
        expected = {**ns["metadata"]["labels"], NAMESPACE_NAME_LABEL: name}
        assert namespace_labels(example_config, name, TODAY) == expected
    assert namespace_labels(example_config, "nobodys", TODAY) == {NAMESPACE_NAME_LABEL: "nobodys"}


def test_namespaces_and_pod_security(example_rendering: Rendering) -> None:
    ns = _one(example_rendering, "Namespace", "cv-team-dev")
    labels = ns["metadata"]["labels"]
    assert labels["mpigate.io/team"] == "cv-team"
    assert {k: v for k, v in labels.items() if k.startswith("pod-security")} == {
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/audit-version": "latest",
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/warn-version": "latest",
    }


def test_resource_quota_backstop_and_limit_range(example_rendering: Rendering) -> None:
    quota = _one(example_rendering, "ResourceQuota", "mpigate-team-quota", "cv-team-dev")
    assert quota["spec"]["hard"] == {
        "count/trainjobs.trainer.kubeflow.org": "40",  # maxStoredJobs default: 4 × maxConcurrentJobs 10
        "count/mpijobs.kubeflow.org": "40",  # MPIJobs as well, each kind up to maxStoredJobs
        "pods": "220",  # 2 × the pod quota 10 × (8 + 3)
        "requests.nvidia.com/gpu": "64",  # 2 × what Kueue can admit on h100-us (32)
    }
    limits = _one(example_rendering, "LimitRange", "mpigate-defaults", "research")
    assert limits["spec"]["limits"] == [
        {"defaultRequest": {"cpu": "500m", "memory": "1Gi"}, "type": "Container"}
    ]


def test_the_backstop_counts_every_kind_of_job_the_webhook_judges(example_rendering: Rendering) -> None:
    """TrainJobs and the MPI Operator's MPIJobs alike (MPG-Q007 counts both): each job kind the
    webhook is sent and the controller looks after has its object count in every team namespace's
    quota, at maxStoredJobs, named as the API server's quota admission names it
    (count/<resource>.<group>, k8s.io/apiserver ObjectCountQuotaResourceNameFor)."""
    from mpigate.admission.routes import ROUTED
    from mpigate.controller.kinds import KINDS

    job_kinds = {k.kind for k in KINDS}
    counts = {f"count/{plural}.{group}" for group, plural, kind, _ in ROUTED if kind in job_kinds}
    assert (
        counts
        == {f"count/{k.plural}.{k.group}" for k in KINDS}
        == {
            "count/trainjobs.trainer.kubeflow.org",
            "count/mpijobs.kubeflow.org",
        }
    )
    config = load(REPO, revision="test", today=TODAY)
    quotas = _objects(example_rendering, "ResourceQuota")
    namespaces = {ns for t in config.teams.values() for ns in t.namespaces}
    assert {q["metadata"]["namespace"] for q in quotas} == namespaces
    for quota in quotas:
        team = config.team_for_namespace(quota["metadata"]["namespace"])
        assert team is not None
        for name in counts:
            assert quota["spec"]["hard"].get(name) == str(team.max_stored_jobs), (team.name, name)


@pytest.mark.upstream
def test_the_trainjob_count_names_the_upstream_crds_resource(upstream: Path) -> None:
    crd = yaml.safe_load((upstream / "trainer" / "crds" / "trainer.kubeflow.org_trainjobs.yaml").read_text())
    assert f"count/{crd['spec']['names']['plural']}.{crd['spec']['group']}" in STORED_JOB_COUNTS


def test_resource_quota_cannot_starve_an_admitted_job(example_rendering: Rendering) -> None:
    """Whatever Kueue admits into a namespace fits its ResourceQuota with the same again
    terminating: the backstop holds twice the Kueue ceiling of every resource it counts, and it
    counts none that Kueue counts differently from the pods (cpu/memory: a container that states
    only limits is counted at the LimitRange default by Kueue, at its limit by the quota)."""
    config = load(REPO, revision="test", today=TODAY)
    tree = queue_view(config).tree
    queues = {q["metadata"]["name"]: q for q in _objects(example_rendering, "ClusterQueue")}
    for quota in _objects(example_rendering, "ResourceQuota"):
        team = config.team_for_namespace(quota["metadata"]["namespace"])
        assert team is not None
        hard = quota["spec"]["hard"]
        assert not {"requests.cpu", "requests.memory", "limits.cpu", "limits.memory"} & set(hard)
        ceilings: dict[str, int] = {}
        for group in queues[team.name]["spec"]["resourceGroups"]:
            for flavor in group["flavors"]:
                for res in flavor["resources"]:
                    fr = (flavor["name"], res["name"])
                    ceilings[res["name"]] = ceilings.get(res["name"], 0) + tree.potential_available(
                        team.name, fr
                    )
        for key, value in hard.items():
            resource = key.removeprefix("requests.")
            if resource in ceilings:
                assert int(value) >= 2 * ceilings[resource], (team.name, key)
        assert int(hard["pods"]) >= 2 * ceilings["pods"]
        for gpu in {r for r in ceilings if "/" in r}:
            assert f"requests.{gpu}" in hard


def test_local_queues_in_every_team_namespace(example_rendering: Rendering) -> None:
    queues = sorted(
        (q["metadata"]["namespace"], q["metadata"]["name"], q["spec"]["clusterQueue"])
        for q in _objects(example_rendering, "LocalQueue")
    )
    assert queues == [
        ("cv-team", "cv-team", "cv-team"),
        ("cv-team-dev", "cv-team", "cv-team"),
        ("nlp-team", "nlp-team", "nlp-team"),
        ("research", "research-team", "research-team"),
    ]


def test_role_bindings_per_persona_and_namespace(example_rendering: Rendering) -> None:
    binding = _one(example_rendering, "RoleBinding", "mpigate:mlops-engineer", "cv-team-dev")
    assert binding["roleRef"] == {
        "name": "mpigate:persona:mlops-engineer",
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
    }
    assert binding["subjects"] == [
        {"name": "omar@acme.example", "apiGroup": "rbac.authorization.k8s.io", "kind": "User"},
        {"name": "cv-pipeline", "kind": "ServiceAccount", "namespace": "cv-team-dev"},
    ]
    assert _one(example_rendering, "ServiceAccount", "cv-pipeline", "cv-team-dev")
    names = sorted(
        b["metadata"]["name"]
        for b in _objects(example_rendering, "RoleBinding")
        if b["metadata"]["namespace"] == "nlp-team"
    )
    assert names == [
        "mpigate:data-scientist",
        "mpigate:mlops-engineer",
        "mpigate:team-admin",
        "mpigate:viewer",
    ]


def test_network_policies(example_rendering: Rendering) -> None:
    policies = {
        p["metadata"]["name"]: p
        for p in _objects(example_rendering, "NetworkPolicy")
        if p["metadata"]["namespace"] == "cv-team"
    }
    assert sorted(policies) == [
        "mpigate-allow-dns-jobset",
        "mpigate-allow-dns-team-label",
        "mpigate-allow-egress-jobset",
        "mpigate-allow-egress-team-label",
        "mpigate-default-deny-jobset",
        "mpigate-default-deny-team-label",
    ]
    deny = policies["mpigate-default-deny-team-label"]["spec"]
    assert deny == {
        "podSelector": {"matchExpressions": [{"key": "mpigate.io/team", "operator": "Exists"}]},
        "policyTypes": ["Ingress", "Egress"],
    }
    egress = policies["mpigate-allow-egress-jobset"]["spec"]["egress"]
    # egress lists registry + object-storage-us, then the team's own rule
    assert [(e["to"][0]["ipBlock"]["cidr"], e["ports"]) for e in egress] == [
        ("10.20.0.0/24", [{"port": 443, "protocol": "TCP"}]),
        ("10.40.0.0/16", [{"port": 443, "protocol": "TCP"}]),
        ("10.50.0.10/32", [{"port": 3128, "protocol": "TCP"}]),  # the Hugging Face proxy (hf://)
        ("192.0.2.0/28", [{"port": 443, "protocol": "TCP"}]),
    ]


def test_alerts_use_kueue_and_mpigate_metrics(example_rendering: Rendering) -> None:
    team_rule = _one(example_rendering, "PrometheusRule", "mpigate-team-nlp-team", "mpigate-system")
    rules = {r["alert"]: r for r in team_rule["spec"]["groups"][0]["rules"]}
    assert (
        'kueue_cluster_queue_resource_usage{cluster_queue="nlp-team", resource="nvidia.com/gpu"}'
        in rules["MpigateTeamGPUQuotaNearlyExhausted"]["expr"]
    )
    assert ">= 0.9" in rules["MpigateTeamGPUQuotaNearlyExhausted"]["expr"]
    assert rules["MpigateTeamJobsPending"]["for"] == "30m"
    assert 'kueue_pending_workloads{cluster_queue="nlp-team"}' in rules["MpigateTeamJobsPending"]["expr"]
    own = _one(example_rendering, "PrometheusRule", "mpigate", "mpigate-system")
    exprs = " ".join(r["expr"] for g in own["spec"]["groups"] for r in g["rules"])
    for metric in (
        "mpigate_admission_requests_total",
        "mpigate_admission_duration_seconds_bucket",
        "mpigate_audit_write_failures_total",
        "mpigate_live_lookup_errors_total",
        "mpigate_config_reload_failures_total",
    ):
        assert metric in exprs
    docs = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    for rule in [*rules.values(), *(r for g in own["spec"]["groups"] for r in g["rules"])]:
        anchor = rule["annotations"]["runbook_url"].rpartition("#")[2]
        assert f"### {rule['alert']}" in docs and anchor == rule["alert"].lower()


def test_dashboard_config_map(example_rendering: Rendering) -> None:
    import json

    cm = _one(example_rendering, "ConfigMap", "mpigate-dashboard", "mpigate-system")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["mpigate-overview.json"])
    titles = [p["title"] for p in dashboard["panels"]]
    assert titles[:4] == [
        "GPUs in use by team",
        "GPU quota consumption (usage / nominal)",
        "Running jobs by team",
        "Pending jobs by team",
    ]
    assert "Admission outcomes (TrainJob CREATE)" in titles
    assert dashboard["panels"][0]["targets"][0]["legendFormat"] == "{{cluster_queue}}"


def _without_source(value):
    """Config objects equal up to where they were read from."""
    if dataclasses.is_dataclass(value) and hasattr(value, "source"):
        return dataclasses.replace(value, source=None)
    return value


def test_config_bundle_round_trips_through_the_loader(
    example_rendering: Rendering, example_config, tmp_path: Path
) -> None:
    cm = _one(example_rendering, "ConfigMap", "mpigate-config", "mpigate-system")
    assert cm["metadata"]["annotations"]["mpigate.io/revision"] == PINNED_REVISION
    data = cm["data"]
    assert data[REVISION_FILE] == PINNED_REVISION + "\n"
    assert "policies__org.yaml" in data and "rbac__personas.yaml" in data
    assert not any("tests" in key for key in data)  # PolicyTests stay out
    assert data["quotas__nlp-team.yaml"] == (REPO / "quotas" / "nlp-team.yaml").read_text(encoding="utf-8")
    # the kubelet mounts a ConfigMap as one file per key (plus hidden ..data links)
    for key, text in data.items():
        (tmp_path / key).write_text(text, encoding="utf-8")
    mounted = load(tmp_path, today=TODAY)
    assert mounted.revision == PINNED_REVISION
    assert mounted.tests == ()
    for field in ("teams", "flavors", "personas", "network_profiles", "egress_lists", "cohorts"):
        left, right = getattr(mounted, field), getattr(example_config, field)
        if isinstance(left, tuple):
            assert left == right
        else:
            assert {k: _without_source(v) for k, v in left.items()} == {
                k: _without_source(v) for k, v in right.items()
            }, field
    assert set(mounted.runtimes) == set(example_config.runtimes)
    assert mounted.org.enforcement.mode_for("MPG-IMG-002") == "warn"


def test_bundle_drops_policy_tests_from_mixed_files(tmp_path: Path) -> None:
    tree = tmp_path / "org"
    shutil.copytree(REPO / "policies", tree / "policies")
    shutil.copytree(REPO / "quotas", tree / "quotas")
    mixed = (REPO / "policies" / "tests" / "smoke.yaml").read_text(encoding="utf-8")
    exception = (REPO / "policies" / "exceptions" / "cv-team-legacy-image.yaml").read_text(encoding="utf-8")
    (tree / "policies" / "tests" / "smoke.yaml").write_text(exception + "---\n" + mixed, encoding="utf-8")
    (tree / "policies" / "exceptions" / "cv-team-legacy-image.yaml").unlink()
    (tree / "notes.yaml").write_text("kind: Notes\nmetadata: {name: x}\n", encoding="utf-8")
    shutil.copytree(REPO / "examples", tree / "examples")
    config = load(tree, today=TODAY)
    rendering = render(config, today=TODAY)
    data = _one(rendering, "ConfigMap", "mpigate-config", "mpigate-system")["data"]
    kept = list(yaml.safe_load_all(data["policies__tests__smoke.yaml"]))
    assert [d["kind"] for d in kept] == ["PolicyException"]
    assert "notes.yaml" not in data


def test_rendering_is_deterministic(example_config, example_rendering: Rendering, tmp_path: Path) -> None:
    again = render(example_config, today=TODAY)
    assert again.files == example_rendering.files
    first, second = tmp_path / "a", tmp_path / "b"
    write_tree(example_rendering, first)
    write_tree(again, second)
    for rel in example_rendering.files:
        assert (first / rel).read_bytes() == (second / rel).read_bytes()
        assert (first / rel).read_bytes().endswith(b"\n")


def test_a_one_field_change_changes_only_the_files_it_must(tmp_path: Path) -> None:
    tree = tmp_path / "org"
    for folder in ("policies", "quotas", "rbac", "networkpolicies", "examples"):
        shutil.copytree(REPO / folder, tree / folder)
    before = render(load(tree, revision="r1", today=TODAY), today=TODAY)
    quota = tree / "quotas" / "nlp-team.yaml"
    quota.write_text(
        quota.read_text(encoding="utf-8").replace("nominal: 16", "nominal: 12"), encoding="utf-8"
    )
    after = render(load(tree, revision="r1", today=TODAY), today=TODAY)
    changed = sorted(p for p in before.files if before.files[p] != after.files.get(p))
    assert changed == [
        "cluster/clusterqueues.yaml",
        "mpigate/config-bundle.yaml",
        "teams/nlp-team/quota.yaml",
    ]
    assert set(before.files) == set(after.files)
    # and within clusterqueues.yaml only nlp-team's queue differs
    old = {o.key: o.data for o in before.objects}
    new = {o.key: o.data for o in after.objects}
    assert sorted(str(k) for k in old if old[k] != new[k]) == [
        "ClusterQueue nlp-team (kueue.x-k8s.io/v1beta2)",
        "ConfigMap mpigate-system/mpigate-config (v1)",
        "ResourceQuota nlp-team/mpigate-team-quota (v1)",
    ]


def test_repo_templates_and_extra_template_dirs_override_by_path(tmp_path: Path) -> None:
    tree = tmp_path / "org"
    for folder in ("policies", "quotas", "rbac", "networkpolicies", "examples"):
        shutil.copytree(REPO / folder, tree / folder)
    shutil.copytree(FIXTURES / "render" / "overrides", tree / "templates")
    rendering = render(load(tree, today=TODAY), today=TODAY)
    queues = sorted(
        (q["metadata"]["namespace"], q["metadata"]["name"]) for q in _objects(rendering, "LocalQueue")
    )
    assert queues == [
        ("cv-team", "training"),
        ("cv-team-dev", "training"),
        ("nlp-team", "training"),
        ("research", "training"),
    ]
    assert "teams/nlp-team/alerts.yaml" not in rendering.files  # an empty override drops the file
    assert yaml.safe_load(rendering.files["teams/nlp-team/kustomization.yaml"])["resources"] == [
        "namespaces.yaml",
        "networkpolicies.yaml",
        "queues.yaml",
        "quota.yaml",
        "rbac.yaml",
    ]
    extra = _one(rendering, "ConfigMap", "org-teams", "mpigate-system")
    assert extra["data"] == {"teams": "cv-team,nlp-team,research-team"}
    assert rendering.files["cluster/extra.yaml"]
    # --templates beats the repository's own templates/
    highest = tmp_path / "highest" / "team"
    highest.mkdir(parents=True)
    (highest / "queues.yaml.j2").write_text(
        (FIXTURES / "render" / "overrides" / "team" / "queues.yaml.j2")
        .read_text()
        .replace("name: training", "name: top"),
        encoding="utf-8",
    )
    top = render(load(tree, today=TODAY), template_dirs=[tmp_path / "highest"], today=TODAY)
    assert {q["metadata"]["name"] for q in _objects(top, "LocalQueue")} == {"top"}


@pytest.mark.parametrize(
    ("case", "line", "message"),
    [
        ("undefined", 10, "undefined value: 'dict object' has no attribute 'queue_names'"),
        (
            "not-yaml",
            9,
            "rendered output is not valid YAML (while parsing a flow sequence: "
            "did not find expected ',' or ']')",
        ),
        ("no-kind", 2, "object at output line 2 has no kind"),
        ("syntax", 6, "template syntax error: Unexpected end of template."),
        ("fail", 2, "template failed: team cv-team allows more than 4 nodes per job; this cluster has 4"),
    ],
)
def test_bad_templates_fail_with_file_and_line(example_config, case: str, line: int, message: str) -> None:
    with pytest.raises(RenderError) as caught:
        render(example_config, template_dirs=[BAD / case], today=TODAY)
    problems = caught.value.problems
    assert problems, case
    first = problems[0]
    assert first.file == os.path.relpath(BAD / case / "team" / "queues.yaml.j2")
    assert first.line == line
    assert first.message.startswith(message)
    assert first.where.startswith("team cv-team")


def test_label_values_must_be_text(example_config, tmp_path: Path) -> None:
    extra = tmp_path / "cluster"
    extra.mkdir()
    (extra / "flag.yaml.j2").write_text(
        "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: flagged\n  labels: {example.com/on: true}\n"
    )
    with pytest.raises(RenderError) as caught:
        render(example_config, template_dirs=[tmp_path], today=TODAY)
    (problem,) = caught.value.problems
    assert problem.line == 2
    assert problem.message == (
        "object at output line 2 has metadata.labels['example.com/on'] = True, which is not text (quote it)"
    )


def test_rendered_network_policies_never_take_a_per_job_name(
    example_config, example_rendering: Rendering, tmp_path: Path
) -> None:
    """The controller's per-job policies are `mpigate-trainjob.<job>`; a rendered NetworkPolicy can
    never be named like one (issue 16 item 5: a TrainJob named default-deny-jobset took over the
    namespace's `mpigate-default-deny-jobset`)."""
    from mpigate.controller.netpol import POLICY_PREFIX, policy_name

    names = [p["metadata"]["name"] for p in _objects(example_rendering, "NetworkPolicy")]
    assert names and all("." not in name for name in names)
    assert all(policy_name(name.removeprefix("mpigate-")) != name for name in names)
    assert POLICY_PREFIX.endswith(".")
    extra = tmp_path / "cluster"
    extra.mkdir()
    (extra / "np.yaml.j2").write_text(
        "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n"
        "metadata: {name: mpigate-trainjob.llm, namespace: nlp-team}\nspec: {podSelector: {}}\n"
    )
    with pytest.raises(RenderError) as caught:
        render(example_config, template_dirs=[tmp_path], today=TODAY)
    (problem,) = caught.value.problems
    assert "rendered NetworkPolicy names may not hold a dot" in problem.message


def test_an_object_rendered_twice_is_an_error(example_config, tmp_path: Path) -> None:
    extra = tmp_path / "cluster"
    extra.mkdir()
    (extra / "again.yaml.j2").write_text(
        "---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: Cohort\nmetadata: {name: research-pool}\n"
    )
    with pytest.raises(
        RenderError, match=r"Cohort research-pool \(kueue.x-k8s.io/v1beta2\) is rendered twice"
    ):
        render(example_config, template_dirs=[tmp_path], today=TODAY)


def test_write_tree_replaces_a_rendered_dir_and_refuses_foreign_ones(
    example_rendering: Rendering, tmp_path: Path
) -> None:
    out = tmp_path / "deploy"
    stats = write_tree(example_rendering, out)
    assert len(stats.written) == len(example_rendering.files) and (out / MARKER_FILE).is_file()
    (out / "teams" / "old-team").mkdir()
    (out / "teams" / "old-team" / "quota.yaml").write_text("stale\n")
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    again = write_tree(example_rendering, out)
    assert again.written == () and again.removed == ("teams/old-team/quota.yaml",)
    assert not (out / "teams" / "old-team").exists()
    assert (out / ".git" / "HEAD").is_file()

    foreign = tmp_path / "repo"
    foreign.mkdir()
    (foreign / "README.md").write_text("mine\n")
    with pytest.raises(RenderError, match="refusing to replace"):
        write_tree(example_rendering, foreign)
    assert (foreign / "README.md").read_text() == "mine\n"


def test_golden_files(example_rendering: Rendering) -> None:
    """The example org's rendering, byte for byte. Regenerate with MPIGATE_UPDATE_GOLDEN=1."""
    if os.environ.get("MPIGATE_UPDATE_GOLDEN") == "1":
        if GOLDEN.exists():
            shutil.rmtree(GOLDEN)
        write_tree(example_rendering, GOLDEN)
    on_disk = {
        p.relative_to(GOLDEN).as_posix(): p.read_text(encoding="utf-8")
        for p in GOLDEN.rglob("*")
        if p.is_file()
    }
    assert sorted(on_disk) == sorted(example_rendering.files), (
        "file set differs; MPIGATE_UPDATE_GOLDEN=1 to regenerate"
    )
    for rel, text in example_rendering.files.items():
        assert on_disk[rel] == text, (
            f"{rel} differs from the golden file; MPIGATE_UPDATE_GOLDEN=1 to regenerate"
        )


def test_per_team_smoke_trainjob_is_rendered_on_demand(example_rendering: Rendering) -> None:
    """Each team gets the preflight smoke TrainJob outside every kustomization (GitOps must not
    start it on each sync), and the admission engine admits it as rendered."""
    from mpigate.policy import AdmissionInput, evaluate

    config = load(REPO, revision=PINNED_REVISION, today=TODAY)
    for team in ("cv-team", "nlp-team", "research-team"):
        path = f"teams/{team}/smoke/preflight-trainjob.yaml"
        job = yaml.safe_load(example_rendering.files[path])
        assert job["kind"] == "TrainJob" and job["metadata"]["name"] == "mpigate-preflight"
        assert "smoke" not in example_rendering.files[f"teams/{team}/kustomization.yaml"]
        ns = job["metadata"]["namespace"]
        decision = evaluate(config, AdmissionInput("CREATE", "TrainJob", ns, "mpigate-preflight", job))
        assert decision.allowed, decision.message
        pinned = team == "research-team"
        assert ("--expect-pinned" in job["spec"]["trainer"]["command"]) == pinned
        assert any(op["path"] == "/spec/trainer/env" for op in decision.patch) == pinned


def test_teams_without_an_mpi_runtime_get_one_summary_warning_and_no_smoke_job() -> None:
    from types import MappingProxyType

    config = load(FIXTURES / "config" / "base", today=TODAY)
    with_smoke = render(config, today=TODAY)
    assert "teams/alpha/smoke/preflight-trainjob.yaml" in with_smoke.files
    bare = dataclasses.replace(config, runtimes=MappingProxyType({}))
    rendering = render(bare, today=TODAY)
    assert not [p for p in rendering.files if "/smoke/" in p]
    assert [w for w in rendering.warnings if "smoke" in w] == [
        "no preflight smoke TrainJob for alpha, beta: "
        "no approved MPI runtime of the team is in the config tree"
    ]
