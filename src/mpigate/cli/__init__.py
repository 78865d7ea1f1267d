"""The ``mpigate`` command. One module per command family keeps each small and independent:
``check`` (check/init/schema), and the commands later layers add.

A command's module is imported only when that command runs (or its own ``--help`` is asked for):
``serve`` and ``controller`` pull in aiohttp, kopf and the whole engine, which ``mpigate check``
or ``--version`` do not need (``--version`` took 0.73 s with every module imported at start).
``mpigate --help`` lists every command from :data:`COMMANDS` without importing any of them
(tests/test_cli.py keeps each short help equal to the one its command gives)."""

from __future__ import annotations

import importlib
import logging
import sys

import click

from mpigate import __version__
from mpigate._build import compiled

__all__ = ["COMMANDS", "cli", "main"]

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# name → (module in this package, attribute, short help as the command gives it)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "audit": ("audit_commands", "audit_group", "Verify and export the hash-chained audit trail."),
    "certs": (
        "serve_commands",
        "certs_command",
        "Generate a CA and a serving certificate for the webhook (clusters without cert-manager).",
    ),
    "check": ("config_commands", "check_command", "Validate a config tree: schemas, then cross-file rules."),
    "controller": (
        "controller_commands",
        "controller_command",
        "Run the controller: for every TrainJob (and MPIJob, where the MPI Operator serves them) in a "
        "team namespace, a NetworkPolicy owned by the job (repaired when edited or deleted), lifecycle "
        "records with GPU-seconds and placement evidence in the audit trail, and Events on the job.",
    ),
    "diff": (
        "render_commands",
        "diff_command",
        "Show what rendering PATH would change, object by object (for pull-request review).",
    ),
    "explain": (
        "engine_commands",
        "explain_command",
        "Show what the admission webhook would answer for TrainJobs and training runtimes.",
    ),
    "init": ("config_commands", "init_command", "Scaffold a config tree, or add a team to one."),
    "preflight": (
        "preflight_commands",
        "preflight_command",
        "Check an MPI job's network: allreduce (exact sum), a point-to-point ring, a ping-pong "
        "latency/bandwidth probe, and the TCP ports each rank listens on.",
    ),
    "render": (
        "render_commands",
        "render_command",
        "Render the config tree into a kustomize tree for Argo CD / Flux.",
    ),
    "report": (
        "report_commands",
        "report_command",
        "Write a compliance report from mpigate audit chains (verified while read) and, optionally, "
        "Kubernetes API-server audit logs.",
    ),
    "review": (
        "serve_commands",
        "review_command",
        "Send TrainJobs and runtimes through a running webhook as the API server would (/mutate on "
        "CREATE, apply its JSONPatch, then /validate) and show what kubectl would print.",
    ),
    "schema": (
        "config_commands",
        "schema_command",
        "Print the JSON Schema (draft 2020-12) of a config kind, for editors and yaml-language-server.",
    ),
    "serve": (
        "serve_commands",
        "serve_command",
        "Serve the admission webhooks: POST /mutate and /validate (AdmissionReview v1), GET /healthz, "
        "/readyz and /metrics, over TLS 1.2+.",
    ),
    "test": (
        "engine_commands",
        "test_command",
        "Run the PolicyTest suites of a config tree (policies/tests/*.yaml by convention).",
    ),
}


class _LazyGroup(click.Group):
    """A group whose commands are imported from :data:`COMMANDS` when one is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module, attribute, _ = entry
        command = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's Group.format_commands, with the short help from COMMANDS instead of the command
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        # a bare command with the same help shortens it as click would shorten the real one's
        rows = [
            (name, click.Command(name, help=COMMANDS[name][2]).get_short_help_str(limit)) for name in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    # which build runs (docs/building.md), as black and mypy say it
    click.echo(f"mpigate, version {__version__} (compiled: {'yes' if compiled() else 'no'})")
    ctx.exit()


@click.group(cls=_LazyGroup, context_settings=CONTEXT)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """mpigate: GitOps governance and admission control for MPI training jobs on Kubernetes.

    \b
    Typical flow:
      mpigate init my-org           # scaffold a config tree
      mpigate check my-org          # validate it (CI)
      mpigate test my-org           # run its policy test suites (CI)
      mpigate render my-org -o out  # manifests for Argo CD / Flux
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="mpigate")
