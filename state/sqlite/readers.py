"""Read-only connections, each on its own thread, so reads never wait behind the writer.

A read runs a synchronous function against one connection in one thread hop, inside a
deferred transaction so multi-statement reads see one consistent snapshot. A cancelled
caller interrupts its query; the connection goes back to the pool when the query stops.

A read that is usually short (a search's page) can skip the hop, whose handoffs between
threads cost more CPU than such a read itself: `run_short` runs it on the event loop's
thread over a connection of its own, within INLINE_BUDGET_S of that thread's CPU time (and
INLINE_WALL_S of wall time: a machine too busy to run it, a disk that makes it wait). SQLite
stops a statement past it (a progress handler), a lock held elsewhere stops it at once (no
busy timeout), and a read about to do much work in Python says so (`heavy`); each of these
runs it again on a reader thread, so the loop waits about the budget at most (SQLite looks
at the clocks between the steps of its virtual machine, not inside FTS5's calls). The same
read (function and arguments) asked again goes to a reader thread at once. After a read
stopped at the budget the loop's connection is closed, and the next read opens another
(`_Inline.attempt` says why).
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, TypeVarTuple, Unpack, cast
from urllib.parse import quote

from .connection import is_busy

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
_STOP = object()
INLINE_BUDGET_S = 0.002  # of the loop thread's CPU time
INLINE_WALL_S = 0.008  # of wall time (a thread the machine does not run, a disk that waits)
LONG_KEPT = 256  # reads remembered as too long for the loop: they go to a thread at once
_CHECK_EVERY = 1000  # SQLite virtual machine steps between two looks at the clock


def connect_reader(
    path: str, factory: type[sqlite3.Connection] = sqlite3.Connection
) -> sqlite3.Connection:
    conn = sqlite3.connect(
        f"file:{quote(path)}?mode=ro",
        uri=True,
        isolation_level=None,
        check_same_thread=False,
        factory=factory,
    )
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA query_only=1")
    return conn


class _Moved(Exception):
    """The read leaves the event loop's thread for a reader thread."""


class _LoopConnection(sqlite3.Connection):
    """The connection `run_short` reads on, on the event loop's thread."""

    deadline = 0.0  # time.thread_time()
    wall_deadline = 0.0  # time.perf_counter()
    over = False

    def check_clock(self) -> int:
        if time.thread_time() > self.deadline or time.perf_counter() > self.wall_deadline:
            self.over = True
            return 1  # SQLite interrupts the statement
        return 0


def heavy(conn: sqlite3.Connection) -> None:
    """Said by a read about to do much work in Python, which no progress handler stops:
    on the event loop's thread it moves to a reader thread (then runs again from the
    start); anywhere else nothing happens."""
    if isinstance(conn, _LoopConnection):
        raise _Moved


