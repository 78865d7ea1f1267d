"""Loading trees into the immutable Config: lookups, defaults, revision, discovery, bundles."""

from __future__ import annotations

import dataclasses
import datetime
import shutil
import subprocess
from pathlib import Path

import pytest

from mpigate.config import ConfigError, check_tree, is_config_tree, load
from mpigate.config.discovery import discover
from mpigate.config.queueing import queue_view
from tests.conftest import FIXTURES, REPO, TODAY

BASE = FIXTURES / "config" / "base"


@pytest.fixture
def config():
    return load(BASE, today=TODAY)


def test_team_lookup_by_namespace(config) -> None:
    assert config.team_for_namespace("alpha-dev").name == "alpha"
    assert config.team_for_namespace("beta").name == "beta"
    assert config.team_for_namespace("nobody") is None


def test_quota_arithmetic(config) -> None:
    alpha = config.teams["alpha"]
    assert (alpha.gpus["gpu-eu"].nominal, alpha.gpus["gpu-eu"].borrowing_limit) == (8, 0)
    tree = queue_view(config).tree
    assert tree.potential_available("alpha", ("gpu-eu", "nvidia.com/gpu")) == 8
    assert tree.potential_available("beta", ("gpu-us", "nvidia.com/gpu")) == 4
    assert alpha.cpu_value == 64
    assert alpha.memory_value == 256 * 2**30


def test_schema_defaults_are_applied(config) -> None:
    org = config.org
    assert org.security.level == "restricted"
    assert org.security.version == "latest"
    assert org.security.inject_defaults is True
    assert org.images.forbid_latest is True
    assert org.unmanaged_namespaces == "allow"
    assert org.audit.checkpoint_every == 1000
    beta = config.teams["beta"]
    assert beta.max_concurrent_jobs == 10
    assert beta.gpus["gpu-us"].borrowing_limit == 0
    assert beta.queues == ("beta-main", "beta-batch")
    assert beta.default_queue == "beta-main"
    assert config.teams["alpha"].queues == ("alpha",)
    assert config.flavors["gpu-us"].gpu_resource == "nvidia.com/gpu"
    assert org.lifecycle.max_runtime_seconds == 72 * 3600
    assert org.lifecycle.default_runtime_seconds == 24 * 3600


def test_builtin_personas_when_absent() -> None:
    result = check_tree(BASE, today=TODAY)
    assert result.builtin_defaults == ("Personas",)
    assert result.config is not None
    assert set(result.config.personas) == {"data-scientist", "mlops-engineer", "team-admin", "viewer"}


def test_enforcement_most_specific_wins(config) -> None:
    enforcement = config.org.enforcement
    assert enforcement.mode_for("MPG-IMG-002") == "warn"
    assert enforcement.mode_for("MPG-IMG-001") == "enforce"
    assert enforcement.mode_for("MPG-SEC-RUNASNONROOT") == "enforce"
    # advisory rules never deny
    assert enforcement.mode_for("MPG-Q008") == "warn"
    assert enforcement.mode_for("MPG-Q004") == "warn"


def test_enforcement_exact_beats_prefix_beats_glob() -> None:
    from mpigate.config.model import Enforcement

    e = Enforcement.build(
        "enforce",
        {"MPG-SEC-CAP*": "audit", "MPG-SEC": "warn", "MPG-SEC-CAPABILITIES-BASELINE": "enforce"},
    )
    assert e.mode_for("MPG-SEC-CAPABILITIES-BASELINE") == "enforce"
    assert e.mode_for("MPG-SEC-CAPABILITIES-RESTRICTED") == "warn"
    assert e.mode_for("MPG-SEC-PRIVILEGED") == "warn"
    assert e.mode_for("MPG-Q001") == "enforce"
    only_glob = Enforcement.build("audit", {"MPG-SEC-CAP*": "warn"})
    assert only_glob.mode_for("MPG-SEC-CAPABILITIES-RESTRICTED") == "warn"
    assert only_glob.mode_for("MPG-Q001") == "audit"


def test_network_and_access(config) -> None:
    assert config.network_for("alpha").profile == "pinned-ports"
    assert config.network_for("beta").profile == "isolated"  # no TeamNetwork → default
    assert config.network_profile_for("alpha").openmpi_env[0] == ("OMPI_MCA_btl_tcp_port_min_v4", "40000")
    assert config.network_profile_for("beta").openmpi_env == ()
    assert config.service_accounts_of("alpha") == frozenset({"alpha-pipeline"})
    assert config.egress_lists["registry"][0].ports == (443,)


