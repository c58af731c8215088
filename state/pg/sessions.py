"""Sessions on PostgreSQL: create, end/reopen, routing fields, titles, handoffs and the
index's source queries. Each function runs inside the writer's transaction (writes) or on
a pooled connection (reads); the rules are state/sqlite/sessions.py's and state/titles.py's, and
uniqueness is the constraints' job, so two processes cannot both win."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from psycopg import AsyncConnection, errors

from ..columns import ROUTING_FIELDS, TOKEN_FIELDS
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
from ..records import HandoffClaim, LiveSession, SessionRow, UntoldReset
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
from ..vocab import CHILD_KINDS, STALE_ERROR
from . import db
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


# --- handoffs (state/sqlite/handoffs.py's state machine) --------------------------------------


async def request_handoff(
    conn: AsyncConnection, session_id: str, platform: str, now: float
) -> bool:
    n = await db.run(
        conn,
        "UPDATE sessions SET handoff_state = 'pending', handoff_platform = %s, handoff_error = NULL, "
        "handoff_updated_at = %s WHERE id = %s "
        "AND COALESCE(handoff_state, '') NOT IN ('pending', 'running')",
        (platform, now, session_id),
    )
    if n == 0:
        await require_session(conn, session_id)
    return n == 1


# Under READ COMMITTED a plain `WHERE id = (SELECT ... LIMIT 1)` lets two claimers pick the
# same row and both update it (the second re-checks only `id`). SKIP LOCKED makes the second
# pass over a row the first holds, and the outer state check refuses a row that changed.
_CLAIM = (
    "UPDATE sessions SET handoff_state = 'running', handoff_updated_at = %s WHERE id = ("
    "SELECT id FROM sessions WHERE handoff_state = 'pending' AND handoff_platform = ANY(%s) "
    "ORDER BY handoff_updated_at LIMIT 1 FOR UPDATE SKIP LOCKED) "
    "AND handoff_state = 'pending' RETURNING id, handoff_platform"
)


async def claim_handoff(
    conn: AsyncConnection, platforms: Sequence[str], now: float
) -> HandoffClaim | None:
    found = await db.tuples(conn, _CLAIM, (now, list(platforms)))
    return {"id": found[0][0], "platform": found[0][1]} if found else None


async def finish_handoff(
    conn: AsyncConnection, session_id: str, state: str | None, error: str | None, expect: str | None
) -> bool:
    sql = (
        "UPDATE sessions SET handoff_state = %s, handoff_error = %s, handoff_updated_at = %s "
        "WHERE id = %s"
    )
    params: list[object] = [state, error, time.time(), session_id]
    if expect is not None:
        sql += " AND handoff_state = %s"
        params.append(expect)
    return await db.run(conn, sql, params) == 1


async def fail_stale_handoffs(conn: AsyncConnection, older_than_s: float, now: float) -> list[str]:
    found = await db.tuples(
        conn,
        "UPDATE sessions SET handoff_state = 'failed', handoff_error = %s, handoff_updated_at = %s "
        "WHERE handoff_state = 'running' AND handoff_updated_at < %s RETURNING id",
        (STALE_ERROR, now, now - older_than_s),
    )
    return sorted(r[0] for r in found)


# --- the gateway index's source queries (state/sqlite/routing.py) ------------------------------

_LIVE = "session_key, id, started_at, last_active, origin_json, source, chat_type"


async def live_sessions_by_key(conn: AsyncConnection) -> list[LiveSession]:
    found = await db.rows(
        conn,
        f"SELECT {_LIVE} FROM sessions WHERE session_key IS NOT NULL AND ended_at IS NULL "
        "ORDER BY started_at, id",
    )
    return cast(list[LiveSession], found)


async def live_session_for_key(conn: AsyncConnection, key: str) -> LiveSession | None:
    found = await db.row(
        conn,
        f"SELECT {_LIVE} FROM sessions WHERE session_key = %s AND ended_at IS NULL "
        "ORDER BY started_at DESC, id DESC LIMIT 1",
        (key,),
    )
    return cast(LiveSession | None, found)


async def newest_live_session_by_key(conn: AsyncConnection) -> dict[str, str]:
    found = await db.tuples(
        conn,
        "SELECT DISTINCT ON (session_key) session_key, id FROM sessions "
        "WHERE session_key IS NOT NULL AND ended_at IS NULL "
        "ORDER BY session_key, started_at DESC, id DESC",
    )
    return {k: v for k, v in found}


async def session_states(
    conn: AsyncConnection, ids: list[str]
) -> dict[str, tuple[float | None, str | None]]:
    found = await db.tuples(
        conn, "SELECT id, ended_at, end_reason FROM sessions WHERE id = ANY(%s)", (ids,)
    )
    return {r[0]: (r[1], r[2]) for r in found}


async def untold_resets(conn: AsyncConnection) -> list[UntoldReset]:
    """See state.sqlite.routing.untold_resets."""
    found = await db.tuples(
        conn,
        "SELECT c.session_key, c.id, p.id, p.title, p.message_count, p.end_reason "
        "FROM sessions c JOIN sessions p ON p.id = c.parent_session_id "
        "WHERE c.ended_at IS NULL AND c.session_key IS NOT NULL AND c.child_kind = 'reset' "
        "AND COALESCE(c.message_count, 0) = 0 AND p.end_reason IN ('idle', 'daily')",
    )
    return [
        {
            "session_key": r[0],
            "session_id": r[1],
            "old_id": r[2],
            "old_title": r[3],
            "old_messages": int(r[4] or 0),
            "end_reason": r[5],
        }
        for r in found
    ]
