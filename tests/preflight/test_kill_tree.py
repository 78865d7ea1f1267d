"""``_kill_tree`` (a preflight run past its timeout) kills every descendant of mpirun, also those
that would outlive it.

The hung-job test in test_mpi_ports.py cannot tell: Open MPI 4's ranks end by themselves once
mpirun is gone. Here the descendants are in sessions of their own, ignore SIGHUP and SIGTERM and
keep running when their parent dies (the control case checks that), as ranks of a launcher that
leaves them behind would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from mpigate.preflight.launch import _kill_tree

from .processes import running, still_running

DEADLINE = 30.0

# A parent whose two children (each in a session of its own) start a grandchild each; every
# descendant ignores SIGHUP and SIGTERM and sleeps. The parent prints the descendants' pids.
_TREE = r"""
import os, signal, subprocess, sys, time
STUBBORN = "import signal, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); " \
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
CHILD = "import subprocess, sys, signal, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); " \
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
    "g = subprocess.Popen([sys.executable, '-c', %r], stdout=subprocess.PIPE, start_new_session=True); " \
    "g.stdout.readline(); print(g.pid, flush=True); time.sleep(600)" % STUBBORN
pids = []
for _ in range(2):
    c = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, start_new_session=True, text=True
    )
    pids += [c.pid, int(c.stdout.readline())]
print(*pids, flush=True)
time.sleep(600)
"""


def _tree() -> tuple[subprocess.Popen[str], list[int]]:
    root = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    assert root.stdout is not None
    descendants = [int(pid) for pid in root.stdout.readline().split()]
    assert len(descendants) == 4 and all(running(pid) for pid in descendants)
    return root, descendants


def _cleanup(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_every_descendant_goes_even_those_that_outlive_their_parent() -> None:
    root, descendants = _tree()
    try:
        _kill_tree(root.pid)
        root.wait(DEADLINE)
        assert root.returncode == -signal.SIGKILL
        assert still_running(descendants, DEADLINE) == []
    finally:
        _cleanup(descendants)


def test_control_the_descendants_survive_their_parent_alone() -> None:
    # What makes the test above able to fail: killing only the root leaves them all running.
    root, descendants = _tree()
    try:
        root.kill()
        root.wait(DEADLINE)
        time.sleep(0.5)
        assert all(running(pid) for pid in descendants)
    finally:
        _cleanup(descendants)
