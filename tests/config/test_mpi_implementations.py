"""Which MPI implementation a runtime runs (issue 26 item 3): Trainer's mlPolicy.mpi where the
runtime has it, else the approved-runtimes entry's ``mpiImplementation``; ``check`` says when the
declaration, the MPI policy and the launcher disagree, and the webhook injects the pinned-port
environment of the runtime's implementation (values proven in tests/preflight/test_hydra_ports.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mpigate.config import check_tree, load
from mpigate.config.model import NetworkProfile
from mpigate.config.mpienv import (
    PINNED_ENV_NAMES,
    implementation_evidence,
    parse_pinned_ranges,
    pinned_env,
)
from mpigate.controller.reconciler import missing_pinned_env
from mpigate.policy import apply_patch
from tests.conftest import TODAY
from tests.policy.helpers import decide, ids, read

PROFILE = NetworkProfile("pinned", "pinned-ports", 2222, 40000, 100, 40200, 40210)


def test_each_implementation_gets_its_own_variables() -> None:
    assert PROFILE.pinned_env("OpenMPI") == PROFILE.openmpi_env
    assert PROFILE.pinned_env("MPICH") == (
        ("MPIR_CVAR_CH3_PORT_RANGE", "40000:40099"),
        ("UCX_TCP_PORT_RANGE", "40000-40099"),
        ("FI_TCP_PORT_LOW_RANGE", "40000"),
        ("FI_TCP_PORT_HIGH_RANGE", "40099"),
    )
    assert PROFILE.pinned_env("Intel") == (
        ("I_MPI_PORT_RANGE", "40200:40210"),
        ("FI_TCP_PORT_LOW_RANGE", "40000"),
        ("FI_TCP_PORT_HIGH_RANGE", "40099"),
    )
    isolated = NetworkProfile("iso", "isolated", 2222, 40000, 100, 40200, 40210)
    assert [isolated.pinned_env(i) for i in ("OpenMPI", "MPICH", "Intel")] == [(), (), ()]
    assert {"I_MPI_PORT_RANGE", "UCX_TCP_PORT_RANGE", "OMPI_MCA_btl_tcp_port_min_v6"} <= PINNED_ENV_NAMES


def test_the_ranges_a_rank_reads_back_are_the_profile_s() -> None:
    for implementation in ("MPICH", "Intel"):
        data, daemon = parse_pinned_ranges(dict(pinned_env(implementation, (40000, 40099), (40200, 40210))))  # type: ignore[arg-type]
        assert data == ((40000, 40099),)
        assert daemon == (((40200, 40210),) if implementation == "Intel" else ())
    with pytest.raises(ValueError, match="invalid port range"):
        parse_pinned_ranges({"I_MPI_PORT_RANGE": "40210:40200"})
    with pytest.raises(ValueError, match="invalid literal"):
        parse_pinned_ranges({"UCX_TCP_PORT_RANGE": "a-b"})


@pytest.mark.parametrize(
    ("command", "env", "says"),
    [
        (["mpirun.openmpi", "-np", "4", "python"], [], [{"OpenMPI"}]),
        (["/usr/bin/mpiexec.hydra", "-n", "4", "python"], [], [{"MPICH", "Intel"}]),
        (["sh", "-c", "mpirun --mca btl self,tcp -np 4 python"], [], [{"OpenMPI"}]),
        (["mpirun", "-n", "4", "-ppn", "1", "python"], ["I_MPI_FABRICS"], [{"Intel"}]),
        (["mpiexec.mpich", "-n", "2", "a.out"], ["MPIR_CVAR_NOLOCAL"], [{"MPICH"}, {"MPICH", "Intel"}]),
        (["/opt/intel/oneapi/mpi/latest/bin/mpirun", "-n", "2"], [], [{"Intel"}]),
        (["python", "train.py"], ["NCCL_DEBUG"], []),  # cannot be seen
        (["mpiexec", "-bind-to", "core", "-n", "2", "a.out"], [], []),  # Hydra's option, not Open MPI's
        (["mpirun", "--bind-to", "none", "-np", "2", "a.out"], [], [{"OpenMPI"}]),
    ],
)
def test_what_a_launcher_shows(command: list[str], env: list[str], says: list[set[str]]) -> None:
    assert [set(e.implementations) for e in implementation_evidence(command, env)] == says


# A runtime without Trainer's MPI policy that runs Intel MPI's Hydra itself (Trainer's CRD accepts
# only OpenMPI in mlPolicy.mpi.mpiImplementation), declared in the OrgPolicy.
HYDRA_RUNTIME = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: mpi-hydra
spec:
  mlPolicy:
    numNodes: 1
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: trainer
            spec:
              template:
                spec:
                  securityContext:
                    {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}
                  containers:
                    - name: node
                      image: "registry.acme.internal/mpigate/impi-runtime:2021.18@sha256:\
                        5f1c1b4a9d2e8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"
                      command: [{command}]
                      securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
"""


