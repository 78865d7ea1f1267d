"""``python -m mpigate.preflight``: the rank entry point (same options as ``mpigate preflight``)."""

from mpigate.cli.preflight_commands import preflight_command

preflight_command(prog_name="python -m mpigate.preflight")
