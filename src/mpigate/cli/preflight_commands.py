"""``mpigate preflight``: the MPI network preflight, its local launcher and its smoke TrainJob."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import click

from mpigate.config import Config, ConfigError
from mpigate.config.model import NetworkProfile
from mpigate.config.mpienv import DEFAULT_IMPLEMENTATION, IMPLEMENTATIONS, PINNED_ENV_NAMES, Implementation
from mpigate.preflight import (
    DEFAULT_SIZES,
    RANGE_NAMES,
    LocalRun,
    PreflightSettings,
    SmokeJobError,
    build_smoke_trainjob,
    mpi_unavailable,
    render_text,
    run_local,
    virtual_pods_unavailable,
)
from mpigate.preflight.launch import DEFAULT_LAUNCHERS
from mpigate.preflight.ports import (
    PortWindowError,
    busy_ports,
    describe_busy,
    free_window,
    launch_ranges,
    move_ranges,
)

from ._output import OUTPUT_OPTION, dump, echo_config_failure

__all__ = ["preflight_command"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _sizes(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter("comma-separated byte counts, e.g. 8,1024,1048576") from None
    if not sizes or any(s < 1 for s in sizes):
        raise click.BadParameter("at least one size, each >= 1 byte")
    return sizes


def _port_base(value: str | None) -> int | Literal["auto"] | None:
    if value is None:
        return None
    if value == "auto":
        return "auto"
    try:
        port = int(value)
    except ValueError:
        raise click.BadParameter("a port number or 'auto'", param_hint="--port-base") from None
    if not 1024 <= port <= 65535:
        raise click.BadParameter("a port between 1024 and 65535, or 'auto'", param_hint="--port-base")
    return port


def _load(path: Path) -> Config:
    # Imported here: every MPI rank runs this module (python -m mpigate.preflight) and none loads a
    # tree; the loader, its schemas and the CEL environment cost each rank 0.2 s of CPU.
    from mpigate.config import load

    try:
        return load(path)
    except ConfigError as exc:
        echo_config_failure(path, exc.problems, point_at="pass one with --config PATH")
        sys.exit(EXIT_USAGE)


@click.command("preflight")
@click.option(
    "--local",
    is_flag=True,
    help="Launch mpirun here with a network profile's environment and watch its ports.",
)
@click.option(
    "--trainjob",
    is_flag=True,
    help="Print the per-team smoke TrainJob that runs the preflight on the cluster.",
)
@click.option(
    "-np", "--np", "np", type=click.IntRange(1, 256), default=4, show_default=True, help="Ranks (--local)."
)
@click.option(
    "--profile",
    default="pinned-ports",
    show_default=True,
    help="Network profile whose env is used (--local).",
)
@click.option(
    "--unpinned", is_flag=True, help="--local: run WITHOUT the profile's env, but judge ports against it."
)
@click.option(
    "--transport",
    type=click.Choice(["tcp", "auto"]),
    default="tcp",
    show_default=True,
    help="--local: tcp = BTLs self,tcp only (ranks on one machine really use TCP); auto = OpenMPI's choice.",
)
@click.option(
    "--pods",
    type=click.IntRange(0, 64),
    default=0,
    help="--local: spread ranks over N virtual pods (network namespaces; root).",
)
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="--local: kill mpirun after this many seconds.",
)
@click.option(
    "--port-base",
    callback=lambda _c, _p, v: _port_base(v),
    help="--local: move the profile's BTL and OOB ranges to start at PORT (sizes kept), or to a "
    "window that nothing here holds with 'auto' (the ranges in the cluster are unchanged).",
)
@click.option(
    "--mpi",
    "implementation",
    type=click.Choice(IMPLEMENTATIONS, case_sensitive=False),
    default=DEFAULT_IMPLEMENTATION,
    show_default=True,
    help="--local: the MPI implementation to run with; its pinned-port environment is injected "
    "(Intel: Intel MPI).",
)
@click.option(
    "--mpirun",
    help="--local: its launcher [OpenMPI: mpirun; MPICH, Intel: mpiexec.hydra], e.g. "
    "/usr/bin/mpiexec.hydra (Debian's mpich) or VENV/bin/mpiexec.hydra (the mpich or impi-rt wheel).",
)
@click.option(
    "--python",
    "python",
    help="--local: the ranks' Python, whose mpi4py loads that implementation [this one].",
)
@click.option("--team", help="Team of the smoke TrainJob (--trainjob).")
@click.option(
    "--image", help="--trainjob: image with Python and mpigate[mpi] (default: the runtime's image)."
)
@click.option(
    "--nodes", type=click.IntRange(1), help="--trainjob: numNodes (default: 2, at most the team's limit)."
)
@click.option("--name", default="mpigate-preflight", show_default=True, help="--trainjob: TrainJob name.")
@click.option(
    "--config", "config_path", type=click.Path(path_type=Path), default=Path("."), show_default=True
)
@click.option(
    "--sizes",
    default=",".join(map(str, DEFAULT_SIZES)),
    show_default=True,
    callback=_sizes,
    help="Ping-pong sizes in bytes.",
)
@click.option(
    "--iterations",
    type=click.IntRange(1),
    default=20,
    show_default=True,
    help="Ping-pong round trips per size.",
)
@click.option(
    "--hold",
    type=click.FloatRange(0),
    default=None,
    help="Seconds to stay connected after the checks [0; --local 1; --trainjob 5].",
)
@click.option(
    "--max-latency-us",
    type=click.FloatRange(0),
    help="Fail when the smallest message's latency exceeds this.",
)
@click.option(
    "--min-bandwidth-mbs",
    type=click.FloatRange(0),
    help="Fail when the largest message's bandwidth is below this (MB/s).",
)
@click.option(
    "--expect-pinned", is_flag=True, help="Fail the ports check when no pinned-port environment is present."
)
@OUTPUT_OPTION
def preflight_command(
    local: bool,
    trainjob: bool,
    np: int,
    profile: str,
    unpinned: bool,
    transport: str,
    pods: int,
    timeout: float,
    port_base: int | Literal["auto"] | None,
    implementation: str,
    mpirun: str | None,
    python: str | None,
    team: str | None,
    image: str | None,
    nodes: int | None,
    name: str,
    config_path: Path,
    sizes: tuple[int, ...],
    iterations: int,
    hold: float | None,
    max_latency_us: float | None,
    min_bandwidth_mbs: float | None,
    expect_pinned: bool,
    output: str,
) -> None:
    """Check an MPI job's network: allreduce (exact sum), a point-to-point ring, a ping-pong
    latency/bandwidth probe, and the TCP ports each rank listens on.

    \b
    Three ways to run it:
      mpirun -np 4 python -m mpigate.preflight       # inside a job: one rank per process
      mpigate preflight --local -np 4 --profile pinned-ports --config .
      mpigate preflight --trainjob --team nlp-team --config .   # the smoke TrainJob as YAML

    \b
    MPICH or Intel MPI (Hydra) instead of Open MPI, e.g. the impi-rt wheel's:
      mpigate preflight --local --mpi Intel --mpirun VENV/bin/mpiexec.hydra --python VENV/bin/python

    \b
    Example:
      $ mpigate preflight --local -np 4 --config .
      rank  host  pid   allreduce  ring  pingpong  ports  listening
      0     vm    4242  pass       pass  pass      pass   40000,40001
      ...
      ports: 12 listeners and 14 connections observed; all in BTL 40000-40099, OOB 40200-40210
      verdict: PASS

    --local first checks that the pinned ranges are free on this machine and names the process
    on a busy port (exit 2); --port-base auto moves them to a free window.

    Exit status: 0 every check passed, 1 a check failed (or a port outside the pinned ranges),
    2 usage, config or environment error (a busy pinned port included).
    """
    if local and trainjob:
        raise click.UsageError("--local and --trainjob exclude each other")
    base_hold = hold if hold is not None else (1.0 if local else 5.0 if trainjob else 0.0)
    settings = PreflightSettings(
        sizes=sizes,
        iterations=iterations,
        hold=base_hold,
        max_latency_us=max_latency_us,
        min_bandwidth_mbs=min_bandwidth_mbs,
        expect_pinned=expect_pinned,
    )
    if trainjob:
        _trainjob(config_path, team, image, nodes, name, settings, output)
    elif local:
        launcher = _Launcher(_implementation(implementation), mpirun, python or sys.executable)
        _local(
            config_path,
            profile,
            unpinned,
            np,
            transport,
            pods,
            timeout,
            port_base,
            launcher,
            settings,
            output,
        )
    else:
        _in_job(settings, output)


def _trainjob(
    config_path: Path,
    team: str | None,
    image: str | None,
    nodes: int | None,
    name: str,
    settings: PreflightSettings,
    output: str,
) -> None:
    if not team:
        raise click.UsageError("--trainjob needs --team NAME")
    config = _load(config_path)
    try:
        job = build_smoke_trainjob(config, team, image=image, num_nodes=nodes, name=name, settings=settings)
    except SmokeJobError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(dump(job, "json" if output == "json" else "yaml"), nl=False)


def _in_job(settings: PreflightSettings, output: str) -> None:
    reason = _mpi_unavailable_here()
    if reason:
        click.secho(f"error: {reason}", fg="red", err=True)
        sys.exit(EXIT_USAGE)
    from mpigate.preflight.checks import abort_job, run_preflight

    try:
        report, ok = run_preflight(settings=settings)
    except Exception as exc:
        # One rank dying quietly would leave the others blocked in a collective until the job's
        # deadline: take the whole job down with a clear message instead.
        click.secho(f"error: preflight failed on this rank: {exc!r}", fg="red", err=True)
        abort_job(EXIT_FAILED)
        raise
    if report is not None:  # rank 0 speaks for all
        click.echo(render_text(report) if output == "text" else dump(report.to_dict(), output), nl=False)
    sys.exit(EXIT_OK if ok else EXIT_FAILED)


def _mpi_unavailable_here() -> str | None:
    """Inside a rank: can mpi4py load an MPI library (without starting a second interpreter)?"""
    try:
        import mpi4py.MPI  # noqa: F401
    except ImportError as exc:
        return f"mpi4py is not installed ({exc}); pip install 'mpigate[mpi]'"
    except RuntimeError as exc:
        return f"mpi4py cannot load an MPI library: {exc}"
    return None


@dataclass(frozen=True)
class _Launcher:
    implementation: Implementation
    mpirun: str | None
    python: str


def _implementation(value: str) -> Implementation:
    return next(i for i in IMPLEMENTATIONS if i.lower() == value.lower())


def _local(
    config_path: Path,
    profile_name: str,
    unpinned: bool,
    np: int,
    transport: str,
    pods: int,
    timeout: float,
    port_base: int | Literal["auto"] | None,
    launcher: _Launcher,
    settings: PreflightSettings,
    output: str,
) -> None:
    config = _load(config_path)
    profile = config.network_profiles.get(profile_name)
    if profile is None:
        known = ", ".join(sorted(config.network_profiles))
        raise click.BadParameter(
            f"no network profile {profile_name!r} (profiles: {known})", param_hint="--profile"
        )
    if profile.mode == "pinned-ports":
        profile = _free_ranges(profile, port_base, check=not unpinned)
    elif port_base is not None:
        raise click.BadParameter(f"profile {profile_name!r} pins no ports", param_hint="--port-base")
    impl = launcher.implementation
    mpirun = launcher.mpirun or DEFAULT_LAUNCHERS[impl]
    reason = mpi_unavailable(launcher.python, mpirun=mpirun, implementation=impl) or (
        virtual_pods_unavailable() if pods else None
    )
    if reason:
        click.secho(f"error: {reason}", fg="red", err=True)
        sys.exit(EXIT_USAGE)
    judge = profile if profile.mode == "pinned-ports" else None
    run = run_local(
        np,
        None if unpinned else profile,
        judge=judge,
        settings=settings,
        transport="tcp" if transport == "tcp" else "auto",
        pods=pods,
        timeout=timeout,
        python=launcher.python,
        mpirun=mpirun,
        implementation=impl,
    )
    if output != "text":
        click.echo(dump(run.to_dict(), output), nl=False)
    else:
        click.echo(_render_local(run, profile_name, unpinned), nl=False)
    sys.exit(EXIT_OK if run.ok else EXIT_FAILED)


def _free_ranges(
    profile: NetworkProfile, port_base: int | Literal["auto"] | None, *, check: bool
) -> NetworkProfile:
    """The profile to launch with: its ranges (moved by --port-base), checked to be free here
    when the run binds them (``check``; an --unpinned run only judges against them).

    Refuses (exit 2) with the busy ports and who holds them: OpenMPI would only say "No sockets
    were able to be opened" (the BTL) or fail to start its daemons (the OOB)."""
    try:
        if port_base == "auto":
            return free_window(profile)
        if port_base is not None:
            profile = move_ranges(profile, port_base)
    except (PortWindowError, ValueError) as exc:
        click.secho(f"error: --port-base: {exc}", fg="red", err=True)
        sys.exit(EXIT_USAGE)
    busy = busy_ports(launch_ranges(profile)) if check else []
    if busy:
        ranges = ", ".join(f"{name} {low}-{high}" for name, low, high in launch_ranges(profile))
        click.secho(f"error: the pinned ranges ({ranges}) are not free on this machine:", fg="red", err=True)
        for line in describe_busy(busy):
            click.echo(f"  {line}", err=True)
        click.echo(
            "hint: stop that process, or run on a free window with --port-base auto "
            "(the ranges in the cluster are unchanged)",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    return profile


def _render_local(run: LocalRun, profile_name: str, unpinned: bool) -> str:
    lines = [f"$ {' '.join(run.argv)}"]
    pinned = [f"{k}={v}" for k, v in run.injected if k in PINNED_ENV_NAMES]
    harness = [
        f"{k}={v}" for k, v in run.injected if k not in PINNED_ENV_NAMES and not k.startswith("OMPI_ALLOW")
    ]
    lines.append(
        f"profile {profile_name} environment: " + ("none (--unpinned)" if unpinned else " ".join(pinned))
    )
    if harness:
        lines.append("local run settings: " + " ".join(harness))
    if run.pods:
        lines.append(f"virtual pods: {', '.join(run.pods)}")
    lines.append("")
    lines.append(render_text(run.report).rstrip("\n") if run.report else "(no preflight report)")
    lines.append("")
    confinement = run.confinement
    if confinement is None:
        network = sorted({s.local_port for s in run.sockets if s.listening and not s.loopback_only})
        lines.append(
            f"ports: {len(run.sockets)} sockets observed in {run.samples} samples; not judged "
            f"(profile {profile_name} does not pin ports); network listeners: {network}"
        )
    else:
        listeners = confinement.select("listener", "network")
        connections = confinement.select("connection", "network")
        local = confinement.select(scope="loopback")
        lines.append(
            f"ports observed ({run.samples} samples of {len(set(run.processes.values()))} process kinds: "
            f"{', '.join(sorted(set(run.processes.values())))}):"
        )
        lines.append(f"  pinned ranges: {confinement.ranges.describe()}")
        for key in RANGE_NAMES:
            used = confinement.ports(key)
            if used:
                lines.append(f"  {key.upper()} ports used: {', '.join(map(str, used))}")
        lines.append(
            f"  {len(listeners)} network listener(s), {len(connections)} network connection(s), "
            f"{len(local)} loopback-only socket(s) (PMIx)"
        )
        shown = 12  # the JSON output has them all
        for v in confinement.violations[:shown]:
            lines.append(f"  OUTSIDE: {v.socket.describe()} ({v.reason})")
        if len(confinement.violations) > shown:
            lines.append(
                f"  ... and {len(confinement.violations) - shown} more outside the pinned ranges (-o json)"
            )
        lines.append(
            f"  confinement: {'all inter-process TCP ports pinned' if confinement.ok else 'VIOLATED'}"
        )
    for problem in run.problems:
        lines.append(f"problem: {problem}")
    if run.returncode not in (0, None) and run.stderr.strip():
        lines.append("mpirun stderr (last lines):")
        lines += [f"  {line}" for line in run.stderr.strip().splitlines()[-10:]]
    lines.append(f"local run: {'PASS' if run.ok else 'FAIL'} in {run.seconds:.1f} s")
    return "\n".join(lines) + "\n"
