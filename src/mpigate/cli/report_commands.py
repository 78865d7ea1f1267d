"""``mpigate report``: compliance reports from audit chains and API-server audit logs."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from mpigate.config import ConfigError, load
from mpigate.report import FORMATS, ReportOptions, build_report, config_context, parse_frameworks, render
from mpigate.report.build import has_chains

from ._output import echo_config_failure, file_format
from .audit_commands import _bound, _key_options, _keyring, _open_output

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
    keys: tuple[str, ...],
    public_keys: tuple[str, ...],
) -> None:
    """Write a compliance report from mpigate audit chains (verified while read) and, optionally,
    Kubernetes API-server audit logs.

    The report covers the period's integrity verdict per chain, decisions by team, rule and
    outcome per day, top denial reasons, who created, changed and deleted which jobs, exceptions
    used, residency evidence, privileged attempts, GPU-hours per team and cost center, and a
    control table per framework (SOC 2, HIPAA, GDPR, PCI DSS). It is written either way; the
    command exits 1 when a chain is not intact (the report then opens with a banner naming the
    first problem's file and line), 2 on usage errors.

    \b
    Examples:
      mpigate report --audit /var/lib/mpigate/audit --public-key audit-key.pub \\
          --from 2026-11-01 --to 2026-12-01 -o november.html
      mpigate report --audit audit/ --k8s-audit kube-apiserver-audit.log --framework soc2,pci \\
          --team nlp-team --format md -o ticket.md
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
    options = ReportOptions(
        since=start,
        until=end,
        team=team,
        frameworks=chosen,
        max_events=max_events,
        max_examples=max_examples,
        **context,
    )
    report = build_report(audit_dirs, k8s_files, keys=_keyring(keys, public_keys), options=options, jobs=jobs)
    text = render(report, fmt)
    with _open_output(output, binary=False) as out:
        out.write(text)
    integrity = report["integrity"]
    summary = report["controlSummary"]
    where = "stdout" if output == "-" else output
    click.echo(
        f"wrote {fmt} report to {where}: {integrity['chains']} chain(s) "
        + (integrity["status"]["text"] if integrity["ok"] else f"{integrity['broken']} NOT INTACT")
        + f", {report['totals']['recordsInPeriod']:,} record(s) in the period; "
        f"controls: {summary['met']} met, {summary['attention']} attention, "
        f"{summary['no evidence']} no evidence",
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
