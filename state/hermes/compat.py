"""`state.hermes.compat.SessionDB`: a synchronous class with the method names and semantics of
Hermes Agent's SessionDB, over switchboard's store and schema.

The store's operations run on the calling thread over the facade's own connection (see
_DirectStore): no event loop and no thread hand-off per call, so sequential calls cost what
the SQL costs. Title problems raise ValueError and open errors sqlite3.DatabaseError, as
Hermes's callers expect.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from .. import columns
from ..errors import AmbiguousSession, SessionNotFound, StateError, TitleError
from ..errors import DatabaseError as StateDatabaseError
from ..rows import Row
from ..sqlite import archive, maintenance, schema, store, usage
from ..sqlite import sessions as sessions_mod
from ..sqlite import writer as writer_mod
from ..sqlite.settings import WriterConfig
from ..titles import MAX_TITLE_LENGTH, clean_title
from . import (
    foreign,  # noqa: F401 - registers the catch-up before every write
    hermes_gateway,
    hermes_listing,
    hermes_messages,
    hermes_search,
    hermes_sessions,
    hermes_transfer,
    locks,
)

T = TypeVar("T")
DEFAULT_DB_PATH = (
    Path(os.environ.get("SWITCHBOARD_HOME", "~/.switchboard")).expanduser() / "state.db"
)


# The Hermes Agent schema number a file this facade creates corresponds to: Hermes 0.19
# reads it and skips its own (historic) data migrations.
SCHEMA_VERSION = 22


def _schema_sql() -> str:
    """DDL of the tables, columns as the store declares them (Hermes callers build legacy
    files from it and check that every declared column exists)."""

    def table(name: str, columns: dict[str, str]) -> str:
        body = ",\n    ".join(f"{col} {decl}" for col, decl in columns.items())
        return f"CREATE TABLE IF NOT EXISTS {name} (\n    {body}\n);"

    return "\n".join(
        [
            "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);",
            "CREATE TABLE IF NOT EXISTS state_meta (key TEXT PRIMARY KEY, value TEXT);",
            table("sessions", columns.SESSION_COLUMNS),
            table("messages", columns.MESSAGE_COLUMNS),
        ]
    )


SCHEMA_SQL = _schema_sql()


class OpenError(sqlite3.DatabaseError):
    """The file cannot be opened as a state.db (a sqlite3.Error, as Hermes callers expect)."""


AUTO_PRUNE_META_KEY = "last_auto_prune"


class _Suspended(RuntimeError):
    """A store coroutine waited on something; the direct mode cannot run it."""


def _drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a store coroutine to completion on this thread. Under _DirectStore nothing it
    awaits ever suspends, so one send() finishes it: no event loop, no thread hand-off."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise _Suspended("a store operation waited on an event loop")


class _DirectExclusive:
    """The writer's `exclusive` for _DirectStore: outside any transaction, on its conn."""

    def __init__(self, direct: _DirectStore) -> None:
        self._direct = direct

    async def exclusive(self, fn: Callable[..., T], *args: Any) -> T:
        with self._direct.lock:
            return fn(self._direct.conn, *args)


