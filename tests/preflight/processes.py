"""Whether processes still run, for the tests that kill process trees."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path


def running(pid: int) -> bool:
    """Alive and not a zombie (orphans wait for PID 1 to reap them)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def still_running(pids: Iterable[int], within: float = 30.0) -> list[int]:
    """The ``pids`` still running once all are gone or ``within`` seconds have passed (SIGKILL
    takes effect at once; a loaded machine takes a moment to reap)."""
    wanted = list(pids)
    deadline = time.monotonic() + within
    while (alive := [pid for pid in wanted if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive
