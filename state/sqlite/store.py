"""`SessionDB`: the SQLite implementation of `state.api.Store` (and of `Maintenance`).

It owns one Writer (all writes, group-committed) and a ReaderPool (all reads). The class is
composed of one part per area, each defined in the module holding that area's SQL
(`SessionOps` in sessions.py, `MessageOps` in messages.py, `InboxOps` in inbox.py, ...):
an operation is written once, beside its statements, and keeps the rules in
docs/architecture.md (lineage, titles, end reasons, pruning). Every part runs its
functions through `Dispatch` (dispatch.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import DatabaseBusy, DatabaseError, StateError
from ..hermes import foreign
from ..records import WriteStats
from . import schema, sessions
from .archive import ArchiveOps
from .connection import connect_writer, error_code, is_busy
from .handoffs import HandoffOps
from .inbox import InboxOps
from .keyset import DashboardOps
from .lineage import LineageOps
from .listing import ListingOps
from .maintenance import MaintenanceOps
from .messages import MessageOps
from .outbox import OutboxOps
from .pairing import PairingOps
from .readers import ReaderPool
from .replies import ReplyOps
from .routing import RoutingOps
from .search import SearchOps
from .sends import SendOps
from .sessions import SessionOps
from .settings import WriterConfig
from .transfer import TransferOps
from .usage import UsageOps
from .writer import Writer

SQLITE_HEADER = b"SQLite format 3\x00"

log = logging.getLogger("state.store")


def check_file(path: Path) -> None:
    """Refuse a path that cannot be a state.db (a directory, a file that is not SQLite)."""
    if path.is_dir():
        raise DatabaseError(str(path), "is a directory, not a database file")
    if path.exists() and path.stat().st_size > 0:
        try:
            with path.open("rb") as fh:
                header = fh.read(16)
        except OSError as exc:
            raise DatabaseError(str(path), f"cannot be read: {exc.strerror}") from exc
        if header != SQLITE_HEADER:
            raise DatabaseError(str(path), "is not an SQLite database (bad file header)")


def _database_error(path: str, exc: sqlite3.DatabaseError, what: str) -> DatabaseError:
    """Name the cause a person can act on: permissions read as such, not as damage."""
    if error_code(exc) in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
        return DatabaseError(
            path,
            f"cannot be written ({exc}): switchboard needs write access to state.db, "
            "its -wal and -shm files and the directory holding them",
        )
    return DatabaseError(path, f"{what} ({exc})")


def open_and_migrate(
    path: str,
    cfg: WriterConfig,
    target: int,
    lock_budget_s: float,
    absorb_limit: int | None = None,
) -> sqlite3.Connection:
    deadline = time.monotonic() + lock_budget_s
    while True:
        try:
            conn = connect_writer(path, cfg.synchronous, cfg.busy_timeout_s)
        except sqlite3.DatabaseError as exc:
            raise _database_error(path, exc, "is damaged or not an SQLite database") from exc
        try:
            schema.migrate(conn, path, target=target, absorb_limit=absorb_limit)
            return conn
        except StateError:
            conn.close()
            raise
        except sqlite3.OperationalError as exc:
            conn.close()
            if is_busy(exc) and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            if is_busy(exc):
                raise DatabaseBusy(f"{path}: locked by another process during start-up") from exc
            raise _database_error(path, exc, "cannot be prepared") from exc
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise _database_error(path, exc, "is damaged or not a database") from exc


class SessionDB(
    SessionOps,
    UsageOps,
    MessageOps,
    LineageOps,
    ListingOps,
    HandoffOps,
    RoutingOps,
    MaintenanceOps,
    InboxOps,
    ReplyOps,
    OutboxOps,
    PairingOps,
    SendOps,
    TransferOps,
    SearchOps,
    ArchiveOps,
    DashboardOps,
):
    """Async session store over one state.db. Create with `await SessionDB.open(path)`
    (or `state.open_store`). Each operation is a method of the part of its area, beside
    the SQL it runs; this class opens and closes the file and its connections."""

    backend = "sqlite"

    def __init__(self, path: Path, writer: Writer, readers: ReaderPool) -> None:
        self.path = path
        self._writer = writer
        self._readers = readers
        self._marks: list[tuple[int, str, str | None]] = []  # mark_reply_soon's, unposted
        self._closed = False

    # --- lifecycle ------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        config: WriterConfig | None = None,
        readers: int = 3,
        schema_target: int = schema.LATEST,
        absorb_at_open: int | None = None,
    ) -> SessionDB:
        """`absorb_at_open`: how many messages other programs wrote get their derived values
        (preview, side index) before this returns; None: all of them. A daemon bounds it
        and runs `catch_up` once it serves."""

        def _prepare() -> Path:
            p = Path(path).expanduser().absolute()
            p.parent.mkdir(parents=True, exist_ok=True)
            check_file(p)
            return p

        p = await asyncio.to_thread(_prepare)
        cfg = config or WriterConfig()
        writer = Writer(str(p), cfg)
        try:
            conn = await asyncio.get_running_loop().run_in_executor(
                writer._executor,
                open_and_migrate,
                str(p),
                cfg,
                schema_target,
                cfg.lock_budget_s,
                absorb_at_open,
            )
        except BaseException:
            await writer.close()
            raise
        await writer.start(conn)
        db = cls(p, writer, ReaderPool(str(p), readers))
        try:  # prove the file answers a read before the caller relies on it
            await db._read(sessions.count_sessions)
        except sqlite3.DatabaseError as exc:
            await db.close()
            raise DatabaseError(str(p), f"is damaged: {exc}") from exc
        return db

    async def close(self) -> None:
        """Flush every queued write, then close all connections."""
        if self._closed:
            return
        self._closed = True
        self._post_marks()
        # Readers first: the last connection to close checkpoints and removes the WAL,
        # and only the (read-write) writer connection can do that.
        await self._readers.close()
        await self._writer.close()

    async def catch_up(self, left: Callable[[int], None] | None = None) -> int:
        """Give the rows other programs wrote their derived values, foreign.BATCH_LIMIT (500) per
        write batch, each queued behind the writes already waiting, until none wait. Returns how
        many waited when it began; `left` hears how many still wait before and after each
        batch (rows another program adds meanwhile count too), and 0 at the end."""
        waiting = await self._read(foreign.count_pending)
        if left is not None:
            left(waiting)
        if waiting:
            log.info(
                "indexing %d row(s) other programs wrote, behind this process's writes", waiting
            )
        remaining = waiting
        while handled := await self._write(foreign.absorb):
            if left is None:
                continue
            remaining -= handled
            if remaining <= 0:  # another program wrote more meanwhile: counted again
                remaining = await self._read(foreign.count_pending)
            left(remaining)
        if left is not None:
            left(0)  # absorb found none waiting
        return waiting

    async def __aenter__(self) -> SessionDB:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def writer(self) -> Writer:
        """The SQLite writer itself: for tests and benchmarks of its internals only."""
        return self._writer

    def write_stats(self) -> WriteStats:
        """A snapshot of the write queue and recent commits (no I/O)."""
        return self._writer.stats.snapshot(self._writer.queue_depth)
