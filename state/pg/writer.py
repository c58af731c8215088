"""The PostgreSQL group-commit writer: one asyncio task, one connection, a bounded queue.

Callers submit `async fn(conn, *args)` operations; the task lets the event loop run once
more (what is ready then joins the batch; with `linger_s` set, which the gateway does while
other replicas are live, it waits that long instead), takes everything queued (up to `max_batch`),
runs it in one transaction with a savepoint per operation, commits once and
resolves each caller's future, so an operation that raises fails only its own caller. A
deadlock or serialization failure redoes the whole (uncommitted) batch; a lost connection
fails the batch and the next one reconnects. Once queued, an operation runs even if its
caller stops waiting.

Why on the daemon's loop and not on a thread of its own, as the SQLite writer is: a batch is
about a dozen statements, one round trip each, and here each answer waits for the loop to
come round to the writer (at 400 messages/s a commit of 6-8 operations takes 7-11 ms, p50,
against about 2.5 ms idle). Two threaded writers were built and measured against this one,
1 and 3 replicas alternated with the same load (docs/benchmarks.md): an event
loop of its own on the thread (its own Python per round trip: daemon CPU per message 0.76 ->
1.08 ms), and a blocking connection behind the same async interface, each operation's
coroutine driven to its end without suspending (the round trip waits in libpq, then for the
GIL). Neither moved the rate, the CPU per message or the turn latency beyond the runs'
spread (the answers then wait for the GIL and the two shared cores instead of the loop), so
the simpler one stays. Fewer round trips did not help either: turns_many in psycopg's
pipeline mode, each statement whose result nothing read yet sent with the next one, took a
merged batch's statements from 11 round trips to 8 (counted in libpq's protocol trace), and
the commit p50 at 400 messages/s stayed where it was (10.1-11.0 ms against 10.1-11.3 ms in
the same alternated runs), so it was not kept either.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection, errors

from ..errors import DatabaseBusy, DatabaseError, StateError, StoreUnavailable, WriterClosed
from ..records import WriterStats
from . import db
from .windows import forget_windows

log = logging.getLogger("state.pg.writer")
T = TypeVar("T")
Op = Callable[..., Awaitable[Any]]
_RETRY = (errors.DeadlockDetected, errors.SerializationFailure)
# fn -> a function running many calls of fn at once: batched(conn, [args, ...]) -> [result, ...]
_BATCHED: dict[
    Callable[..., Any], Callable[[AsyncConnection, list[tuple[Any, ...]]], Awaitable[list[Any]]]
] = {}


# Where a fn's calls run in their batch, when not where they were queued: -1 first, 1 last
# (stable within each part). For writes whose order against the rest of a batch cannot
# matter, so the operations around them merge into longer runs: a turn's writes (under its
# key's lease; what they depend on committed before they were queued, and nothing queued
# with them depends on them) first, a sent reply's fate (nothing reads it back) last.
_PLACE: dict[Callable[..., Any], int] = {}


def register_batched(
    fn: Callable[..., Any],
    batched: Callable[[AsyncConnection, list[tuple[Any, ...]]], Awaitable[list[Any]]],
    *,
    place: int = 0,
) -> None:
    _BATCHED[fn] = batched
    if place:
        _PLACE[fn] = place


# Several fns whose calls, next to each other in a batch (the same `place` puts them
# there), run as one: merged(conn, [(fn, args), ...]) -> [result, ...], so work they have
# in common (a turn's begin and another's end: one append) is done once
Merged = Callable[
    [AsyncConnection, list[tuple[Callable[..., Any], tuple[Any, ...]]]], Awaitable[list[Any]]
]
_MERGED: dict[Callable[..., Any], Merged] = {}


def register_merged(fns: tuple[Callable[..., Any], ...], merged: Merged, *, place: int = 0) -> None:
    for fn in fns:
        _MERGED[fn] = merged
        if place:
            _PLACE[fn] = place


@dataclass(frozen=True)
class PgWriterConfig:
    queue_size: int = 10_000
    max_batch: int = 500
    retries: int = 5  # whole-batch redos after a deadlock or serialization failure


# while the server is away, how often the writer tries to connect again
RECONNECT_S = 0.5


def _lost(conn: AsyncConnection) -> bool:
    """Whether an OperationalError left the connection unusable (the server went away), as
    opposed to a statement's own failure on a live one (a value too large for an index:
    ProgramLimitExceeded is an OperationalError too)."""
    return conn.closed or conn.broken


class _Uncommitted(Exception):
    """The connection failed before COMMIT: nothing of the batch was applied."""


class _Item:
    __slots__ = ("fn", "args", "future")

    def __init__(self, fn: Op, args: tuple[Any, ...], future: asyncio.Future[Any]) -> None:
        self.fn, self.args, self.future = fn, args, future


_STOP = object()


class PgWriter:
    """Owns the write connection; `submit` queues an operation and waits for its commit."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[AsyncConnection]],
        where: str,
        config: PgWriterConfig | None = None,
    ) -> None:
        self.config = config or PgWriterConfig()
        self.stats = WriterStats()
        self.where = where
        self._connect = connect
        self._queue: asyncio.Queue[Any] = asyncio.Queue(self.config.queue_size)
        self._conn: AsyncConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._down_since: float | None = None  # the write connection could not be opened
        self._next_try = 0.0
        self._last_error = ""
        # seconds each batch waits, after the first operation, for more to join it (0:
        # one pass of the event loop only); the gateway sets it while other replicas live
        self.linger_s = 0.0

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    async def start(self, conn: AsyncConnection) -> None:
        self._conn = conn
        self._task = asyncio.create_task(self._serve(), name="state.pg.writer")

    async def submit(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._closing or self._task is None or self._task.done():
            raise WriterClosed("the store is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Item(fn, args, future))  # backpressure when full
        return await future

    async def close(self) -> None:
        """Run everything already queued, then close the connection."""
        if self._task is None:
            return
        if not self._closing:
            self._closing = True
            await self._queue.put(_STOP)
        await asyncio.gather(self._task, return_exceptions=True)
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _serve(self) -> None:
        while True:
            first = await self._queue.get()
            if first is _STOP:
                return
            # one more pass of the event loop before the batch is closed (or `linger_s`,
            # while other replicas are live: gateway.app's _pace_commits): the tasks and
            # requests ready then add their operations to this commit (a batch costs about
            # the same few statements per kind of operation whatever its size)
            await asyncio.sleep(self.linger_s)
            batch: list[_Item] = [first]
            stop = False
            while len(batch) < self.config.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            results = await self._execute(batch)
            for item, (ok, value) in zip(batch, results, strict=True):
                if item.future.done():  # the caller stopped waiting; committed anyway
                    continue
                if ok:
                    item.future.set_result(value)
                else:
                    item.future.set_exception(value)
            if stop:
                return

    async def _execute(self, batch: list[_Item]) -> list[tuple[bool, Any]]:
        """Run a batch; redo it (nothing of it committed) after a deadlock, a serialization
        failure or a connection lost before COMMIT; fail it when the outcome is unknown."""
        for attempt in range(self.config.retries + 1):
            last = attempt == self.config.retries
            try:
                conn = await self._connection()
            except StoreUnavailable as exc:  # the server is away: fail now, never wait for it
                return [(False, exc)] * len(batch)
            try:
                started = time.perf_counter()
                results = await self._attempt(conn, batch)
                self.stats.record(len(batch), (time.perf_counter() - started) * 1000)
                self.stats.failed_operations += sum(1 for ok, _ in results if not ok)
                return results
            except _RETRY as exc:
                self.stats.busy_retries += 1
                forget_windows(self._conn)  # advanced by statements now rolled back
                await self._rollback()
                if last:
                    err: BaseException = DatabaseBusy(f"{self.where}: {exc.sqlstate}: {exc}")
                    return [(False, err)] * len(batch)
                await asyncio.sleep(0.005 * 2**attempt)
            except _Uncommitted as exc:  # the connection broke before COMMIT: safe to redo
                log.warning("write connection lost (%s); reconnecting", exc.__cause__)
                await self._drop_broken()
                if last:
                    return [
                        (False, StoreUnavailable(self.where, f"write failed: {exc.__cause__}"))
                    ] * len(batch)
                # redone at once on a new connection; a server that is away fails its connect
            except psycopg.Error as exc:  # at COMMIT: it may or may not have been applied
                log.error("commit of a batch of %d failed: %s", len(batch), exc)
                await self._drop_broken()
                reason = f"the commit failed and may not have been applied: {exc}"
                kind = (
                    StoreUnavailable if isinstance(exc, psycopg.OperationalError) else DatabaseError
                )
                return [(False, kind(self.where, reason))] * len(batch)
        raise AssertionError("unreachable")

    async def _attempt(self, conn: AsyncConnection, batch: list[_Item]) -> list[tuple[bool, Any]]:
        """Fast path first: the whole batch without savepoints, runs of batchable operations
        merged. If any operation raises, roll back and redo the batch one savepoint per
        operation, so only the failing caller sees its error."""
        try:
            await db.begin(conn)  # sent with the batch's first statement
            results = await self._run_fast(conn, batch)
        except _RETRY:
            raise
        except psycopg.OperationalError as exc:
            if _lost(conn):
                raise _Uncommitted() from exc
            await self._fall_back(conn, batch, exc)
            return await self._run_isolated(conn, batch)
        except Exception as exc:
            await self._fall_back(conn, batch, exc)
            return await self._run_isolated(conn, batch)
        await db.command(conn, b"COMMIT")
        return results

    async def _fall_back(self, conn: AsyncConnection, batch: list[_Item], exc: Exception) -> None:
        """An operation of the fast path raised on a live connection: roll the batch back
        before it is redone one savepoint per operation."""
        forget_windows(conn)  # advanced by statements now rolled back
        try:
            await conn.execute(b"ROLLBACK")
        except psycopg.OperationalError as lost:
            raise _Uncommitted() from lost
        self.stats.fallbacks += 1
        routine = isinstance(
            exc,
            (
                StateError,
                ValueError,
                psycopg.errors.IntegrityError,
                psycopg.DataError,
                psycopg.errors.ProgramLimitExceeded,
            ),
        )
        log.log(
            logging.DEBUG if routine else logging.WARNING,
            "batch of %d redone one operation at a time: %r",
            len(batch),
            exc,
            exc_info=not routine,
        )

    @classmethod
    async def _run_fast(cls, conn: AsyncConnection, batch: list[_Item]) -> list[tuple[bool, Any]]:
        if any(item.fn in _PLACE for item in batch):
            order = sorted(range(len(batch)), key=lambda i: _PLACE.get(batch[i].fn, 0))
            done = await cls._run_runs(conn, [batch[i] for i in order])
            results: list[tuple[bool, Any]] = [(False, None)] * len(batch)
            for i, result in zip(order, done, strict=True):
                results[i] = result
            return results
        return await cls._run_runs(conn, batch)

    @staticmethod
    async def _run_runs(conn: AsyncConnection, batch: list[_Item]) -> list[tuple[bool, Any]]:
        """The batch in order, each run of one batchable operation (or of one merged
        group's) merged."""
        results: list[tuple[bool, Any]] = []
        i = 0
        while i < len(batch):
            group = _MERGED.get(batch[i].fn)
            if group is not None:
                j = i + 1
                while j < len(batch) and _MERGED.get(batch[j].fn) is group:
                    j += 1
                values = await group(conn, [(item.fn, item.args) for item in batch[i:j]])
                results.extend((True, v) for v in values)
                i = j
                continue
            merged = _BATCHED.get(batch[i].fn)
            j = i + 1
            if merged is not None:
                while j < len(batch) and batch[j].fn is batch[i].fn:
                    j += 1
            if merged is not None and j - i > 1:
                values = await merged(conn, [item.args for item in batch[i:j]])
                results.extend((True, v) for v in values)
            else:
                results.append((True, await batch[i].fn(conn, *batch[i].args)))
            i = j
        return results

    async def _run_isolated(
        self, conn: AsyncConnection, batch: list[_Item]
    ) -> list[tuple[bool, Any]]:
        results: list[tuple[bool, Any]] = []
        try:
            await conn.execute(b"BEGIN")
            for item in batch:
                try:
                    async with conn.transaction():  # a savepoint per operation
                        value = await item.fn(conn, *item.args)
                except _RETRY:
                    raise  # the whole batch, from the start
                except psycopg.OperationalError as exc:
                    if _lost(conn):
                        raise  # the whole batch, from the start, on a new connection
                    forget_windows(conn)  # a statement's own failure (a value too large...)
                    results.append((False, exc))
                except Exception as exc:
                    forget_windows(conn)  # advanced by statements of the savepoint undone
                    results.append((False, exc))
                else:
                    results.append((True, value))
        except _RETRY:
            raise
        except psycopg.OperationalError as exc:
            raise _Uncommitted() from exc
        await conn.execute(b"COMMIT")
        return results

    async def _rollback(self) -> None:
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                await conn.execute(b"ROLLBACK")
            except psycopg.Error:
                await self._drop_broken()

    async def _connection(self) -> AsyncConnection:
        """The write connection, opened again when it broke. While the server is away a
        connect is tried at most every RECONNECT_S: the batches in between fail at once
        (StoreUnavailable), so no caller waits for the server to come back."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        now = time.monotonic()
        if self._down_since is not None and now < self._next_try:
            raise StoreUnavailable(self.where, f"the database is unreachable ({self._last_error})")
        try:
            self._conn = await self._connect()
        except psycopg.Error as exc:
            if self._down_since is None:
                self._down_since = now
                log.warning(
                    "cannot open the write connection (%s); writes fail until the "
                    "database answers (tried every %g s)",
                    exc,
                    RECONNECT_S,
                )
            self._next_try = now + RECONNECT_S
            self._last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StoreUnavailable(
                self.where, f"the database is unreachable ({self._last_error})"
            ) from exc
        if self._down_since is not None:
            log.info("write connection open again after %.1f s", now - self._down_since)
            self._down_since = None
        return self._conn

    async def _drop_broken(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                await conn.close()
            except psycopg.Error:
                pass
