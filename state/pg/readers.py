"""The reader connections: up to `size` autocommit connections, opened on demand and kept
while they work. A read either gets a connection within `wait_s` or fails at once with a
DatabaseError, so a request never waits for the server to come back: while it is away,
one connect is tried at most every `retry_s` (the reads in between fail without trying),
and the first read after it returns opens a connection again.

(psycopg_pool's pool makes a waiting read wait out its reconnect backoff, which doubles to
a minute and more: a daemon held requests for the whole outage and answered again up to
12 s after the server was back.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus

from ..errors import DatabaseError, StoreUnavailable

log = logging.getLogger("state.pg.readers")

# libpq's connect_timeout (whole seconds, 2 at least) for the connections a request waits
# on: a server that does not answer a connect within it is away, and the request is
# answered "try again" instead of held
CONNECT_TIMEOUT_S = 2


class ReadPool:
    """Reader connections for one database; `connection()` lends one."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[AsyncConnection]],
        where: str,
        *,
        size: int = 4,
        wait_s: float = 2.0,
        retry_s: float = 0.5,
        max_idle_s: float = 300.0,
        max_lifetime_s: float = 3600.0,
    ) -> None:
        self.where = where
        self.size = size
        self.wait_s = wait_s
        self.retry_s = retry_s
        self.max_idle_s = max_idle_s
        self.max_lifetime_s = max_lifetime_s
        self._connect = connect
        self._free = asyncio.Semaphore(size)
        self._idle: deque[tuple[AsyncConnection, float, float]] = deque()  # conn, born, used
        self._down_since: float | None = None
        self._next_try = 0.0
        self._last_error = ""
        self._closed = False

    async def open(self) -> None:
        """Open the first connection now, so a bad DSN fails at start-up."""
        conn = await self._new()
        now = time.monotonic()
        self._idle.append((conn, now, now))

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        if self._closed:
            raise DatabaseError(self.where, "the store is closed")
        try:
            if self._free.locked():  # wait_for runs the acquire as a task of its own
                await asyncio.wait_for(self._free.acquire(), self.wait_s)
            else:
                await self._free.acquire()  # a free connection: taken at once
        except TimeoutError:
            raise StoreUnavailable(
                self.where, f"no reader connection free within {self.wait_s:g} s"
            ) from None
        try:
            conn, born = await self._take()
            try:
                yield conn
            finally:
                self._give_back(conn, born)
        finally:
            self._free.release()

    async def _take(self) -> tuple[AsyncConnection, float]:
        now = time.monotonic()
        while self._idle:
            conn, born, used = self._idle.pop()
            if conn.closed or now - used > self.max_idle_s or now - born > self.max_lifetime_s:
                await _close(conn)
                continue
            return conn, born
        return await self._new(), now

    async def _new(self) -> AsyncConnection:
        now = time.monotonic()
        if self._down_since is not None and now < self._next_try:
            raise StoreUnavailable(self.where, f"the database is unreachable ({self._last_error})")
        try:
            conn = await self._connect()
        except psycopg.Error as exc:
            if self._down_since is None:
                self._down_since = now
                log.warning(
                    "%s: cannot open a reader connection (%s); reads fail until it "
                    "answers (a connect tried every %g s)",
                    self.where,
                    exc,
                    self.retry_s,
                )
            self._next_try = now + self.retry_s
            self._last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StoreUnavailable(
                self.where, f"the database is unreachable ({self._last_error})"
            ) from exc
        if self._down_since is not None:
            log.info(
                "%s: reader connections open again after %.1f s", self.where, now - self._down_since
            )
            self._down_since = None
        return conn

    def discard_idle(self) -> None:
        """Close every idle connection: one failed as if the server went away (a restart
        ends every session at once), so the others are as good as gone."""
        while self._idle:
            self._closing(self._idle.pop()[0])

    def _give_back(self, conn: AsyncConnection, born: float) -> None:
        # a connection that broke, or that a failed read left inside a transaction, is not
        # lent again; the others are (the newest first: the oldest ones go idle and close)
        if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE or self._closed:
            self._closing(conn)
            return
        self._idle.append((conn, born, time.monotonic()))

    def _closing(self, conn: AsyncConnection) -> None:
        if not conn.closed:
            task = asyncio.get_running_loop().create_task(
                _close(conn), name="state.pg.readers.close"
            )
            _CLOSING.add(task)
            task.add_done_callback(_CLOSING.discard)

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            await _close(self._idle.pop()[0])
        if _CLOSING:
            await asyncio.gather(*list(_CLOSING), return_exceptions=True)


_CLOSING: set[asyncio.Task[None]] = set()


async def _close(conn: AsyncConnection) -> None:
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()
