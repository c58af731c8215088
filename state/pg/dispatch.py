"""`Dispatch`: the two doors every operation of PgStore goes through.

PgStore is composed of one part per area (`SessionOps` in sessions.py, `MessageOps` in
messages.py, `InboxOps` in turns.py, ...), each beside the SQL it runs. A part hands a
coroutine function of a connection to `_write` (the group-commit writer: one transaction per
batch, a savepoint per write) or `_read` (a pooled reader connection).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import psycopg

from ..errors import StoreUnavailable, UnstorableData
from .readers import ReadPool

T = TypeVar("T")


class Submits(Protocol):
    """The writer as the parts see it (state/pg/writer.py's PgWriter, which imports the
    history windows and through them the message rules: no import of it here)."""

    async def submit(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...


class Dispatch:
    """What every part of PgStore shares: where it is, the writer, the reader pool."""

    where: str
    _dsn: str
    _writer: Submits
    _pool: ReadPool
    _closed: bool

    async def _read(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run a read on a reader connection. Connections are not pinged before use (a round
        trip per read); a read that meets one the server dropped runs again on a new one."""
        for attempt in (1, 2):
            try:
                async with self._pool.connection() as conn:
                    return await fn(conn, *args)
            except psycopg.OperationalError as exc:
                self._pool.discard_idle()  # gone with it, as a restart ends every session
                if attempt == 2:
                    raise StoreUnavailable(self.where, f"read failed: {exc}") from exc
        raise AssertionError("unreachable")

    async def _write(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        try:
            return await self._writer.submit(fn, *args)
        except (psycopg.DataError, psycopg.errors.ProgramLimitExceeded) as exc:
            # a NUL in text, an id too long for its index: the same write fails every time
            raise UnstorableData(self.where, str(exc)) from exc