class _DirectStore(store.SessionDB):
    """The async store's operations run on the calling thread over one connection.

    The store's methods hand SQL functions to `_read`/`_write`; here those run at once (a
    write in its own IMMEDIATE transaction) under a lock, so a sequential caller pays no
    thread hand-offs. Other processes and the daemon share the file through SQLite's locks.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:  # noqa: D107
        self.path = path
        self.conn = conn
        self.lock = threading.RLock()
        self._closed = False
        self._writer = _DirectExclusive(self)  # type: ignore[assignment]
        self._readers = None  # type: ignore[assignment]

    async def _read(self, fn: Any, *args: Any) -> Any:
        with self.lock:
            return fn(self.conn, *args)

    async def _write(self, fn: Any, *args: Any) -> Any:
        with self.lock:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                writer_mod.before_batch(conn)
                result = fn(conn, *args)
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                translated = writer_mod.translate_error(exc, str(self.path))
                if translated is exc:
                    raise
                raise translated from exc
            conn.execute("COMMIT")
            return result

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self.lock:
            self.conn.close()


def _open_direct(path: Path, read_only: bool) -> _DirectStore:
    if read_only:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        return _DirectStore(path, conn)
    path.parent.mkdir(parents=True, exist_ok=True)
    store.check_file(path)
    cfg = WriterConfig()
    conn = store.open_and_migrate(str(path), cfg, schema.LATEST, cfg.lock_budget_s)
    return _DirectStore(path, conn)


class SessionDB:
    def __init__(
        self, db_path: str | os.PathLike[str] | None = None, read_only: bool = False
    ) -> None:
        self.db_path = Path(db_path) if db_path is not None else DEFAULT_DB_PATH
        self.read_only = read_only
        path = self.db_path.expanduser().absolute()
        fresh = not path.exists()
        try:
            self._db = _open_direct(path, read_only)
        except (StateDatabaseError, sqlite3.DatabaseError) as exc:
            # Hermes's callers catch sqlite3.Error around SessionDB() and degrade.
            raise OpenError(str(exc)) from exc
        self._lock = self._db.lock
        # Raw access for callers that run their own SQL (Hermes's `_conn`): autocommit, rows
        # addressable by name.
        self._conn = sqlite3.connect(
            f"file:{path}?mode={'ro' if read_only else 'rw'}",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
        )
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._fts_enabled = True  # switchboard's index is maintained by SQL triggers
        if fresh and not read_only:
            # A file created here needs none of Hermes's historic data migrations.
            self._conn.execute(
                "INSERT INTO schema_version(version) SELECT ? "
                "WHERE NOT EXISTS (SELECT 1 FROM schema_version)",
                (SCHEMA_VERSION,),
            )

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return _drive(coro)

    def _w(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(conn, *args) in one write transaction."""
        return _drive(self._db._write(fn, *args))  # type: ignore[no-any-return]

    def _r(self, fn: Callable[..., T], *args: Any) -> T:
        return _drive(self._db._read(fn, *args))  # type: ignore[no-any-return]

    # --- gateway sessions ---
    def record_gateway_session_peer(
        self,
        session_id: str,
        *,
        source: str,
        user_id: str | None = None,
        session_key: str | None = None,
        chat_id: str | None = None,
        chat_type: str | None = None,
        thread_id: str | None = None,
        display_name: str | None = None,
        origin_json: str | None = None,
    ) -> None:
        peer = {
            "source": source,
            "user_id": user_id,
            "session_key": session_key,
            "chat_id": chat_id,
            "chat_type": chat_type,
            "thread_id": thread_id,
        }
        self._w(hermes_gateway.record_peer, session_id, peer, display_name, origin_json)

    def set_expiry_finalized(self, session_id: str, finalized: bool = True) -> None:
        self._set(
            session_id,
            "UPDATE sessions SET expiry_finalized = ? WHERE id = ?",
            (int(bool(finalized)),),
        )

    def find_latest_gateway_session_for_peer(
        self,
        *,
        source: str,
        user_id: str | None = None,
        session_key: str | None = None,
        chat_id: str | None = None,
        chat_type: str | None = None,
        thread_id: str | None = None,
    ) -> Row | None:
        return self._r(
            hermes_gateway.latest_for_peer,
            source,
            user_id,
            session_key,
            chat_id,
            chat_type,
            thread_id,
        )

    def list_gateway_sessions(
        self, *, platform: str | None = None, active_only: bool = True
    ) -> list[Row]:
        return self._r(hermes_gateway.list_gateway, platform, active_only)

    def find_session_by_origin(
        self,
        *,
        platform: str,
        chat_id: str,
        thread_id: str | None = None,
        user_id: str | None = None,
    ) -> str | None:
        return self._r(hermes_gateway.by_origin, platform, chat_id, thread_id, user_id)

    def set_auto_title_if_empty(self, session_id: str, title: str) -> bool:
        cleaned = self.sanitize_title(hermes_messages.scrub(title))
        if not cleaned:
            return False
        try:
            return self._w(hermes_sessions.set_auto_title_if_empty, session_id, cleaned)
        except TitleError as exc:
            raise ValueError(str(exc)) from exc

    def get_compression_lineage(self, session_id: str) -> list[str]:
        return self._r(hermes_sessions.compression_lineage, session_id)

    def export_session_lineage(self, session_id: str) -> Row | None:
        """The tip's export plus every segment of its compression chain, in order."""
        ids = self.get_compression_lineage(session_id)
        if not ids:
            return None
        segments = [s for s in (self.export_session(i) for i in ids) if s is not None]
        tip = dict(segments[-1])
        tip["segments"] = segments
        tip["lineage_session_ids"] = ids
        tip["messages"] = [m for seg in segments for m in seg["messages"]]
        tip["message_count"] = len(tip["messages"])
        return tip

    _IMPORT_MAX_SESSION_BYTES = hermes_transfer.MAX_SESSION_BYTES
    _IMPORT_MAX_MESSAGES_PER_SESSION = hermes_transfer.MAX_MESSAGES_PER_SESSION

    def import_sessions(self, sessions: list[dict[str, Any]]) -> dict[str, Any]:
        """Import exported sessions; a batch with any invalid entry imports nothing."""
        errors = hermes_transfer.validate(sessions)
        if errors:
            return {"ok": False, "imported": 0, "skipped": 0, "detached": 0, "errors": errors}
        return self._w(hermes_transfer.import_batch, sessions)

    def _execute_write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run fn(conn) in one write transaction (Hermes's private helper, used by callers
        that need raw SQL)."""
        return self._w(fn)

    # --- compression leases ---
    def try_acquire_compression_lock(
        self, session_id: str, holder: str, ttl_seconds: float = 300.0
    ) -> bool:
        try:
            return self._w(locks.try_acquire, session_id, holder, ttl_seconds)
        except (sqlite3.Error, StateError):
            return False

    def refresh_compression_lock(
        self, session_id: str, holder: str, ttl_seconds: float = 300.0
    ) -> bool:
        try:
            return self._w(locks.refresh, session_id, holder, ttl_seconds)
        except (sqlite3.Error, StateError):
            return False

    def release_compression_lock(self, session_id: str, holder: str) -> None:
        self._w(locks.release, session_id, holder)

    def get_compression_lock_holder(self, session_id: str) -> str | None:
        return self._r(locks.holder, session_id)

    def close(self) -> None:
        if self._db._closed:
            return
        self._conn.close()
        _drive(self._db.close())

    def __enter__(self) -> SessionDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sessions ---
    def create_session(self, session_id: str, source: str, **kwargs: Any) -> str:
        """Create, or fill the still-empty metadata of an existing session (an upsert)."""
        fields = {k: v for k, v in kwargs.items() if v is not None}
        fields.update(id=session_id, source=source)
        return self._w(hermes_sessions.upsert, fields)

    def ensure_session(self, session_id: str, source: str = "unknown", **kwargs: Any) -> str:
        return self.create_session(session_id, source, **kwargs)

    def end_session(self, session_id: str, end_reason: str) -> None:
        with contextlib.suppress(SessionNotFound):
            self._w(sessions_mod.end_session, session_id, end_reason, None)

    def reopen_session(self, session_id: str) -> None:
        with contextlib.suppress(SessionNotFound):
            self._w(sessions_mod.reopen_session, session_id)

    def update_system_prompt(self, session_id: str, system_prompt: str | None) -> None:
        with contextlib.suppress(SessionNotFound):
            self._w(sessions_mod.update_system_prompt, session_id, system_prompt)

    def update_session_cwd(
        self,
        session_id: str,
        cwd: str,
        git_branch: str | None = None,
        git_repo_root: str | None = None,
    ) -> None:
        self._w(hermes_sessions.update_cwd, session_id, cwd, git_branch, git_repo_root)

    def distinct_session_cwds(self, include_archived: bool = False) -> list[Row]:
        return self._r(hermes_sessions.distinct_cwds, include_archived)

    def backfill_repo_roots(self, cwd_to_root: dict[str, str]) -> int:
        return self._w(hermes_sessions.backfill_repo_roots, cwd_to_root)

    def _set(self, session_id: str, sql: str, params: tuple[Any, ...]) -> None:
        self._w(lambda c: c.execute(sql, (*params, session_id)))

    def update_session_model(self, session_id: str, model: str) -> None:
        self._set(session_id, "UPDATE sessions SET model = ? WHERE id = ?", (model,))

    def update_session_billing_route(
        self,
        session_id: str,
        *,
        provider: str | None,
        base_url: str | None,
        billing_mode: str | None = None,
    ) -> None:
        """A provider switch: the route changes and the cached system prompt is dropped so
        the next turn rebuilds its header."""
        if billing_mode is None:
            self._set(
                session_id,
                "UPDATE sessions SET billing_provider = ?, billing_base_url = ?, "
                "system_prompt = NULL WHERE id = ?",
                (provider, base_url),
            )
        else:
            self._set(
                session_id,
                "UPDATE sessions SET billing_provider = ?, billing_base_url = ?, "
                "billing_mode = ?, system_prompt = NULL WHERE id = ?",
                (provider, base_url, billing_mode),
            )

    def update_session_meta(
        self, session_id: str, model_config_json: str, model: str | None = None
    ) -> None:
        if model is None:
            self._set(
                session_id,
                "UPDATE sessions SET model_config = ? WHERE id = ?",
                (model_config_json,),
            )
        else:
            self._set(
                session_id,
                "UPDATE sessions SET model_config = ?, model = ? WHERE id = ?",
                (model_config_json, model),
            )

    def record_auxiliary_usage(
        self,
        session_id: str,
        task: str,
        *,
        model: str | None = None,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated_cost_usd: float | None = None,
    ) -> None:
        counts = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_read_tokens": cache_read_tokens,
            "cache_write_tokens": cache_write_tokens,
            "reasoning_tokens": reasoning_tokens,
        }
        route = {
            "model": model,
            "billing_provider": billing_provider,
            "billing_base_url": billing_base_url,
        }
        self._w(usage.add_usage, session_id, task, route, counts, 1, estimated_cost_usd, None)

    def get_session(self, session_id: str) -> Row | None:
        return self._run(self._db.get_session(session_id))

    def resolve_session_id(self, session_id_or_prefix: str) -> str | None:
        try:
            return self._run(self._db.resolve_session_id(session_id_or_prefix))
        except (SessionNotFound, AmbiguousSession):
            return None

    def update_token_counts(
        self,
        session_id: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        model: str | None = None,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated_cost_usd: float | None = None,
        actual_cost_usd: float | None = None,
        cost_status: str | None = None,
        cost_source: str | None = None,
        pricing_version: str | None = None,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        billing_mode: str | None = None,
        api_call_count: int = 0,
        absolute: bool = False,
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

        def write(conn: sqlite3.Connection) -> None:
            hermes_sessions.upsert(conn, {"id": session_id, "source": "unknown"})
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

        self._w(write)

    # --- titles ---
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

    def set_session_title(self, session_id: str, title: str | None) -> bool:
        title = hermes_messages.scrub(title)
        try:
            cleaned = self.sanitize_title(title)
            if cleaned is None:
                self._run(self._db.set_session_title(session_id, None))
            else:
                self._w(hermes_sessions.set_title_taking_from_ancestor, session_id, cleaned)
        except SessionNotFound:
            return False
        except TitleError as exc:
            raise ValueError(str(exc)) from exc
        return True

    def get_session_title(self, session_id: str) -> str | None:
        return self._run(self._db.get_session_title(session_id))

    def get_session_by_title(self, title: str) -> Row | None:
        return self._run(self._db.get_session_by_title(title))

    def resolve_session_by_title(self, title: str) -> str | None:
        return self._run(self._db.resolve_session_by_title(title))

    def get_next_title_in_lineage(self, base_title: str) -> str:
        return self._run(self._db.get_next_title_in_lineage(base_title))

    # --- lineage ---
    def get_compression_tip(self, session_id: str) -> str:
        return self._run(self._db.get_compression_tip(session_id))

    def resolve_resume_session_id(self, session_id: str) -> str:
        return self._run(self._db.resolve_resume_session_id(session_id))

    # --- listing and search ---
    def list_sessions_rich(
        self,
        source: str | None = None,
        exclude_sources: list[str] | None = None,
        cwd_prefix: str | None = None,
        limit: int = 20,
        offset: int = 0,
        include_children: bool = False,
        min_message_count: int | None = None,
        project_compression_tips: bool = True,
        order_by_last_active: bool = False,
        include_archived: bool = False,
        archived_only: bool = False,
        id_query: str | None = None,
        search_query: str | None = None,
        compact_rows: bool = False,
    ) -> list[Row]:
        q = hermes_listing.RichQuery(
            source=source,
            exclude_sources=tuple(exclude_sources or ()),
            cwd_prefix=cwd_prefix,
            limit=limit,
            offset=offset,
            include_children=include_children,
            min_message_count=min_message_count,
            project_compression_tips=project_compression_tips,
            order_by_last_active=order_by_last_active,
            include_archived=include_archived,
            archived_only=archived_only,
            id_query=id_query,
            search_query=search_query,
            compact_rows=compact_rows,
        )
        return self._r(hermes_listing.list_rich, q)

    def search_sessions_by_id(
        self, query: str, limit: int = 20, include_archived: bool = True
    ) -> list[Row]:
        """Sessions whose id (or lineage root id) contains `query`: exact, then prefix,
        then substring matches."""
        rows = self.list_sessions_rich(
            limit=max(limit, 1) * 4,
            order_by_last_active=True,
            include_archived=include_archived,
            id_query=query,
        )
        needle = query.lower()

        def rank(row: Row) -> int:
            ids = [str(row["id"]).lower(), str(row.get("_lineage_root_id") or "").lower()]
            if needle in ids:
                return 0
            return 1 if any(i.startswith(needle) for i in ids if i) else 2

        return sorted(rows, key=rank)[:limit]

    def search_sessions(
        self, source: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[Row]:
        """Hermes Agent's name for listing sessions by start time (all of them, children
        included), optionally of one source."""
        return self._run(self._db.sessions_by_start(source, limit, offset))

    def search_messages(
        self,
        query: str,
        source_filter: list[str] | None = None,
        exclude_sources: list[str] | None = None,
        role_filter: list[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        sort: str | None = None,
        include_inactive: bool = False,
    ) -> list[Row]:
        """Hits with `context` (previous, hit, next message); a query that cannot be run
        finds nothing."""
        if self._r(lambda c: c.execute("SELECT 1 FROM sb_pending LIMIT 1").fetchone()):
            self._w(lambda c: None)  # every write first indexes rows other programs wrote
        return self._r(
            hermes_search.search_messages,
            query,
            source_filter or (),
            exclude_sources or (),
            role_filter or (),
            limit,
            offset,
            sort,
            include_inactive,
        )

    # --- messages ---
    def append_message(
        self,
        session_id: str,
        role: str,
        content: Any = None,
        tool_name: str | None = None,
        tool_calls: Any = None,
        tool_call_id: str | None = None,
        token_count: int | None = None,
        finish_reason: str | None = None,
        reasoning: str | None = None,
        reasoning_content: str | None = None,
        reasoning_details: Any = None,
        codex_reasoning_items: Any = None,
        codex_message_items: Any = None,
        platform_message_id: str | None = None,
        observed: bool = False,
        effect_disposition: str | None = None,
        timestamp: Any = None,
        api_content: str | None = None,
    ) -> int:
        msg = {
            "role": role,
            "content": content,
            "tool_name": tool_name,
            "tool_calls": tool_calls,
            "tool_call_id": tool_call_id,
            "token_count": token_count,
            "finish_reason": finish_reason,
            "reasoning": reasoning,
            "reasoning_content": reasoning_content,
            "reasoning_details": reasoning_details,
            "codex_reasoning_items": codex_reasoning_items,
            "codex_message_items": codex_message_items,
            "platform_message_id": platform_message_id,
            "observed": observed,
            "effect_disposition": effect_disposition,
            "timestamp": timestamp,
            "api_content": api_content,
        }
        return self._w(hermes_messages.append, session_id, msg)

    def get_messages(
        self,
        session_id: str,
        include_inactive: bool = False,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Row]:
        return self._r(hermes_messages.read, session_id, include_inactive, limit, offset)

    def get_messages_as_conversation(
        self,
        session_id: str,
        include_ancestors: bool = False,
        include_inactive: bool = False,
        repair_alternation: bool = False,
    ) -> list[dict[str, Any]]:
        def read(conn: sqlite3.Connection) -> list[Row]:
            ids = hermes_messages.lineage(conn, session_id) if include_ancestors else [session_id]
            return hermes_messages.conversation_rows(conn, ids, include_inactive)

        return hermes_messages.to_conversation(
            self._r(read), dedupe_replays=include_ancestors, repair_alternation=repair_alternation
        )

    def _lineage_rows(self, session_id: str) -> tuple[list[str], list[Row]]:
        def read(conn: sqlite3.Connection) -> tuple[list[str], list[Row]]:
            ids = hermes_messages.lineage(conn, session_id)
            return ids, hermes_messages.conversation_rows(conn, ids)

        return self._r(read)

    def get_resume_conversations(
        self, session_id: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(model history: this session's rows, repaired; display history: the lineage's
        rows with replayed prompts removed) from one read."""
        _ids, rows = self._lineage_rows(session_id)
        own = [r for r in rows if r["session_id"] == session_id]
        model = hermes_messages.to_conversation(own, dedupe_replays=False, repair_alternation=True)
        display = hermes_messages.to_conversation(
            rows, dedupe_replays=True, repair_alternation=False
        )
        return model, display

    def get_ancestor_display_prefix(self, session_id: str) -> list[dict[str, Any]]:
        ids, rows = self._lineage_rows(session_id)
        if len(ids) <= 1:
            return []
        ancestors = [r for r in rows if r["session_id"] != session_id]
        return hermes_messages.to_conversation(
            ancestors, dedupe_replays=True, repair_alternation=False
        )

    def get_conversation_root(self, session_id: str) -> str:
        return self._r(hermes_messages.lineage, session_id)[0]

    def replace_messages(
        self, session_id: str, messages: list[dict[str, Any]], active_only: bool = False
    ) -> None:
        self._w(hermes_messages.replace, session_id, messages, active_only)

    def set_latest_user_api_content(self, session_id: str, content: Any, api_content: str) -> int:
        return self._w(
            hermes_messages.set_latest_user_api_content, session_id, content, api_content
        )

    def has_archived_messages(self, session_id: str) -> bool:
        return self._r(
            lambda c: (
                c.execute(
                    "SELECT 1 FROM messages WHERE session_id = ? AND active = 0 LIMIT 1",
                    (session_id,),
                ).fetchone()
                is not None
            )
        )

    def clear_messages(self, session_id: str) -> None:
        self._run(self._db.clear_messages(session_id))

    def session_count(
        self,
        source: str | None = None,
        cwd_prefix: str | None = None,
        min_message_count: int | None = None,
        include_archived: bool = False,
        archived_only: bool = False,
        exclude_children: bool = False,
        exclude_sources: list[str] | None = None,
    ) -> int:
        sql, params = "SELECT COUNT(*) FROM sessions WHERE 1", []  # type: list[Any]
        if source:
            sql += " AND source = ?"
            params.append(source)
        if exclude_sources:
            sql += f" AND source NOT IN ({', '.join('?' for _ in exclude_sources)})"
            params += list(exclude_sources)
        clause, values = hermes_sessions.cwd_prefix_clause(cwd_prefix)
        sql += clause
        params += values
        if min_message_count is not None:
            sql += " AND COALESCE(message_count, 0) >= ?"
            params.append(min_message_count)
        if archived_only:
            sql += " AND COALESCE(archived, 0) = 1"
        elif not include_archived:
            sql += " AND COALESCE(archived, 0) = 0"
        if exclude_children:
            sql += " AND parent_session_id IS NULL"
        return int(self._r(lambda c: c.execute(sql, params).fetchone()[0]))

    def message_count(self, session_id: str | None = None) -> int:
        return self._run(self._db.message_count(session_id))

    # --- export, delete, prune, meta ---
    def export_session(self, session_id: str) -> Row | None:
        try:
            rec = self._run(self._db.export_session(session_id))
        except SessionNotFound:
            return None
        return {**rec["session"], "messages": rec["messages"]}

    def export_all(self, source: str | None = None) -> list[Row]:
        async def collect() -> list[Row]:
            return [
                {**r["session"], "messages": r["messages"]}
                async for r in self._db.export_all(source)
            ]

        return self._run(collect())

    def delete_session(self, session_id: str, sessions_dir: Any = None) -> bool:
        return bool(self._w(archive.delete_many, [session_id]))

    def delete_sessions(self, session_ids: list[Any], sessions_dir: Any = None) -> int:
        """Delete the listed sessions (any state) in one transaction; the real count."""
        wanted = {i for i in session_ids if isinstance(i, str)}
        return sum(1 for sid in self._w(archive.delete_many, session_ids) if sid in wanted)

    def count_empty_sessions(self) -> int:
        return len(self._r(archive.empty_ids))

    def delete_empty_sessions(self, sessions_dir: Any = None) -> int:
        return len(self._w(lambda c: archive.delete_many(c, archive.empty_ids(c))))

    def delete_session_if_empty(self, session_id: str, sessions_dir: Any = None) -> bool:
        def write(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT title IS NULL AND COALESCE(message_count, 0) = 0 "
                "AND NOT EXISTS (SELECT 1 FROM messages WHERE session_id = ?1) "
                "AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_session_id = ?1) "
                "FROM sessions WHERE id = ?1",
                (session_id,),
            ).fetchone()
            return bool(row and row[0]) and bool(archive.delete_many(conn, [session_id]))

        return self._w(write)

    def list_prune_candidates(
        self, older_than_days: float | None = None, source: str | None = None, **filters: Any
    ) -> list[Row]:
        return self._r(archive.select, older_than_days, source, filters, time.time())

    def prune_sessions(
        self,
        older_than_days: float | None = 90,
        source: str | None = None,
        sessions_dir: Any = None,
        **filters: Any,
    ) -> int:
        """Delete ended sessions started before the cut-off (and matching the filters);
        their children are orphaned."""

        def write(conn: sqlite3.Connection) -> int:
            rows = archive.select(conn, older_than_days, source, filters, time.time())
            ids = [r["id"] for r in rows]
            conn.execute(
                f"DELETE FROM session_model_usage WHERE session_id IN ({', '.join('?' for _ in ids)})",
                ids,
            )
            return maintenance.delete_sessions(conn, ids)

        return self._w(write)

    def archive_sessions(
        self, older_than_days: float | None = None, source: str | None = None, **filters: Any
    ) -> int:
        filters.setdefault("archived", False)

        def write(conn: sqlite3.Connection) -> int:
            rows = archive.select(conn, older_than_days, source, filters, time.time())
            return archive.archive_many(conn, [r["id"] for r in rows])

        return self._w(write)

    def set_session_archived(self, session_id: str, archived: bool) -> bool:
        return self._w(hermes_sessions.set_archived, session_id, archived)

    def get_meta(self, key: str) -> str | None:
        return self._run(self._db.get_meta(key))

    def set_meta(self, key: str, value: str) -> None:
        self._run(self._db.set_meta(key, value))

    def optimize_fts(self) -> int:
        """FTS5 'optimize' on each search index of the file; how many there were."""

        def write(conn: sqlite3.Connection) -> int:
            names = [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%USING fts5%' "
                    "AND name IN (?, 'messages_aux_fts')",
                    (schema.FTS_TABLE,),
                )
            ]
            for name in names:
                conn.execute(f"INSERT INTO {name}({name}) VALUES ('optimize')")
            return len(names)

        return self._w(write)

    def rebuild_fts(self) -> int:
        self._run(self._db.rebuild_search_index())
        return 2

    def vacuum(self) -> int:
        count = self.optimize_fts()
        self._run(self._db.vacuum())
        return count

    def maybe_auto_prune_and_vacuum(
        self,
        retention_days: int = 90,
        min_interval_hours: int = 24,
        vacuum: bool = True,
        sessions_dir: Any = None,
    ) -> dict[str, Any]:
        """Prune (by start time) at most once per interval, VACUUM after a prune that
        removed something; never raises."""
        result: dict[str, Any] = {"skipped": False, "pruned": 0, "vacuumed": False}
        try:
            last = self.get_meta(AUTO_PRUNE_META_KEY)
            try:
                last_ts = float(last) if last is not None else None
            except ValueError:
                last_ts = None
            now = time.time()
            if last_ts is not None and now - last_ts < min_interval_hours * 3600:
                result["skipped"] = True
                return result
            result["pruned"] = self.prune_sessions(older_than_days=retention_days)
            if result["pruned"] and vacuum:
                self.vacuum()
                result["vacuumed"] = True
            self.set_meta(AUTO_PRUNE_META_KEY, str(now))
        except Exception as exc:  # noqa: BLE001 - maintenance must never break a start-up
            result["error"] = str(exc)
        return result