class _Inline:
    """The loop thread's connection, opened at its first use; one read at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn: _LoopConnection | None = None
        self.lock = threading.Lock()  # a second thread with a loop of its own takes the hop

    def attempt(self, fn: Callable[..., T], args: tuple[Any, ...]) -> tuple[str, T | None]:
        """("done", what fn returned), or ("long", None) / ("busy", None): run it on a
        reader thread (it outlasted the budget or said it would / a lock stopped it)."""
        conn = self.conn
        if conn is None:
            conn = self.conn = cast(_LoopConnection, connect_reader(self.path, _LoopConnection))
            conn.execute("PRAGMA busy_timeout=0")
            conn.set_progress_handler(conn.check_clock, _CHECK_EVERY)
        conn.over = False
        conn.deadline = time.thread_time() + INLINE_BUDGET_S
        conn.wall_deadline = time.perf_counter() + INLINE_WALL_S
        value = None
        try:
            conn.execute("BEGIN")
            value = fn(conn, *args)
        except _Moved:
            return "long", None
        except sqlite3.OperationalError as exc:
            if not conn.over:  # stopped at the budget: "long", below
                if is_busy(exc):
                    return "busy", None
                raise
        finally:
            conn.deadline = conn.wall_deadline = float("inf")
            if conn.in_transaction:
                conn.execute("COMMIT")
        if conn.over:  # stopped at the budget (or fn caught the stop: its answer is not whole)
            # A statement SQLite stopped midway leaves the connection slower for the reads
            # after it: searches after common-word ones stopped here took twice their CPU
            # time or more on it, for the same instructions (callgrind), until the
            # connection was opened again (bench/hermes_search_bench.py). So the next read
            # opens another.
            self.conn = None
            conn.close()
            return "long", None
        return "done", value

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class _Slot:
    """One connection and the thread that owns it; work arrives on a simple queue and the
    result goes straight back to the loop (no executor futures in between)."""

    def __init__(self, path: str, index: int) -> None:
        self.path = path
        self.conn: sqlite3.Connection | None = None
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name=f"state-reader-{index}", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is _STOP:
                if self.conn is not None:
                    self.conn.close()
                return
            loop, fut, fn, args = job
            try:
                if self.conn is None:
                    self.conn = connect_reader(self.path)
                conn = self.conn
                conn.execute("BEGIN")
                try:
                    value = fn(conn, *args)
                finally:
                    try:
                        conn.execute("COMMIT")
                    except sqlite3.Error:
                        pass
                outcome = (True, value)
            except BaseException as exc:  # delivered to the caller, never lost in the thread
                outcome = (False, exc)
            try:
                loop.call_soon_threadsafe(_settle, fut, *outcome)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass


class ReaderPool:
    def __init__(self, path: str, size: int = 3) -> None:
        self.path = path
        self._slots = [_Slot(path, i) for i in range(size)]
        # the slot used last goes first: its connection's page cache is the warm one
        self._free: asyncio.Queue[_Slot] = asyncio.LifoQueue()
        self._inline = _Inline(path)
        self._long: dict[Any, None] = {}  # reads that outlasted the budget, oldest first
        for slot in self._slots:
            self._free.put_nowait(slot)
        self._closed = False

    async def run(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        if self._closed:
            raise RuntimeError("the reader pool is closed")
        slot = await self._free.get()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        slot.jobs.put((loop, fut, fn, args))
        try:
            return await fut
        except asyncio.CancelledError:
            if slot.conn is not None:
                slot.conn.interrupt()
            raise
        finally:
            if fut.done() and not fut.cancelled():
                self._free.put_nowait(slot)
            else:
                # The thread is still busy with the interrupted query: hand the slot back
                # only when its result arrives (the thread settles `fut` even if cancelled).
                self._release_later(slot, fut)

    async def run_short(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        """`run` for a read that is usually short: on the calling thread (the event loop's)
        within INLINE_BUDGET_S, else on a reader thread (see the module's docstring). fn
        may run twice: it must only read."""
        if self._closed:
            raise RuntimeError("the reader pool is closed")
        try:
            key: Any = (fn, args)
            long = key in self._long
        except TypeError:  # arguments that cannot be hashed are not remembered
            key, long = None, False
        inline = self._inline
        if not long and inline.lock.acquire(blocking=False):
            try:
                outcome, value = inline.attempt(fn, args)
            finally:
                inline.lock.release()
            if outcome == "done":
                return cast(T, value)
            if outcome == "long" and key is not None:
                self._long[key] = None
                if len(self._long) > LONG_KEPT:
                    del self._long[next(iter(self._long))]
        return await self.run(fn, *args)

    def _release_later(self, slot: _Slot, fut: asyncio.Future[Any]) -> None:
        # The thread runs jobs in order: a no-op job queued behind the interrupted one
        # completes only after that one has stopped, and then the slot is free again.
        probe: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        probe.add_done_callback(lambda _f: self._free.put_nowait(slot))
        slot.jobs.put((asyncio.get_running_loop(), probe, lambda _c: None, ()))

    async def close(self) -> None:
        self._closed = True
        self._inline.close()
        # Take every slot back (waits for reads in flight), then stop its thread.
        for _ in self._slots:
            slot = await self._free.get()
            slot.jobs.put(_STOP)
            await asyncio.to_thread(slot.thread.join, 10)
