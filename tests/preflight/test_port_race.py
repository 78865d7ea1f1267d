"""libfabric's port race (``mpigate.preflight.launch.PORT_RACE``) is told apart from other launch
failures and named in the run's problems, so that the preflight says what happened and the Hydra
tests relaunch only for it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from mpigate.preflight import PreflightSettings, run_local
from mpigate.preflight.launch import PORT_RACE, lost_port_race

# What Intel MPI 2021.18.1 (impi-rt wheel) printed when it lost the race (a landing's log, 2026-11-26).
RACE_OUTPUT = "\n".join(
    [
        "Abort(203572367) on node 0 (rank 0 in comm 0): Fatal error in internal_Init_thread: "
        "Other MPI error, error stack:",
        "internal_Init_thread(43701)..: MPI_Init_thread(argc=(nil), argv=(nil), required=3, "
        "provided=0x7ffcb5bf86d0) failed",
        "MPII_Init_thread(118)........:",
        "MPID_Init(1778)..............:",
        "MPIDI_OFI_mpi_init_hook(1739):",
        "create_vni_context(2379).....: OFI EP enable failed "
        "(ofi_init.c:2379:create_vni_context:Address already in use)",
        "",
    ]
)


# What MPICH 5.0.2 (mpich wheel, ch4:ofi) printed when it lost the race (make test, 2026-11-26).
MPICH_RACE_OUTPUT = "\n".join(
    [
        "Abort(337790351): Fatal error in internal_Init_thread: Other MPI error, error stack:",
        "internal_Init_thread(71)..........: MPI_Init_thread(argc=(nil), argv=(nil), required=3, "
        "provided=0x7ffcd9cf9ca0) failed",
        "MPII_Init_thread(289).............: ",
        "MPID_Init(549)....................: ",
        "MPIDI_OFI_init_local(720).........: ",
        "MPIDI_OFI_create_vci_context(1058): OFI call ep_enable failed "
        "(default nic=eth0: Address already in use)",
        "",
    ]
)


@pytest.mark.parametrize(
    ("output", "lost"),
    [
        (RACE_OUTPUT, True),
        (MPICH_RACE_OUTPUT, True),
        (MPICH_RACE_OUTPUT.replace("Address already in use", "Connection refused"), False),
        (RACE_OUTPUT.replace("Address already in use", "Connection refused"), False),
        ("bind: Address already in use", False),
        ("", False),
    ],
)
def test_the_race_is_told_apart(output: str, lost: bool) -> None:
    assert lost_port_race(output) is lost


def _launcher(tmp_path: Path, output: str, code: int) -> str:
    script = tmp_path / "mpiexec.hydra"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.parametrize(
    ("output", "named", "implementation"),
    [
        (RACE_OUTPUT, True, "Intel"),
        (MPICH_RACE_OUTPUT, True, "MPICH"),
        ("Abort: something else\n", False, "Intel"),
    ],
)
def test_a_run_that_lost_it_says_so(tmp_path: Path, output: str, named: bool, implementation: str) -> None:
    run = run_local(
        2,
        None,
        settings=PreflightSettings(hold=0.1),
        timeout=60,
        mpirun=_launcher(tmp_path, output, 143),
        implementation=implementation,
    )
    assert run.returncode == 143
    assert run.report is None
    assert (PORT_RACE in run.problems) is named
    assert any("no preflight report" in p for p in run.problems)
