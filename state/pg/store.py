"""`PgStore`: the PostgreSQL implementation of `state.api.Store`.

It owns one group-commit writer (state/pg/writer.py, one connection) and a read pool, and
only dispatches to the operation modules beside it. It does not implement `Maintenance`:
PostgreSQL runs its own VACUUM and has no WAL file for the store to checkpoint, so callers
see the capability as absent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import IO, Any, TypeVar

import psycopg
from psycopg import AsyncConnection

from ..columns import AUTO_PRUNE_KEY, PRUNE_CHUNK, session_fields
from ..errors import DatabaseError, SessionNotFound, StoreUnavailable, UnstorableData
from ..filters import SessionFilter
from ..history import HistoryWindows
from ..records import (
    Accepted,
    AutoPruneResult,
    BeginPlan,
    ExportRecord,
    Fence,
    HandoffClaim,
    ImportReport,
    InboxEntry,
    LiveSession,
    MessageRow,
    Period,
    Release,
    SearchHit,
    SessionRow,
    StoredReply,
    UnsentReply,
    UntoldReset,
    UsageStats,
    WriteStats,
)
from ..rows import Row, payload_of
from ..sqlite import search as sqlite_search
from . import (
    admin,
    cluster,
    dashboard,
    db,
    inbox,
    lineage,
    messages,
    pairing,
    replies,
    schema,
    search,
    sends,
    sessions,
    shards,
    takeover,
    usage,
)
from . import appends as _appends  # noqa: F401  (registers the writer's merged appends)
from .control import ControlLink
from .readers import CONNECT_TIMEOUT_S, ReadPool
from .windows import WriterConnection
from .writer import PgWriter, PgWriterConfig

log = logging.getLogger("state.pg")

T = TypeVar("T")


def redact(dsn: str) -> str:
    """The DSN without its password, for error messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "the PostgreSQL DSN"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in info.items())


