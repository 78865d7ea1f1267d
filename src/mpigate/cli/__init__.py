"""The ``mpigate`` command. One module per command family keeps each small and independent:
``check`` (check/init/schema), and the commands later layers add."""

from __future__ import annotations

import logging
import sys

import click

from mpigate import __version__
from mpigate._build import compiled

from .audit_commands import audit_group
from .config_commands import check_command, init_command, schema_command
from .controller_commands import controller_command
from .engine_commands import explain_command, test_command
from .preflight_commands import preflight_command
from .render_commands import diff_command, render_command
from .report_commands import report_command
from .serve_commands import certs_command, review_command, serve_command

__all__ = ["cli", "main"]

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.version_option(
    __version__,
    "--version",
    prog_name="mpigate",
    # which build runs (docs/building.md), as black and mypy say it
    message=f"%(prog)s, version %(version)s (compiled: {'yes' if compiled() else 'no'})",
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


cli.add_command(check_command)
cli.add_command(init_command)
cli.add_command(schema_command)
cli.add_command(render_command)
cli.add_command(diff_command)
cli.add_command(preflight_command)
cli.add_command(explain_command)
cli.add_command(test_command)
cli.add_command(audit_group)
cli.add_command(serve_command)
cli.add_command(certs_command)
cli.add_command(review_command)
cli.add_command(report_command)
cli.add_command(controller_command)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="mpigate")
