"""The template context: the numbers and policy decisions the templates render from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mpigate.config import Config, load
from mpigate.config.model import Persona
from mpigate.render import RenderError, render
from mpigate.render.context import _cluster_read_rules, pod_security_levels, team_context
from tests.conftest import FIXTURES, TODAY

BASE = FIXTURES / "config" / "base"
PSS = FIXTURES / "render" / "pss"


@pytest.fixture(scope="module")
def base() -> Config:
    return load(BASE, today=TODAY)


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "org"
    shutil.copytree(BASE, tree)
    return tree


def test_team_without_cohort_or_cpu_quota(base: Config) -> None:
    beta = team_context(base, base.teams["beta"], TODAY)
    cpu_group, gpu_group = beta["cluster_queue"]["resource_groups"]
    # no cohort: Kueue forbids borrowingLimit; no cpu/memory quota: a bound no team reaches
    assert cpu_group["flavors"][0]["resources"] == [
        {"name": "cpu", "nominalQuota": "1M"},
        {"name": "memory", "nominalQuota": "1Ei"},
        {"name": "pods", "nominalQuota": 10 * (8 + 3)},  # defaults: maxConcurrentJobs 10, maxNodesPerJob 8
    ]
    assert gpu_group["flavors"] == [
        {"name": "gpu-us", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}
    ]
    # twice what Kueue can admit (pods, GPUs): room for terminating pods; cpu/memory are Kueue's
    assert beta["resource_quota"]["hard"] == {
        "count/trainjobs.trainer.kubeflow.org": "40",  # 4 × maxConcurrentJobs
        "count/mpijobs.kubeflow.org": "40",
        "pods": "220",
        "requests.nvidia.com/gpu": "8",
    }
    assert beta["queues"] == ["beta-main", "beta-batch"] and beta["default_queue"] == "beta-main"
    assert beta["cohort"] is None


def test_team_with_cohort_borrowing(tmp_path: Path) -> None:
    """alpha may borrow 4 GPUs; gamma, the only other queue of cohort pool, lends at most 2 of its 8
    (lendingLimit): Kueue admits at most 10 for alpha, and the backstop holds twice that."""
    tree = _tree(tmp_path)
    quota = tree / "quotas" / "alpha.yaml"
    quota.write_text(
        quota.read_text().replace("gpu-eu: {nominal: 8}", "gpu-eu: {nominal: 8, borrowingLimit: 4}")
    )
    (tree / "quotas" / "gamma.yaml").write_text(
        "apiVersion: mpigate.io/v1alpha1\nkind: TeamQuota\nmetadata: {name: gamma}\n"
        "spec: {namespaces: [gamma], region: eu, cohort: pool,\n"
        "       gpus: {gpu-eu: {nominal: 8, lendingLimit: 2}}}\n"
    )
    config = load(tree, today=TODAY)
    alpha = team_context(config, config.teams["alpha"], TODAY)
    _, gpu_group = alpha["cluster_queue"]["resource_groups"]
    assert gpu_group["flavors"][0]["resources"] == [
        {"name": "nvidia.com/gpu", "borrowingLimit": 4, "nominalQuota": 8}
    ]
    assert alpha["gpu_ceilings"] == {"nvidia.com/gpu": 10}
    assert alpha["resource_quota"]["hard"]["requests.nvidia.com/gpu"] == "20"
    gamma = team_context(config, config.teams["gamma"], TODAY)
    _, gamma_gpus = gamma["cluster_queue"]["resource_groups"]
    assert gamma_gpus["flavors"][0]["resources"] == [
        {"name": "nvidia.com/gpu", "borrowingLimit": 0, "lendingLimit": 2, "nominalQuota": 8}
    ]


def test_fractional_fair_share_weight(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    quota = tree / "quotas" / "beta.yaml"
    quota.write_text(quota.read_text() + "  fairShareWeight: 1.5\n")
    config = load(tree, today=TODAY)
    assert team_context(config, config.teams["beta"], TODAY)["fair_share_weight"] == "1.5"
    assert team_context(config, config.teams["alpha"], TODAY)["fair_share_weight"] == 1


def test_pod_security_follows_the_org_level_by_default(base: Config) -> None:
    levels = pod_security_levels(base, base.teams["beta"], "beta", TODAY)
    assert (levels["enforce"], levels["audit"], levels["warn"], levels["relaxed"]) == (
        "restricted",
        "restricted",
        "restricted",
        [],
    )


def test_an_active_exception_lowers_enforce_in_its_namespaces_only(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    shutil.copy(PSS / "root-in-dev.yaml", tree / "policies" / "exceptions")
    shutil.copy(PSS / "expired-hostpath.yaml", tree / "policies" / "exceptions")
    config = load(tree, today=TODAY)
    alpha = config.teams["alpha"]
    dev = pod_security_levels(config, alpha, "alpha-dev", TODAY)
    assert dev["enforce"] == "baseline"  # runAsNonRoot is a restricted check
    assert (dev["audit"], dev["warn"]) == ("restricted", "restricted")  # still visible
    assert dev["relaxed"] == [{"rule": "MPG-SEC-RUNASNONROOT", "why": "PolicyException alpha-root-in-dev"}]
    assert pod_security_levels(config, alpha, "alpha", TODAY)["enforce"] == "restricted"
    # after the exception's last day the namespace is restricted again
    import datetime as dt

    assert pod_security_levels(config, alpha, "alpha-dev", dt.date(2027, 7, 1))["enforce"] == "restricted"
    # the rendered Namespace carries it
    rendering = render(config, today=TODAY)
    ns = next(o.data for o in rendering.objects if o.key.kind == "Namespace" and o.key.name == "alpha-dev")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert ns["metadata"]["annotations"]["mpigate.io/pod-security-relaxed"] == "MPG-SEC-RUNASNONROOT"


def test_a_baseline_check_not_enforced_by_the_org_makes_enforce_privileged(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    org = tree / "policies" / "org.yaml"
    org.write_text(
        org.read_text().replace("MPG-SEC: enforce}", "MPG-SEC: enforce, MPG-SEC-HOSTPORTS: audit}")
    )
    config = load(tree, today=TODAY)
    for team in config.teams.values():
        for ns in team.namespaces:
            levels = pod_security_levels(config, team, ns, TODAY)
            assert levels["enforce"] == "privileged"
            assert levels["relaxed"] == [{"rule": "MPG-SEC-HOSTPORTS", "why": "enforcement mode audit"}]


def test_cluster_read_rules_take_only_reads_of_shareable_cluster_objects() -> None:
    persona = Persona(
        "p",
        "",
        "none",
        (
            {
                "apiGroups": ["trainer.kubeflow.org"],
                "resources": ["trainjobs", "clustertrainingruntimes"],
                "verbs": ["*"],
            },
            {
                "apiGroups": ["kueue.x-k8s.io"],
                "resources": ["clusterqueues", "workloadpriorityclasses"],
                "verbs": ["get", "update"],
            },
            {"apiGroups": [""], "resources": ["nodes", "namespaces"], "verbs": ["get", "list"]},
        ),
    )
    assert _cluster_read_rules(persona) == [
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloadpriorityclasses"], "verbs": ["get"]},
        {
            "apiGroups": ["trainer.kubeflow.org"],
            "resources": ["clustertrainingruntimes"],
            "verbs": ["get", "list", "watch"],
        },
    ]


def test_a_gpu_flavor_named_like_a_region_flavor_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    flavors = tree / "quotas" / "flavors.yaml"
    flavors.write_text(flavors.read_text().replace("gpu-us:", "region-eu:").replace("gpu-us", "region-eu"))
    beta = tree / "quotas" / "beta.yaml"
    beta.write_text(beta.read_text().replace("gpu-us", "region-eu"))
    with pytest.raises(
        RenderError, match="GPU flavor 'region-eu' clashes with the ResourceFlavor rendered for region 'eu'"
    ):
        render(load(tree, today=TODAY), today=TODAY)


def test_too_many_node_labels_for_kueue_are_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    flavors = tree / "quotas" / "flavors.yaml"
    labels = ", ".join(f"example.com/l{i}: v" for i in range(8))
    flavors.write_text(
        flavors.read_text().replace(
            "gpu-us: {region: us,", f"gpu-us: {{region: us, nodeLabels: {{{labels}}},"
        )
    )
    with pytest.raises(
        RenderError, match="GPU flavor 'gpu-us' has 9 node labels with its region's; Kueue allows at most 8"
    ):
        render(load(tree, today=TODAY), today=TODAY)