class PgStore:
    """Async session store on one PostgreSQL database. Create with `await PgStore.open(dsn)`
    (or `state.open_store` with `state.backend: postgres`)."""

    backend = "postgres"

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
            conn = await AsyncConnection.connect(
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
        st = self._writer.stats
        return WriteStats(
            queue_depth=self._writer.queue_depth,
            batches=st.batches,
            operations=st.operations,
            failed_operations=st.failed_operations,
            busy_retries=st.busy_retries,
            last_batch_size=st.last_batch_size,
            last_commit_ms=st.last_commit_ms,
            recent_commit_ms=tuple(st.commit_ms),
            recent_batch_sizes=tuple(st.batch_sizes),
        )

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

    # --- sessions -------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        source: str = "cli",
        *,
        model: str | None = None,
        model_config: Mapping[str, Any] | str | None = None,
        system_prompt: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        child_kind: str | None = None,
        title: str | None = None,
        started_at: float | None = None,
        **routing: Any,
    ) -> str:
        fields = session_fields(
            session_id or "",
            source,
            model,
            model_config,
            system_prompt,
            user_id,
            parent_session_id,
            child_kind,
            title,
            started_at,
            routing,
        )
        if not session_id:
            return await self._write(sessions.insert_new_session, fields, source == "cli")
        await self._write(sessions.insert_session, fields)
        return session_id

    async def ensure_session(
        self,
        session_id: str,
        source: str = "cli",
        *,
        model: str | None = None,
        model_config: Mapping[str, Any] | str | None = None,
        system_prompt: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        child_kind: str | None = None,
        **routing: Any,
    ) -> bool:
        fields = session_fields(
            session_id,
            source,
            model,
            model_config,
            system_prompt,
            user_id,
            parent_session_id,
            child_kind,
            None,
            None,
            routing,
        )

        async def write(conn: AsyncConnection) -> bool:
            return await sessions.insert_session(conn, fields, if_missing=True)

        return await self._write(write)

    async def get_session(self, session_id: str) -> SessionRow | None:
        return await self._read(sessions.get_session, session_id)

    async def require_session(self, session_id: str) -> SessionRow:
        row = await self.get_session(session_id)
        if row is None:
            raise SessionNotFound(session_id)
        return row

    async def end_session(self, session_id: str, reason: str, *, now: float | None = None) -> bool:
        return await self._write(sessions.end_session, session_id, reason, now)

    async def reopen_session(self, session_id: str) -> bool:
        return await self._write(sessions.reopen_session, session_id)

    async def resolve_session_id(self, ref: str) -> str:
        return await self._read(sessions.resolve_id, ref)

    async def resolve_session_ref(self, ref: str) -> str:
        return await self._read(sessions.resolve_ref, ref)

    async def update_system_prompt(self, session_id: str, prompt: str | None) -> None:
        await self._write(sessions.update_system_prompt, session_id, prompt)

    async def update_session(self, session_id: str, **fields: Any) -> None:
        await self._write(sessions.update_fields, session_id, fields)

    async def update_token_counts(
        self,
        session_id: str,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated_cost_usd: float | None = None,
        actual_cost_usd: float | None = None,
        absolute: bool = False,
        model: str | None = None,
        api_call_count: int = 0,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        billing_mode: str | None = None,
        cost_status: str | None = None,
        cost_source: str | None = None,
        pricing_version: str | None = None,
    ) -> None:
        counts = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_read_tokens": cache_read_tokens,
            "cache_write_tokens": cache_write_tokens,
            "reasoning_tokens": reasoning_tokens,
        }
        route = {
            "billing_provider": billing_provider,
            "billing_base_url": billing_base_url,
            "billing_mode": billing_mode,
        }
        cost = {
            "cost_status": cost_status,
            "cost_source": cost_source,
            "pricing_version": pricing_version,
        }

        async def write(conn: AsyncConnection) -> None:
            await sessions.require_session(conn, session_id)
            await usage.update_token_counts(
                conn,
                session_id,
                counts,
                model=model,
                estimated_cost_usd=estimated_cost_usd,
                actual_cost_usd=actual_cost_usd,
                api_call_count=api_call_count,
                absolute=absolute,
                route=route,
                cost=cost,
            )

        await self._write(write)

    async def session_count(self, source: str | None = None) -> int:
        return await self._read(sessions.count_sessions, source)

    async def message_count(self, session_id: str | None = None) -> int:
        return await self._read(messages.count_messages, session_id)

    async def stats(self) -> UsageStats:
        return await self._read(admin.stats)

    async def server_status(self) -> dict[str, Any]:
        """The server's version and replication state (state/pg/admin.py), for doctor."""
        return await self._read(admin.server_status)

    # --- messages -------------------------------------------------------------------

    async def append_message(
        self, session_id: str, role: str, content: str | None = None, **fields: Any
    ) -> int:
        bad = [k for k in fields if k not in messages.MESSAGE_FIELDS]
        if bad:
            raise TypeError(f"unknown message field(s): {', '.join(bad)}")
        msg = {"role": role, "content": content, **fields}
        ids = await self._write(messages.append_messages, session_id, (msg,))
        return ids[0]

    async def append_messages(
        self,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        dedupe: tuple[str, str] | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> list[int]:
        tokens = None
        if input_tokens or output_tokens:
            tokens = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        return await self._write(messages.append_messages, session_id, list(batch), dedupe, tokens)

    async def append_and_read(
        self,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        dedupe: tuple[str, str] | None = None,
        last: int | None = None,
    ) -> tuple[list[int], list[dict[str, Any]]]:
        return await self._write(messages.append_and_read, session_id, list(batch), dedupe, last)

    async def get_messages(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        after_id: int | None = None,
        last: int | None = None,
    ) -> list[MessageRow]:
        async def read(conn: AsyncConnection) -> list[MessageRow]:
            return await messages.get_messages(
                conn, session_id, limit=limit, after_id=after_id, last=last
            )

        return await self._read(read)

    async def get_messages_around(
        self, session_id: str, message_id: int, window: int = 5
    ) -> list[MessageRow]:
        return await self._read(messages.get_messages_around, session_id, message_id, window)

    async def get_messages_as_conversation(
        self, session_id: str, *, include_ancestors: bool = False, last: int | None = None
    ) -> list[dict[str, Any]]:
        return await self._read(lineage.conversation, session_id, include_ancestors, last)

    async def count_messages_outside(
        self, session_id: str, first_id: int, last_id: int
    ) -> tuple[int, int]:
        return await self._read(messages.count_outside, session_id, first_id, last_id)

    async def clear_messages(self, session_id: str) -> int:
        return await self._write(messages.clear_messages, session_id)

    async def has_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> bool:
        return await self._read(messages.is_stored, source, chat_id, platform_message_id)

    async def reply_to_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> StoredReply | None:
        return await self._read(replies.reply_to, source, chat_id, platform_message_id)

    # --- titles ---------------------------------------------------------------------

    async def set_session_title(self, session_id: str, title: str | None) -> str | None:
        return await self._write(sessions.set_title, session_id, title)

    async def set_title_if_unset(self, session_id: str, title: str) -> str | None:
        return await self._write(sessions.set_title_if_unset, session_id, title)

    async def get_session_title(self, session_id: str) -> str | None:
        row = await self.get_session(session_id)
        return None if row is None else row.get("title")

    async def get_session_by_title(self, title: str) -> SessionRow | None:
        return await self._read(sessions.get_by_title, title)

    async def resolve_session_by_title(self, title: str) -> str | None:
        return await self._read(sessions.resolve_title, title)

    async def get_next_title_in_lineage(self, title: str) -> str:
        return await self._read(sessions.next_title_in_lineage, title)

    # --- lineage --------------------------------------------------------------------

    async def get_ancestors(self, session_id: str) -> list[SessionRow]:
        return await self._read(lineage.ancestors, session_id)

    async def get_descendants(self, session_id: str) -> list[SessionRow]:
        return await self._read(lineage.descendants, session_id)

    async def get_children(self, session_id: str, kind: str | None = None) -> list[SessionRow]:
        return await self._read(lineage.children, session_id, kind)

    async def get_compression_tip(self, session_id: str) -> str:
        return await self._read(lineage.compression_tip, session_id)

    async def resolve_resume_session_id(self, session_id: str) -> str:
        return await self._read(lineage.compression_tip, session_id)

    async def fork_session(
        self,
        parent_id: str,
        kind: str,
        *,
        new_id: str | None = None,
        title: str | None = None,
        copy_messages: bool = False,
        seed_messages: Iterable[Mapping[str, Any]] = (),
        end_reason: str | None = None,
        **routing: Any,
    ) -> str:
        return await self._write(
            lineage.fork,
            parent_id,
            kind,
            new_id,
            title,
            copy_messages,
            list(seed_messages),
            end_reason,
            routing,
        )

    async def count_dangling_parents(self) -> int:
        return await self._read(admin.count_dangling_parents)

    async def clear_dangling_parents(self) -> int:
        return await self._write(admin.clear_dangling_parents)

    # --- listings -------------------------------------------------------------------

    async def list_sessions(
        self,
        source: str | None = None,
        *,
        exclude_sources: Iterable[str] = (),
        user_id: str | None = None,
        chat_id: str | None = None,
        include_children: bool = False,
        include_archived: bool = False,
        titled_only: bool = False,
        limit: int = 20,
        offset: int = 0,
    ) -> list[SessionRow]:
        flt = SessionFilter(
            source=source,
            exclude_sources=tuple(exclude_sources),
            user_id=user_id,
            chat_id=chat_id,
            include_children=include_children,
            include_archived=include_archived,
            titled_only=titled_only,
        )
        return await self._read(admin.list_sessions, flt, limit, offset)

    async def sessions_by_start(
        self, source: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]:
        return await self._read(admin.sessions_by_start, source, limit, offset)

    async def resolve_in_scope(self, ref: str, flt: SessionFilter) -> str | None:
        return await self._read(admin.resolve_in_scope, ref, flt)

    async def list_filtered(
        self, flt: SessionFilter, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]:
        return await self._read(admin.list_sessions, flt, limit, offset)

    async def count_filtered(self, flt: SessionFilter) -> int:
        return await self._read(admin.count_filtered, flt)

    # --- handoff and the gateway's session index --------------------------------------

    async def request_handoff(
        self, session_id: str, platform: str, *, now: float | None = None
    ) -> bool:
        return await self._write(
            sessions.request_handoff, session_id, platform, time.time() if now is None else now
        )

    async def claim_handoff(
        self, platforms: Iterable[str], *, now: float | None = None
    ) -> HandoffClaim | None:
        """Atomically take the oldest pending handoff for one of `platforms`: of any number
        of daemons sharing the database, one wins (state/pg/sessions.py, `_CLAIM`)."""
        wanted = list(platforms)
        if not wanted:
            return None
        return await self._write(
            sessions.claim_handoff, wanted, time.time() if now is None else now
        )

    async def finish_handoff(
        self,
        session_id: str,
        state: str | None,
        error: str | None = None,
        *,
        expect: str | None = None,
    ) -> bool:
        return await self._write(sessions.finish_handoff, session_id, state, error, expect)

    async def fail_stale_handoffs(
        self, older_than_s: float, *, now: float | None = None
    ) -> list[str]:
        return await self._write(
            sessions.fail_stale_handoffs, older_than_s, time.time() if now is None else now
        )

    async def live_sessions_by_key(self) -> list[LiveSession]:
        return await self._read(sessions.live_sessions_by_key)

    async def live_session_for_key(self, key: str) -> LiveSession | None:
        return await self._read(sessions.live_session_for_key, key)

    async def newest_live_session_by_key(self) -> dict[str, str]:
        return await self._read(sessions.newest_live_session_by_key)

    async def session_states(self, ids: list[str]) -> dict[str, tuple[float | None, str | None]]:
        return await self._read(sessions.session_states, ids)

    async def untold_resets(self) -> list[UntoldReset]:
        return await self._read(sessions.untold_resets)

    # --- delete, prune, meta, schema ------------------------------------------------

    async def delete_session(self, session_id: str) -> None:
        await self._write(admin.delete_session, session_id)

    async def prune_sessions(
        self,
        older_than_days: float = 90,
        source: str | None = None,
        *,
        now: float | None = None,
        protected: Iterable[str] = (),
    ) -> int:
        at = time.time() if now is None else now
        keep = frozenset(protected)
        total = 0
        while True:
            n = await self._write(admin.prune_chunk, older_than_days, source, at, keep)
            total += n
            if n < PRUNE_CHUNK:
                return total

    async def prune_candidates(
        self,
        older_than_days: float,
        source: str | None = None,
        *,
        now: float | None = None,
        limit: int = 1000,
    ) -> list[str]:
        at = time.time() if now is None else now
        return await self._read(admin.prune_candidates, older_than_days, source, at, limit)

    async def maybe_auto_prune_and_vacuum(
        self,
        retention_days: float = 90,
        min_interval_hours: float = 24,
        vacuum: bool = True,
        *,
        now: float | None = None,
        min_vacuum_bytes: int = 8 * 1024 * 1024,
        min_vacuum_share: float = 0.2,
    ) -> AutoPruneResult:
        """Prune at most once per interval across every process, then (if it pruned and
        `vacuum`) a plain VACUUM of the pruned tables. Unlike SQLite's, it rewrites nothing
        and blocks no writer, so it needs no size threshold: the `min_vacuum_*` arguments
        are SQLite's and ignored here."""
        at = time.time() if now is None else now
        due = await self._write(
            admin.claim_meta_stamp, AUTO_PRUNE_KEY, min_interval_hours * 3600, at
        )
        if not due:
            return {"ran": False, "pruned": 0, "vacuumed": False}
        pruned = await self.prune_sessions(retention_days, now=at)
        if vacuum and pruned:
            await self._read(admin.vacuum_pruned)
        return {"ran": True, "pruned": pruned, "vacuumed": bool(vacuum and pruned)}

    # --- the inbox (state/pg/inbox.py) ---------------------------------------------------

    async def accept_inbound(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        *,
        session_key: str | None = None,
        replica: int | None = None,
    ) -> tuple[int, str, bool]:
        """Commit an inbound message before its platform is acknowledged: (inbox id, state,
        whether it is new). A platform id taken before returns that row, storing nothing.
        Any failure is a DatabaseError, so the gateway can refuse the message cleanly.
        Replicas record the message's session key and which replica took it."""
        try:
            return await self._write(
                inbox.accept,
                platform,
                chat_id,
                platform_message_id,
                payload_of(payload),
                time.time(),
                session_key,
                replica,
            )
        except psycopg.Error as exc:  # e.g. a NUL in an id, which PostgreSQL text refuses
            raise DatabaseError(self.where, f"the inbox refused the message: {exc}") from exc

    async def accept_and_take(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        *,
        session_key: str,
        me: int,
        space: int,
        begin: BeginPlan | None = None,
    ) -> Accepted:
        """`accept_inbound` for replica `me` and, when the row is new, `take_lease` on
        `session_key` in one transaction: (inbox id, state, new, the route as take_lease
        returns it, or None when the row is not new or a live replica holds the key, and
        the turn's begin when `begin` asked for it and its test allowed it)."""
        try:
            return await self._write(
                cluster.accept_take,
                platform,
                chat_id,
                platform_message_id,
                payload_of(payload),
                time.time(),
                session_key,
                me,
                space,
                begin,
            )
        except psycopg.Error as exc:
            raise DatabaseError(self.where, f"the inbox refused the message: {exc}") from exc

    async def accept_and_begin(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        session_id: str,
        message: Mapping[str, Any],
        *,
        last: int | None = None,
    ) -> tuple[int, str, bool, tuple[int, list[dict[str, Any]]] | None]:
        """`accept_inbound` and, when the row is new, `begin_turn` in one transaction."""
        try:
            return await self._write(
                inbox.accept_begin,
                platform,
                chat_id,
                platform_message_id,
                payload_of(payload),
                time.time(),
                session_id,
                dict(message),
                last,
            )
        except psycopg.Error as exc:
            raise DatabaseError(self.where, f"the inbox refused the message: {exc}") from exc

    async def begin_turn(
        self,
        inbox_id: int,
        session_id: str,
        message: Mapping[str, Any],
        *,
        last: int | None = None,
        fence: Fence | None = None,
    ) -> tuple[int, list[dict[str, Any]]]:
        """The user's message into its session (once), the row `started`, and the newest
        `last` messages up to it in OpenAI chat format: (the message's id, the history).
        With a fence: only while that lease holds (else LeaseLost, nothing written)."""
        if fence is not None:
            return await self._write(
                cluster.turn_write_fenced,
                fence,
                inbox.BEGIN,
                (inbox_id, session_id, dict(message), last),
                None,
            )
        return await self._write(inbox.begin_turn, inbox_id, session_id, dict(message), last)

    async def end_turn(
        self,
        inbox_id: int,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        reply_state: str = "ready",
        fence: Fence | None = None,
        release: Release | None = None,
    ) -> list[int]:
        """The reply into the session, the row `answered` and the reply in the outbox as
        `reply_state`, in one transaction; with a fence, only while that lease holds, and
        with `release` (the route as left, the rows answered for other replicas) the lease
        freed in the same commit, as release_lease would."""
        tokens = None
        if input_tokens or output_tokens:
            tokens = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        if fence is not None:
            return await self._write(
                cluster.turn_write_fenced,
                fence,
                inbox.END,
                (inbox_id, session_id, list(batch), tokens, reply_state),
                release,
            )
        if release is not None:
            raise ValueError("a lease can only be freed by a fenced write")
        return await self._write(
            inbox.end_turn, inbox_id, session_id, list(batch), tokens, reply_state
        )

    async def mark_reply(self, inbox_id: int, reply_state: str, ref: str | None = None) -> None:
        await self._write(inbox.mark_reply, inbox_id, reply_state, ref)

    def mark_reply_soon(self, inbox_id: int, reply_state: str, ref: str | None = None) -> None:
        """`mark_reply` without waiting: a task of the store's own, awaited at close."""
        task = asyncio.get_running_loop().create_task(self._mark_logged(inbox_id, reply_state, ref))
        self._posted.add(task)
        task.add_done_callback(self._posted.discard)

    async def _mark_logged(self, inbox_id: int, reply_state: str, ref: str | None) -> None:
        try:
            await self.mark_reply(inbox_id, reply_state, ref)
        except Exception as exc:  # the row stays unconfirmed: counted at the next start
            log.warning("inbox row %d: the reply's fate could not be stored (%s)", inbox_id, exc)

    async def unsent_replies(self) -> list[dict[str, Any]]:
        return await self._read(inbox.unsent_replies)

    async def finish_inbound(
        self, inbox_id: int, state: str, reason: str | None = None, *, fence: Fence | None = None
    ) -> None:
        """Close an inbox row without an agent reply (a command answered, or dropped)."""
        if fence is not None:
            await self._write(cluster.finish_fenced, fence, inbox_id, state, reason)
            return
        await self._write(inbox.finish, inbox_id, state, reason)

    # --- several replicas (state/pg/cluster.py) -------------------------------------------

    async def take_lease(self, key: str, me: int, space: int) -> dict[str, Any] | None:
        return await self._write(cluster.take_lease, key, me, space)

    async def release_lease(
        self,
        fence: Fence,
        route: Mapping[str, Any] | None,
        answered: Sequence[tuple[int, int]] = (),
    ) -> bool:
        return await self._write(cluster.release_lease, fence, route, list(answered))

    async def open_for_key(self, key: str) -> list[dict[str, Any]]:
        return await self._read(cluster.open_for_key, key)

    async def routes(self, space: int) -> list[dict[str, Any]]:
        return await self._read(cluster.routes, space)

    async def live_jobs(self, space: int) -> list[tuple[str, str]]:
        return await self._read(cluster.live_jobs, space)

    async def add_job(self, session_id: str, name: str, owner: int) -> None:
        await self._write(cluster.add_job, session_id, name, owner, time.time())

    async def drop_job(self, session_id: str, name: str) -> None:
        await self._write(cluster.drop_job, session_id, name)

    async def orphaned_inbound(self, space: int, me: int | None = None) -> list[InboxEntry]:
        return await self._read(takeover.orphans, space, me)

    async def orphaned_replies(self, space: int) -> list[UnsentReply]:
        return await self._read(takeover.orphan_replies, space)

    async def claim_orphaned_reply(self, space: int, inbox_id: int, me: int) -> bool:
        return await self._write(takeover.claim_reply, space, inbox_id, me)

    async def lease_holds(self, fence: Fence) -> bool:
        return await self._read(cluster.lease_holds, fence)

    async def inbox_states(self, ids: Sequence[int]) -> dict[int, str]:
        return await self._read(cluster.row_states, ids)

    async def cluster_report(self) -> dict[str, int]:
        return await self._read(takeover.report)

    async def claim_shards(
        self, platform: str, count: int, me: int, space: int, every_s: float
    ) -> tuple[dict[int, int], int]:
        """The shards `me` owns after its claim (id -> epoch), and how many to hand over."""
        return await self._write(shards.claim, platform, count, me, space, every_s)

    async def release_shards(
        self, platform: str, count: int, me: int, owned: Mapping[int, int]
    ) -> int:
        return await self._write(shards.release, platform, count, me, owned)

    def control_link(self, name: str) -> ControlLink:
        """A replica's control connection (not yet open) to this store's database."""
        return ControlLink(self._dsn, self.where, name)

    async def open_inbound(self) -> list[dict[str, Any]]:
        """Rows a crash left `received`/`started`, oldest first."""
        return await self._read(inbox.open_rows)

    async def inbox_counts(self) -> dict[str, int]:
        return await self._read(inbox.counts)

    async def prune_inbox(self, older_than: float) -> int:
        """Forget closed inbox rows last touched before `older_than` (never a message)."""
        return await self._write(inbox.prune, older_than)

    # --- DM pairing (state/pg/pairing.py) --------------------------------------------

    async def pairing_offer(
        self,
        platform: str,
        user_id: str,
        user_name: str | None,
        chat_id: str,
        code: str,
        *,
        now: float,
        ttl_s: float,
        user_interval_s: float,
        max_pending: int,
    ) -> str | None:
        return await self._write(
            pairing.offer,
            platform,
            user_id,
            user_name,
            chat_id,
            code,
            now,
            ttl_s,
            user_interval_s,
            max_pending,
        )

    async def pairing_decide(self, code: str, state: str, now: float) -> dict[str, Any] | None:
        return await self._write(pairing.decide, code, state, now)

    async def pairing_revoke(self, platform: str, user_id: str, now: float) -> bool:
        return await self._write(pairing.revoke, platform, user_id, now)

    async def pairing_approved(self, platform: str, user_id: str) -> bool:
        return await self._read(pairing.approved, platform, user_id)

    async def pairing_list(self, now: float) -> list[dict[str, Any]]:
        return await self._read(pairing.listing, now)

    # --- the outbox of one-off sends (state/sqlite/sends.py) -----------------------------------

    async def send_add(
        self, platform: str, chat_id: str, thread_id: str | None, text: str, now: float
    ) -> int:
        """A one-off message, stored `pending` before it is sent; its row id."""
        return await self._write(sends.add, platform, chat_id, thread_id, text, now)

    async def send_finish(
        self, send_id: int, state: str, error: str | None, message_ids: Sequence[str], now: float
    ) -> None:
        await self._write(sends.finish, send_id, state, error, message_ids, now)

    async def sends_claim_due(
        self, before: float, now: float, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Take pending sends last tried before `before` (stamped `now`) to try again."""
        return await self._write(sends.claim_due, before, now, limit)

    async def sends_pending(self) -> int:
        return await self._read(sends.pending_count)

    async def get_meta(self, key: str) -> str | None:
        return await self._read(admin.get_meta, key)

    async def set_meta(self, key: str, value: str | None) -> None:
        await self._write(admin.set_meta, key, value)

    async def schema_version(self) -> int:
        return await self._read(schema.current_version)

    def latest_schema_version(self) -> int:
        return schema.LATEST

    async def catch_up(self) -> int:
        """Nothing waits: every program writes PostgreSQL through switchboard's store."""
        return 0

    # --- export / import, search -----------------------------------------------------

    async def export_session(self, session_id: str) -> ExportRecord:
        page = await self._read(admin.export_page, None, 1, None, [session_id])
        if not page:
            raise SessionNotFound(session_id)
        return page[0]

    async def export_all(
        self,
        source: str | None = None,
        *,
        session_ids: list[str] | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[ExportRecord]:
        after: tuple[float, str] | None = None
        while True:
            page = await self._read(admin.export_page, after, page_size, source, session_ids)
            for rec in page:
                yield rec
            if len(page) < page_size:
                return
            last = page[-1]["session"]
            after = (last["started_at"], last["id"])

    async def write_jsonl(self, fh: IO[str], **kwargs: Any) -> int:
        n = 0
        async for rec in self.export_all(**kwargs):
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
        return n

    async def import_records(
        self, records: Iterable[Mapping[str, Any]], *, batch: int = 100
    ) -> ImportReport:
        report = ImportReport()
        pending: list[Mapping[str, Any]] = []
        ids: list[str] = []

        async def flush() -> None:
            if pending:
                chunk = list(pending)
                pending.clear()
                await self._write(admin.import_records, chunk, report)

        for rec in records:
            rec = report.storable(rec)
            pending.append(rec)
            sess = rec.get("session") if isinstance(rec, Mapping) else None
            if isinstance(sess, Mapping) and isinstance(sess.get("id"), str):
                ids.append(sess["id"])
            if len(pending) >= batch:
                await flush()
        await flush()
        for i in range(0, len(ids), 500):
            await self._write(admin.orphan_dangling, ids[i : i + 500])
        return report

    async def search_messages(
        self,
        query: str,
        *,
        sources: Iterable[str] = (),
        exclude_sources: Iterable[str] = (),
        roles: Iterable[str] = (),
        scope: SessionFilter | None = None,
        exclude_session_ids: Iterable[str] = (),
        sort: str = "relevance",
        limit: int = 20,
        offset: int = 0,
    ) -> list[SearchHit]:
        req = sqlite_search.SearchRequest(
            query=query,
            sources=tuple(sources),
            exclude_sources=tuple(exclude_sources),
            roles=tuple(roles),
            scope=scope or SessionFilter(include_children=True),
            exclude_session_ids=tuple(exclude_session_ids),
            sort=sort,
            limit=limit,
            offset=offset,
        )
        return await self._read(search.search, req, self._totals)

    # --- the dashboard's queries (state/pg/dashboard.py) ----------------------------------

    async def session_page(self, q: Any) -> tuple[list[Row], tuple[float, str] | None]:
        """One keyset page of sessions (a `state.sqlite.keyset.PageQuery`) and the next cursor."""
        return await self._read(dashboard.session_page, q)

    async def lineage_tree(self, session_id: str) -> Row | None:
        return await self._read(dashboard.lineage_tree, session_id)

    async def count_empty_sessions(self) -> int:
        return await self._read(dashboard.count_empty)

    async def delete_empty_sessions(self, protected: Iterable[str] = ()) -> int:
        """Delete ended sessions that have no messages, a chunk per transaction."""
        keep, total = frozenset(protected), 0
        while True:
            n = await self._write(dashboard.delete_empty_chunk, keep)
            total += n
            if n < PRUNE_CHUNK:
                return total

    async def insights(self, since: float, until: float, source: str | None = None) -> Row:
        """Activity figures for [since, until) (see state/sqlite/insights.py)."""
        return await self._read(dashboard.insights, Period(since, until, source))
