"""The Hermes facade's direct mode and the base of its parts.

The store's operations run on the calling thread over the facade's own connection
(DirectStore): no event loop and no thread hand-off per call, so sequential calls cost what
the SQL costs. `Facade` is what the facade's parts (facade_*.py) share.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Self, TypeVar, TypeVarTuple, Unpack, cast

from ..sqlite import compaction, schema, store
from ..sqlite import writer as writer_mod
from ..sqlite.connection import translate_error
from ..sqlite.settings import WriterConfig
from ..titles import MAX_TITLE_LENGTH, clean_title
from . import (
    foreign,  # noqa: F401 - registers the catch-up before every write
)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
# Merging the search indexes at close, paid for by the writes made (compaction.py): about
# what keeps an index written one message per transaction compact.
MERGE_PAGES_PER_WRITE = 2


class Suspended(RuntimeError):
    """A store coroutine waited on something; the direct mode cannot run it."""


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a store coroutine to completion on this thread. Under DirectStore nothing it
    awaits ever suspends, so one send() finishes it: no event loop, no thread hand-off."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return cast(T, stop.value)
    coro.close()
    raise Suspended("a store operation waited on an event loop")


class DirectExclusive:
    """The writer's `exclusive` for DirectStore: outside any transaction, on its conn."""

    def __init__(self, direct: DirectStore) -> None:
        self._direct = direct

    async def exclusive(self, fn: Callable[..., T], *args: Any) -> T:
        with self._direct.lock:
            return fn(self._direct.conn, *args)


class DirectStore(store.SessionDB):
    """The async store's operations run on the calling thread over one connection.

    The store's methods hand SQL functions to `_read`/`_write`; here those run at once (a
    write in its own IMMEDIATE transaction) under a lock, so a sequential caller pays no
    thread hand-offs. Other processes and the daemon share the file through SQLite's locks.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection, read_only: bool = False) -> None:  # noqa: D107
        self.path = path
        self.conn = conn
        self.lock = threading.RLock()
        self._closed = False
        self._read_only = read_only
        self.writes = 0  # write transactions committed: they pay for merging at close
        self._writer = DirectExclusive(self)  # type: ignore[assignment]
        self._readers = None  # type: ignore[assignment]

    async def _read(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        with self.lock:
            return fn(self.conn, *args)

    _read_short = _read

    async def _write(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        with self.lock:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                writer_mod.before_batch(conn)
                result = fn(conn, *args)
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                translated = translate_error(exc, str(self.path))
                if translated is exc:
                    raise
                raise translated from exc
            conn.execute("COMMIT")
            self.writes += 1
            return result

    def compact(self) -> int:
        """Merge the search indexes' segments (state/sqlite/compaction.py) for at most
        MERGE_PAGES_PER_WRITE pages per write made since the last call; returns the steps
        taken. A file another process is writing is left as it is."""
        budget, self.writes = self.writes * MERGE_PAGES_PER_WRITE, 0
        steps, tables = 0, None
        with self.lock:
            while budget > 0:
                pages = min(budget, compaction.STEP_PAGES)
                try:
                    done = compaction.run_step(self.conn, tables, pages)
                except sqlite3.Error:
                    return steps  # a damaged index: left to the search index check
                if done is None:
                    return steps
                steps, budget = steps + 1, budget - pages
                tables, worked = done
                if not worked:
                    break
        return steps

    async def close(self) -> None:
        if self._closed:
            return
        if not self._read_only:
            self.compact()
        self._closed = True
        with self.lock:
            self.conn.close()


def open_direct(path: Path, read_only: bool) -> DirectStore:
    if read_only:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        return DirectStore(path, conn, read_only=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    store.check_file(path)
    cfg = WriterConfig()
    conn = store.open_and_migrate(str(path), cfg, schema.LATEST, cfg.lock_budget_s)
    return DirectStore(path, conn)


class Facade:
    """What every part of the Hermes facade shares: the direct store, its lock, the raw
    connection Hermes callers run their own SQL on, and the ways to run an operation."""

    _db: DirectStore
    _lock: threading.RLock
    _conn: sqlite3.Connection

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return drive(coro)

    def _w(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(conn, *args) in one write transaction."""
        return drive(self._db._write(fn, *args))

    def _r(self, fn: Callable[..., T], *args: Any) -> T:
        return drive(self._db._read(fn, *args))

    def _execute_write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run fn(conn) in one write transaction (Hermes's private helper, used by callers
        that need raw SQL)."""
        return self._w(fn)

    def close(self) -> None:
        if self._db._closed:
            return
        self._conn.close()
        drive(self._db.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _set(self, session_id: str, sql: str, params: tuple[Any, ...]) -> None:
        self._w(lambda c: c.execute(sql, (*params, session_id)))

    @staticmethod
    def sanitize_title(title: str | None) -> str | None:
        if not title:
            return None
        cleaned = clean_title(title)
        if not cleaned:
            return None
        if len(cleaned) > MAX_TITLE_LENGTH:
            raise ValueError(f"Title too long ({len(cleaned)} chars, max {MAX_TITLE_LENGTH})")
        return cleaned
