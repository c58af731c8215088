"""Read-only connections, each on its own thread, so reads never wait behind the writer.

A read runs a synchronous function against one connection in one thread hop, inside a
deferred transaction so multi-statement reads see one consistent snapshot. A cancelled
caller interrupts its query; the connection goes back to the pool when the query stops.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar, TypeVarTuple, Unpack
from urllib.parse import quote

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
_STOP = object()


def connect_reader(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(
        f"file:{quote(path)}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
    )
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA query_only=1")
    return conn


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
        self._free: asyncio.Queue[_Slot] = asyncio.Queue()
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

    def _release_later(self, slot: _Slot, fut: asyncio.Future[Any]) -> None:
        # The thread runs jobs in order: a no-op job queued behind the interrupted one
        # completes only after that one has stopped, and then the slot is free again.
        probe: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        probe.add_done_callback(lambda _f: self._free.put_nowait(slot))
        slot.jobs.put((asyncio.get_running_loop(), probe, lambda _c: None, ()))

    async def close(self) -> None:
        self._closed = True
        # Take every slot back (waits for reads in flight), then stop its thread.
        for _ in self._slots:
            slot = await self._free.get()
            slot.jobs.put(_STOP)
            await asyncio.to_thread(slot.thread.join, 10)
