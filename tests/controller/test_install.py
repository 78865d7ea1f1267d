"""webhooks/ installs the controller as it runs: valid arguments, probes on its metrics port, the
Lease identity from the downward API, and RBAC for exactly the calls it makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tests.conftest import REPO

from mpigate.admission.kube import KubeError
from mpigate.cli.controller_commands import controller_command
from mpigate.controller import handlers
from mpigate.controller.kinds import MPIJOB, TRAINJOB
from mpigate.controller.leader import LeaseSettings
from mpigate.controller.ledger import DEFAULT_LEDGER_NAME
from mpigate.controller.reliances import DEFAULT_KUEUE_CONFIG
from mpigate.controller.runner import served_kinds
from mpigate.render import read_objects


def one(kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    found = [
        o
        for _, o in read_objects(REPO / "webhooks")
        if o["kind"] == kind
        and o["metadata"]["name"] == name
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, (kind, name)
    return found[0]


def test_statefulset_arguments_probes_and_volumes() -> None:
    pod = one("StatefulSet", "mpigate-controller")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    ctx = controller_command.make_context("controller", list(container["args"][1:]))  # raises if invalid
    assert ctx.params["audit_dir"].as_posix() == "/var/lib/mpigate/audit"
    assert ctx.params["metrics_port"] == 8080
    assert ctx.params["leader_elect"] is True
    assert ctx.params["namespace_label"] == "mpigate.io/team"  # the webhooks' namespaceSelector key
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # the audit volume is the StatefulSet's per-replica claim (tests/webhooks/test_install_base.py)
    assert mounts["audit"] == "/var/lib/mpigate/audit" and "audit" not in volumes
    assert volumes["audit-key"]["secret"]["secretName"] == "mpigate-audit-key"
    assert mounts["config"] == "/etc/mpigate/config"


def rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_grants_what_the_controller_calls_and_no_deletes() -> None:
    granted = rules(one("ClusterRole", "mpigate-controller"))
    trainer, _, trainjobs = handlers.TRAINJOBS
    needed = {
        # kopf: list+watch of every watched resource; patch for its progress annotations and ours
        (trainer, trainjobs, "list"),
        (trainer, trainjobs, "watch"),
        (trainer, trainjobs, "patch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("networking.k8s.io", "networkpolicies", "list"),
        ("networking.k8s.io", "networkpolicies", "watch"),
        # the reconciler
        ("networking.k8s.io", "networkpolicies", "get"),
        ("networking.k8s.io", "networkpolicies", "create"),
        ("networking.k8s.io", "networkpolicies", "patch"),
        (trainer, "trainjobs/finalizers", "update"),  # blockOwnerDeletion in the owner reference
        ("", "nodes", "get"),
        ("", "namespaces", "get"),
        ("", "events", "create"),
        ("", "events", "list"),  # the scheduler's Events of pods that ran while it was down
        (trainer, "trainingruntimes", "get"),
        (trainer, "clustertrainingruntimes", "get"),
        # MPIJobs, where the MPI Operator serves them: as TrainJobs
        ("kubeflow.org", "mpijobs", "list"),
        ("kubeflow.org", "mpijobs", "watch"),
        ("kubeflow.org", "mpijobs", "get"),
        ("kubeflow.org", "mpijobs", "patch"),
        ("kubeflow.org", "mpijobs/finalizers", "update"),
    }
    assert needed <= granted, needed - granted
    assert not {g for g in granted if g[2] in ("delete", "deletecollection", "*")}
    lease = rules(one("Role", "mpigate-controller-leader-election", "mpigate-system"))
    assert {("coordination.k8s.io", "leases", v) for v in ("get", "create", "patch")} <= lease
    assert LeaseSettings(namespace="mpigate-system").name == "mpigate-controller"
    # the ledger: get and patch of its one ConfigMap (create cannot name it), in mpigate-system
    ledger = one("Role", "mpigate-controller-ledger", "mpigate-system")
    assert rules(ledger) == {("", "configmaps", v) for v in ("get", "patch", "create")}
    assert [r.get("resourceNames") for r in ledger["rules"]] == [[DEFAULT_LEDGER_NAME], None]
    ctx = controller_command.make_context(
        "controller", ["--config", "x", "--lease-namespace", "mpigate-system"]
    )
    assert ctx.params["ledger"] is None  # → mpigate-system/mpigate-controller-ledger
    # Kueue's Configuration, read for what the gate relies on: that one ConfigMap, read-only
    namespace, name = DEFAULT_KUEUE_CONFIG.split("/")
    kueue = one("Role", "mpigate-controller-kueue-config", namespace)
    assert rules(kueue) == {("", "configmaps", "get")}
    assert [r["resourceNames"] for r in kueue["rules"]] == [[name]]
    binding = one("RoleBinding", "mpigate-controller-kueue-config", namespace)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mpigate-controller", "namespace": "mpigate-system"}
    ]


def test_print_netpol_needs_no_cluster() -> None:
    result = CliRunner().invoke(
        controller_command,
        [
            "--config",
            str(REPO),
            "--print-netpol",
            str(REPO / "examples/trainjobs/phi-pinned.yaml"),
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert '"name": "mpigate-trainjob.phi-finetune"' in result.output
    assert '"uid": "<uid of the TrainJob>"' in result.output
    stray = CliRunner().invoke(
        controller_command,
        [
            "--config",
            str(REPO),
            "--print-netpol",
            str(REPO / "examples/trainjobs/deny-unmanaged-namespace.yaml"),
        ],
    )
    assert stray.exit_code == 1
    assert "namespace sandbox belongs to no team" in stray.output
    # an MPIJob's: around the MPI Operator's pods of the job
    mpi = CliRunner().invoke(
        controller_command,
        ["--config", str(REPO), "--print-netpol", str(REPO / "examples/mpijobs/mpi-allreduce.yaml")],
    )
    assert mpi.exit_code == 0, mpi.output
    assert "name: mpigate-mpijob.mpi-allreduce" in mpi.output
    assert "training.kubeflow.org/operator-name: mpi-operator" in mpi.output
    assert "uid: <uid of the MPIJob>" in mpi.output
    old = CliRunner().invoke(
        controller_command,
        ["--config", str(REPO), "--print-netpol", str(REPO / "examples/mpijobs/deny-mpijob-v1.yaml")],
    )
    assert old.exit_code == 2 and "holds no TrainJob (or kubeflow.org/v2beta1 MPIJob)" in old.output


def test_print_netpol_reports_bad_input_with_its_location(tmp_path: Path) -> None:
    broken = tmp_path / "job.yaml"
    broken.write_text("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n\tname: x\n")
    not_a_job = tmp_path / "cm.yaml"
    not_a_job.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    odd_meta = tmp_path / "meta.yaml"
    odd_meta.write_text("kind: TrainJob\nmetadata: just-a-string\n")
    for path, code, text in (
        (broken, 2, f"{broken}:4:1:"),
        (not_a_job, 2, "holds no TrainJob"),
        (odd_meta, 2, "holds no TrainJob"),
    ):
        result = CliRunner().invoke(controller_command, ["--config", str(REPO), "--print-netpol", str(path)])
        assert result.exit_code == code, result.output
        assert text in result.output
        assert "Traceback" not in result.output


class _Discovery:
    """A ControllerApi whose GET answers discovery with ``answer`` (an exception is raised)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.paths: list[str] = []

    async def get(self, path: str) -> Any:
        self.paths.append(path)
        if isinstance(answer := self.answer, Exception):
            raise answer
        return answer


