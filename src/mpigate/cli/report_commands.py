"""``mpigate report``: compliance reports from audit chains and API-server audit logs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import yaml

from mpigate.audit import AuditKeyError, load_signer
from mpigate.audit.signing import ALGORITHMS
from mpigate.config import ConfigError, load
from mpigate.report import FORMATS, ReportOptions, build_report, config_context, parse_frameworks, render
from mpigate.report.assess import STATUSES
from mpigate.report.build import ReportInputError, has_chains
from mpigate.report.completeness import expected_chains
from mpigate.report.manifest import build_manifest, manifest_path
from mpigate.report.output import PAPERS

from ._output import echo_config_failure, file_format
from .audit_commands import _bound, _key_options, _keyring, _open_output
from .serve_commands import Duration

__all__ = ["report_command"]

_SUFFIXES = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".json": "json", ".csv": "csv"}


@click.command("report")
@click.option(
    "--audit",
    "audit_dirs",
    multiple=True,
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="Audit directory or chain directory (repeatable); every chain under it is verified and read.",
)
@click.option(
    "--k8s-audit",
    "k8s_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Kubernetes API-server audit log (audit.k8s.io Event JSON lines, may be gzipped; repeatable).",
)
@click.option("--from", "since", help="Start of the period (RFC 3339 time or date, UTC, inclusive).")
@click.option("--to", "until", help="End of the period (RFC 3339 time or date, UTC, exclusive).")
@click.option("--team", help="Only this team's records (and API-server events in its namespaces).")
@click.option(
    "--framework",
    "frameworks",
    multiple=True,
    default=("all",),
    show_default=True,
    help="Control catalogues: soc2, hipaa, gdpr, pci (comma-separated or repeated; 'all').",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="Output format (default: from the -o suffix, else html; a suffix naming another format is refused).",
)
@click.option(
    "-o",
    "--output",
    "output",
    default="-",
    show_default=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Output file ('-' for stdout).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, path_type=Path),
    help="Config tree: each team's namespaces and allowed regions (else learned from the records).",
)
@click.option(
    "--max-events",
    type=click.IntRange(1, 100_000),
    default=200,
    show_default=True,
    help="Most recent requests listed (counts are always exact).",
)
@click.option(
    "--max-examples",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    help="Example messages kept per denial reason.",
)
@click.option(
    "--jobs",
    type=click.IntRange(0, 256),
    default=0,
    show_default=True,
    help="Worker processes reading chains and logs in parallel (0: one per CPU for large inputs).",
)
@click.option(
    "--heartbeat",
    type=Duration(),
    default="24h",
    show_default=True,
    help="The longest time a writer may stay silent: longer stretches without a record are gaps.",
)
@click.option(
    "--expect-chains",
    "expect",
    multiple=True,
    help="Chains that must be among the inputs: chain ids, or SOURCE=N (at least N chains written "
    "by that source, e.g. webhook=3); comma-separated or repeated.",
)
@click.option(
    "--install",
    "install",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The install base (webhooks/ of `mpigate init --install-base`): expect at least as many "
    "webhook chains as its webhook StatefulSet has replicas, and one controller chain.",
)
@click.option(
    "--sample", type=click.IntRange(0, 100_000), default=0, help="Draw a random sample of N requests."
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="The sample's seed (same seed, same sample)."
)
@click.option(
    "--not-applicable",
    "not_applicable",
    multiple=True,
    metavar="CONTROL=WHY",
    help="Declare a control not applicable, with the justification (e.g. 'PCI-DSS-1.3.1=no CDE traffic').",
)
@click.option(
    "--paper", type=click.Choice(PAPERS), default="A4", show_default=True, help="Printed page size (HTML)."
)
@click.option(
    "--sign-key",
    type=click.Path(exists=True, dir_okay=False),
    help="Sign a manifest of the report and its inputs (<output>.manifest.json) with this audit key.",
)
@click.option(
    "--sign-method",
    type=click.Choice(ALGORITHMS),
    default="ed25519",
    show_default=True,
    help="The --sign-key's kind (as for the audit trail's checkpoints).",
)
@_key_options
def report_command(
    audit_dirs: tuple[str, ...],
    k8s_files: tuple[str, ...],
    since: str | None,
    until: str | None,
    team: str | None,
    frameworks: tuple[str, ...],
    fmt: str | None,
    output: str,
    config_path: Path | None,
    max_events: int,
    max_examples: int,
    jobs: int,
    heartbeat: float,
    expect: tuple[str, ...],
    install: Path | None,
    sample: int,
    seed: int,
    not_applicable: tuple[str, ...],
    paper: str,
    sign_key: str | None,
    sign_method: str,
    keys: tuple[str, ...],
    public_keys: tuple[str, ...],
) -> None:
    """Write a compliance report from mpigate audit chains (verified while read) and, optionally,
    Kubernetes API-server audit logs.

    The report covers the integrity and completeness of its inputs (coverage of the period,
    gaps, expected chains, reconciliation with the API server's log), the config revisions in
    force, a control table per framework (SOC 2, HIPAA, GDPR, PCI DSS v4.0.1) with each control's
    population and status (met, attention, not evaluated, no occasion, not applicable), the API
    server's security-relevant events outside mpigate's judgement, decisions, denials, who changed
    which jobs, exceptions, residency, the image inventory, GPU-hours and a reproducible sample.
    It is written either way; the command exits 1 when a chain is not intact (the report then
    opens with a banner naming the first problem's file and line), 2 on usage errors (including
    a chain or log given twice).

    \b
    Examples:
      mpigate report --audit /var/lib/mpigate/audit --public-key audit-key.pub \\
          --k8s-audit /var/log/kubernetes/audit.log --expect-chains webhook=3,controller=1 \\
          --from 2026-11-01 --to 2026-12-01 --sign-key report-key.pem -o november.html
      mpigate report --audit audit/ --k8s-audit kube-apiserver-audit.log --framework soc2,pci \\
          --team nlp-team --sample 25 --seed 2026 --format md -o ticket.md
    """
    try:
        chosen = parse_frameworks(frameworks)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--framework") from exc
    if not chosen:
        raise click.BadParameter("name at least one framework", param_hint="--framework")
    fmt = file_format(output, fmt, suffixes=_SUFFIXES, default="html", formats=FORMATS)
    start, end = _bound(since, "--from"), _bound(until, "--to")
    if start is not None and end is not None and start >= end:
        raise click.BadParameter(f"--from {since} is not before --to {until}", param_hint="--from")
    if not has_chains(audit_dirs):
        raise click.UsageError(
            f"no audit chains (directories with *.jsonl segments) under {', '.join(audit_dirs)}"
        )
    context = {}
    if config_path is not None:
        try:
            context = config_context(load(config_path))
        except ConfigError as exc:
            echo_config_failure(config_path, exc.problems, point_at="pass one with --config PATH")
            sys.exit(2)
    expectations = list(expect)
    if install is not None:
        expectations.extend(_install_expectations(install))
    try:
        expected_chains(expectations)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--expect-chains") from exc
    declared = _not_applicable(not_applicable, chosen)
    signer = None
    if sign_key is not None:
        if output == "-":
            raise click.BadParameter(
                "a signed manifest needs an output file (-o FILE)", param_hint="--sign-key"
            )
        try:
            signer = load_signer(sign_method, sign_key)
        except AuditKeyError as exc:
            raise click.BadParameter(str(exc), param_hint="--sign-key") from exc
    options = ReportOptions(
        since=start,
        until=end,
        team=team,
        frameworks=chosen,
        max_events=max_events,
        max_examples=max_examples,
        heartbeat=heartbeat,
        expect_chains=tuple(expectations),
        sample=sample,
        seed=seed,
        not_applicable=declared,
        **context,
    )
    try:
        report = build_report(
            audit_dirs, k8s_files, keys=_keyring(keys, public_keys), options=options, jobs=jobs
        )
    except ReportInputError as exc:
        raise click.UsageError(str(exc)) from exc
    text = render(report, fmt, paper=paper)
    with _open_output(output, binary=False) as out:
        out.write(text)
    integrity = report["integrity"]
    summary = report["controlSummary"]
    where = "stdout" if output == "-" else output
    click.echo(
        f"wrote {fmt} report {report['reportId']} to {where}: {integrity['chains']} chain(s) "
        + (integrity["status"]["text"] if integrity["ok"] else f"{integrity['broken']} NOT INTACT")
        + f", {report['totals']['recordsInPeriod']:,} record(s) in the period, "
        f"{(report['completeness']['coverage'] or 0.0) * 100:.1f} % of it covered; controls: "
        + ", ".join(f"{summary[s]} {s}" for s in STATUSES),
        err=True,
    )
    if signer is not None:
        manifest = build_manifest(report, Path(output), fmt, signer)
        target = manifest_path(output)
        target.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        click.echo(
            f"signed manifest {target} ({signer.alg}, key {signer.key_id}): "
            f"`mpigate audit verify --report-manifest {target}` checks it",
            err=True,
        )
    if team is not None and team not in report["totals"]["teams"]:
        click.secho(
            f"warning: no decision of team {team!r} in the period; check the name "
            "(without --team, the report lists every team it saw)",
            fg="yellow",
            err=True,
        )
    for file in report["inputs"]["k8sAudit"]:
        if file["malformed"]:
            first = file["firstMalformed"]
            click.secho(
                f"{file['file']}: {file['malformed']} malformed line(s), "
                f"first at line {first['line']}: {first['reason']}",
                fg="yellow",
                err=True,
            )
        if file["unreadable"]:
            click.secho(f"{file['file']}: {file['unreadable']}", fg="red", err=True)
    if not integrity["ok"]:
        problem = integrity["firstProblem"]
        where = problem["file"] + (f":{problem['line']}" if problem["line"] is not None else "")
        click.secho(
            f"integrity {problem['kind']}: {where}: {problem['message']}",
            fg="red",
            err=True,
        )
    sys.exit(0 if integrity["ok"] else 1)


def _not_applicable(values: tuple[str, ...], frameworks: tuple[str, ...]) -> dict[str, str]:
    """``CONTROL=WHY`` declarations, checked against the catalogues."""
    from mpigate.report import all_frameworks

    known = {c.full_id for name in frameworks for c in all_frameworks()[name].controls}
    out: dict[str, str] = {}
    for value in values:
        control, eq, why = value.partition("=")
        control, why = control.strip(), why.strip()
        if not eq or not why:
            raise click.BadParameter(
                f"{value!r}: write CONTROL=WHY (a justification is required)", param_hint="--not-applicable"
            )
        if control not in known:
            raise click.BadParameter(
                f"{control!r} is not a control of the chosen frameworks (e.g. SOC2-CC6.6, PCI-DSS-1.3.1)",
                param_hint="--not-applicable",
            )
        out[control] = why
    return out


def _install_expectations(install: Path) -> list[str]:
    """SOURCE=N expectations from the install base's workloads: one chain per webhook replica
    (each writes its own), and at least one controller chain (only the leader writes). The webhook
    is a StatefulSet since issue 23; an overlay that still runs the Deployment counts the same."""
    replicas = None
    for path in sorted([*install.glob("*.yaml"), *install.glob("*/*.yaml")]):
        try:
            documents = list(yaml.safe_load_all(path.read_text("utf-8")))
        except (OSError, yaml.YAMLError) as exc:
            raise click.BadParameter(f"{path}: {exc}", param_hint="--install") from exc
        for doc in documents:
            if (
                isinstance(doc, dict)
                and doc.get("kind") in ("StatefulSet", "Deployment")
                and (doc.get("metadata") or {}).get("name") == "mpigate-webhook"
            ):
                value = (doc.get("spec") or {}).get("replicas", 1)
                replicas = value if isinstance(value, int) and value > 0 else 1
    if replicas is None:
        raise click.BadParameter(
            f"no StatefulSet mpigate-webhook under {install} (give the install base, e.g. webhooks/base)",
            param_hint="--install",
        )
    return [f"webhook={replicas}", "controller=1"]
