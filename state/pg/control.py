"""A replica's control connection: its identity, its liveness and its wake-ups.

One direct (never pooled: a transaction pooler would break session advisory locks and
LISTEN) autocommit connection with TCP keepalives holds the incarnation's advisory lock
(state/pg/cluster.py reads liveness from `pg_locks`), the leader lock while this replica
leads, and LISTENs on the incarnation's channel. Only `serve()` uses the connection after
`open()`: it waits for notifications in short slices and tries the leader lock between
them, so nothing else ever shares it. Losing the connection means losing the locks: `serve`
opens a new one as a new incarnation and tells its caller.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import AsyncConnection

from ..errors import DatabaseError, StoreConfigError
from ..records import Wakeup
from . import cluster, db

log = logging.getLogger("state.pg.control")

# Keepalives: a partitioned replica's connection (and so its locks) ends within about
# idle + interval * count seconds, on both sides: libpq's for the replica's end, the same
# figures as the session's settings for the server's (whose own default is the kernel's,
# two hours), so a replica whose host froze or was cut off loses its leases in about 11 s.
# (A replica stopped on a live host keeps them: its kernel still answers the probes.)
KEEPALIVES: dict[str, Any] = {  # libpq connection parameters, passed to connect()
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 11000,
}
SERVER_KEEPALIVES = (
    "SELECT "
    + ", ".join(
        f"set_config('tcp_{name}', '{KEEPALIVES[name]}', false)"
        for name in ("keepalives_idle", "keepalives_interval", "keepalives_count")
    )
    + f", set_config('tcp_user_timeout', '{KEEPALIVES['tcp_user_timeout']}', false)"
)


# the rejoin after a lost control connection is tried at once, then with a backoff to this
# cap: the replica takes no message meanwhile, so its pause is the outage's tail
REJOIN_FIRST_S, REJOIN_MAX_S = 0.1, 1.0


def application_name(replica: str) -> str:
    """The control connection's name in pg_stat_activity (operators and tests find a
    replica's lock holder by it)."""
    return f"switchboard-control:{replica}"[:63]


class ReplicaNameTaken(StoreConfigError):
    """A live replica already runs under this name."""


class ControlLink:
    def __init__(self, dsn: str, where: str, name: str) -> None:
        self.dsn = dsn
        self.where = where
        self.name = name
        self.incarnation = 0
        self.space = 0
        self.leading = False
        self.live = 1  # replicas whose control lock is held, this one included (per slice)
        # whether this incarnation's lock is held: False from a lost connection until the
        # rejoin, while nothing may be taken or committed in this incarnation's name
        self.joined = False
        self._conn: AsyncConnection | None = None

    async def open(self) -> None:
        """Connect, register this replica as a new incarnation and take its lock."""
        try:
            conn = await AsyncConnection.connect(
                self.dsn,
                autocommit=True,
                application_name=application_name(self.name),
                **KEEPALIVES,
            )
        except psycopg.Error as exc:
            raise DatabaseError(self.where, f"cannot open the control connection: {exc}") from exc
        try:
            await db.run(conn, SERVER_KEEPALIVES)
            self.space = int(await db.value(conn, "SELECT hashtext(current_schema()) & 2147483647"))
            taken = await db.value(
                conn,
                f"SELECT 1 FROM replicas WHERE name = %(name)s AND incarnation IN ({cluster.LIVE})",
                {"name": self.name, "space": self.space},
            )
            if taken:
                raise ReplicaNameTaken(
                    "cluster.replica_id",
                    f"a live replica already runs as {self.name!r}; give each its own name",
                )
            incarnation = int(await db.value(conn, "SELECT nextval('replica_incarnations')"))
            await db.run(conn, "SELECT pg_advisory_lock(%s, %s)", (self.space, incarnation))
            await db.run(
                conn,
                "INSERT INTO replicas (name, incarnation, host, pid, started_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
                "incarnation = excluded.incarnation, host = excluded.host, pid = excluded.pid, "
                "started_at = excluded.started_at",
                (self.name, incarnation, socket.gethostname(), os.getpid(), time.time()),
            )
            await conn.execute(f'LISTEN "{cluster.channel(incarnation)}"'.encode())
        except BaseException:
            await conn.close()
            raise
        self._conn, self.incarnation, self.leading = conn, incarnation, False
        self.joined = True
        log.info("replica %s is incarnation %d", self.name, incarnation)

    async def serve(
        self,
        on_wakeup: Callable[[Wakeup], None],
        on_incarnation: Callable[[int], None],
        *,
        slice_s: float = 1.0,
    ) -> None:
        """Deliver wake-ups and keep trying the leader lock, until cancelled. A lost
        connection is reopened as a new incarnation (`on_incarnation`); meanwhile nothing
        leads here."""
        while True:
            try:
                conn = self._conn
                if conn is None or conn.closed:
                    raise psycopg.OperationalError("the control connection is closed")
                if not self.leading:
                    self.leading = bool(
                        await db.value(
                            conn,
                            "SELECT pg_try_advisory_lock(%s, %s)",
                            (self.space, cluster.LEADER),
                        )
                    )
                    if self.leading:
                        log.info("replica %s leads (resets, pruning)", self.name)
                self.live = int(
                    await db.value(  # (the leader lock is incarnation 0)
                        conn,
                        f"SELECT count(*) FROM ({cluster.LIVE}) l (n) WHERE n <> {cluster.LEADER}",
                        {"space": self.space},
                    )
                )
                async for note in conn.notifies(timeout=slice_s):
                    kind, _, ref = note.payload.partition(":")
                    on_wakeup(Wakeup(kind, ref))
            except asyncio.CancelledError:
                raise
            except psycopg.Error as exc:
                self.leading = self.joined = False
                log.error("control connection lost (%s); rejoining as a new incarnation", exc)
                await self._close_conn()
                pause, said = REJOIN_FIRST_S, False
                while True:
                    try:
                        await self.open()
                        break
                    except (DatabaseError, psycopg.Error) as again:
                        if not said:  # once per outage, not once per try
                            log.warning("control connection: %s; retrying", again)
                            said = True
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, REJOIN_MAX_S)
                on_incarnation(self.incarnation)

    async def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except psycopg.Error:
                pass

    async def close(self) -> None:
        """Closing the connection frees the replica and leader locks at once."""
        self.leading = self.joined = False
        await self._close_conn()