async def test_mpijobs_are_looked_after_where_the_api_serves_them() -> None:
    served = {"kind": "APIResourceList", "resources": [{"name": "mpijobs"}, {"name": "mpijobs/status"}]}
    for answer, kinds in (
        (served, (TRAINJOB, MPIJOB)),
        (None, (TRAINJOB,)),  # 404: no MPI Operator
        ({"resources": [{"name": "mpijobs/status"}]}, (TRAINJOB,)),
        ({"resources": "odd"}, (TRAINJOB,)),
    ):
        api = _Discovery(answer)
        assert await served_kinds(api) == kinds  # type: ignore[arg-type]
        assert api.paths == ["/apis/kubeflow.org/v2beta1"]
    # any other failure stops the start: never blind to a kind that may be there
    with pytest.raises(KubeError):
        await served_kinds(_Discovery(KubeError("GET: HTTP 503", status=503)))  # type: ignore[arg-type]
    # the pod watch: one kind's pods by their labels; with both, every pod (filtered by the handler)
    assert handlers.pod_selector((TRAINJOB,)) == "jobset.sigs.k8s.io/jobset-name"
    assert handlers.pod_selector((MPIJOB,)) == (
        "training.kubeflow.org/job-name,training.kubeflow.org/operator-name=mpi-operator"
    )
    assert handlers.pod_selector((TRAINJOB, MPIJOB)) is None
