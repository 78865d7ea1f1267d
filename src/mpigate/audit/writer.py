"""The append-only, hash-chained, group-committed audit log writer.

Usage (sync — CLI, controller)::

    with AuditLog.open("/var/lib/mpigate/audit", signer=load_signer("ed25519", key_file)) as log:
        written = log.append(record_from_decision(decision, request, "validate", "webhook"))
        written.seq, written.hash           # durable (fsync'ed) when append returns

Usage (asyncio — the aiohttp webhook; :class:`AsyncAuditLog` is in ``async_log``)::

    log = await AsyncAuditLog.open(directory, signer=signer, metrics=AuditMetrics(registry))
    try:
        written = await log.append(entry)   # raises AuditWriteError when the disk fails
    except AuditWriteError:
        ...                                 # answer with an error: the API server's failurePolicy applies
    await log.aclose()                      # writes the shutdown checkpoint

One writer thread owns the file. Appends queue an entry and wait on a future; the thread takes
whatever is queued (group commit), assigns ``seq``/``time``/``prev``/``hash``, writes the lines
with one ``write`` and one ``fdatasync`` and only then completes the futures. A failed commit is
rolled back (the file is truncated to where it was), every caller of that batch gets an
:class:`AuditWriteError`, and the next batch tries again — from a fresh look at the disk when the
rollback itself failed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import errno
import fcntl
import hashlib
import logging
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from mpigate import __version__

from ._canonical import GENESIS_PREV, RECORD_VERSION, canonical_bytes, format_time, parse_time, record_hash
from ._claim import claim_chain
from ._tail import Tail, move_aside, scan_tail
from ._template import Sentinels, encode_entry
from .errors import AuditClosedError, AuditWriteError
from .layout import fsync_dir, list_segments, segment_name
from .metrics import AuditMetrics
from .options import WriterOptions, WrittenRecord
from .signing import Signer, signed_bytes

__all__ = ["AuditLog"]

logger = logging.getLogger(__name__)

# How often an unhealthy, idle writer tries the disk again (seconds).
_HEAL_INTERVAL = 1.0


@dataclass(slots=True)
class _Pending:
    entry: Mapping[str, Any]
    template: str
    future: concurrent.futures.Future[WrittenRecord]
    submitted: float


@dataclass(slots=True)
class _State:
    """The writer thread's view of the chain head and the open segment."""

    seq: int = 0
    head: str = GENESIS_PREV
    since_checkpoint: int = 0
    last_ms: int = 0
    segment: Path | None = None
    offset: int = 0
    lines: int = 0
    segment_started: float | None = None  # epoch seconds of the segment's first record
    unsigned_since: float | None = None  # monotonic time of the first record after the last checkpoint

    def copy(self) -> _State:
        return replace(self)


def _errno_name(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, "EIO") if isinstance(code, int) else type(exc).__name__


def _is_shutdown(record: Mapping[str, Any]) -> bool:
    """Whether a record is a shutdown checkpoint (a cleanly closed chain, docs/audit.md)."""
    checkpoint = record.get("checkpoint")
    return (
        record.get("stage") == "checkpoint"
        and isinstance(checkpoint, Mapping)
        and checkpoint.get("reason") == "shutdown"
    )


