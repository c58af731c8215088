"""`PgStore`: the PostgreSQL implementation of `state.api.Store`.

It owns one group-commit writer (state/pg/writer.py, one connection) and a read pool. The
class is composed of one part per area, each defined in the module holding that area's SQL
(`SessionOps` in sessions.py, `InboxOps` in turns.py, `ClusterOps` in cluster.py, ...),
all running their functions through `Dispatch` (dispatch.py). It does not implement
`Maintenance`: PostgreSQL runs its own VACUUM and has no WAL file for the store to
checkpoint, so callers see the capability as absent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
from psycopg import AsyncConnection

from ..errors import DatabaseError
from ..history import HistoryWindows
from ..records import WriteStats
from . import appends as _appends  # noqa: F401  (registers the writer's merged appends)
from . import db, schema, search
from .admin import AdminOps
from .cluster import ClusterOps
from .control import ControlLink
from .dashboard import DashboardOps
from .lineage import LineageOps
from .listing import ListingOps
from .messages import MessageOps
from .outbox import OutboxOps
from .pairing import PairingOps
from .readers import CONNECT_TIMEOUT_S, ReadPool
from .replies import ReplyOps
from .routing import RoutingOps
from .search import SearchOps
from .sends import SendOps
from .sessions import SessionOps
from .shards import ShardOps
from .takeover import TakeoverOps
from .transfer import TransferOps
from .turns import InboxOps
from .usage import UsageOps
from .windows import WriterConnection
from .writer import PgWriter, PgWriterConfig


def redact(dsn: str) -> str:
    """The DSN without its password, for error messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "the PostgreSQL DSN"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in info.items())


class PgStore(
    SessionOps,
    UsageOps,
    MessageOps,
    LineageOps,
    ListingOps,
    RoutingOps,
    AdminOps,
    InboxOps,
    ReplyOps,
    OutboxOps,
    ClusterOps,
    TakeoverOps,
    ShardOps,
    PairingOps,
    SendOps,
    TransferOps,
    SearchOps,
    DashboardOps,
):
    """Async session store on one PostgreSQL database. Create with `await PgStore.open(dsn)`
    (or `state.open_store` with `state.backend: postgres`). Each operation is a method of
    the part of its area, beside the SQL it runs; this class opens and closes the
    connections."""

    backend = "postgres"
    _writer: PgWriter  # the parts see only its `submit` (dispatch.Submits)

    def __init__(self, where: str, writer: PgWriter, pool: ReadPool, dsn: str = "") -> None:
        self.where = where
        self._dsn = dsn
        self._writer = writer
        self._posted: set[asyncio.Task[None]] = set()  # mark_reply_soon's writes
        self._pool = pool
        self._totals = search.Totals()
        self._closed = False

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        config: PgWriterConfig | None = None,
        readers: int = 4,
        schema_target: int = schema.LATEST,
    ) -> PgStore:
        where = redact(dsn)

        async def connect() -> AsyncConnection:
            # the writer's: it keeps the history windows (state/pg/windows.py)
            conn = await WriterConnection.connect(
                dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
            )
            conn.windows = HistoryWindows()
            db.go_direct(conn)  # its statements go through libpq directly
            db.binary_lists(conn)
            await db.generic_plans(conn)
            return conn

        try:
            conn = await connect()
        except psycopg.Error as exc:
            raise DatabaseError(where, f"cannot connect: {exc}") from exc
        try:
            await schema.migrate(conn, where, target=schema_target)
        except BaseException:
            await conn.close()
            raise
        writer = PgWriter(connect, where, config)
        await writer.start(conn)

        async def reader() -> AsyncConnection:
            conn = await db.LoopConnection.connect(
                dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
            )
            await db.configure(conn)
            return conn

        pool = ReadPool(reader, where, size=readers)
        try:
            await pool.open()
        except BaseException:
            await writer.close()
            raise
        return cls(where, writer, pool, dsn)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._posted:
            await asyncio.gather(*self._posted, return_exceptions=True)
        await self._writer.close()
        await self._pool.close()

    async def __aenter__(self) -> PgStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def linger(self, seconds: float) -> None:
        """How long each commit waits, after its first operation, for more to join it."""
        self._writer.linger_s = seconds

    def write_stats(self) -> WriteStats:
        return self._writer.stats.snapshot(self._writer.queue_depth)

    async def catch_up(self, left: Callable[[int], None] | None = None) -> int:
        """Nothing waits: every program writes PostgreSQL through switchboard's store."""
        if left is not None:
            left(0)
        return 0

    def control_link(self, name: str) -> ControlLink:
        """A replica's control connection (not yet open) to this store's database."""
        return ControlLink(self._dsn, self.where, name)
