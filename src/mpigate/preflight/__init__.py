"""The MPI network preflight: checks that an MPI job's ranks can talk, how fast, and on which ports.

* ``checks.run_preflight`` — the mpi4py program (allreduce, ring, ping-pong, own ports), one call
  per rank; ``python -m mpigate.preflight`` is its entry point.
* ``launch.run_local`` — runs it under a local ``mpirun`` with a network profile's ``OMPI_MCA_*``
  environment while ``portwatch.PortSampler`` records every TCP socket of the process tree, and
  ``confinement.analyse`` judges them against the profile's pinned ranges.
* ``netns.VirtualPods`` — network namespaces that make one machine look like several pods.
* ``trainjob.build_smoke_trainjob`` — the per-team smoke TrainJob that runs the preflight on the
  cluster.

Nothing here imports mpi4py at module level: only a rank needs an MPI library.
"""

from .checks import DEFAULT_SIZES, PreflightSettings, run_preflight
from .confinement import RANGE_NAMES, ConfinementReport, PortRanges, SocketVerdict, analyse, parse_port_list
from .launch import LocalRun, launch_environment, mpi_unavailable, mpirun_command, run_local
from .netns import VirtualPods, VirtualPodsError, virtual_pods_unavailable
from .portwatch import ObservedSocket, PortSampler, parse_tcp_table, process_tree, sample_once
from .report import CheckResult, PingPong, PreflightReport, RankReport, format_bytes, render_text
from .trainjob import SmokeJobError, build_smoke_trainjob

__all__ = [
    "DEFAULT_SIZES",
    "RANGE_NAMES",
    "CheckResult",
    "ConfinementReport",
    "LocalRun",
    "ObservedSocket",
    "PingPong",
    "PortRanges",
    "PortSampler",
    "PreflightReport",
    "PreflightSettings",
    "RankReport",
    "SmokeJobError",
    "SocketVerdict",
    "VirtualPods",
    "VirtualPodsError",
    "analyse",
    "build_smoke_trainjob",
    "format_bytes",
    "launch_environment",
    "mpi_unavailable",
    "mpirun_command",
    "parse_port_list",
    "parse_tcp_table",
    "process_tree",
    "render_text",
    "run_local",
    "run_preflight",
    "sample_once",
    "virtual_pods_unavailable",
]