class AuditLog:
    """A hash-chained JSONL audit log with one writer thread. Create with :meth:`open`.

    Thread-safe: any thread may call :meth:`append`/:meth:`submit`. One :class:`AuditLog` per
    chain; a second writer on the same chain gets :class:`AuditLockedError`.
    """

    def __init__(
        self,
        *,
        chain_dir: Path,
        chain: str,
        source: str,
        signer: Signer | None,
        options: WriterOptions,
        metrics: AuditMetrics | None,
        clock: Callable[[], dt.datetime],
        lock_fd: int,
    ) -> None:
        self._chain_dir = chain_dir
        self._chain = chain
        self._source = source
        self._signer = signer
        self._options = options
        self._metrics = metrics
        self._clock = clock
        self._lock_fd = lock_fd
        self._cond = threading.Condition()
        self._queue: deque[_Pending] = deque()
        self._closing = False
        self._closed = threading.Event()
        self._fd: int | None = None
        self._state = _State()
        self._needs_reload = True
        self._healthy = True
        self._problem: str | None = None
        # the last record is a shutdown checkpoint (this writer's or, reopened, a previous one's):
        # the chain is sealed and closing again adds nothing
        self._sealed = False
        self._sentinels = Sentinels(secrets.token_hex(16))
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        directory: str | Path,
        *,
        chain: str | None = None,
        source: str = "mpigate",
        signer: Signer | None = None,
        options: WriterOptions | None = None,
        metrics: AuditMetrics | None = None,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> AuditLog:
        """Open (or start) a chain under ``directory`` and start the writer thread.

        ``chain`` defaults to ``<hostname>-<random>``: the most recent chain of this host that no
        live writer holds is continued (a restarted StatefulSet pod resumes its chain), otherwise
        a new one is started. Recovery runs before this returns: a torn last line is moved aside
        and a ``recovered`` record appended. Raises :class:`AuditWriteError` when the directory
        cannot be written and :class:`AuditLockedError` when another writer holds ``chain``.
        """
        root = Path(directory)
        if signer is None:
            logger.warning("audit log %s: no signing key; checkpoints are unsigned (development only)", root)
        try:
            root.mkdir(parents=True, exist_ok=True)
            chain_id, lock_fd = claim_chain(root, chain)
        except OSError as exc:
            raise AuditWriteError(f"cannot open audit directory {root}: {exc}", _errno_name(exc)) from exc
        log = cls(
            chain_dir=root / chain_id,
            chain=chain_id,
            source=source,
            signer=signer,
            options=options or WriterOptions(),
            metrics=metrics,
            clock=clock or (lambda: dt.datetime.now(dt.UTC)),
            lock_fd=lock_fd,
        )
        try:
            log._reload(startup=True)
        except OSError as exc:
            log._release()
            raise AuditWriteError(
                f"cannot open audit chain {log._chain_dir}: {exc}", _errno_name(exc)
            ) from exc
        except BaseException:
            log._release()
            raise
        if metrics is not None:
            metrics.writer_healthy.set(1)
        log._thread = threading.Thread(target=log._run, name=f"audit-writer-{chain_id}", daemon=True)
        log._thread.start()
        return log

    # ------------------------------------------------------------------ public API

    @property
    def chain(self) -> str:
        """This writer's chain id (the directory name under the audit dir)."""
        return self._chain

    @property
    def directory(self) -> Path:
        """The chain directory."""
        return self._chain_dir

    @property
    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last durable record."""
        state = self._state
        return state.seq, state.head

    @property
    def healthy(self) -> bool:
        """False after a failed commit until the next successful one."""
        return self._healthy

    @property
    def problem(self) -> str | None:
        """Why the last commit failed, while :attr:`healthy` is False (else None)."""
        return None if self._healthy else self._problem

    def submit(self, entry: Mapping[str, Any]) -> concurrent.futures.Future[WrittenRecord]:
        """Queue ``entry`` and return a future of its :class:`WrittenRecord` (completed after fsync,
        or failed with :class:`AuditWriteError`). Raises ``ValueError`` for an invalid entry and
        :class:`AuditClosedError` after :meth:`close`."""
        template = encode_entry(entry, self._chain, self._sentinels)
        future: concurrent.futures.Future[WrittenRecord] = concurrent.futures.Future()
        pending = _Pending(entry, template, future, time.monotonic())
        with self._cond:
            if self._closing:
                raise AuditClosedError()
            self._queue.append(pending)
            self._cond.notify()
        return future

    def append(self, entry: Mapping[str, Any], timeout: float | None = None) -> WrittenRecord:
        """Append ``entry`` (from :func:`record_from_decision` & co) and return once it is durable.

        Raises :class:`AuditWriteError` if it could not be written: then it is NOT in the log.
        """
        return self.submit(entry).result(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Drain the queue, write a ``shutdown`` checkpoint, close the file and release the chain."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._closed.wait(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if not self._queue and not self._closing:
                        self._cond.wait(self._idle_timeout())
                    take = self._options.max_batch_records if self._options.group_commit else 1
                    batch = [self._queue.popleft() for _ in range(min(take, len(self._queue)))]
                    finished = self._closing and not self._queue
                if batch:
                    self._commit_batch(batch)
                elif not finished:
                    self._idle()
                if finished:
                    self._shutdown()
                    return
        except BaseException:  # pragma: no cover - a bug; never leave callers hanging
            logger.exception("audit writer %s stopped unexpectedly", self._chain)
            with self._cond:
                self._closing = True  # later appends fail at once instead of waiting forever
            self._fail_queue(AuditWriteError("the audit writer stopped unexpectedly", "internal"))
            self._release()
            raise

    def _idle_timeout(self) -> float:
        if not self._healthy:
            return _HEAL_INTERVAL
        due = self._checkpoint_due_at()
        if due is not None:
            return max(0.01, due - time.monotonic())
        return min(self._options.rotate_max_age_seconds, 60.0)

    def _checkpoint_due_at(self) -> float | None:
        """When the unsigned records reach ``checkpoint_interval_seconds`` (monotonic), or None."""
        state = self._state
        if not state.since_checkpoint or state.unsigned_since is None:
            return None
        return state.unsigned_since + self._options.checkpoint_interval_seconds

    def _checkpoint_due(self) -> bool:
        due = self._checkpoint_due_at()
        return due is not None and time.monotonic() >= due

    def _idle(self) -> None:
        if not self._healthy:
            self._heal()
            return
        now = self._clock().timestamp()
        try:
            if self._needs_reload:
                return  # the next append retries; nothing to sign meanwhile
            if self._due_for_rotation(now):
                self._rotate(now)
            elif self._checkpoint_due():
                self._commit_internal(lambda: [self._checkpoint_line("age")])
        except OSError as exc:
            self._note_failure(exc, 0)

    def _heal(self) -> None:
        """Try the disk again after a failure, with nothing queued: a server that reports not
        ready gets no traffic whose appends would retry, so the writer itself signs the head
        (a ``resume`` checkpoint) once the disk takes writes again."""
        try:
            if self._needs_reload:
                self._reload(startup=False)
            self._commit_internal(lambda: [self._checkpoint_line("resume")])
        except OSError as exc:
            self._note_failure(exc, 0, probe=True)

    def _shutdown(self) -> None:
        try:
            # Sealed by a shutdown checkpoint even when an age (or rotate) checkpoint already signed
            # the head: verify calls a chain that ends otherwise unverifiable (its writer may have
            # crashed), and a writer idle for checkpoint_interval_seconds before a clean close
            # ended with an age checkpoint.
            if not self._needs_reload and self._fd is not None and not self._sealed:
                self._commit_internal(lambda: [self._checkpoint_line("shutdown")])
        except OSError as exc:
            self._note_failure(exc, 0)
        finally:
            self._fail_queue(AuditClosedError())
            self._release()

    def _fail_queue(self, error: AuditWriteError) -> None:
        with self._cond:
            pending = list(self._queue)
            self._queue.clear()
        for item in pending:
            if item.future.set_running_or_notify_cancel():
                item.future.set_exception(error)

    def _release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = -1
        self._closed.set()

    # ------------------------------------------------------------------ commits

    def _commit_batch(self, batch: list[_Pending]) -> None:
        live = [p for p in batch if p.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            self._commit_live(live)
        except Exception as exc:  # a bug or a broken clock: never leave a caller waiting
            logger.exception("audit chain %s: unexpected error while committing", self._chain)
            self._close_segment()
            self._needs_reload = True
            error = AuditWriteError(f"audit log internal error: {exc!r}", "internal")
            for pending in live:
                if not pending.future.done():
                    pending.future.set_exception(error)

    def _commit_live(self, live: list[_Pending]) -> None:
        try:
            if self._needs_reload:
                self._reload(startup=False)
            now = self._clock().timestamp()
            if self._due_for_rotation(now):
                self._rotate(now)
        except OSError as exc:
            self._fail(live, exc)
            return
        snapshot = self._state.copy()
        lines: list[bytes] = []
        written: list[WrittenRecord] = []
        for pending in live:
            line, record = self._build(pending.template, pending.entry)
            lines.append(line)
            written.append(record)
            if self._state.since_checkpoint >= self._options.checkpoint_every:
                lines.append(self._checkpoint_line("interval"))
        if self._checkpoint_due():  # the oldest unsigned record waited long enough: sign in this commit
            lines.append(self._checkpoint_line("age"))
        try:
            self._write_durably(b"".join(lines), snapshot)
        except OSError as exc:
            self._fail(live, exc)
            return
        self._succeeded(len(lines))
        done = time.monotonic()
        for pending, record in zip(live, written, strict=True):
            if self._metrics is not None:
                self._metrics.records_written.labels(record.stage).inc()
                self._metrics.append_seconds.observe(done - pending.submitted)
            pending.future.set_result(record)

    def _commit_internal(self, build: Callable[[], list[bytes]]) -> None:
        """Build and write records the writer makes itself (checkpoints, genesis, recovered)."""
        snapshot = self._state.copy()
        lines = build()
        if lines:
            self._write_durably(b"".join(lines), snapshot)
            self._succeeded(len(lines))

    def _write_durably(self, data: bytes, snapshot: _State) -> None:
        fd = self._fd
        if fd is None:
            raise OSError(errno.EBADF, "the audit segment is not open")
        try:
            view = memoryview(data)
            done = 0
            while done < len(data):
                done += os.write(fd, view[done:])
            started = time.monotonic()
            os.fdatasync(fd)
            if self._metrics is not None:
                self._metrics.fsync_seconds.observe(time.monotonic() - started)
        except OSError:
            self._rollback(snapshot)
            raise
        self._state.offset = snapshot.offset + len(data)

    def _rollback(self, snapshot: _State) -> None:
        """Undo a failed commit: cut the segment back to where it was and restore the head."""
        self._state = snapshot
        try:
            if self._fd is not None:
                os.ftruncate(self._fd, snapshot.offset)
                os.fsync(self._fd)
        except OSError as exc:
            # Cannot even truncate: forget the file and look at the disk afresh next time
            # (recovery then moves any torn tail aside).
            logger.error("audit chain %s: cannot roll back a failed write: %s", self._chain, exc)
            self._close_segment()
            self._needs_reload = True

    def _close_segment(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _fail(self, live: list[_Pending], exc: OSError) -> None:
        error = self._note_failure(exc, len(live))
        for pending in live:
            pending.future.set_exception(error)

    def _note_failure(self, exc: OSError, records: int, *, probe: bool = False) -> AuditWriteError:
        reason = _errno_name(exc)
        where = self._state.segment or self._chain_dir
        message = f"audit log {where}: {exc.strerror or exc} ({reason}); {records} record(s) not written"
        if self._healthy:
            logger.error("%s", message)
        elif probe:  # the disk is still failing: said once already, and the probe wrote no record
            logger.debug("%s", message)
        else:
            logger.warning("%s", message)
        self._healthy = False
        self._problem = message
        if self._metrics is not None:
            if not probe:
                self._metrics.write_failures.labels(reason).inc()
            self._metrics.writer_healthy.set(0)
        error = AuditWriteError(message, reason)
        error.__cause__ = exc
        return error

    def _succeeded(self, lines: int) -> None:
        if self._metrics is not None:
            self._metrics.batch_records.observe(lines)
        if not self._healthy:
            logger.warning("audit chain %s: writing again after failures", self._chain)
            self._healthy = True
            if self._metrics is not None:
                self._metrics.writer_healthy.set(1)

    # ------------------------------------------------------------------ building records

    def _next_time(self) -> tuple[str, int]:
        # Times never go backwards within a chain, so that tools can merge chains by time.
        now_ms = int(self._clock().timestamp() * 1000)
        ms = max(now_ms, self._state.last_ms)
        moment = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
        return format_time(moment), ms

    def _envelope(self) -> dict[str, Any]:
        stamp, ms = self._next_time()
        state = self._state
        state.seq += 1
        state.last_ms = ms
        if state.segment_started is None:
            state.segment_started = ms / 1000
        return {
            "v": RECORD_VERSION,
            "seq": state.seq,
            "time": stamp,
            "chain": self._chain,
            "prev": state.head,
        }

    def _advance(self, digest: str, stage: str, *, sealing: bool = False) -> tuple[str, int]:
        state = self._state
        state.head = digest
        state.lines += 1
        self._sealed = sealing
        if stage == "checkpoint":
            state.since_checkpoint = 0
            state.unsigned_since = None
        else:
            if not state.since_checkpoint:
                state.unsigned_since = time.monotonic()
            state.since_checkpoint += 1
        assert state.segment is not None
        return state.segment.name, state.lines

    def _build(self, template: str, entry: Mapping[str, Any]) -> tuple[bytes, WrittenRecord]:
        envelope = self._envelope()
        marks = self._sentinels
        text = (
            template.replace(marks.seq, str(envelope["seq"]), 1)
            .replace(marks.prev, f'"{envelope["prev"]}"', 1)
            .replace(marks.time, f'"{envelope["time"]}"', 1)
        )
        # "chain" sorts before "hash", so the hash member is never first and always has a comma.
        digest = hashlib.sha256(text.replace(marks.hash_member, "", 1).encode("utf-8")).hexdigest()
        line = (text.replace(marks.hash, f'"{digest}"', 1) + "\n").encode("utf-8")
        stage = str(entry["stage"])
        segment, line_no = self._advance(digest, stage)
        data = {**entry, **envelope, "hash": digest}
        record = WrittenRecord(
            chain=self._chain,
            seq=envelope["seq"],
            time=envelope["time"],
            hash=digest,
            prev=envelope["prev"],
            stage=stage,
            segment=segment,
            line=line_no,
            data=data,
        )
        return line, record

    def _internal_line(self, entry: dict[str, Any], sign: bool = False) -> bytes:
        record = {**entry, **self._envelope()}
        if sign and self._signer is not None:
            record["checkpoint"]["sig"] = self._signer.sign(signed_bytes(record))
        record["hash"] = record_hash(record)
        self._advance(record["hash"], str(entry["stage"]), sealing=_is_shutdown(record))
        return canonical_bytes(record) + b"\n"

    def _checkpoint_line(self, reason: str, next_segment: str | None = None) -> bytes:
        state = self._state
        assert state.segment is not None
        checkpoint: dict[str, Any] = {
            "reason": reason,
            "headSeq": state.seq,
            "head": state.head,
            "segment": state.segment.name,
            "alg": self._signer.alg if self._signer else "none",
            "keyId": self._signer.key_id if self._signer else "",
        }
        if next_segment is not None:
            checkpoint["next"] = next_segment
        return self._internal_line(
            {"source": self._source, "stage": "checkpoint", "checkpoint": checkpoint}, sign=True
        )

    # ------------------------------------------------------------------ rotation

    def _due_for_rotation(self, now: float) -> bool:
        state = self._state
        if state.lines == 0:
            return False
        if state.offset >= self._options.rotate_max_bytes:
            return True
        started = state.segment_started
        return started is not None and now - started >= self._options.rotate_max_age_seconds

    def _rotate(self, now: float) -> None:
        """Close the segment with a signed ``rotate`` checkpoint naming the next one, open that."""
        next_name = segment_name(self._state.seq + 2)
        self._commit_internal(lambda: [self._checkpoint_line("rotate", next_name)])
        try:
            self._open_segment(self._chain_dir / next_name, create=True)
        except OSError:
            # The rotate checkpoint is durable: recovery opens the segment it names.
            self._close_segment()
            self._needs_reload = True
            raise
        logger.info("audit chain %s: rotated to %s", self._chain, next_name)

    def _open_segment(self, path: Path, *, create: bool) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o640)
        self._close_segment()
        self._fd = fd
        if create:
            os.fsync(fd)
            fsync_dir(path.parent)
        state = self._state
        state.segment = path
        state.offset = os.fstat(fd).st_size
        if create and state.offset == 0:
            state.lines = 0
            state.segment_started = None

    # ------------------------------------------------------------------ recovery

    def _reload(self, *, startup: bool) -> None:
        """(Re)establish the head from the disk: the one code path for start-up and for resuming
        after a failure. Moves a torn tail aside and records that in a ``recovered`` record."""
        self._close_segment()
        self._chain_dir.mkdir(parents=True, exist_ok=True)
        segments = list_segments(self._chain_dir)
        if not segments:
            self._state = _State()
            self._open_segment(self._chain_dir / segment_name(1), create=True)
            segments = [self._chain_dir / segment_name(1)]
        current = segments[-1]
        tail = scan_tail(current)
        moved: tuple[str, int] | None = None
        if tail.torn:
            moved = self._move_aside(current, tail)
        last = tail.last
        for earlier in reversed(segments[:-1]):
            if last is not None:
                break
            last = scan_tail(earlier).last
        state = _State(segment=current, lines=tail.lines, segment_started=tail.first_time)
        if last is not None:
            state.seq = int(last.get("seq", 0))
            state.head = str(last.get("hash", GENESIS_PREV))
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                state.last_ms = int(parse_time(str(last.get("time"))).timestamp() * 1000)
            if record_hash(last) != state.head:
                logger.error(
                    "audit chain %s: the last record (seq %s in %s) does not match its hash; continuing "
                    "the chain from it — run `mpigate audit verify`",
                    self._chain,
                    state.seq,
                    current.name,
                )
        if last is not None and last.get("stage") != "checkpoint":
            # resuming after a failure with an unsigned tail: it is due for a signature too
            state.since_checkpoint = 1
            state.unsigned_since = time.monotonic()
        self._state = state
        self._sealed = last is not None and _is_shutdown(last)
        self._open_segment(current, create=False)
        if last is not None and last.get("stage") == "checkpoint":
            nxt = (last.get("checkpoint") or {}).get("next")
            if isinstance(nxt, str) and nxt != current.name and tail.lines > 0:
                # Crashed between the rotate checkpoint and creating the next segment.
                self._open_segment(self._chain_dir / nxt, create=True)

        def build() -> list[bytes]:
            lines: list[bytes] = []
            if last is None:
                # Signed at once: every intact chain carries a checkpoint from its first record on,
                # so a chain without a valid one is a rewrite, never a young chain.
                lines.append(self._internal_line(self._genesis_entry()))
                lines.append(self._checkpoint_line("genesis"))
            if moved is not None:
                name, size = moved
                recovered = {
                    "segment": current.name,
                    "movedTo": name,
                    "bytes": size,
                    "afterSeq": self._state.seq,
                    "afterHash": self._state.head,
                    "reason": "incomplete last line after an unclean shutdown",
                }
                lines.append(
                    self._internal_line(
                        {"source": self._source, "stage": "recovered", "recovered": recovered}
                    )
                )
            if moved is not None or (startup and last is not None and last.get("stage") != "checkpoint"):
                lines.append(self._checkpoint_line("recovered" if moved else "restart"))
            return lines

        self._commit_internal(build)
        self._needs_reload = False
        logger.info("audit chain %s: open at seq %d in %s", self._chain, self._state.seq, current)

    def _genesis_entry(self) -> dict[str, Any]:
        return {
            "source": self._source,
            "stage": "genesis",
            "genesis": {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "version": __version__,
                "alg": self._signer.alg if self._signer else "none",
                "keyId": self._signer.key_id if self._signer else "",
            },
        }

    def _move_aside(self, segment: Path, tail: Tail) -> tuple[str, int]:
        name, size = move_aside(segment, tail)
        logger.warning(
            "audit chain %s: moved %d torn byte(s) from the end of %s to %s",
            self._chain,
            size,
            segment.name,
            name,
        )
        return name, size
