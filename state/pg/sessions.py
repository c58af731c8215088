"""Sessions on PostgreSQL: create, end/reopen, routing fields, titles, references. Each function runs inside the writer's transaction (writes) or on
a pooled connection (reads); the rules are state/sqlite/sessions.py's and state/titles.py's, and
uniqueness is the constraints' job, so two processes cannot both win."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, cast

from psycopg import AsyncConnection, errors

from ..columns import ROUTING_FIELDS, TOKEN_FIELDS
from ..creation import Creation
from ..errors import (
    AmbiguousSession,
    LiveSessionExists,
    SessionExists,
    SessionNotFound,
    TitleEmpty,
    TitleTaken,
    TitleTooLong,
)
from ..ids import new_session_id
from ..records import SessionRow
from ..rows import like_escape
from ..titles import (
    MAX_TITLE_LENGTH,
    clean_title,
    lineage_key,
    lineage_title,
    sanitize_title,
    split_lineage,
    title_key,
)
from ..vocab import CHILD_KINDS
from . import db
from .dispatch import Dispatch
from .schema import LIVE_KEY_INDEX, TITLE_INDEX


def _unique_error(exc: errors.UniqueViolation, fields: Mapping[str, Any]) -> Exception:
    name = db.violated(exc)
    if name == LIVE_KEY_INDEX:
        return LiveSessionExists(str(fields.get("session_key")))
    if name == TITLE_INDEX:
        return TitleTaken(str(fields.get("title")), "another session")
    return SessionExists(str(fields.get("id")))


async def insert_session(
    conn: AsyncConnection, fields: Mapping[str, Any], *, if_missing: bool = False
) -> bool:
    """Insert a session row; returns False when `if_missing` and it already existed."""
    cols = dict(fields)
    cols.setdefault("started_at", time.time())
    cols.setdefault("last_active", cols["started_at"])
    for name in ("message_count", "tool_call_count", *TOKEN_FIELDS):
        cols.setdefault(name, 0)
    for name in ("model_config", "origin_json"):
        if isinstance(cols.get(name), (dict, list)):
            cols[name] = json.dumps(cols[name], ensure_ascii=False)
    if cols.get("child_kind") is not None and cols["child_kind"] not in CHILD_KINDS:
        raise ValueError(f"child_kind must be one of {', '.join(CHILD_KINDS)}")
    title = cols.pop("title", None)
    tail = " ON CONFLICT (id) DO NOTHING" if if_missing else ""
    try:
        async with conn.transaction():
            n = await db.run(
                conn,
                f"INSERT INTO sessions ({', '.join(cols)}) VALUES ({db.marks(len(cols))}){tail}",
                tuple(cols.values()),
            )
    except errors.UniqueViolation as exc:
        raise _unique_error(exc, cols) from exc
    if n == 0:
        return False
    if title is not None:
        await set_title(conn, cols["id"], title)
    return True


async def insert_new_session(
    conn: AsyncConnection, fields: Mapping[str, Any], terminal: bool
) -> str:
    """Insert under a fresh generated id, drawing again if another writer took it."""
    while True:
        sid = new_session_id(terminal=terminal)
        try:
            await insert_session(conn, {**fields, "id": sid})
            return sid
        except SessionExists:
            continue


async def require_session(conn: AsyncConnection, session_id: str) -> None:
    if await db.value(conn, "SELECT 1 FROM sessions WHERE id = %s", (session_id,)) is None:
        raise SessionNotFound(session_id)


async def get_session(conn: AsyncConnection, session_id: str) -> SessionRow | None:
    return cast(
        SessionRow | None, await db.row(conn, "SELECT * FROM sessions WHERE id = %s", (session_id,))
    )


async def end_session(
    conn: AsyncConnection, session_id: str, reason: str, now: float | None = None
) -> bool:
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("end_reason must be a non-empty string")
    n = await db.run(
        conn,
        "UPDATE sessions SET ended_at = %s, end_reason = %s WHERE id = %s AND ended_at IS NULL",
        (time.time() if now is None else now, reason, session_id),
    )
    if n == 0:
        await require_session(conn, session_id)
        return False
    return True


async def reopen_session(conn: AsyncConnection, session_id: str) -> bool:
    try:
        async with conn.transaction():
            n = await db.run(
                conn,
                "UPDATE sessions SET ended_at = NULL, end_reason = NULL "
                "WHERE id = %s AND ended_at IS NOT NULL",
                (session_id,),
            )
    except errors.UniqueViolation as exc:
        key = await db.value(conn, "SELECT session_key FROM sessions WHERE id = %s", (session_id,))
        raise LiveSessionExists(str(key)) from exc
    if n == 0:
        await require_session(conn, session_id)
        return False
    return True


async def update_system_prompt(conn: AsyncConnection, session_id: str, prompt: str | None) -> None:
    if not await db.run(
        conn, "UPDATE sessions SET system_prompt = %s WHERE id = %s", (prompt, session_id)
    ):
        raise SessionNotFound(session_id)


async def update_fields(conn: AsyncConnection, session_id: str, fields: Mapping[str, Any]) -> None:
    bad = [k for k in fields if k not in ROUTING_FIELDS]
    if bad:
        raise ValueError(f"not updatable: {', '.join(bad)}")
    if not fields:
        return
    values = [
        json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v
        for v in fields.values()
    ]
    sets = ", ".join(f"{k} = %s" for k in fields)
    try:
        async with conn.transaction():
            n = await db.run(
                conn, f"UPDATE sessions SET {sets} WHERE id = %s", (*values, session_id)
            )
    except errors.UniqueViolation as exc:
        raise _unique_error(exc, fields) from exc
    if n == 0:
        raise SessionNotFound(session_id)
    if "source" in fields or "chat_id" in fields:
        # the dedupe keys follow the session (has_platform_message asks by its chat)
        await db.run(
            conn,
            "WITH moved AS (DELETE FROM platform_messages p USING messages m "
            "WHERE p.message_id = m.id AND m.session_id = %s RETURNING p.*) "
            "INSERT INTO platform_messages SELECT s.source, s.chat_id, moved.platform_message_id, "
            "moved.message_id FROM moved, sessions s WHERE s.id = %s AND s.source IS NOT NULL "
            "AND s.chat_id IS NOT NULL ON CONFLICT DO NOTHING",
            (session_id, session_id),
        )


# --- titles ---------------------------------------------------------------------------


async def title_owner(conn: AsyncConnection, title: str) -> str | None:
    found = await db.value(
        conn, "SELECT id FROM sessions WHERE title_key = %s LIMIT 1", (title_key(title),)
    )
    return None if found is None else str(found)


async def set_title(conn: AsyncConnection, session_id: str, raw: str | None) -> str | None:
    if raw is None or not clean_title(raw):
        if raw is not None and raw.strip() and not clean_title(raw):
            raise TitleEmpty()
        n = await db.run(
            conn,
            "UPDATE sessions SET title = NULL, title_key = NULL, title_base = NULL, "
            "title_number = NULL WHERE id = %s",
            (session_id,),
        )
        if n == 0:
            raise SessionNotFound(session_id)
        return None
    title = sanitize_title(raw)
    owner = await title_owner(conn, title)
    if owner is not None and owner != session_id:
        raise TitleTaken(title, owner)
    base_key, number = lineage_key(title)
    try:
        async with conn.transaction():
            n = await db.run(
                conn,
                "UPDATE sessions SET title = %s, title_key = %s, title_base = %s, title_number = %s "
                "WHERE id = %s",
                (title, title_key(title), base_key, number, session_id),
            )
    except errors.UniqueViolation as exc:  # another process took it since the check
        raise TitleTaken(title, await title_owner(conn, title) or "another session") from exc
    if n == 0:
        raise SessionNotFound(session_id)
    return title


async def set_title_if_unset(conn: AsyncConnection, session_id: str, raw: str) -> str | None:
    found = await db.row(conn, "SELECT title FROM sessions WHERE id = %s", (session_id,))
    if found is None:
        raise SessionNotFound(session_id)
    if found["title"] is not None:
        return None
    try:
        title = sanitize_title(raw[:MAX_TITLE_LENGTH])
    except (TitleEmpty, TitleTooLong):
        return None
    for _ in range(20):  # another writer may take each candidate first
        if await title_owner(conn, title) is not None:
            title = await next_title_in_lineage(conn, title)
        try:
            return await set_title(conn, session_id, title)
        except TitleTaken:
            continue
    return None


async def next_title_in_lineage(conn: AsyncConnection, title: str) -> str:
    base, _ = split_lineage(clean_title(title))
    top = await db.value(
        conn, "SELECT MAX(title_number) FROM sessions WHERE title_base = %s", (title_key(base),)
    )
    top = int(top or 0)
    while True:
        top += 1
        candidate = lineage_title(base, top)
        if len(candidate) > MAX_TITLE_LENGTH:
            suffix = f" #{top}"
            candidate = base[: MAX_TITLE_LENGTH - len(suffix)].rstrip() + suffix
        if await title_owner(conn, candidate) is None:
            return candidate


async def resolve_title(conn: AsyncConnection, raw: str) -> str | None:
    title = clean_title(raw)
    if not title:
        return None
    base, _ = split_lineage(title)
    if title != base:
        return await title_owner(conn, title)
    found = await db.value(
        conn,
        "SELECT id FROM sessions WHERE title_base = %s "
        "ORDER BY title_number DESC, started_at DESC LIMIT 1",
        (title_key(base),),
    )
    return str(found) if found is not None else await title_owner(conn, title)


async def resolve_id(conn: AsyncConnection, ref: str) -> str:
    ref = ref.strip()
    if not ref:
        raise SessionNotFound(ref)
    if await db.value(conn, "SELECT 1 FROM sessions WHERE id = %s", (ref,)):
        return ref
    found = await db.tuples(
        conn,
        "SELECT id FROM sessions WHERE id LIKE %s ESCAPE '\\' ORDER BY id LIMIT 6",
        (like_escape(ref) + "%",),
    )
    if not found:
        raise SessionNotFound(ref)
    if len(found) > 1:
        raise AmbiguousSession(ref, [r[0] for r in found])
    return str(found[0][0])


async def resolve_ref(conn: AsyncConnection, ref: str) -> str:
    try:
        return await resolve_id(conn, ref)
    except SessionNotFound:
        by_title = await resolve_title(conn, ref)
        if by_title is None:
            raise
        return by_title


async def get_by_title(conn: AsyncConnection, title: str) -> SessionRow | None:
    owner = await title_owner(conn, clean_title(title))
    return await get_session(conn, owner) if owner else None


async def count_sessions(conn: AsyncConnection, source: str | None = None) -> int:
    if source:
        return int(
            await db.value(conn, "SELECT COUNT(*) FROM sessions WHERE source = %s", (source,))
        )
    return int(await db.value(conn, "SELECT COUNT(*) FROM sessions"))


class SessionOps(Creation, Dispatch):
    """PgStore's sessions: create, read, end/reopen, resolve references, titles."""

    async def _insert(self, fields: dict[str, Any]) -> None:
        await self._write(insert_session, fields)

    async def _insert_new(self, fields: dict[str, Any], cli: bool) -> str:
        return await self._write(insert_new_session, fields, cli)

    async def _insert_if_missing(self, fields: dict[str, Any]) -> bool:
        async def write(conn: AsyncConnection) -> bool:
            return await insert_session(conn, fields, if_missing=True)

        return await self._write(write)

    async def get_session(self, session_id: str) -> SessionRow | None:
        return await self._read(get_session, session_id)

    async def end_session(self, session_id: str, reason: str, *, now: float | None = None) -> bool:
        return await self._write(end_session, session_id, reason, now)

    async def reopen_session(self, session_id: str) -> bool:
        return await self._write(reopen_session, session_id)

    async def resolve_session_id(self, ref: str) -> str:
        return await self._read(resolve_id, ref)

    async def resolve_session_ref(self, ref: str) -> str:
        return await self._read(resolve_ref, ref)

    async def update_system_prompt(self, session_id: str, prompt: str | None) -> None:
        await self._write(update_system_prompt, session_id, prompt)

    async def update_session(self, session_id: str, **fields: Any) -> None:
        await self._write(update_fields, session_id, fields)

    async def session_count(self, source: str | None = None) -> int:
        return await self._read(count_sessions, source)

    async def set_session_title(self, session_id: str, title: str | None) -> str | None:
        return await self._write(set_title, session_id, title)

    async def set_title_if_unset(self, session_id: str, title: str) -> str | None:
        return await self._write(set_title_if_unset, session_id, title)

    async def get_session_by_title(self, title: str) -> SessionRow | None:
        return await self._read(get_by_title, title)

    async def resolve_session_by_title(self, title: str) -> str | None:
        return await self._read(resolve_title, title)

    async def get_next_title_in_lineage(self, title: str) -> str:
        return await self._read(next_title_in_lineage, title)
