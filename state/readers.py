"""Read-only connections, each on its own thread, so reads never wait behind the writer.

A read runs a synchronous function against one connection in one thread hop, inside a
deferred transaction so multi-statement reads see one consistent snapshot. A cancelled
caller interrupts its query; the connection goes back to the pool when the query stops.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote

T = TypeVar("T")


class _Slot:
    def __init__(self, index: int) -> None:
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"state-reader-{index}"
        )
        self.conn: sqlite3.Connection | None = None


def connect_reader(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(
        f"file:{quote(path)}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
    )
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA query_only=1")
    return conn


class ReaderPool:
    def __init__(self, path: str, size: int = 3) -> None:
        self.path = path
        self._slots = [_Slot(i) for i in range(size)]
        self._free: asyncio.Queue[_Slot] = asyncio.Queue()
        for slot in self._slots:
            self._free.put_nowait(slot)
        self._closed = False

    def _call(self, slot: _Slot, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        if slot.conn is None:
            slot.conn = connect_reader(self.path)
        conn = slot.conn
        conn.execute("BEGIN")
        try:
            return fn(conn, *args)
        finally:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error:
                pass

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise RuntimeError("the reader pool is closed")
        slot = await self._free.get()
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(slot.executor, self._call, slot, fn, args)
        try:
            result = await asyncio.shield(fut)
        except asyncio.CancelledError:
            if slot.conn is not None:
                slot.conn.interrupt()
            fut.add_done_callback(lambda _f: self._free.put_nowait(slot))
            raise
        except BaseException:
            self._free.put_nowait(slot)
            raise
        self._free.put_nowait(slot)
        return result

    async def close(self) -> None:
        self._closed = True
        # Take every slot back (waits for reads in flight), then close on its own thread.
        for _ in self._slots:
            slot = await self._free.get()
            if slot.conn is not None:
                conn, slot.conn = slot.conn, None
                await asyncio.get_running_loop().run_in_executor(slot.executor, conn.close)
            slot.executor.shutdown(wait=True)