def _tree(
    org_tree: Path,
    *,
    declared: str | None,
    command: str = "mpiexec.hydra",
    allow: str = "OpenMPI, Intel, MPICH",
) -> Path:
    org = org_tree / "policies" / "org.yaml"
    entry = "      - {name: mpi-hydra" + (f", mpiImplementation: {declared}" if declared else "") + "}\n"
    text = org.read_text().replace("    mpiImplementations: [OpenMPI]", f"    mpiImplementations: [{allow}]")
    org.write_text(text.replace("  runtimes:\n    allowed:\n", "  runtimes:\n    allowed:\n" + entry))
    (org_tree / "policies" / "runtimes" / "mpi-hydra.yaml").write_text(
        HYDRA_RUNTIME.replace("{command}", command)
    )
    return org_tree


def _problems(tree: Path) -> list[str]:
    return [str(p) for p in check_tree(tree, today=TODAY).problems if p.code == "runtime.mpi-implementation"]


def test_a_declared_intel_runtime_checks_clean(org_tree: Path) -> None:
    tree = _tree(org_tree, declared="Intel")
    assert _problems(tree) == []
    config = load(tree, today=TODAY)
    assert config.org.runtime_approval("mpi-hydra", "ClusterTrainingRuntime").mpi_implementation == "Intel"  # type: ignore[union-attr]


def test_an_undeclared_hydra_launcher_is_warned(org_tree: Path) -> None:
    [warning] = _problems(_tree(org_tree, declared=None))
    assert "warning:" in warning
    assert (
        "runs Intel MPI or MPICH (the launcher mpiexec.hydra), but no mpiImplementation is declared"
        in warning
    )
    assert "{name: mpi-hydra, mpiImplementation: Intel}" in warning


def test_a_declaration_the_launcher_contradicts_is_warned(org_tree: Path) -> None:
    [warning] = _problems(_tree(org_tree, declared="Intel", command="mpirun.openmpi"))
    assert (
        "runs Open MPI (the launcher mpirun.openmpi), but its approved-runtimes entry declares Intel"
        in warning
    )
    assert "replicatedJobs[0].template.spec.template.spec.containers[0]" in warning


def test_a_declaration_must_be_allowed_and_agree_with_the_mpi_policy(org_tree: Path) -> None:
    [error] = _problems(_tree(org_tree, declared="MPICH", allow="OpenMPI, Intel"))
    assert (
        "warning:" not in error
        and "declares mpiImplementation MPICH, which spec.runtimes.mpiImplementations" in error
    )
    org = org_tree / "policies" / "org.yaml"
    org.write_text(
        org.read_text().replace("- mpi-openmpi-gpu ", "- {name: mpi-openmpi-gpu, mpiImplementation: Intel} ")
    )
    problems = _problems(org_tree)
    assert any(
        "'mpi-openmpi-gpu' declares mpiImplementation Intel, but its mlPolicy.mpi.mpiImplementation "
        "is OpenMPI" in p
        for p in problems
    ), problems


def _phi_job() -> dict[str, Any]:
    job = read("trainjobs/phi-pinned.yaml")
    job["spec"]["runtimeRef"] = {"name": "mpi-hydra"}
    del job["spec"]["initializer"]
    return job


@pytest.mark.parametrize("implementation", ["Intel", "MPICH"])
def test_the_webhook_injects_the_runtime_s_implementation_s_environment(
    org_tree: Path, implementation: str
) -> None:
    config = load(_tree(org_tree, declared=implementation), revision="test", today=TODAY)
    job = _phi_job()
    decision = decide(config, job)
    assert decision.allowed, decision.message
    out = apply_patch(job, decision.patch)
    injected = [(e["name"], e["value"]) for e in out["spec"]["trainer"]["env"]]  # type: ignore[index]
    assert injected == list(config.network_profiles["pinned-ports"].pinned_env(implementation))  # type: ignore[arg-type]
    assert not any(name.startswith("OMPI_") for name, _ in injected)
    # The requester is told how the job runs and what mpigate cannot see (explain and kubectl show it).
    [note] = [w for w in decision.warnings if "mpiexec.hydra" in w]
    label = "Intel MPI" if implementation == "Intel" else "MPICH"
    assert note == (
        f"{label} runs as plain mpiexec.hydra (Trainer's MPI policy: OpenMPI only); "
        "TCP ports pinned (mpi-hydra)"
    )
    # ... and Open MPI jobs on Trainer's MPI policy are not.
    assert not [w for w in decide(config, read("trainjobs/phi-pinned.yaml")).warnings if "mpiexec.hydra" in w]


def test_overriding_intel_s_pinned_range_is_denied(org_tree: Path) -> None:
    config = load(_tree(org_tree, declared="Intel"), revision="test", today=TODAY)
    job = _phi_job()
    job["spec"]["trainer"]["env"] = [{"name": "I_MPI_PORT_RANGE", "value": "1024:65535"}]
    decision = decide(config, job)
    assert not decision.allowed
    assert "MPG-NET-002" in ids(decision)
    assert "overrides I_MPI_PORT_RANGE (pinned to 40200:40210" in decision.message
    assert "Intel MPI would listen on ports the NetworkPolicy blocks" in decision.message


def test_the_controller_judges_a_job_by_the_implementation_whose_variables_it_carries() -> None:
    intel = {name for name, _ in PROFILE.pinned_env("Intel")}
    assert missing_pinned_env(PROFILE, intel) == []  # before: every OMPI_MCA_* name was "missing"
    assert missing_pinned_env(PROFILE, intel - {"I_MPI_PORT_RANGE"}) == ["I_MPI_PORT_RANGE"]
    assert missing_pinned_env(PROFILE, set()) == [name for name, _ in PROFILE.openmpi_env]
    assert missing_pinned_env(PROFILE, {"UCX_TCP_PORT_RANGE"}) == [
        "MPIR_CVAR_CH3_PORT_RANGE",
        "FI_TCP_PORT_LOW_RANGE",
        "FI_TCP_PORT_HIGH_RANGE",
    ]


def test_the_ssh_key_path_of_a_declared_hydra_runtime_is_checked(org_tree: Path) -> None:
    """Hydra's ssh launcher, like mpirun, runs ssh as the pods' user (UID 1000 here): keys mounted
    at /root/.ssh are unreadable to it. Before, only runtimes with Trainer's MPI policy were judged."""
    tree = _tree(org_tree, declared="Intel")
    runtime = tree / "policies" / "runtimes" / "mpi-hydra.yaml"
    runtime.write_text(
        runtime.read_text()
        + "                      volumeMounts: [{name: ssh, mountPath: /root/.ssh}]\n"
        + "                  volumes: [{name: ssh, secret: {secretName: mpi-ssh}}]\n"
    )
    config = load(tree, revision="test", today=TODAY)
    decision = decide(config, _phi_job())
    assert not decision.allowed
    assert "MPG-RT-002" in ids(decision)
    assert (
        "the node pods' node container runs as UID 1000, but the SSH keys are mounted at /root/.ssh "
        "(only root reads keys there); Hydra's ssh launcher (mpiexec.hydra -launcher ssh) cannot reach "
        "the workers over SSH." in decision.message
    )
    runtime.write_text(runtime.read_text().replace("mountPath: /root/.ssh", "mountPath: /home/mpiuser/.ssh"))
    assert "MPG-RT-002" not in ids(decide(load(tree, revision="test", today=TODAY), _phi_job()))
