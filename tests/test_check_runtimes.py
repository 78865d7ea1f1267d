"""check judges the approved in-tree runtimes with the webhook's engine (a CREATE of each) and,
for each it would deny, prints the JSONPatch that makes it compliant (issue 21 item 5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mpigate.cli import cli
from mpigate.config import check_tree, load
from mpigate.policy import apply_patch
from mpigate.runtime_admission import RuntimeVerdict, judge_runtimes
from tests.conftest import REPO


@pytest.fixture
def tree(org_tree: Path) -> Path:
    return org_tree


def _loose_runtime(tree: Path) -> Path:
    """The reference runtime without its securityContexts, as Trainer's own runtimes ship: fine
    for Kubernetes, refused by the webhook under restricted Pod Security."""
    runtime = yaml.safe_load((REPO / "policies" / "runtimes" / "mpi-openmpi-gpu.yaml").read_text())
    runtime["metadata"]["name"] = "mpi-openmpi-loose"
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]["spec"]
        pod["securityContext"] = {k: v for k, v in pod["securityContext"].items() if k != "seccompProfile"}
        pod["securityContext"].pop("runAsNonRoot")
        for container in pod["containers"]:
            container.pop("securityContext", None)
    path = tree / "policies" / "runtimes" / "mpi-openmpi-loose.yaml"
    path.write_text(yaml.safe_dump(runtime, sort_keys=False))
    return path


def test_the_example_org_s_runtimes_are_all_admitted() -> None:
    verdicts = judge_runtimes(load(REPO))
    assert verdicts and all(v.decision.allowed for v in verdicts)
    assert {v.runtime.name for v in verdicts} == {"mpi-openmpi-gpu", "mpi-openmpi-data"}


def test_check_fails_for_a_runtime_the_webhook_would_deny(tree: Path) -> None:
    """Before: `check` passed with 0 warnings and the runtime failed at kubectl apply."""
    _loose_runtime(tree)
    result = CliRunner().invoke(cli, ["check", str(tree)])
    assert result.exit_code == 1, result.output
    assert (
        "policies/runtimes/mpi-openmpi-loose.yaml:1:1: (runtime): the webhook would deny installing "
        "ClusterTrainingRuntime mpi-openmpi-loose (MPG-SEC-ALLOWPRIVILEGEESCALATION, "
        "MPG-SEC-CAPABILITIES-RESTRICTED, MPG-SEC-RUNASNONROOT, MPG-SEC-SECCOMPPROFILE-RESTRICTED) "
        "(hint: the patch below makes it compliant)"
    ) in result.output
    assert "JSONPatch that makes it compliant" in result.output
    assert "ok: 3 teams" not in result.output


def test_the_printed_patch_makes_the_runtime_compliant(tree: Path) -> None:
    path = _loose_runtime(tree)
    result = CliRunner().invoke(cli, ["check", str(tree), "-o", "json"])
    assert result.exit_code == 1
    data = json.loads(result.output)
    [loose] = [r for r in data["runtimes"] if r["name"] == "mpi-openmpi-loose"]
    assert loose["allowed"] is False and loose["compliantAfterPatch"] is True and loose["byHand"] == []
    ops = loose["patch"]
    assert {op["op"] for op in ops} == {"add"}
    assert {
        "/spec/template/spec/replicatedJobs/0/template/spec/template/spec/containers/0/securityContext"
    } <= {op["path"] for op in ops}
    # Apply it to the file and check again: the tree passes.
    path.write_text(yaml.safe_dump(apply_patch(yaml.safe_load(path.read_text()), ops), sort_keys=False))
    again = CliRunner().invoke(cli, ["check", str(tree)])
    assert again.exit_code == 0, again.output


def test_what_a_patch_cannot_fix_is_listed_by_hand(tree: Path) -> None:
    shutil.copy(REPO / "examples" / "runtimes" / "deny-root-runtime.yaml", tree / "policies" / "runtimes")
    [root] = [v for v in _verdicts(tree) if v.denied]
    assert root.runtime.name == "openmpi-root"
    assert root.patch and not root.patch_complies
    assert {v.rule for v in root.by_hand} == {"MPG-IMG-001", "MPG-RT-002"}
    assert not {v.rule for v in root.by_hand if v.rule.startswith("MPG-SEC-")}  # the patch fixed those
    result = CliRunner().invoke(cli, ["check", str(tree)])
    assert "  still to change by hand:" in result.output
    assert "[MPG-IMG-001]" in result.output.split("still to change by hand:")[1]


def _verdicts(tree: Path) -> list[RuntimeVerdict]:
    result = check_tree(tree)
    assert result.config is not None, [str(p) for p in result.errors]
    return judge_runtimes(result.config)
