"""``mpigate controller``: the in-cluster controller (kopf), and ``--print-netpol`` offline."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from mpigate.admission.kube import KubeConfigError
from mpigate.audit import AuditError
from mpigate.config import ConfigError, load
from mpigate.controller.background import DEFAULT_STATE_NAME
from mpigate.controller.kinds import TRAINJOB, kind_of
from mpigate.controller.leader import LeaseSettings
from mpigate.controller.ledger import DEFAULT_LEDGER_NAME
from mpigate.controller.netpol import build_network_policy
from mpigate.controller.reliances import DEFAULT_KUEUE_CONFIG
from mpigate.controller.runner import ControllerOptions, default_identity, run_controller

from ._inputs import read_objects
from ._output import dump, echo_config_failure, echo_problems
from .serve_commands import Duration, _configure_logging, _kube_config

__all__ = ["controller_command"]

_PLACEHOLDER_UID = "<uid of the {kind}>"


@click.command("controller")
@click.option(
    "--config", "config_path", required=True, type=click.Path(path_type=Path), help="Config tree or bundle."
)
@click.option("--kubeconfig", type=click.Path(path_type=Path, exists=True), help="Default: in-cluster.")
@click.option("--context", "kube_context", help="kubeconfig context (default: current-context).")
@click.option("--audit-dir", type=click.Path(path_type=Path), help="Write lifecycle/evidence records here.")
@click.option(
    "--audit-key", type=click.Path(path_type=Path, exists=True), help="Checkpoint signing key file."
)
@click.option(
    "--namespace-label",
    default="mpigate.io/team",
    show_default=True,
    help="Manage only TrainJobs and MPIJobs in team namespaces carrying this label (as the webhooks "
    "select them); '' manages every namespace the config assigns to a team.",
)
@click.option("--metrics-port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--leader-elect/--no-leader-elect",
    default=True,
    show_default=True,
    help="Run only while holding the Lease.",
)
@click.option(
    "--lease-namespace",
    envvar="POD_NAMESPACE",
    default="mpigate-system",
    show_default=True,
    help="Namespace of the leader Lease ($POD_NAMESPACE).",
)
@click.option("--lease-name", default="mpigate-controller", show_default=True)
@click.option("--identity", default=None, help="Holder identity in the Lease (default: $POD_NAME-<random>).")
@click.option(
    "--resync", default="5m", show_default=True, type=Duration(), help="Full reconciliation period."
)
@click.option(
    "--kueue-config",
    default=DEFAULT_KUEUE_CONFIG,
    show_default=True,
    metavar="NAMESPACE/NAME",
    help="Kueue's Configuration ConfigMap: checked at start and every resync for what the gate relies on "
    "(manageJobsWithoutQueueName, the TrainJob and MPIJob integrations; metric mpigate_controller_reliance). "
    "'' skips the check.",
)
@click.option(
    "--ledger",
    default=None,
    metavar="NAMESPACE/NAME",
    help=f"ConfigMap of the run segments still open, so that a job deleted while the controller is down "
    f"is still closed (default: <lease namespace>/{DEFAULT_LEDGER_NAME}); '' keeps none.",
)
@click.option(
    "--audit-state",
    default=None,
    metavar="NAMESPACE/NAME",
    help=f"ConfigMap of the background audit's standing violations, so that a restart neither repeats nor "
    f"loses them (default: <lease namespace>/{DEFAULT_STATE_NAME}); '' keeps them in memory only.",
)
@click.option("--log-format", type=click.Choice(["json", "text"]), default="json", show_default=True)
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True
)
@click.option(
    "--print-netpol",
    "print_netpol",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Only print the NetworkPolicy the controller would create for this TrainJob (or MPIJob) file, "
    "and exit.",
)
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
def controller_command(
    config_path: Path,
    kubeconfig: Path | None,
    kube_context: str | None,
    audit_dir: Path | None,
    audit_key: Path | None,
    namespace_label: str,
    metrics_port: int,
    leader_elect: bool,
    lease_namespace: str,
    lease_name: str,
    identity: str | None,
    resync: float,
    kueue_config: str,
    ledger: str | None,
    audit_state: str | None,
    log_format: str,
    log_level: str,
    print_netpol: Path | None,
    output: str,
) -> None:
    """Run the controller: for every TrainJob (and MPIJob, where the MPI Operator serves them) in a
    team namespace, a NetworkPolicy owned by the job (repaired when edited or deleted), lifecycle
    records with GPU-seconds and placement evidence in the audit trail, and Events on the job.
    Metrics on :PORT/metrics.

    Replicas elect a leader through a Lease; only the leader acts. Exit codes: 0 stopped, 1 the
    Lease was lost (restart as a standby), 2 usage or config error.

    \b
    Examples:
      $ mpigate controller --config /etc/mpigate/config --audit-dir /var/lib/mpigate/audit
      $ mpigate controller --config . --print-netpol examples/trainjobs/phi-pinned.yaml
    """
    if print_netpol is not None:
        _print_netpol(config_path, print_netpol, output)
        return
    _configure_logging(log_format, log_level)
    if not config_path.exists():
        raise click.BadParameter(f"{config_path} does not exist", param_hint="--config")
    try:
        kube = _kube_config(kubeconfig, kube_context, True)
    except KubeConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--kubeconfig") from exc
    if kube is None:
        raise click.UsageError("not running in a cluster: pass --kubeconfig (or set KUBECONFIG)")
    namespace, _, name = kueue_config.partition("/")
    if kueue_config and not (namespace and name):
        raise click.BadParameter(f"{kueue_config!r}: expected NAMESPACE/NAME", param_hint="--kueue-config")
    if ledger is None:
        ledger = f"{lease_namespace}/{DEFAULT_LEDGER_NAME}"
    ledger_namespace, _, ledger_name = ledger.partition("/")
    if (ledger and not (ledger_namespace and ledger_name)) or "/" in ledger_name:
        raise click.BadParameter(f"{ledger!r}: expected NAMESPACE/NAME", param_hint="--ledger")
    if audit_state is None:
        audit_state = f"{lease_namespace}/{DEFAULT_STATE_NAME}"
    state_namespace, _, state_name = audit_state.partition("/")
    if (audit_state and not (state_namespace and state_name)) or "/" in state_name:
        raise click.BadParameter(f"{audit_state!r}: expected NAMESPACE/NAME", param_hint="--audit-state")
    options = ControllerOptions(
        config_path=config_path,
        kube=kube,
        audit_dir=audit_dir,
        audit_key=audit_key,
        namespace_label=namespace_label or None,
        metrics_port=metrics_port,
        leader_election=leader_elect,
        lease=LeaseSettings(namespace=lease_namespace, name=lease_name),
        identity=identity or default_identity(),
        resync_seconds=max(resync, 10.0),
        kueue_config=kueue_config or None,
        ledger=ledger or None,
        audit_state=audit_state or None,
    )
    try:
        code = asyncio.run(run_controller(options))
    except (OSError, AuditError) as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)
    sys.exit(code)


def _print_netpol(config_path: Path, trainjob_file: Path, output: str) -> None:
    try:
        config = load(config_path)
    except ConfigError as exc:
        echo_config_failure(config_path, exc.problems, point_at="pass one with --config PATH")
        sys.exit(2)
    documents, problems = read_objects(trainjob_file)
    if problems:
        echo_problems(problems)
        sys.exit(2)
    jobs = [
        (d.data, kind)
        for d in documents
        if isinstance(d.data, dict)
        and (kind := kind_of(d.data)) is not None
        and d.data.get("apiVersion") == kind.api_version  # not an old kubeflow.org/v1 MPIJob
    ]
    trainjob, kind = jobs[0] if jobs else ({}, TRAINJOB)
    meta = trainjob.setdefault("metadata", {})
    if not jobs or not isinstance(meta, dict):
        raise click.BadParameter(
            f"{trainjob_file} holds no TrainJob (or kubeflow.org/v2beta1 MPIJob)", param_hint="--print-netpol"
        )
    meta.setdefault("uid", _PLACEHOLDER_UID.format(kind=kind.kind))  # assigned by the API server
    policy = build_network_policy(config, trainjob, kind=kind)
    if policy is None:
        click.secho(
            f"namespace {meta.get('namespace') or '(none)'} belongs to no team: the controller creates no "
            f"NetworkPolicy for this {kind.kind}",
            fg="yellow",
            err=True,
        )
        sys.exit(1)
    click.echo(dump(policy, output), nl=False)
