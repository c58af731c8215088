"""The single writer: one thread, one write connection, a bounded queue, group commit.

Callers submit synchronous operations `fn(conn, *args)`; the writer thread runs everything
that is queued in one `BEGIN IMMEDIATE` transaction, commits once, then hands the results
back to the event loop, which resolves every caller's future. An operation that raises fails
only its own caller (the batch is redone one savepoint per operation). Once queued, an
operation runs even if its caller stops waiting.

The thread takes its next batch as soon as a commit ends, while the loop is still resolving
the previous one: the write connection never waits for the event loop. Under load (the last
batch held several operations or left some queued) a batch waits `commit_linger_s` before
it commits, so that fewer, fuller commits carry the same writes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, TypeVarTuple, Unpack

from ..errors import DatabaseBusy, DatabaseError, StateError, WriterClosed
from ..records import WriterStats
from . import compaction
from .backpressure import Room
from .connection import close_quietly, connect_writer, identity, is_busy, translate_error
from .settings import SYNCHRONOUS_MODES, WriterConfig
from .windows import keeps, windows_of

log = logging.getLogger("state.writer")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class _Op:
    __slots__ = ("fn", "args", "future", "exclusive")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        future: asyncio.Future[Any] | None,  # None: posted, nobody waits
        exclusive: bool,
    ) -> None:
        self.fn = fn
        self.args = args
        self.future = future
        self.exclusive = exclusive


_STOP = object()

# fn -> a function that runs many calls of fn at once: batched(conn, [args, ...]) -> [result, ...].
# The writer uses it for runs of consecutive operations in a batch (the append hot path).
_BATCHED: dict[
    Callable[..., Any], Callable[[sqlite3.Connection, list[tuple[Any, ...]]], list[Any]]
] = {}


def register_batched(
    fn: Callable[..., Any],
    batched: Callable[[sqlite3.Connection, list[tuple[Any, ...]]], list[Any]],
) -> None:
    _BATCHED[fn] = batched


# Run at the start of every batch's transaction, before its operations: catching up on rows
# another program wrote into the file (state.hermes.foreign). Must be cheap when there is nothing.
_BEFORE_BATCH: list[Callable[[sqlite3.Connection], object]] = []


def register_before_batch(fn: Callable[[sqlite3.Connection], object]) -> None:
    if fn not in _BEFORE_BATCH:
        _BEFORE_BATCH.append(fn)


def before_batch(conn: sqlite3.Connection) -> None:
    """Run what registered to run at the start of every write transaction."""
    for fn in _BEFORE_BATCH:
        fn(conn)


class Writer:
    """Owns the write connection. Use `submit` for transactional work, `exclusive` for
    statements that cannot run inside a transaction (VACUUM, checkpoints)."""

    def __init__(self, path: str, config: WriterConfig | None = None) -> None:
        self.path = path
        self.config = config or WriterConfig()
        if self.config.synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
        self.stats = WriterStats()
        self.pause: Callable[[float], None] = time.sleep  # the wait under load (on the thread)
        # The executor's one thread opens, migrates and closes the file; `_serve` runs on a
        # thread of its own for the writer's life.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-writer")
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._slots = Room(self.config.queue_size)  # backpressure
        self._conn: sqlite3.Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._closing = False
        self._ckpt_executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="state-checkpoint"
        )
        self._ckpt_conn: sqlite3.Connection | None = None
        self._ckpt_task: asyncio.Task[None] | None = None
        self._restart_wanted = False
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file opened
        self._replaced_said = False
        self.checkpoints = 0
        self.wal_restarts = 0
        # the search indexes may hold segments to merge (a file opened may, any write may)
        self._merge_due = True
        self._merge_tables: tuple[str, ...] | None = None  # known once usermerge is set
        self.merge_steps = 0

    @property
    def queue_depth(self) -> int:
        """Operations waiting for the writer (not counting the batch it is running)."""
        return self._inbox.qsize()

    @property
    def merge_pending(self) -> bool:
        """Whether the search indexes may still have segments to merge when idle."""
        return self._merge_due and self.config.merge_idle_s is not None

    async def start(self, conn: sqlite3.Connection | None = None) -> None:
        """Adopt `conn` (already migrated) or open a new one, then start the task."""
        loop = asyncio.get_running_loop()

        def _open() -> sqlite3.Connection:
            return conn or connect_writer(
                self.path, self.config.synchronous, self.config.busy_timeout_s
            )

        self._conn = await loop.run_in_executor(self._executor, _open)
        self._identity = identity(self.path)
        self._loop = loop
        # A WAL can only start over when a checkpoint completes between two write
        # transactions, which only the writer can arrange under continuous writes. The
        # background checkpointer copies most frames first, so this one finds little left.
        self._conn.execute(f"PRAGMA wal_autocheckpoint={self.config.writer_checkpoint_pages}")
        self._stopped = loop.create_future()
        # A daemon thread, not the executor's worker: a program that exits (or crashes)
        # without closing the store must not hang at exit joining a thread that waits for
        # work forever. Nothing is lost that a crash would not lose: committed is committed.
        threading.Thread(target=self._serve, name="state-writer-serve", daemon=True).start()
        self._ckpt_task = asyncio.create_task(self._checkpoint_loop(), name="state.checkpoint")

    async def submit(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        return await self._enqueue(fn, args, exclusive=False)

    def post(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], object], *args: *Ts) -> None:
        """Queue `fn` and return at once: for bookkeeping nobody waits on (an outbox row's
        `sent` mark). No result, no future and no place in the queue's backpressure (the
        work that posts is itself bounded by it); a failure is logged. Raises WriterClosed
        when the store is closed."""
        if self._closing or self._stopped is None or self._stopped.done():
            raise WriterClosed("the store is closed")
        self._inbox.put(_Op(fn, args, None, False))

    async def exclusive(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        return await self._enqueue(fn, args, exclusive=True)

    async def _enqueue(self, fn: Callable[..., T], args: tuple[Any, ...], exclusive: bool) -> T:
        if self._closing or self._stopped is None:
            raise WriterClosed("the store is closed")
        if self._stopped.done():
            raise WriterClosed("the writer has stopped")
        await self._slots.take()  # backpressure: wait for room in the queue
        if self._closing or self._stopped.done():  # closed while this caller waited
            self._slots.give_back()
            raise WriterClosed("the store is closed")
        assert self._loop is not None  # set before `_stopped`
        future: asyncio.Future[T] = self._loop.create_future()
        self._inbox.put(_Op(fn, args, future, exclusive))
        return await future

    async def close(self) -> None:
        """Run everything already queued, then close the connection."""
        if self._stopped is None:
            self._executor.shutdown(wait=False)
            return
        if not self._closing:
            self._closing = True
            self._inbox.put(_STOP)
        if self._ckpt_task is not None:
            self._ckpt_task.cancel()
            await asyncio.gather(self._ckpt_task, return_exceptions=True)
        ckpt, self._ckpt_conn = self._ckpt_conn, None
        if ckpt is not None:
            await asyncio.get_running_loop().run_in_executor(
                self._ckpt_executor, close_quietly, ckpt
            )
        self._ckpt_executor.shutdown(wait=True)
        try:
            await self._stopped
        finally:
            conn, self._conn = self._conn, None
            if conn is not None:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._executor, close_quietly, conn, True)
            self._executor.shutdown(wait=True)

    async def _checkpoint_loop(self) -> None:
        """Passive checkpoints from a second connection, so copying WAL frames back into the
        database (and its fsync) happens beside the writer instead of inside a commit.

        The WAL can only start over when a write transaction begins with every frame
        copied back, and under continuous writes only the writer can see that moment. So once
        the WAL is long and this checkpoint has caught up, the writer is asked to finish the
        job between two batches: it copies the few frames committed meanwhile, and its next
        transaction starts the WAL from the beginning."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.config.checkpoint_every_s)
            try:
                frames = await loop.run_in_executor(self._ckpt_executor, self._checkpoint_step)
            except sqlite3.Error as exc:
                log.warning("passive checkpoint failed: %s", exc)
                continue
            if frames is not None:
                log_frames, copied = frames
                # (An idle writer needs no help: its next transaction finds every frame
                # copied and restarts the WAL by itself.)
                if log_frames >= self.config.restart_wal_frames and copied >= log_frames:
                    self._restart_wanted = True

    def _checkpoint_step(self) -> tuple[int, int] | None:
        """(frames in the WAL, frames copied back), or None when the WAL is still small."""
        try:
            if os.path.getsize(self.path + "-wal") < self.config.checkpoint_wal_bytes:
                return None
        except OSError:
            return None
        if self._ckpt_conn is None:
            self._ckpt_conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False
            )
            self._ckpt_conn.execute("PRAGMA busy_timeout=1000")
        _busy, log_frames, copied = self._ckpt_conn.execute(
            "PRAGMA wal_checkpoint(PASSIVE)"
        ).fetchone()
        self.checkpoints += 1
        return log_frames, copied

    def _finish_checkpoint(self) -> None:
        """On the writer thread, between transactions: copy what the background checkpoint
        left, so the next write transaction restarts the WAL."""
        conn = self._conn
        assert conn is not None
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.wal_restarts += 1
        except sqlite3.Error as exc:
            log.warning("checkpoint before restarting the WAL failed: %s", exc)

    def _resolve(self, batch: list[_Op], results: list[tuple[bool, Any]]) -> None:
        """On the loop: hand each caller its result."""
        for op, (ok, value) in zip(batch, results, strict=True):
            if op.future is None:  # posted: nobody waits
                if not ok:
                    log.warning("posted write %s failed: %s", op.fn.__name__, value)
                continue
            self._slots.give_back()
            if op.future.done():  # the caller stopped waiting; the work is committed anyway
                continue
            if ok:
                op.future.set_result(value)
            else:
                op.future.set_exception(value)

    def _post(self, batch: list[_Op], results: list[tuple[bool, Any]]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._resolve, batch, results)

    # --- on the writer thread -------------------------------------------------------

    def _serve(self) -> None:
        """Take whatever is queued (up to max_batch, an exclusive operation on its own), run
        it, post the results, repeat until told to stop."""
        held: Any = None  # an exclusive operation met while gathering a batch
        stop = busy = False
        linger = self.config.commit_linger_s
        try:
            while not stop:
                if held is not None:
                    first, held = held, None
                elif busy and linger > 0:
                    # Under load, the next operations are seconds' thousandths away: a
                    # sleep (which no put cuts short) lets them join the next commit. The
                    # writer sleeps before it looks at the queue, so a put meanwhile finds
                    # it asleep rather than waiting on the queue and wakes no thread (on a
                    # virtual machine a wake-up costs microseconds of both threads' CPU).
                    self.pause(linger)
                    first = self._queued()
                    if first is None:  # none came: the next one waits for company itself
                        first = self._next()
                        if first is not _STOP and not first.exclusive:
                            self.pause(linger)
                else:  # a caller writing one thing at a time never waits
                    first = self._next()
                if first is _STOP:
                    break
                batch: list[_Op] = [first]
                while not first.exclusive and len(batch) < self.config.max_batch:
                    nxt = self._queued()
                    if nxt is None:
                        break
                    if nxt is _STOP:
                        stop = True
                        break
                    if nxt.exclusive:
                        held = nxt
                        break
                    batch.append(nxt)
                self._post(batch, self._execute(batch))
                busy = len(batch) > 1 or not self._inbox.empty()
                self._merge_due = True
                if self._restart_wanted:
                    self._restart_wanted = False
                    self._finish_checkpoint()
        finally:
            self._drain_after_stop(held)

    def _queued(self) -> Any:
        """The next queued item, or None when nothing is queued."""
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            return None

    def _next(self) -> Any:
        """The next queued item. While the search indexes may need merging, once the queue
        has stayed empty for `merge_idle_s` they are merged step by step, with a rest after
        each (compaction.REST), until they are compact. Anything queued goes first, at the
        end of the step or the rest it arrives in."""
        idle = self.config.merge_idle_s
        wait = idle
        while self._merge_due and idle is not None:
            try:
                return self._inbox.get(timeout=wait)
            except queue.Empty:
                took = self._compact_step()
                wait = idle if took is None else max(took * compaction.REST, compaction.REST_MIN_S)
        return self._inbox.get()

    def _compact_step(self) -> float | None:
        """One merge step (compaction.py): the seconds it took, or None (nothing left to
        merge, the merge failed, or another process holds the lock: next idle moment)."""
        conn = self._conn
        assert conn is not None
        started = time.perf_counter()
        try:
            self._check_same_file()
            done = compaction.run_step(conn, self._merge_tables, self.config.merge_pages)
            if done is None:
                return None
            self._merge_tables, worked = done
            self.merge_steps += 1
            if self._restart_wanted:  # a long merge is continuous writing too
                self._restart_wanted = False
                self._finish_checkpoint()
            if not worked:
                self._merge_due = False
                return None
        except (sqlite3.Error, DatabaseError) as exc:
            log.warning("merging the search indexes failed: %s", exc)
            self._merge_due = False
            return None
        return time.perf_counter() - started

    def _drain_after_stop(self, held: Any) -> None:
        """Refuse whatever is still queued (only a crash of the loop above leaves any), then
        tell the loop the writer has stopped."""
        left = [held] if isinstance(held, _Op) else []
        while (op := self._queued()) is not None:
            if isinstance(op, _Op):
                left.append(op)
        assert self._loop is not None and self._stopped is not None
        try:
            if left:
                self._post(left, [(False, WriterClosed("the writer has stopped"))] * len(left))
            stopped = self._stopped

            def finish() -> None:
                if not stopped.done():
                    stopped.set_result(None)

            self._loop.call_soon_threadsafe(finish)
        except RuntimeError:  # the event loop is gone; nobody is waiting
            pass

    def _execute(self, batch: list[_Op]) -> list[tuple[bool, Any]]:
        try:
            self._check_same_file()
        except DatabaseError as exc:  # said once, in the log; every caller is told
            return [(False, exc)] * len(batch)
        try:
            if batch[0].exclusive:
                return self._run_exclusive(batch[0])
            return self._run_batch(batch)
        except BaseException as exc:  # the whole batch failed (disk full at commit, lock budget)
            _forget_windows(self._conn)
            log.error("write batch of %d failed: %s", len(batch), exc)
            err = translate_error(exc, self.path)
            return [(False, err)] * len(batch)

    def _check_same_file(self) -> None:
        """Refuse to write when the path no longer names the file this writer opened (moved,
        deleted or replaced underneath the daemon): what it wrote would go to a file nobody
        opens again. A restart opens whatever the path names then."""
        if self._identity is None or identity(self.path) == self._identity:
            return
        if not self._replaced_said:
            self._replaced_said = True
            log.error(
                "%s was replaced or removed while the daemon had it open; refusing to "
                "write into the file it opened (restart switchboard to open the one "
                "at that path now)",
                self.path,
            )
        raise DatabaseError(
            self.path,
            "the file was replaced or removed underneath the "
            "daemon; nothing was written (restart to open the new file)",
        )

    def _run_batch(self, batch: list[_Op]) -> list[tuple[bool, Any]]:
        conn = self._conn
        assert conn is not None
        deadline = time.monotonic() + self.config.lock_budget_s
        attempt = 0
        while True:
            try:
                started = time.perf_counter()
                results = self._attempt(conn, batch, self.stats)
                commit_ms = (time.perf_counter() - started) * 1000
                self.stats.record(len(batch), commit_ms)
                self.stats.failed_operations += sum(1 for ok, _ in results if not ok)
                return results
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise
                attempt += 1
                self.stats.busy_retries += 1
                if time.monotonic() >= deadline:
                    raise DatabaseBusy(
                        f"{self.path}: another process kept the database locked for "
                        f"{self.config.lock_budget_s:.0f} s"
                    ) from exc
                # Jittered backoff so two writers in different processes do not collide again.
                time.sleep(min(0.5, 0.01 * 2 ** min(attempt, 6)) * random.uniform(0.5, 1.5))

    @staticmethod
    def _attempt(
        conn: sqlite3.Connection, batch: list[_Op], stats: WriterStats
    ) -> list[tuple[bool, Any]]:
        """Fast path first: the whole batch with no savepoints, runs of batchable operations
        merged. If any operation raises, roll back and redo the batch one savepoint per
        operation, so only the failing caller sees its error."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            before_batch(conn)
            results = Writer._run_fast(conn, batch)
            conn.execute("COMMIT")
            return results
        except Exception as exc:
            _forget_windows(conn)  # advanced by statements that were rolled back
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if is_busy(exc):
                raise
            stats.fallbacks += 1
            # An operation's own error (a missing session, a taken title) is routine; anything
            # else means the merged path is wrong and must not hide behind the slow path.
            routine = isinstance(exc, (StateError, ValueError, sqlite3.IntegrityError))
            log.log(
                logging.DEBUG if routine else logging.WARNING,
                "batch of %d redone one operation at a time: %r",
                len(batch),
                exc,
                exc_info=not routine,
            )
        return Writer._run_isolated(conn, batch)

    @staticmethod
    def _run_fast(conn: sqlite3.Connection, batch: list[_Op]) -> list[tuple[bool, Any]]:
        """Every batchable function's calls in the batch run merged, at the place of its
        first call, in their order; the rest one by one in theirs. Safe because the
        operations of one batch were all pending at once: none was submitted after another
        of them returned, so any order of them is one the callers could have seen."""
        results: list[tuple[bool, Any] | None] = [None] * len(batch)
        groups: dict[Callable[..., Any], list[int]] = {}
        plan: list[Callable[..., Any] | int] = []  # a batched function's group, or one op
        windows = windows_of(conn)
        for i, op in enumerate(batch):
            if op.fn in _BATCHED:
                group = groups.get(op.fn)
                if group is None:
                    groups[op.fn] = group = []
                    plan.append(op.fn)
                group.append(i)
            else:
                plan.append(i)
        for step in plan:
            # an operation that may change messages clears the windows right before it
            # runs: the ones kept before it, or advanced by a group that ran before it
            if windows is not None and not keeps(step if callable(step) else batch[step].fn):
                windows.clear()
            if isinstance(step, int):
                op = batch[step]
                results[step] = (True, op.fn(conn, *op.args))
                continue
            which = groups[step]
            if len(which) == 1:
                op = batch[which[0]]
                results[which[0]] = (True, op.fn(conn, *op.args))
                continue
            values = _BATCHED[step](conn, [batch[i].args for i in which])
            for i, v in zip(which, values, strict=True):
                results[i] = (True, v)
        return results  # type: ignore[return-value]  # every slot is filled above

    @staticmethod
    def _run_isolated(conn: sqlite3.Connection, batch: list[_Op]) -> list[tuple[bool, Any]]:
        conn.execute("BEGIN IMMEDIATE")
        results: list[tuple[bool, Any]] = []
        try:
            before_batch(conn)
            for op in batch:
                if not keeps(op.fn):
                    _forget_windows(conn)
                conn.execute("SAVEPOINT op")
                try:
                    value = op.fn(conn, *op.args)
                except sqlite3.OperationalError as exc:
                    _forget_windows(conn)
                    if is_busy(exc):
                        raise  # retry the whole batch
                    if not conn.in_transaction:
                        # SQLite rolled the whole transaction back itself (a full disk can):
                        # the operations before this one are undone too, so the batch fails
                        raise
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    results.append((False, translate_error(exc, "state.db")))
                except Exception as exc:
                    _forget_windows(conn)
                    if not conn.in_transaction:
                        raise  # as above
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    results.append((False, exc))
                else:
                    conn.execute("RELEASE op")
                    results.append((True, value))
            conn.execute("COMMIT")
        except BaseException:
            _forget_windows(conn)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return results

    def _run_exclusive(self, op: _Op) -> list[tuple[bool, Any]]:
        conn = self._conn
        assert conn is not None
        _forget_windows(conn)
        try:
            return [(True, op.fn(conn, *op.args))]
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [(False, translate_error(exc, self.path))]


def _forget_windows(conn: sqlite3.Connection | None) -> None:
    windows = windows_of(conn) if conn is not None else None
    if windows is not None:
        windows.clear()
