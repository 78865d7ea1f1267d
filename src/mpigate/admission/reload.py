"""Config hot reload: the served config is swapped atomically when the tree changes.

The config arrives as a mounted ConfigMap (the kubelet writes a new timestamped directory and
swaps the ``..data`` symlink) or as a plain directory / file. Polling a cheap fingerprint of the
tree (the ``..data`` target plus inode, mtime and size of every file) works for both, on every
filesystem, without inotify limits. A change is loaded once the tree has been stable for the
debounce interval (a ``git pull`` or ``kubectl cp`` writes files one by one). A valid config
replaces the served one in one assignment; an invalid one is logged with every problem, counted,
and the last good config keeps serving.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mpigate.config import Config, ConfigError, is_config_tree, load
from mpigate.config.bundle import BUNDLE_ARCHIVE
from mpigate.config.discovery import IGNORE_FILE, discover
from mpigate.config.loader import REVISION_FILE

from .logjson import fields

__all__ = ["ConfigStore", "LoadedConfig", "tree_stamp"]

log = logging.getLogger(__name__)

Stamp = tuple[object, ...]
Loader = Callable[[Path], Config]


def tree_stamp(path: Path) -> Stamp:
    """A fingerprint that changes whenever a file of the config tree at ``path`` changes, appears
    or vanishes: the files :func:`mpigate.config.discover` loads (so that edits elsewhere in a
    repository checkout — docs, build output, code — neither trigger a reload nor cost a walk of
    their folders), the ``.mpigateignore`` that selects them, a bundle's ``.mpigate-revision`` and
    compressed archive (:mod:`mpigate.config.bundle`) and a ConfigMap's ``..data`` link."""
    entries: list[object] = []
    data_link = path / "..data"
    if data_link.is_symlink():
        entries.append(("..data", os.readlink(data_link)))
    if path.is_file() or not path.is_dir():
        entries.append(_file_entry(path, path.name))
        return tuple(entries)
    for name in (IGNORE_FILE, REVISION_FILE, BUNDLE_ARCHIVE):
        entries.append(_file_entry(path / name, name))
    # Plain strings for the entries, not Path objects: this runs every poll interval.
    prefix = len(str(path)) + 1
    for file in discover(path):
        full = str(file)
        entries.append(_file_entry(full, full[prefix:]))
    return tuple(entries)


def _file_entry(full: Path | str, rel: str) -> tuple[object, ...]:
    try:
        st = os.stat(full)
    except OSError:
        return (rel, None)
    return (rel, st.st_ino, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A config being served, with when it was loaded (Unix time)."""

    config: Config
    loaded_at: float

    @property
    def revision(self) -> str:
        return self.config.revision


class ConfigStore:
    """Holds the served config and reloads it when the tree changes (call :meth:`poll`)."""

    def __init__(self, path: Path, *, debounce: float = 0.5, loader: Loader = load) -> None:
        self.path = path
        self.debounce = debounce
        self._loader = loader
        self._current: LoadedConfig | None = None
        self._applied: Stamp | None = None
        self._pending: Stamp | None = None
        self._pending_since = 0.0
        self.last_error: str | None = None

    @property
    def current(self) -> LoadedConfig | None:
        return self._current

    async def load_now(self) -> LoadedConfig | None:
        """Load the tree now (startup). Returns the served config, ``None`` if still none."""
        stamp = await asyncio.to_thread(tree_stamp, self.path)
        await self._load(stamp)
        return self._current

    async def poll(self) -> bool | None:
        """One poll: True when a new config was swapped in, False when a change was rejected,
        None when nothing (yet) happened."""
        stamp = await asyncio.to_thread(tree_stamp, self.path)
        if stamp == self._applied:
            self._pending = None
            return None
        now = time.monotonic()
        if stamp != self._pending:
            self._pending = stamp
            self._pending_since = now
            if self.debounce > 0:
                return None
        if now - self._pending_since < self.debounce:
            return None
        self._pending = None
        return await self._load(stamp)

    async def _load(self, stamp: Stamp) -> bool:
        self._applied = stamp  # an invalid tree is not retried until it changes again
        try:
            config = await asyncio.to_thread(self._loader, self.path)
        except ConfigError as exc:
            self.last_error = str(exc)
            problems = [str(p) for p in exc.errors]
            if not is_config_tree(exc.problems):
                # the whole tree is missing: a ConfigMap not (yet) mounted, or the wrong --config
                problems = [
                    f"{self.path} is not an mpigate config tree (no OrgPolicy document): check --config "
                    "and that the config bundle ConfigMap is mounted there",
                    *problems,
                ]
            more = len(problems) - 1
            log.error(
                "config at %s rejected: %s%s; still serving %s (`mpigate check` lists every problem)",
                self.path,
                problems[0] if problems else "no usable config",
                f" (and {more} more error{'s' if more > 1 else ''})" if more > 0 else "",
                self._current.revision if self._current else "nothing",
                extra=fields(event="config_rejected", errors=problems[:50], path=str(self.path)),
            )
            return False
        except Exception as exc:  # unreadable tree, permission errors: same treatment
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.error(
                "config at %s cannot be loaded: %s",
                self.path,
                self.last_error,
                extra=fields(event="config_rejected", errors=[self.last_error], path=str(self.path)),
            )
            return False
        previous = self._current.revision if self._current else None
        self._current = LoadedConfig(config, time.time())
        self.last_error = None
        _freeze_heap()
        log.info(
            "serving config revision %s",
            config.revision,
            extra=fields(
                event="config_loaded", revision=config.revision, previous=previous, path=str(self.path)
            ),
        )
        return True


def _freeze_heap() -> None:
    """Take what lives on after a config swap — the config, the imported code — out of the cyclic
    garbage collector's full collections (``gc.freeze``). The server allocates fast (every review,
    every page of a job cache's relist), and each full collection walked the whole heap on the loop
    that answers admissions: 160 ms pauses, 18 of them while 20,000 TrainJobs were listed
    (``benchmarks/live_cache.py``; 6 ms at most once frozen). What the previous config left is
    collected first, once per swap (frozen objects in a reference cycle would never be freed)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