def test_exceptions(config) -> None:
    (exc,) = config.exceptions_for("alpha")
    assert exc.rule_ids == frozenset({"MPG-IMG-001"})
    # the name narrows, the requester decides (match.requestedBy: the mlops-engineer persona)
    assert exc.matches("alpha", "legacy-x", {}, personas=frozenset({"mlops-engineer"}))
    assert not exc.matches("alpha", "legacy-x", {}, "ann@fixture.example", (), frozenset({"data-scientist"}))
    assert not exc.matches("alpha", "modern", {}, personas=frozenset({"mlops-engineer"}))
    assert exc.active_on(exc.expires)
    assert not exc.active_on(exc.expires + datetime.timedelta(days=1))
    assert config.exceptions_for("beta") == ()


def test_config_is_immutable(config) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.revision = "x"
    with pytest.raises(TypeError):
        config.teams["gamma"] = config.teams["alpha"]
    runtime = config.runtime("ClusterTrainingRuntime", "mpi-fixture")
    assert runtime is not None
    with pytest.raises(TypeError):
        runtime.manifest["spec"]["mlPolicy"]["numNodes"] = 3


def test_policy_tests_are_loaded(config) -> None:
    (suite,) = config.tests
    assert suite.name == "alpha"
    assert suite.cases[0]["name"] == "hello is admitted"
    assert suite.case_locations[0].line == 7


def test_load_raises_with_every_problem(tmp_path: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(BASE, root)
    (root / "rbac" / "beta.yaml").write_text(
        (root / "rbac" / "beta.yaml").read_text().replace("team: beta", "team: zeta")
    )
    (root / "quotas" / "alpha.yaml").write_text(
        (root / "quotas" / "alpha.yaml").read_text().replace("maxNodesPerJob", "maxNodes")
    )
    with pytest.raises(ConfigError) as info:
        load(root, today=TODAY)
    codes = sorted(p.code for p in info.value.errors)
    assert codes == ["ref.team", "schema.unknown-key"]
    assert "2 error(s)" in str(info.value)


def test_a_path_without_an_org_policy_is_no_config_tree(tmp_path: Path) -> None:
    assert not is_config_tree(check_tree(tmp_path).problems)
    (tmp_path / "notes.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    assert not is_config_tree(check_tree(tmp_path).problems)
    root = tmp_path / "t"
    shutil.copytree(BASE, root)
    (root / "quotas" / "flavors.yaml").unlink()
    incomplete = check_tree(root, today=TODAY)
    assert "missing.GPUFlavors" in {p.code for p in incomplete.errors}
    assert is_config_tree(incomplete.problems)
    assert is_config_tree(check_tree(BASE, today=TODAY).problems)


def test_revision_content_hash_outside_git(tmp_path: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(BASE, root)
    first = load(root, today=TODAY).revision
    assert first.startswith("sha256.") and len(first) == len("sha256.") + 16
    assert load(root, today=TODAY).revision == first
    (root / "quotas" / "beta.yaml").write_text((root / "quotas" / "beta.yaml").read_text() + "\n# comment\n")
    assert load(root, today=TODAY).revision != first


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_revision_is_git_commit_and_marks_dirty(tmp_path: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(BASE, root)
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "config")
    head = _git(root, "rev-parse", "HEAD")
    assert load(root, today=TODAY).revision == head
    (root / "README.txt").write_text("not config\n")
    assert load(root, today=TODAY).revision == head  # only config files count
    (root / "quotas" / "beta.yaml").write_text((root / "quotas" / "beta.yaml").read_text() + "# edit\n")
    dirty = load(root, today=TODAY).revision
    assert dirty.startswith(head + "-dirty.")


def test_revision_override(config) -> None:
    assert load(BASE, revision="abc123", today=TODAY).revision == "abc123"


def test_discovery_skips_non_config(tmp_path: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(BASE, root)
    for rel in (
        "examples/x.yaml",
        "templates/y.yaml",
        ".hidden/z.yaml",
        "quotas/.hidden.yaml",
        "scratch/notes.yaml",
        "quotas/archive/old.yaml",
        "docs/a.yml",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("kind: [broken\n")
    (root / ".mpigateignore").write_text("# comment\nscratch/\narchive\n")
    found = {p.relative_to(root).as_posix() for p in discover(root)}
    assert not {f for f in found if "broken" in (root / f).read_text()}
    assert "quotas/alpha.yaml" in found
    assert check_tree(root, today=TODAY).ok


def _bundle_files() -> list[Path]:
    """What a config bundle carries: everything but the policy test suites (their object files
    are relative to the repository and are not needed to serve decisions)."""
    return [p for p in discover(BASE) if "tests" not in p.relative_to(BASE).parts]


def test_single_file_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.yaml"
    parts = [p.read_text() for p in _bundle_files()]
    bundle.write_text("\n---\n".join(parts))
    config = load(bundle, today=TODAY)
    assert sorted(config.teams) == ["alpha", "beta"]
    assert config.files == ("bundle.yaml",)


def test_configmap_style_mount(tmp_path: Path) -> None:
    """A mounted ConfigMap: files are symlinks into a hidden ..data directory."""
    mount = tmp_path / "mount"
    data = mount / "..2026_11_22_10_00_00.1"
    data.mkdir(parents=True)
    for i, path in enumerate(_bundle_files()):
        (data / f"{i:02d}-{path.name}").write_text(path.read_text())
    (mount / "..data").symlink_to(data.name)
    for item in data.iterdir():
        (mount / item.name).symlink_to(Path("..data") / item.name)
    config = load(mount, revision="bundle-rev", today=TODAY)
    assert sorted(config.teams) == ["alpha", "beta"]
    assert config.revision == "bundle-rev"
    # the bundle's own revision file (a hidden ConfigMap key) is used when no override is given
    (data / ".mpigate-revision").write_text("0123abc\n")
    (mount / ".mpigate-revision").symlink_to(Path("..data") / ".mpigate-revision")
    assert load(mount, today=TODAY).revision == "0123abc"


def test_example_org_at_repo_root_is_valid() -> None:
    result = check_tree(REPO, today=TODAY)
    assert result.errors == (), "\n".join(map(str, result.errors))
    config = result.config
    assert config is not None
    assert sorted(config.teams) == ["cv-team", "nlp-team", "research-team"]
    nlp = config.teams["nlp-team"]
    assert (
        nlp.region,
        queue_view(config).tree.potential_available("nlp-team", ("a100-eu", "nvidia.com/gpu")),
    ) == (
        "eu",
        16,
    )
    assert (nlp.max_concurrent_jobs, nlp.max_nodes_per_job) == (5, 4)
    assert config.teams["cv-team"].max_nodes_per_job == 8
    research = config.access["research-team"]
    assert set(research.members) == {"viewer", "mlops-engineer"}
    assert research.members["mlops-engineer"].users == () and research.members["mlops-engineer"].groups == ()
    rt = config.runtime("ClusterTrainingRuntime", "mpi-openmpi-gpu")
    assert rt is not None and rt.manifest["spec"]["mlPolicy"]["mpi"]["mpiImplementation"] == "OpenMPI"
    assert [e.name for e in config.exceptions] == ["cv-team-legacy-image"]


def test_job_network_profile_takes_the_stricter(tmp_path: Path) -> None:
    """A data classification can tighten a team's network profile, never loosen it; the webhook
    (port env) and the controller (NetworkPolicy ports) share this decision."""
    from mpigate.policy import AdmissionInput, evaluate

    root = tmp_path / "t"
    shutil.copytree(BASE, root)
    org = root / "policies" / "org.yaml"
    org.write_text(
        org.read_text().replace(
            "phi: {regions: [eu], networkProfile: pinned-ports}",
            "phi: {regions: [eu], networkProfile: pinned-ports}\n    open: {networkProfile: isolated}",
        )
    )
    config = load(root, today=TODAY)
    assert config.job_network_profile("beta", None)[0].name == "isolated"
    assert config.job_network_profile("beta", "phi") == (
        config.network_profiles["pinned-ports"],
        "data classification phi",
    )
    # alpha is pinned-ports: the looser classification does not loosen it
    assert config.job_network_profile("alpha", "open") == (
        config.network_profiles["pinned-ports"],
        "team alpha",
    )
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "j", "namespace": "alpha", "labels": {"mpigate.io/data-classification": "open"}},
        "spec": {"runtimeRef": {"name": "mpi-fixture"}, "trainer": {"numNodes": 1}},
    }
    decision = evaluate(config, AdmissionInput("CREATE", "TrainJob", "alpha", "j", job))
    env_ops = [op for op in decision.patch if op["path"].startswith("/spec/trainer/env")]
    names = {
        e["name"] for op in env_ops for e in (op["value"] if isinstance(op["value"], list) else [op["value"]])
    }
    assert "OMPI_MCA_btl_tcp_port_min_v4" in names
