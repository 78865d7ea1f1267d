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
from mpigate.audit.signing import ALGORITHMS, KeyRing, generate_key

from ._output import OUTPUT_OPTION, dump, file_format

__all__ = ["audit_group"]

KEY_OPTIONS = [
    click.option(
        "--key",
        "keys",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False),
        help="HMAC secret file to check hmac-sha256 checkpoints (repeat for rotated keys).",
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
    status = (
        click.style("OK", fg="green")
        if report.ok
        else click.style(f"{len(report.errors)} PROBLEM(S)", fg="red")
    )
    click.echo(f"chain {report.chain} ({_relative(report.directory)}): {status}")
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
    click.echo(f"  signatures:      {report.signatures}")
    if report.recoveries or report.torn_fragments:
        fragments = ", ".join(report.torn_fragments) or "-"
        click.echo(f"  recoveries:      {report.recoveries} (fragments moved aside: {fragments})")
    for problem in report.problems:
        color = "red" if problem.severity == "error" else "yellow"
        click.secho(
            f"  {problem.severity} {problem.kind}: {_relative(problem.location)}: {problem.message}", fg=color
        )


@audit_group.command("verify")
@click.argument("directories", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@_key_options
@OUTPUT_OPTION
def verify_command(
    directories: tuple[str, ...], keys: tuple[str, ...], public_keys: tuple[str, ...], output: str
) -> None:
    """Check every chain under DIRECTORIES: hashes, links, sequence, segments, signatures.

    Reports per chain the records, segments, time span and last checkpoint, and the file and line
    of the first occurrence of each problem (edited, deleted or reordered records, truncated or
    deleted segments, forged checkpoints). Exits 1 when any chain has an error; warnings (such as
    records after the last checkpoint) do not fail.

    \b
    Example:
      mpigate audit verify /var/lib/mpigate/audit --key /etc/mpigate/audit-key/key
    """
    reading = read_chains(directories, _keyring(keys, public_keys))
    if not reading.readers:
        raise click.UsageError(
            f"no audit chains (directories with *.jsonl segments) under {', '.join(directories)}"
        )
    for _ in reading:
        pass
    reports = reading.reports
    if output == "text":
        for report in reports:
            _echo_report(report)
        bad = sum(1 for r in reports if not r.ok)
        summary = f"{len(reports)} chain(s), {sum(r.records for r in reports)} records: "
        click.echo(summary + ("all intact" if not bad else f"{bad} with problems"))
    else:
        click.echo(dump({"ok": reading.ok, "chains": [r.to_dict() for r in reports]}, output), nl=False)
    sys.exit(0 if reading.ok else 1)


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
@click.option("--method", type=click.Choice(ALGORITHMS), default="ed25519", show_default=True)
@click.option(
    "--public", "public_file", type=click.Path(dir_okay=False), help="Where to write the Ed25519 public key."
)
def keygen_command(key_file: str, method: str, public_file: str | None) -> None:
    """Create a checkpoint signing key (mode 0600): a 32-byte HMAC secret or an Ed25519 key pair.

    \b
    Example:
      mpigate audit keygen --method ed25519 audit-key.pem --public audit-key.pub
      kubectl -n mpigate-system create secret generic mpigate-audit-key --from-file=key=audit-key.pem
    """
    if Path(key_file).exists():
        raise click.UsageError(f"{key_file} exists; refusing to overwrite a key")
    private, public = generate_key(method)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private)
    click.echo(f"wrote {method} key to {key_file}")
    if public is not None:
        target = public_file or f"{key_file}.pub"
        Path(target).write_bytes(public)
        click.echo(f"wrote public key to {target} (give it to verifiers: --public-key {target})")


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

    At least once: the acknowledged offset of each chain is kept in DIRECTORY/.otlp-state.json,
    so a restarted shipper resumes where the collector last confirmed.

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
