"""``mpigate audit``: verify, export and key generation for the tamper-evident audit trail."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click

from mpigate.audit._canonical import format_time, parse_time
from mpigate.audit.errors import AuditKeyError
from mpigate.audit.export import export_csv, export_jsonl, export_openreports, filter_team
from mpigate.audit.reader import ChainReport, read_chains
from mpigate.audit.signing import ALGORITHMS, ED25519, KeyRing, generate_key
from mpigate.audit.status import trail_status
from mpigate.audit.witness import Witness, apply_witness
from mpigate.config import ConfigError, load
from mpigate.report.k8saudit import K8sAuditReader

from ._output import OUTPUT_OPTION, dump, echo_config_failure, file_format

__all__ = ["audit_group"]

KEY_OPTIONS = [
    click.option(
        "--key",
        "keys",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False),
        help="The signing key file (HMAC secret, or Ed25519 private key) to check checkpoints with "
        "(repeat for rotated keys).",
    ),
    click.option(
        "--public-key",
        "public_keys",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False),
        help="Ed25519 public key PEM to check ed25519 checkpoints (repeat for rotated keys).",
    ),
]


def _key_options(func: Any) -> Any:
    for option in reversed(KEY_OPTIONS):
        func = option(func)
    return func


def _keyring(keys: tuple[str, ...], public_keys: tuple[str, ...]) -> KeyRing:
    try:
        return KeyRing.load(keys, public_keys)
    except AuditKeyError as exc:
        raise click.UsageError(str(exc)) from exc


@click.group("audit")
def audit_group() -> None:
    """Verify and export the hash-chained audit trail.

    \b
    Examples:
      mpigate audit verify /var/lib/mpigate/audit --public-key audit-key.pub
      mpigate audit export /var/lib/mpigate/audit --format csv --from 2026-11-01 -o nov.csv
      mpigate audit keygen --method ed25519 audit-key.pem --public audit-key.pub
    """


def _relative(path: str) -> str:
    with contextlib.suppress(ValueError):
        return os.path.relpath(path)
    return path


def _echo_report(report: ChainReport) -> None:
    status = report.status()
    label = {
        "verified": click.style("VERIFIED", fg="green"),
        "pending": click.style("VERIFIED (writer running)", fg="green"),
        "unverifiable": click.style("UNVERIFIABLE", fg="yellow"),
        "broken": click.style(f"{len(report.errors)} PROBLEM(S)", fg="red"),
    }[status.state]
    click.echo(f"chain {report.chain} ({_relative(report.directory)}): {label}")
    span = f"seq {report.first_seq}..{report.last_seq}" if report.records else "no records"
    click.echo(
        f"  records:         {report.records} ({span}) in {report.segments} segment(s), {report.bytes} bytes"
    )
    click.echo(f"  time span:       {report.first_time or '-'} .. {report.last_time or '-'}")
    cp = report.last_checkpoint
    if cp is not None:
        state = {True: "signature verified", False: "SIGNATURE INVALID", None: "signature not checked"}[
            cp.verified
        ]
        where = f"{Path(cp.file).name}:{cp.line}"
        click.echo(f"  last checkpoint: seq {cp.seq} at {cp.time} ({where}, {cp.reason}, {state})")
    else:
        click.echo("  last checkpoint: none")
    verified = f" ({report.verified_checkpoints} checkpoint(s) verified)" if report.keys_given else ""
    click.echo(f"  signatures:      {report.signatures}{verified}")
    if report.witness_given:
        seen = (
            f"up to seq {report.witnessed_seq} ({report.witnessed_time})"
            if report.witnessed_seq is not None
            else "no decision of this chain"
        )
        click.echo(f"  witness:         {seen}; the API server's log runs to {report.witness_end or '-'}")
    if report.recoveries or report.torn_fragments:
        fragments = ", ".join(report.torn_fragments) or "-"
        click.echo(f"  recoveries:      {report.recoveries} (fragments moved aside: {fragments})")
    for rule, digests in sorted(report.rule_digests.items()):
        seen = ", ".join(f"{digest} ({count})" for digest, count in sorted(digests.items()))
        click.echo(f"  rule {rule}: expressions {seen}")
    if status.state != "broken":
        color = "yellow" if status.state == "unverifiable" else None
        click.secho(f"  status:          {status.text()}", fg=color)
    for problem in report.problems:
        color = "red" if problem.severity == "error" else "yellow"
        click.secho(
            f"  {problem.severity} {problem.kind}: {_relative(problem.location)}: {problem.message}", fg=color
        )


@audit_group.command("verify")
@click.argument("directories", nargs=-1, type=click.Path(exists=True, file_okay=False))
@_key_options
@click.option(
    "--k8s-audit",
    "k8s_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The API server's audit log as witness (audit.k8s.io Event JSON lines, may be gzipped; "
    "repeatable): every decision's chain position is in it, so removed newest records and deleted "
    "chains are found.",
)
@click.option(
    "--report-manifest",
    "manifests",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="A report's signed manifest (<report>.manifest.json, written by `mpigate report --sign-key`): "
    "check the report file's SHA-256, the signature, and the digests of the inputs still present.",
)
@OUTPUT_OPTION
def verify_command(
    directories: tuple[str, ...],
    keys: tuple[str, ...],
    public_keys: tuple[str, ...],
    k8s_files: tuple[str, ...],
    manifests: tuple[str, ...],
    output: str,
) -> None:
    """Check every chain under DIRECTORIES: hashes, links, sequence, segments, signatures.

    Reports per chain the records, segments, time span and last checkpoint, the file and line of
    the first occurrence of each problem (edited, deleted or reordered records, truncated or
    deleted segments, forged or missing checkpoints), and a status: verified (every record
    authenticated by a signed checkpoint, the chain closed by its shutdown checkpoint), pending
    (a running writer holds the chain; its newest records are signed at its next checkpoint),
    unverifiable since a time (no key, or the newest records are covered by no signature), or
    broken. With --k8s-audit the API server's audit log witnesses the chains: a chain position it
    saw beyond a chain's end, a record that differs from the one it saw, or a chain it names without
    a directory is an error, and the records it saw count as verified. Exits 0 when every chain is
    verified or pending, else 1 (2 when a --k8s-audit file cannot be read). With
    --report-manifest, also checks that a compliance report is the file mpigate wrote and signed
    (its SHA-256, the signature, the digests of its inputs still present; DIRECTORIES may then be
    left out).

    \b
    Examples:
      mpigate audit verify /var/lib/mpigate/audit --public-key audit-key.pub
      mpigate audit verify archive/ live/ --public-key audit-key.pub --k8s-audit kube-audit.log.gz
      mpigate audit verify --report-manifest november.html.manifest.json --public-key audit-key.pub
    """
    keyring = _keyring(keys, public_keys)
    if not directories and not manifests:
        raise click.UsageError("name audit DIRECTORIES, or a report with --report-manifest")
    manifests_ok = _verify_manifests(manifests, keyring) if manifests else True
    if not directories:
        sys.exit(0 if manifests_ok else 1)
    witness = _read_witness(k8s_files) if k8s_files else None
    reading = read_chains(directories, keyring)
    if not reading.readers and (witness is None or not witness.newest):
        # (with a witness that names chains, an empty directory means they were all deleted)
        raise click.UsageError(
            f"no audit chains (directories with *.jsonl segments) under {', '.join(directories)}"
        )
    for _ in reading:
        pass
    reports = reading.reports
    if witness is not None:
        reports = apply_witness(reports, witness)
    trail = trail_status(reports)
    if output == "text":
        if witness is not None:
            click.echo(
                f"witness: {witness.positions} chain position(s) of {len(witness.newest)} chain(s) in "
                f"{len(k8s_files)} API-server audit log(s), newest event {witness.end or '-'}"
            )
            if not witness.positions:
                click.secho(
                    "warning: the API server's audit log holds no mpigate record positions (is the "
                    "webhook run with --audit-dir, and does the audit policy log TrainJob writes at "
                    "level Metadata or above?): it witnesses nothing",
                    fg="yellow",
                )
            if witness.malformed:
                click.secho(
                    f"warning: {witness.malformed} record annotation(s) are no chain position, first "
                    f"{witness.first_malformed}",
                    fg="yellow",
                )
        for report in reports:
            _echo_report(report)
        summary = f"{len(reports)} chain(s), {sum(r.records for r in reports)} records: "
        click.echo(summary + trail.text())
        if trail.chain_set_note:
            click.echo(f"note: {trail.chain_set_note}")
    else:
        document = {"ok": trail.ok, "status": trail.to_dict(), "chains": [r.to_dict() for r in reports]}
        click.echo(dump(document, output), nl=False)
    sys.exit(0 if trail.ok and manifests_ok else 1)


def _read_witness(files: tuple[str, ...]) -> Witness:
    """The positions every file witnessed (the report reads these logs with the same reader)."""
    witness = Witness()
    for name in files:
        reader = K8sAuditReader(name)
        for _ in reader:
            pass
        if reader.stats.unreadable:
            raise click.BadParameter(f"{name}: {reader.stats.unreadable}", param_hint="--k8s-audit")
        witness.merge(reader.witness)
    return witness


def _verify_manifests(manifests: tuple[str, ...], keyring: KeyRing) -> bool:
    """Check each report manifest (report digest, signature, inputs); print the verdicts."""
    from mpigate.report.manifest import verify_manifest

    ok = True
    for path in manifests:
        manifest, errors, warnings = verify_manifest(path, keyring, check_inputs=True)
        report = manifest.get("report", {}) if manifest else {}
        label = f"report {report.get('file', '?')} ({manifest.get('reportId', '?') if manifest else '?'})"
        if errors:
            ok = False
            click.secho(f"{label}: {len(errors)} PROBLEM(S)", fg="red", err=True)
        else:
            inputs = len(manifest.get("inputs", []))
            click.echo(
                f"{label}: OK — its SHA-256 and {inputs} input digest(s) match the signed manifest", err=True
            )
        for problem in errors:
            click.secho(f"  error: {problem}", fg="red", err=True)
        for warning in warnings:
            click.secho(f"  warning: {warning}", fg="yellow", err=True)
    return ok


def _bound(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    try:
        return format_time(parse_time(value))
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not an RFC 3339 time or date", param_hint=option) from exc


@contextlib.contextmanager
def _open_output(path: str, binary: bool) -> Iterator[IO[Any]]:
    if path == "-":
        stream = sys.stdout.buffer
        if binary:
            yield stream
            stream.flush()
        else:
            text = io.TextIOWrapper(stream, encoding="utf-8", newline="", write_through=True)
            try:
                yield text
            finally:
                text.flush()
                text.detach()
        return
    try:
        handle: IO[Any] = open(path, "wb") if binary else open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115
    except OSError as exc:
        raise click.BadParameter(f"cannot write {path}: {exc.strerror or exc}", param_hint="-o") from exc
    with handle:
        yield handle


_EXPORT_FORMATS = ("jsonl", "csv", "openreports")
_EXPORT_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".yaml": "openreports",
    ".yml": "openreports",
}


@audit_group.command("export")
@click.argument("directories", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(_EXPORT_FORMATS),
    help="jsonl: records as stored; csv: stable columns; openreports: openreports.io/v1alpha1 Reports "
    "(YAML). Default: from the -o suffix (.jsonl, .csv, .yaml), else jsonl.",
)
@click.option("--from", "since", help="Only records at or after this RFC 3339 time or date (UTC).")
@click.option("--to", "until", help="Only records before this RFC 3339 time or date (UTC).")
@click.option("--team", help="Only records of this team.")
@click.option(
    "-o",
    "--output",
    "output",
    default="-",
    show_default=True,
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    help="Output file ('-' for stdout).",
)
@_key_options
def export_command(
    directories: tuple[str, ...],
    fmt: str | None,
    since: str | None,
    until: str | None,
    team: str | None,
    output: str,
    keys: tuple[str, ...],
    public_keys: tuple[str, ...],
) -> None:
    """Export records of every chain under DIRECTORIES, merged by time, in constant memory.

    Chains are verified while read; the export is written either way, and the command exits 1
    (with the problems on stderr) when a chain is not intact.

    \b
    Examples:
      mpigate audit export /var/lib/mpigate/audit --format csv --team nlp-team -o nlp.csv
      mpigate audit export audit/ --format openreports --from 2026-11-01 | kubectl apply -f -
    """
    fmt = file_format(output, fmt, suffixes=_EXPORT_SUFFIXES, default="jsonl", formats=_EXPORT_FORMATS)
    reading = read_chains(
        directories, _keyring(keys, public_keys), since=_bound(since, "--from"), until=_bound(until, "--to")
    )
    if not reading.readers:
        raise click.UsageError(
            f"no audit chains (directories with *.jsonl segments) under {', '.join(directories)}"
        )
    entries = filter_team(reading, team)
    with _open_output(output, binary=fmt == "jsonl") as out:
        if fmt == "jsonl":
            count = export_jsonl(entries, out)
        elif fmt == "csv":
            count = export_csv(entries, out)
        else:
            count = export_openreports(entries, out)
    noun = "report(s)" if fmt == "openreports" else "record(s)"
    click.echo(f"exported {count} {noun} from {len(reading.readers)} chain(s)", err=True)
    bad = [r for r in reading.reports if not r.ok]
    for report in bad:
        for problem in report.errors:
            click.secho(
                f"integrity {problem.kind}: {_relative(problem.location)}: {problem.message}",
                fg="red",
                err=True,
            )
    sys.exit(1 if bad else 0)


@audit_group.command("keygen")
@click.argument("key_file", type=click.Path(dir_okay=False))
@click.option(
    "--method",
    type=click.Choice(ALGORITHMS),
    help="ed25519 (default: auditors verify with the public key) or hmac-sha256 (a shared secret).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="Take the method from this config tree's OrgPolicy (spec.audit.signing.method).",
)
@click.option(
    "--public", "public_file", type=click.Path(dir_okay=False), help="Where to write the Ed25519 public key."
)
def keygen_command(
    key_file: str, method: str | None, config_path: Path | None, public_file: str | None
) -> None:
    """Create a checkpoint signing key (mode 0600): an Ed25519 key pair or a 32-byte HMAC secret.

    With --config the method is the one the org's OrgPolicy names, so that `mpigate serve` accepts
    the key (it refuses a key that does not suit the configured method).

    \b
    Examples:
      mpigate audit keygen audit-key.pem --public audit-key.pub --config acme-config
      kubectl -n mpigate-system create secret generic mpigate-audit-key --from-file=key=audit-key.pem
    """
    if config_path is not None:
        try:
            configured = load(config_path).org.audit.signing_method
        except ConfigError as exc:
            echo_config_failure(config_path, exc.problems, point_at="pass one with --config PATH")
            sys.exit(2)
        if method is not None and method != configured:
            raise click.UsageError(
                f"--method {method} contradicts the OrgPolicy in {config_path}, which signs with "
                f"{configured} (spec.audit.signing.method); drop --method or change the OrgPolicy"
            )
        method = configured
    method = method or ED25519
    if Path(key_file).exists():
        raise click.UsageError(f"{key_file} exists; refusing to overwrite a key")
    if public_file is not None and method != ED25519:
        raise click.UsageError(f"--public is for ed25519 keys; an {method} key has no public half")
    private, public = generate_key(method)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private)
    click.echo(f"wrote {method} key to {key_file}")
    if public is not None:
        target = public_file or f"{key_file}.pub"
        Path(target).write_bytes(public)
        click.echo(f"wrote public key to {target} (give it to verifiers: --public-key {target})")
    else:
        click.echo(f"verifiers need this secret itself (--key {key_file}): whoever verifies could also sign")


@audit_group.command("ship")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--endpoint", required=True, help="OTLP/HTTP logs endpoint, e.g. https://otel-collector:4318/v1/logs."
)
@click.option(
    "--header", "headers", multiple=True, metavar="KEY=VALUE", help="Extra HTTP header (repeatable)."
)
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA bundle of the collector.")
@click.option("--once", is_flag=True, help="Ship what is there and exit (exit 1 if a request failed).")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds between passes.")
def ship_command(
    directory: str, endpoint: str, headers: tuple[str, ...], ca_file: str | None, once: bool, interval: float
) -> None:
    """Ship the records of every chain under DIRECTORY to an OpenTelemetry Collector (OTLP logs).

    At least once: the acknowledged offset of each chain is kept next to it
    (CHAIN/.otlp-position.json), so a restarted shipper resumes where the collector last
    confirmed. `mpigate serve` and `mpigate controller` do this themselves while running when
    OrgPolicy spec.audit.otlp.endpoint is set; a chain one of them is shipping is skipped.

    \b
    Example (a sidecar next to the webhook):
      mpigate audit ship /var/lib/mpigate/audit --endpoint https://otel-collector:4318/v1/logs
    """
    from mpigate.audit.otlp import OtlpShipper

    parsed: dict[str, str] = {}
    for header in headers:
        key, sep, value = header.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{header!r} is not KEY=VALUE", param_hint="--header")
        parsed[key.strip()] = value.strip()
    shipper = OtlpShipper(directory, endpoint, headers=parsed, certificate_file=ca_file)
    if once:
        result = shipper.ship_once()
        click.echo(f"shipped {result.shipped} record(s); {result.lag} waiting", err=True)
        sys.exit(1 if result.failed else 0)
    try:
        shipper.run(interval=interval)  # until interrupted (SIGINT/SIGTERM ends the process)
    except KeyboardInterrupt:
        pass
    finally:
        shipper.stop()


@audit_group.command("restore")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Empty directory to write."
)
def restore_command(files: tuple[Path, ...], out: Path) -> None:
    """Rebuild chain directories from what an OTLP sink received, to verify the shipped copy.

    FILES are the OpenTelemetry Collector's `file` exporter output (OTLP/JSON, one export request
    per line). Each record is written back byte for byte into its chain's segments; a record
    received twice is kept once, the same seq with two different hashes is reported (exit 1).

    \b
    Example (after a rollout: is every answered decision in the sink?):
      mpigate audit restore /var/log/otel/mpigate-audit.jsonl --out /tmp/shipped
      mpigate audit verify /tmp/shipped --public-key audit.pub
    """
    from mpigate.audit.restore import restore_chains

    try:
        result = restore_chains(files, out)
    except (OSError, ValueError) as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)
    for chain, count in sorted(result.chains.items()):
        click.echo(f"{out / chain}: {count} record(s)")
    if result.duplicates:
        click.echo(f"{result.duplicates} record(s) received more than once (kept once)", err=True)
    for problem in result.problems:
        click.secho(problem, fg="red", err=True)
    sys.exit(1 if result.problems else 0)
