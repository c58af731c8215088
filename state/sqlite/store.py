"""`SessionDB`: the SQLite implementation of `state.api.Store` (and of `Maintenance`).

It owns one Writer (all writes, group-committed) and a ReaderPool (all reads) and only
dispatches: every statement lives in an operation module (sessions, messages, lineage,
listing, handoffs, routing, maintenance, transfer, search) that keeps the rules in
docs/architecture.md (lineage, titles, end reasons, pruning).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar, TypeVarTuple, Unpack

from ..errors import DatabaseBusy, DatabaseError, SessionNotFound, StateError, WriterClosed
from ..hermes import foreign, hermes_import, hermes_sessions
from ..records import (
    AutoPruneResult,
    ExportRecord,
    Fence,
    HandoffClaim,
    LiveSession,
    MessageRow,
    Release,
    SearchHit,
    SessionRow,
    UntoldReset,
    UsageStats,
    WriteStats,
)
from ..rows import Row
from . import (
    archive,
    handoffs,
    inbox,
    lineage,
    listing,
    maintenance,
    messages,
    pairing,
    replies,
    routing,
    schema,
    search,
    sends,
    sessions,
    transfer,
    usage,
)
from .readers import ReaderPool
from .settings import WriterConfig
from .writer import Writer, connect_writer, error_code, is_busy

log = logging.getLogger("state.store")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")

SQLITE_HEADER = b"SQLite format 3\x00"
AUTO_PRUNE_KEY = maintenance.AUTO_PRUNE_KEY


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


class SessionDB:
    """Async session store over one state.db. Create with `await SessionDB.open(path)`
    (or `state.open_store`)."""

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

    async def catch_up(self) -> int:
        """Give the rows other programs wrote their derived values, up to a thousand per write
        batch, each queued behind the writes already waiting, until none wait. Returns how
        many waited when it began."""
        waiting = await self._read(foreign.count_pending)
        if waiting:
            log.info(
                "indexing %d row(s) other programs wrote, behind this process's writes", waiting
            )
        while await self._write(foreign.absorb):
            pass
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

    async def _read(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        return await self._readers.run(fn, *args)

    async def _write(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        return await self._writer.submit(fn, *args)

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
        """Create a session (under a generated id unless one is given; a given id that
        exists raises SessionExists). Routing columns go in `routing`."""
        fields = sessions.session_fields(
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
        """Create the session unless it exists. Returns True when it was created."""
        fields = sessions.session_fields(
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
        return await self._write(lambda c: sessions.insert_session(c, fields, if_missing=True))

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
        """Exact id or unique prefix (raises SessionNotFound / AmbiguousSession)."""
        return await self._read(sessions.resolve_id, ref)

    async def resolve_session_ref(self, ref: str) -> str:
        """Id, unique id prefix, or title (newest of its lineage)."""
        return await self._read(sessions.resolve_ref, ref)

    async def update_system_prompt(self, session_id: str, prompt: str | None) -> None:
        await self._write(sessions.update_system_prompt, session_id, prompt)

    async def update_session(self, session_id: str, **fields: Any) -> None:
        """Set routing/handoff/billing columns (see sessions.ROUTING_FIELDS)."""
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
        """Add to the counters (default), or set them (`absolute=True`), with the billing
        route and per-model usage rules of state/sqlite/usage.py (the facade's one code path)."""
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

        def write(conn: sqlite3.Connection) -> None:
            sessions.require_session(conn, session_id)
            usage.update_token_counts(
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
        """Totals over the store (sessions, messages, tokens, cost, file sizes)."""
        return await self._read(maintenance.stats, str(self.path))

    # --- messages -------------------------------------------------------------------

    async def append_message(
        self, session_id: str, role: str, content: str | None = None, **fields: Any
    ) -> int:
        """Append one message; returns its id once it is committed."""
        msg = {"role": role, "content": content, **fields}
        bad = [k for k in fields if k not in messages.MESSAGE_FIELDS]
        if bad:
            raise TypeError(f"unknown message field(s): {', '.join(bad)}")
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
        """Append several messages atomically, in order.

        `dedupe=(source, chat_id)`: store nothing and return [] if a message's
        platform_message_id was already stored for that chat (checked in the same
        transaction). Token counts, if given, are added in the same transaction."""
        tokens = None
        if input_tokens or output_tokens:
            tokens = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        if dedupe is None and tokens is None:
            return await self._write(messages.append_messages, session_id, list(batch))
        return await self._write(messages.append_messages, session_id, list(batch), dedupe, tokens)

    async def append_and_read(
        self,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        dedupe: tuple[str, str] | None = None,
        last: int | None = None,
    ) -> tuple[list[int], list[dict[str, Any]]]:
        """Append messages and return (their ids, the newest `last` messages in OpenAI chat
        format) from the same transaction. With `dedupe`, a duplicate returns ([], [])."""
        return await self._write(messages.append_and_read, session_id, list(batch), dedupe, last)

    async def get_messages(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        after_id: int | None = None,
        last: int | None = None,
    ) -> list[MessageRow]:
        return await self._read(
            lambda c: messages.get_messages(
                c, session_id, limit=limit, after_id=after_id, last=last
            )
        )

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
        """How many messages of the session come before `first_id` and after `last_id`."""
        return await self._read(messages.count_outside, session_id, first_id, last_id)

    async def clear_messages(self, session_id: str) -> int:
        return await self._write(messages.clear_messages, session_id)

    # --- titles ---------------------------------------------------------------------

    async def set_session_title(self, session_id: str, title: str | None) -> str | None:
        """Set (or clear with None/'') the title; raises TitleTooLong/TitleTaken/TitleEmpty."""
        return await self._write(sessions.set_title, session_id, title)

    async def set_title_if_unset(self, session_id: str, title: str) -> str | None:
        """Set an automatic title unless one is set; numbered when taken."""
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
        return await self._read(lineage.resume_target, session_id)

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
        """Create a child of `parent_id` in one transaction: copy or seed its messages,
        title it (an explicit title, else the next `#N` of the parent's title for
        compression/branch), and end the parent with `end_reason`."""
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

    # --- listing --------------------------------------------------------------------

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
        """Newest activity first, each row with `last_active` and a 60-char `preview`."""
        flt = listing.SessionFilter(
            source=source,
            exclude_sources=tuple(exclude_sources),
            user_id=user_id,
            chat_id=chat_id,
            include_children=include_children,
            include_archived=include_archived,
            titled_only=titled_only,
        )
        return await self._read(listing.list_sessions, flt, limit, offset)

    async def sessions_by_start(
        self, source: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]:
        """Every session, children included, newest start first, with all its columns."""
        return await self._read(listing.sessions_by_start, source, limit, offset)

    async def resolve_in_scope(self, ref: str, flt: listing.SessionFilter) -> str | None:
        """Id, unique prefix or title, among the sessions `flt` allows (None if none)."""
        return await self._read(listing.resolve_in_scope, ref, flt)

    async def list_filtered(
        self, flt: listing.SessionFilter, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]:
        return await self._read(listing.list_sessions, flt, limit, offset)

    async def count_filtered(self, flt: listing.SessionFilter) -> int:
        return await self._read(listing.count_sessions, flt)

    async def has_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> bool:
        """True if a message with this platform id was already stored for that chat."""
        return await self._read(messages.is_stored, source, chat_id, platform_message_id)

    async def reply_to_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> replies.StoredReply | None:
        return await self._read(replies.reply_to, source, chat_id, platform_message_id)

    # --- handoff (terminal -> chat) ----------------------------------------------------

    async def request_handoff(
        self, session_id: str, platform: str, *, now: float | None = None
    ) -> bool:
        """Mark a session `pending` for `platform`; False if a handoff is already in flight."""
        at = time.time() if now is None else now
        return await self._write(handoffs.request, session_id, platform, at)

    async def claim_handoff(
        self, platforms: Iterable[str], *, now: float | None = None
    ) -> HandoffClaim | None:
        """Atomically take the oldest pending handoff for one of `platforms` (pending ->
        running). Of two daemons sharing the file, one wins."""
        wanted = list(platforms)
        if not wanted:
            return None
        at = time.time() if now is None else now
        return await self._write(handoffs.claim, wanted, at)

    async def finish_handoff(
        self,
        session_id: str,
        state: str | None,
        error: str | None = None,
        *,
        expect: str | None = None,
    ) -> bool:
        """Set the handoff's final (or reset) state; with `expect`, only from that state."""
        return await self._write(handoffs.finish, session_id, state, error, expect)

    async def fail_stale_handoffs(
        self, older_than_s: float, *, now: float | None = None
    ) -> list[str]:
        """`running` handoffs whose daemon went away: failed, never stuck."""
        at = time.time() if now is None else now
        return await self._write(handoffs.fail_stale, older_than_s, at)

    # --- what the gateway's session index is built from ----------------------------

    async def live_sessions_by_key(self) -> list[LiveSession]:
        """The newest live (not ended) session per session_key: the index's source of truth."""
        return await self._read(routing.live_sessions_by_key)

    async def live_session_for_key(self, key: str) -> LiveSession | None:
        """The newest live session with this session_key, or None."""
        return await self._read(routing.live_session_for_key, key)

    async def newest_live_session_by_key(self) -> dict[str, str]:
        """session_key -> id of its newest live session: what the index checks itself
        against at start-up."""
        return await self._read(routing.newest_live_session_by_key)

    async def session_states(self, ids: list[str]) -> dict[str, tuple[float | None, str | None]]:
        """id -> (ended_at, end_reason) for the ids that exist."""
        return await self._read(routing.session_states, ids)

    async def untold_resets(self) -> list[UntoldReset]:
        """Live, still empty reset children and the idle/daily sessions they replaced."""
        return await self._read(routing.untold_resets)

    # --- delete, prune, vacuum, meta ------------------------------------------------

    async def delete_session(self, session_id: str) -> None:
        """Delete a session and its messages; its children become roots."""
        await self._write(maintenance.delete_session, session_id)

    async def prune_sessions(
        self,
        older_than_days: float = 90,
        source: str | None = None,
        *,
        now: float | None = None,
        protected: Iterable[str] = (),
    ) -> int:
        """Delete ended sessions idle for longer than `older_than_days`; returns the count.
        Runs in small transactions so live traffic keeps flowing during a large prune."""
        at = time.time() if now is None else now
        keep = frozenset(protected)
        total = 0
        while True:
            n = await self._write(maintenance.prune_chunk, older_than_days, source, at, keep)
            total += n
            if n < maintenance.PRUNE_CHUNK:
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
        return await self._read(maintenance.prune_candidates, older_than_days, source, at, limit)

    async def vacuum(self) -> tuple[int, int]:
        """VACUUM; returns the file size in bytes before and after."""
        return await self._writer.exclusive(maintenance.vacuum)

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
        """Prune at most once per interval across every process sharing the file (the
        stamp lives in state_meta); VACUUM only when that frees a worthwhile amount."""
        at = time.time() if now is None else now
        due = await self._write(
            maintenance.claim_meta_stamp, AUTO_PRUNE_KEY, min_interval_hours * 3600, at
        )
        if not due:
            return {"ran": False, "pruned": 0, "vacuumed": False}
        pruned = await self.prune_sessions(retention_days, now=at)
        vacuumed = False
        if vacuum and pruned:
            free, total = await self._read(maintenance.freeable_bytes)
            if free >= min_vacuum_bytes or (total and free / total >= min_vacuum_share):
                await self.vacuum()
                vacuumed = True
        return {"ran": True, "pruned": pruned, "vacuumed": vacuumed}

    # --- the inbox (state/sqlite/inbox.py) ---------------------------------------------------

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
        (`session_key`/`replica` are for stores replicas share: one file has one daemon.)"""
        return await self._write(
            inbox.accept,
            platform,
            chat_id,
            platform_message_id,
            inbox.payload_of(payload),
            time.time(),
        )

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
        """`accept_inbound` and, when the row is new, `begin_turn` in one transaction:
        (inbox id, state, whether new, begin_turn's result or None)."""
        return await self._write(
            inbox.accept_begin,
            platform,
            chat_id,
            platform_message_id,
            inbox.payload_of(payload),
            time.time(),
            session_id,
            dict(message),
            last,
        )

    async def begin_turn(
        self,
        inbox_id: int,
        session_id: str,
        message: Mapping[str, Any],
        *,
        last: int | None = None,
        fence: Fence | None = None,
    ) -> tuple[int, list[dict[str, Any]]]:
        """The user's message into its session, once (a turn a crash interrupted finds it
        there), and the newest `last` messages up to it in OpenAI chat format: (the
        message's id, the history). The inbox row counts as `started` from here."""
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
        `reply_state` ('ready', 'sending', or 'sent' for a reply given as its request's
        response), in one transaction. (No fences or leases here: one home, one daemon.)"""
        if release is not None:
            raise ValueError("a lease can only be freed by a fenced write (replicas)")
        tokens = (
            {"input_tokens": input_tokens, "output_tokens": output_tokens}
            if input_tokens or output_tokens
            else None
        )
        return await self._write(
            inbox.end_turn, inbox_id, session_id, list(batch), tokens, reply_state
        )

    async def mark_reply(self, inbox_id: int, reply_state: str, ref: str | None = None) -> None:
        """After the send: 'sent' (with the platform's message ids) or 'failed'."""
        await self._write(inbox.mark_reply, inbox_id, reply_state, ref)

    def mark_reply_soon(self, inbox_id: int, reply_state: str, ref: str | None = None) -> None:
        """`mark_reply` posted to the writer: no future, no task (one per turn otherwise),
        and the marks of one turn of the event loop go as one operation (each operation
        queued wakes the writer's thread)."""
        if self._closed:
            raise WriterClosed("the store is closed")
        self._marks.append((inbox_id, reply_state, ref))
        if len(self._marks) == 1:
            asyncio.get_running_loop().call_soon(self._post_marks)

    def _post_marks(self) -> None:
        marks, self._marks = self._marks, []
        if not marks:
            return
        try:
            self._writer.post(inbox.mark_replies_many, marks)
        except WriterClosed as exc:  # the rows stay unconfirmed, as after a crash
            log.warning("%d sent mark(s) not stored: %s", len(marks), exc)

    async def unsent_replies(self) -> list[dict[str, Any]]:
        """Replies committed but not confirmed sent ('ready' and 'sending'), oldest first."""
        return await self._read(inbox.unsent_replies)

    async def finish_inbound(
        self, inbox_id: int, state: str, reason: str | None = None, *, fence: Fence | None = None
    ) -> None:
        """Close an inbox row without an agent reply (a command answered, or dropped)."""
        await self._write(inbox.finish, inbox_id, state, reason)

    async def open_inbound(self) -> list[dict[str, Any]]:
        """Rows a crash left `received`/`started`, oldest first."""
        return await self._read(inbox.open_rows)

    async def inbox_counts(self) -> dict[str, int]:
        """Rows per state, with `started` (open rows whose message is in a session) apart."""
        found = await self._read(inbox.counts)
        started = await self._read(inbox.started_rows)
        if started:
            found["received"] = found.get("received", 0) - started
            found["started"] = started
        return {k: v for k, v in found.items() if v}

    async def prune_inbox(self, older_than: float) -> int:
        """Forget closed inbox rows last touched before `older_than` (never a message)."""
        return await self._write(inbox.prune, older_than)

    # --- DM pairing (state/sqlite/pairing.py) ------------------------------------------------

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
        """Record `code` as the user's pending pairing code within the limits; the code,
        None when the user may not have one now, or pairing.TAKEN (draw another)."""
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
        """Approve or deny the pending request holding `code` (single use); None if none."""
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
        return await self._read(maintenance.get_meta, key)

    async def set_meta(self, key: str, value: str | None) -> None:
        await self._write(maintenance.set_meta, key, value)

    async def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """Copy WAL frames back into the file: (busy, frames in the WAL, frames copied)."""
        if mode not in maintenance.CHECKPOINT_MODES:
            raise ValueError("checkpoint mode must be PASSIVE, FULL, RESTART or TRUNCATE")
        return await self._writer.exclusive(maintenance.checkpoint, mode)

    # --- export / import ------------------------------------------------------------

    async def export_session(self, session_id: str) -> ExportRecord:
        page = await self._read(transfer.export_page, None, 1, None, [session_id])
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
        """Stream sessions (each with its messages), oldest first, a page at a time."""
        after: tuple[float, str] | None = None
        while True:
            page = await self._read(transfer.export_page, after, page_size, source, session_ids)
            for rec in page:
                yield rec
            if len(page) < page_size:
                return
            last = page[-1]["session"]
            after = (last["started_at"], last["id"])

    async def write_jsonl(self, fh: IO[str], **kwargs: Any) -> int:
        """Export to a text file object as JSONL; returns the number of sessions."""
        n = 0
        async for rec in self.export_all(**kwargs):
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
        return n

    async def import_records(
        self, records: Iterable[Mapping[str, Any]], *, batch: int = 100
    ) -> transfer.ImportReport:
        """Import exported records; sessions that already exist are skipped."""
        report = transfer.ImportReport()
        pending: list[Mapping[str, Any]] = []
        ids: list[str] = []

        async def flush() -> None:
            if pending:
                chunk = list(pending)
                pending.clear()
                await self._write(transfer.import_records, chunk, report)

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
            await self._write(transfer.orphan_dangling, ids[i : i + 500])
        return report

    # --- search ------------------------------------------------------------------------

    async def search_messages(
        self,
        query: str,
        *,
        sources: Iterable[str] = (),
        exclude_sources: Iterable[str] = (),
        roles: Iterable[str] = (),
        scope: listing.SessionFilter | None = None,
        exclude_session_ids: Iterable[str] = (),
        sort: str = "relevance",
        limit: int = 20,
        offset: int = 0,
    ) -> list[SearchHit]:
        """Search every message (see state.sqlite.search); raises QueryError for unusable queries."""
        req = search.SearchRequest(
            query=query,
            sources=tuple(sources),
            exclude_sources=tuple(exclude_sources),
            roles=tuple(roles),
            scope=scope or listing.SessionFilter(include_children=True),
            exclude_session_ids=tuple(exclude_session_ids),
            sort=sort,
            limit=limit,
            offset=offset,
        )
        return await self._read(search.search, req)

    # --- search index, integrity, schema, lineage repair -----------------------------

    async def rebuild_search_index(self) -> int:
        """Rebuild both FTS indexes from the messages table; returns the aux row count."""
        return await self._write(maintenance.rebuild_search_index)

    async def optimize_search_index(self) -> None:
        await self._write(maintenance.optimize_search_index)

    async def check_search_index(self) -> list[str]:
        """FTS integrity checks; returns a list of problems (empty when healthy)."""
        return await self._write(maintenance.check_search_index)

    async def integrity_check(self, quick: bool = True) -> list[str]:
        return await self._read(maintenance.integrity_check, quick)

    async def schema_version(self) -> int:
        """The schema version the file is at (0 for a file switchboard never migrated)."""
        return await self._read(schema.current_version)

    def latest_schema_version(self) -> int:
        """The newest schema version this switchboard knows (and migrates files to)."""
        return schema.LATEST

    async def count_dangling_parents(self) -> int:
        """Sessions whose parent no longer exists (written by another program)."""
        return await self._read(maintenance.count_dangling_parents)

    async def clear_dangling_parents(self) -> int:
        """Make those sessions roots; returns how many were changed."""
        return await self._write(maintenance.clear_dangling_parents)

    # --- archive, bulk delete, per-model usage, workspace (state/sqlite/archive.py, usage.py) ---

    async def set_session_archived(self, session_id: str, archived: bool = True) -> bool:
        """Archive (or restore) a session with its compression ancestors and continuations."""
        return bool(await self._write(hermes_sessions.set_archived, session_id, archived))

    async def delete_sessions(self, session_ids: list[str]) -> list[str]:
        """Delete many sessions in one transaction (with their delegate subagents)."""
        return list(await self._write(archive.delete_many, session_ids))

    async def model_usage(self, session_id: str) -> list[dict[str, Any]]:
        """What the session spent per model, billing route and task."""
        return list(await self._read(usage.model_usage, session_id))

    async def update_session_cwd(
        self,
        session_id: str,
        cwd: str,
        git_branch: str | None = None,
        git_repo_root: str | None = None,
    ) -> None:
        await self._write(hermes_sessions.update_cwd, session_id, cwd, git_branch, git_repo_root)

    async def import_hermes(
        self,
        source: str | os.PathLike[str],
        *,
        dry_run: bool = False,
        routing: hermes_import.Routing | None = None,
    ) -> Any:
        """Copy a Hermes Agent state.db's sessions, messages, titles and usage in (once);
        `routing` gives the imported rows switchboard's session keys (state/hermes/hermes_import.py)."""
        return await self._writer.exclusive(hermes_import.import_db, Path(source), dry_run, routing)

    # --- dashboard queries (state/sqlite/keyset.py, family.py, cleanup.py, insights.py) ----------

    async def session_page(self, q: Any) -> tuple[list[Row], tuple[float, str] | None]:
        """One keyset page of sessions (a `state.sqlite.keyset.PageQuery`) and the next cursor."""
        from . import keyset

        rows, cursor = await self._read(keyset.page, q)
        return list(rows), cursor

    async def lineage_tree(self, session_id: str) -> Row | None:
        from . import family

        return await self._read(family.lineage_tree, session_id)

    async def count_empty_sessions(self) -> int:
        from . import cleanup

        return int(await self._read(cleanup.count_empty))

    async def delete_empty_sessions(self, protected: Iterable[str] = ()) -> int:
        """Delete ended sessions that have no messages, a chunk per transaction."""
        from . import cleanup

        keep, total = frozenset(protected), 0
        while True:
            n = int(await self._write(cleanup.delete_empty_chunk, keep))
            total += n
            if n < maintenance.PRUNE_CHUNK:
                return total

    async def insights(self, since: float, until: float, source: str | None = None) -> Row:
        """Activity figures for [since, until) (see state/sqlite/insights.py)."""
        from . import insights

        return dict(await self._read(insights.insights, insights.Period(since, until, source)))
