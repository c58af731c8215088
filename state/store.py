"""`SessionDB`: the async interface to state.db that the rest of switchboard uses.

It owns one Writer (all writes, group-committed) and a ReaderPool (all reads), and keeps
the rules of DESIGN.md (lineage, titles, end reasons, pruning) in the operations it submits.
The gateway never sees SQL; a different store (PostgreSQL) can implement the same methods.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

from . import lineage, listing, maintenance, messages, schema, search, sessions, transfer
from .errors import DatabaseBusy, DatabaseError, SessionNotFound, StateError
from .readers import ReaderPool
from .rows import Row
from .writer import Writer, WriterConfig, connect_writer

log = logging.getLogger("state.store")

SQLITE_HEADER = b"SQLite format 3\x00"
AUTO_PRUNE_KEY = "switchboard.auto_prune.last_run"


def _check_file(path: Path) -> None:
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
    text = str(exc).lower()
    if "readonly" in text or "read-only" in text or "unable to open" in text:
        return DatabaseError(
            path,
            f"cannot be written ({exc}): switchboard needs write access to state.db, "
            "its -wal and -shm files and the directory holding them",
        )
    return DatabaseError(path, f"{what} ({exc})")


def _open_and_migrate(
    path: str, cfg: WriterConfig, target: int, lock_budget_s: float
) -> sqlite3.Connection:
    deadline = time.monotonic() + lock_budget_s
    while True:
        try:
            conn = connect_writer(path, cfg.synchronous, cfg.busy_timeout_s)
        except sqlite3.DatabaseError as exc:
            raise _database_error(path, exc, "is damaged or not an SQLite database") from exc
        try:
            schema.migrate(conn, path, target=target)
            return conn
        except StateError:
            conn.close()
            raise
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" in str(exc) and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            if "locked" in str(exc):
                raise DatabaseBusy(f"{path}: locked by another process during start-up") from exc
            raise _database_error(path, exc, "cannot be prepared") from exc
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise _database_error(path, exc, "is damaged or not a database") from exc


class SessionDB:
    """Async session store over one state.db. Create with `await SessionDB.open(path)`."""

    def __init__(self, path: Path, writer: Writer, readers: ReaderPool) -> None:
        self.path = path
        self._writer = writer
        self._readers = readers
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
    ) -> SessionDB:
        def _prepare() -> Path:
            p = Path(path).expanduser().absolute()
            p.parent.mkdir(parents=True, exist_ok=True)
            _check_file(p)
            return p

        p = await asyncio.to_thread(_prepare)
        cfg = config or WriterConfig()
        writer = Writer(str(p), cfg)
        try:
            conn = await asyncio.get_running_loop().run_in_executor(
                writer._executor, _open_and_migrate, str(p), cfg, schema_target, cfg.lock_budget_s
            )
        except BaseException:
            await writer.close()
            raise
        await writer.start(conn)
        db = cls(p, writer, ReaderPool(str(p), readers))
        try:  # prove the file answers a read before the caller relies on it
            await db._read(lambda c: c.execute("SELECT COUNT(*) FROM sessions").fetchone())
        except sqlite3.DatabaseError as exc:
            await db.close()
            raise DatabaseError(str(p), f"is damaged: {exc}") from exc
        return db

    async def close(self) -> None:
        """Flush every queued write, then close all connections."""
        if self._closed:
            return
        self._closed = True
        # Readers first: the last connection to close checkpoints and removes the WAL,
        # and only the (read-write) writer connection can do that.
        await self._readers.close()
        await self._writer.close()

    async def __aenter__(self) -> SessionDB:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def writer(self) -> Writer:
        return self._writer

    async def _read(self, fn: Any, *args: Any) -> Any:
        return await self._readers.run(fn, *args)

    async def _write(self, fn: Any, *args: Any) -> Any:
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
        fields = self._session_fields(
            session_id or "", source, model, model_config, system_prompt, user_id,
            parent_session_id, child_kind, title, started_at, routing,
        )  # fmt: skip
        if not session_id:
            return str(await self._write(sessions.insert_new_session, fields, source == "cli"))
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
        fields = self._session_fields(
            session_id, source, model, model_config, system_prompt, user_id,
            parent_session_id, child_kind, None, None, routing,
        )  # fmt: skip
        return bool(
            await self._write(lambda c: sessions.insert_session(c, fields, if_missing=True))
        )

    @staticmethod
    def _session_fields(
        sid: str, source: str, model: str | None, model_config: Any, system_prompt: str | None,
        user_id: str | None, parent: str | None, child_kind: str | None, title: str | None,
        started_at: float | None, routing: Mapping[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        bad = [k for k in routing if k not in sessions.ROUTING_FIELDS]
        if bad:
            raise TypeError(f"unknown session field(s): {', '.join(bad)}")
        fields: dict[str, Any] = {"id": sid, "source": source}
        for key, value in (
            ("model", model), ("model_config", model_config), ("system_prompt", system_prompt),
            ("user_id", user_id), ("parent_session_id", parent), ("child_kind", child_kind),
            ("title", title), ("started_at", started_at),
        ):  # fmt: skip
            if value is not None:
                fields[key] = value
        fields.update({k: v for k, v in routing.items() if v is not None})
        return fields

    async def get_session(self, session_id: str) -> Row | None:
        return await self._read(sessions.get_session, session_id)

    async def require_session(self, session_id: str) -> Row:
        row = await self.get_session(session_id)
        if row is None:
            raise SessionNotFound(session_id)
        return row

    async def end_session(self, session_id: str, reason: str, *, now: float | None = None) -> bool:
        return bool(await self._write(sessions.end_session, session_id, reason, now))

    async def reopen_session(self, session_id: str) -> bool:
        return bool(await self._write(sessions.reopen_session, session_id))

    async def resolve_session_id(self, ref: str) -> str:
        """Exact id or unique prefix (raises SessionNotFound / AmbiguousSession)."""
        return str(await self._read(sessions.resolve_id, ref))

    async def resolve_session_ref(self, ref: str) -> str:
        """Id, unique id prefix, or title (newest of its lineage)."""

        def _resolve(conn: sqlite3.Connection) -> str:
            try:
                return sessions.resolve_id(conn, ref)
            except SessionNotFound:
                by_title = sessions.resolve_title(conn, ref)
                if by_title is None:
                    raise
                return by_title

        return str(await self._read(_resolve))

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
    ) -> None:
        """Add to the counters (default), or set them (`absolute=True`)."""
        counts = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_read_tokens": cache_read_tokens,
            "cache_write_tokens": cache_write_tokens,
            "reasoning_tokens": reasoning_tokens,
        }
        if not absolute:
            counts = {k: v for k, v in counts.items() if v}
        await self._write(
            lambda c: sessions.update_token_counts(
                c, session_id, counts, estimated_cost_usd=estimated_cost_usd,
                actual_cost_usd=actual_cost_usd, absolute=absolute,
            )
        )  # fmt: skip

    async def _count(self, table: str, column: str, value: str | None) -> int:
        sql = f"SELECT COUNT(*) FROM {table}" + (f" WHERE {column} = ?" if value else "")
        row = await self._read(lambda c: c.execute(sql, (value,) if value else ()).fetchone())
        return int(row[0])

    async def session_count(self, source: str | None = None) -> int:
        return await self._count("sessions", "source", source)

    async def message_count(self, session_id: str | None = None) -> int:
        return await self._count("messages", "session_id", session_id)

    async def stats(self) -> Row:
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
        return int(ids[0])

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
            return list(await self._write(messages.append_messages, session_id, list(batch)))
        return list(
            await self._write(messages.append_messages, session_id, list(batch), dedupe, tokens)
        )

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
        ids, rows = await self._write(
            messages.append_and_read, session_id, list(batch), dedupe, last
        )
        return list(ids), list(rows)

    async def get_messages(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        after_id: int | None = None,
        last: int | None = None,
    ) -> list[Row]:
        return list(
            await self._read(
                lambda c: messages.get_messages(
                    c, session_id, limit=limit, after_id=after_id, last=last
                )
            )
        )

    async def get_messages_around(
        self, session_id: str, message_id: int, window: int = 5
    ) -> list[Row]:
        return list(await self._read(messages.get_messages_around, session_id, message_id, window))

    async def get_messages_as_conversation(
        self, session_id: str, *, include_ancestors: bool = False, last: int | None = None
    ) -> list[dict[str, Any]]:
        def _conv(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows: list[dict[str, Any]] = []
            if include_ancestors:
                for anc in reversed(lineage.ancestors(conn, session_id)):
                    rows.extend(messages.conversation(conn, anc["id"]))
            rows.extend(messages.conversation(conn, session_id, last))
            return rows

        return list(await self._read(_conv))

    async def count_messages_outside(
        self, session_id: str, first_id: int, last_id: int
    ) -> tuple[int, int]:
        """How many messages of the session come before `first_id` and after `last_id`."""
        row = await self._read(
            lambda c: c.execute(
                "SELECT (SELECT COUNT(*) FROM messages WHERE session_id = ? AND id < ?), "
                "(SELECT COUNT(*) FROM messages WHERE session_id = ? AND id > ?)",
                (session_id, first_id, session_id, last_id),
            ).fetchone()
        )
        return int(row[0]), int(row[1])

    async def clear_messages(self, session_id: str) -> int:
        return int(await self._write(messages.clear_messages, session_id))

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

    async def get_session_by_title(self, title: str) -> Row | None:
        def _get(conn: sqlite3.Connection) -> Row | None:
            owner = sessions.title_owner(conn, sessions.clean_title(title))
            return sessions.get_session(conn, owner) if owner else None

        return await self._read(_get)

    async def resolve_session_by_title(self, title: str) -> str | None:
        return await self._read(sessions.resolve_title, title)

    async def get_next_title_in_lineage(self, title: str) -> str:
        return str(await self._read(sessions.next_title_in_lineage, title))

    # --- lineage --------------------------------------------------------------------

    async def get_ancestors(self, session_id: str) -> list[Row]:
        return list(await self._read(lineage.ancestors, session_id))

    async def get_descendants(self, session_id: str) -> list[Row]:
        return list(await self._read(lineage.descendants, session_id))

    async def get_children(self, session_id: str, kind: str | None = None) -> list[Row]:
        return list(await self._read(lineage.children, session_id, kind))

    async def get_compression_tip(self, session_id: str) -> str:
        return str(await self._read(lineage.compression_tip, session_id))

    async def resolve_resume_session_id(self, session_id: str) -> str:
        return str(await self._read(lineage.resume_target, session_id))

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
        seeds = list(seed_messages)

        def _fork(conn: sqlite3.Connection) -> str:
            parent = sessions.get_session(conn, parent_id)
            if parent is None:
                raise SessionNotFound(parent_id)
            cid = new_id or sessions.fresh_session_id(conn, terminal=parent["source"] == "cli")
            fields: dict[str, Any] = {
                "id": cid,
                "source": parent["source"],
                "parent_session_id": parent_id,
                "child_kind": kind,
            }
            for col in ("user_id", "model", "model_config", "system_prompt", "session_key",
                        "chat_id", "chat_type", "thread_id", "origin_json"):  # fmt: skip
                if parent.get(col) is not None:
                    fields[col] = parent[col]
            fields.update({k: v for k, v in routing.items() if v is not None})
            sessions.insert_session(conn, fields)
            if title is not None:
                sessions.set_title(conn, cid, title)
            elif parent.get("title") and kind in ("compression", "branch"):
                sessions.set_title(conn, cid, sessions.next_title_in_lineage(conn, parent["title"]))
            if copy_messages:
                history = messages.get_messages(conn, parent_id)
                messages.append_messages(conn, cid, [
                    {k: v for k, v in m.items() if k in messages.MESSAGE_FIELDS} for m in history
                ])  # fmt: skip
            if seeds:
                messages.append_messages(conn, cid, seeds)
            if end_reason is not None:
                sessions.end_session(conn, parent_id, end_reason)
            return cid

        return str(await self._write(_fork))

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
    ) -> list[Row]:
        """Newest activity first, each row with `last_active` and a 60-char `preview`."""
        flt = listing.SessionFilter(
            source=source, exclude_sources=tuple(exclude_sources), user_id=user_id,
            chat_id=chat_id, include_children=include_children,
            include_archived=include_archived, titled_only=titled_only,
        )  # fmt: skip
        return list(await self._read(listing.list_sessions, flt, limit, offset))

    async def sessions_by_start(
        self, source: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[Row]:
        """Every session, children included, newest start first, with all its columns."""
        return list(await self._read(listing.sessions_by_start, source, limit, offset))

    async def resolve_in_scope(self, ref: str, flt: listing.SessionFilter) -> str | None:
        """Id, unique prefix or title, among the sessions `flt` allows (None if none)."""
        return await self._read(listing.resolve_in_scope, ref, flt)

    async def list_filtered(
        self, flt: listing.SessionFilter, limit: int = 20, offset: int = 0
    ) -> list[Row]:
        return list(await self._read(listing.list_sessions, flt, limit, offset))

    async def count_filtered(self, flt: listing.SessionFilter) -> int:
        return int(await self._read(listing.count_sessions, flt))

    async def has_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> bool:
        """True if a message with this platform id was already stored for that chat."""
        return bool(await self._read(messages.is_stored, source, chat_id, platform_message_id))

    # --- handoff (terminal -> chat) ----------------------------------------------------

    async def request_handoff(
        self, session_id: str, platform: str, *, now: float | None = None
    ) -> bool:
        """Mark a session `pending` for `platform`; False if a handoff is already in flight."""
        at = time.time() if now is None else now

        def _request(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE sessions SET handoff_state = 'pending', handoff_platform = ?, handoff_error = NULL, "
                "handoff_updated_at = ? WHERE id = ? AND COALESCE(handoff_state, '') NOT IN ('pending', 'running')",
                (platform, at, session_id),
            )
            if cur.rowcount == 0:
                sessions.require_session(conn, session_id)
            return cur.rowcount == 1

        return bool(await self._write(_request))

    async def claim_handoff(
        self, platforms: Iterable[str], *, now: float | None = None
    ) -> Row | None:
        """Atomically take the oldest pending handoff for one of `platforms` (pending ->
        running). One statement in one IMMEDIATE transaction: of two daemons, one wins."""
        wanted = list(platforms)
        if not wanted:
            return None
        at = time.time() if now is None else now

        def _claim(conn: sqlite3.Connection) -> Row | None:
            marks = ", ".join("?" for _ in wanted)
            row = conn.execute(
                "UPDATE sessions SET handoff_state = 'running', handoff_updated_at = ? WHERE id = ("
                f"SELECT id FROM sessions WHERE handoff_state = 'pending' AND handoff_platform IN ({marks}) "
                "ORDER BY handoff_updated_at LIMIT 1) RETURNING id, handoff_platform",
                (at, *wanted),
            ).fetchone()
            return {"id": row[0], "platform": row[1]} if row else None

        return await self._write(_claim)

    async def finish_handoff(
        self,
        session_id: str,
        state: str | None,
        error: str | None = None,
        *,
        expect: str | None = None,
    ) -> bool:
        """Set the handoff's final (or reset) state; with `expect`, only from that state."""

        def _finish(conn: sqlite3.Connection) -> bool:
            sql = "UPDATE sessions SET handoff_state = ?, handoff_error = ?, handoff_updated_at = ? WHERE id = ?"
            params: list[object] = [state, error, time.time(), session_id]
            if expect is not None:
                sql += " AND handoff_state = ?"
                params.append(expect)
            return conn.execute(sql, params).rowcount == 1

        return bool(await self._write(_finish))

    async def fail_stale_handoffs(
        self, older_than_s: float, *, now: float | None = None
    ) -> list[str]:
        """`running` handoffs whose daemon went away: failed, never stuck."""
        at = time.time() if now is None else now

        def _fail(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "UPDATE sessions SET handoff_state = 'failed', handoff_error = "
                "'the gateway stopped during the handoff', handoff_updated_at = ? "
                "WHERE handoff_state = 'running' AND handoff_updated_at < ? RETURNING id",
                (at, at - older_than_s),
            ).fetchall()
            return [r[0] for r in rows]

        return list(await self._write(_fail))

    async def live_sessions_by_key(self) -> list[Row]:
        """The newest live (not ended) session per session_key: the index's source of truth."""
        return list(await self._read(lambda c: [
            dict(zip(("session_key", "id", "started_at", "last_active", "origin_json", "source", "chat_type"), r, strict=True))
            for r in c.execute(
                "SELECT session_key, id, started_at, last_active, origin_json, source, chat_type "
                "FROM sessions WHERE session_key IS NOT NULL AND ended_at IS NULL "
                "ORDER BY started_at"
            )
        ]))  # fmt: skip

    async def newest_live_session_by_key(self) -> dict[str, str]:
        """session_key -> id of its newest live session: what the index checks itself
        against at start-up. SQLite groups along the key index and hands back one JSON
        object, so most of the work runs without the GIL and no row is built per session."""

        def _newest(conn: sqlite3.Connection) -> dict[str, str]:
            (text,) = conn.execute(
                # the bare `id` beside MAX() comes from the row holding the maximum
                "SELECT json_group_object(k, id) FROM (SELECT session_key AS k, id, MAX(started_at) "
                "FROM sessions WHERE session_key IS NOT NULL AND ended_at IS NULL GROUP BY session_key)"
            ).fetchone()
            return dict(json.loads(text)) if text else {}

        return await self._read(_newest)

    async def session_states(self, ids: list[str]) -> dict[str, tuple[float | None, str | None]]:
        """id -> (ended_at, end_reason) for the ids that exist."""

        def _states(conn: sqlite3.Connection) -> dict[str, tuple[float | None, str | None]]:
            out: dict[str, tuple[float | None, str | None]] = {}
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ", ".join("?" for _ in chunk)
                for sid, ended, reason in conn.execute(
                    f"SELECT id, ended_at, end_reason FROM sessions WHERE id IN ({marks})", chunk
                ):
                    out[sid] = (ended, reason)
            return out

        return dict(await self._read(_states))

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
            n = int(await self._write(maintenance.prune_chunk, older_than_days, source, at, keep))
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
        return list(
            await self._read(maintenance.prune_candidates, older_than_days, source, at, limit)
        )

    async def vacuum(self) -> tuple[int, int]:
        """VACUUM; returns the file size in bytes before and after."""
        before, after = await self._writer.exclusive(maintenance.vacuum)
        return int(before), int(after)

    async def maybe_auto_prune_and_vacuum(
        self,
        retention_days: float = 90,
        min_interval_hours: float = 24,
        vacuum: bool = True,
        *,
        now: float | None = None,
        min_vacuum_bytes: int = 8 * 1024 * 1024,
        min_vacuum_share: float = 0.2,
    ) -> dict[str, Any]:
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

    async def get_meta(self, key: str) -> str | None:
        return await self._read(maintenance.get_meta, key)

    async def set_meta(self, key: str, value: str | None) -> None:
        await self._write(maintenance.set_meta, key, value)

    async def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        if mode not in ("PASSIVE", "FULL", "RESTART", "TRUNCATE"):
            raise ValueError("checkpoint mode must be PASSIVE, FULL, RESTART or TRUNCATE")
        row = await self._writer.exclusive(
            lambda c: c.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        )
        return int(row[0]), int(row[1]), int(row[2])

    # --- export / import ------------------------------------------------------------

    async def export_session(self, session_id: str) -> Row:
        page = await self._read(transfer.export_page, None, 1, None, [session_id])
        if not page:
            raise SessionNotFound(session_id)
        return dict(page[0])

    async def export_all(
        self,
        source: str | None = None,
        *,
        session_ids: list[str] | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[Row]:
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

    async def write_jsonl(self, fh: Any, **kwargs: Any) -> int:
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
    ) -> list[Row]:
        """Search every message (see state.search); raises QueryError for unusable queries."""
        req = search.SearchRequest(
            query=query, sources=tuple(sources), exclude_sources=tuple(exclude_sources),
            roles=tuple(roles), scope=scope or listing.SessionFilter(include_children=True),
            exclude_session_ids=tuple(exclude_session_ids), sort=sort, limit=limit, offset=offset,
        )  # fmt: skip
        return list(await self._read(search.search, req))

    # --- search index maintenance ----------------------------------------------------

    async def rebuild_search_index(self) -> int:
        """Rebuild both FTS indexes from the messages table; returns the aux row count."""

        def _rebuild(conn: sqlite3.Connection) -> int:
            conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
            return schema.rebuild_aux(conn)

        return int(await self._write(_rebuild))

    async def optimize_search_index(self) -> None:
        def _optimize(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
            conn.execute("INSERT INTO messages_aux_fts(messages_aux_fts) VALUES ('optimize')")

        await self._write(_optimize)

    async def check_search_index(self) -> list[str]:
        """FTS integrity checks; returns a list of problems (empty when healthy)."""

        def _check(conn: sqlite3.Connection) -> list[str]:
            problems = []
            for table in ("messages_fts", "messages_aux_fts"):
                try:
                    conn.execute(
                        f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)"
                    )
                except sqlite3.DatabaseError as exc:
                    problems.append(f"{table}: {exc}")
            return problems

        return list(await self._write(_check))

    async def integrity_check(self, quick: bool = True) -> list[str]:
        pragma = "quick_check" if quick else "integrity_check"
        rows = await self._read(lambda c: c.execute(f"PRAGMA {pragma}").fetchall())
        found = [r[0] for r in rows]
        return [] if found == ["ok"] else found

    # --- dashboard queries (state/keyset.py, family.py, cleanup.py, insights.py) ----------

    async def session_page(self, q: Any) -> tuple[list[Row], tuple[float, str] | None]:
        """One keyset page of sessions (a `state.keyset.PageQuery`) and the next cursor."""
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
        """Activity figures for [since, until) (see state/insights.py)."""
        from . import insights

        return dict(await self._read(insights.insights, insights.Period(since, until, source)))
