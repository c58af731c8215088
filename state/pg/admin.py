"""Listings, delete and prune, the key/value meta table, lineage repair, statistics and
export/import on PostgreSQL (the rules of state/sqlite/listing.py, maintenance.py, transfer.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, cast

from psycopg import AsyncConnection

from ..columns import PRUNE_CHUNK
from ..errors import AmbiguousSession, SessionNotFound, TitleTaken
from ..filters import LIST_COLUMNS, SessionFilter, with_chat_name
from ..records import (
    DERIVED_SESSION_COLUMNS,
    FORMAT_VERSION,
    ExportRecord,
    ImportReport,
    SessionRow,
    SourceUsage,
    UsageStats,
)
from ..rows import like_escape, to_json_text
from ..titles import clean_title, split_lineage, title_key
from . import db, messages, sessions

# --- listings ------------------------------------------------------------------------


async def list_sessions(
    conn: AsyncConnection, flt: SessionFilter, limit: int, offset: int
) -> list[SessionRow]:
    where, params = flt.where(mark="%s")
    found = await db.rows(
        conn,
        f"SELECT {LIST_COLUMNS} FROM sessions WHERE {where} "
        "ORDER BY last_active DESC NULLS LAST, id DESC LIMIT %s OFFSET %s",
        (*params, max(0, limit), max(0, offset)),
    )
    return cast(list[SessionRow], [with_chat_name(r) for r in found])


async def sessions_by_start(
    conn: AsyncConnection, source: str | None, limit: int, offset: int
) -> list[SessionRow]:
    where, params = ("WHERE source = %s ", [source]) if source else ("", [])
    found = await db.rows(
        conn,
        f"SELECT * FROM sessions {where}ORDER BY started_at DESC, id DESC LIMIT %s OFFSET %s",
        [*params, max(0, limit), max(0, offset)],
    )
    return cast(list[SessionRow], found)


async def count_filtered(conn: AsyncConnection, flt: SessionFilter) -> int:
    where, params = flt.where(mark="%s")
    return int(await db.value(conn, f"SELECT COUNT(*) FROM sessions WHERE {where}", params))


async def resolve_in_scope(conn: AsyncConnection, ref: str, flt: SessionFilter) -> str | None:
    ref = ref.strip()
    if not ref:
        return None
    where, params = flt.where(mark="%s")
    found = await db.value(
        conn, f"SELECT id FROM sessions WHERE id = %s AND {where}", (ref, *params)
    )
    if found is not None:
        return str(found)
    prefixed = await db.tuples(
        conn,
        f"SELECT id FROM sessions WHERE id LIKE %s ESCAPE '\\' AND {where} ORDER BY id LIMIT 6",
        (like_escape(ref) + "%", *params),
    )
    if len(prefixed) > 1:
        raise AmbiguousSession(ref, [r[0] for r in prefixed])
    if prefixed:
        return str(prefixed[0][0])
    title = clean_title(ref)
    if not title:
        return None
    base, _ = split_lineage(title)
    by_key = f"SELECT id FROM sessions WHERE title_key = %s AND {where}"
    if title != base:
        found = await db.value(conn, by_key, (title_key(title), *params))
        return str(found) if found is not None else None
    found = await db.value(
        conn,
        f"SELECT id FROM sessions WHERE title_base = %s AND {where} "
        "ORDER BY title_number DESC, started_at DESC LIMIT 1",
        (title_key(base), *params),
    )
    if found is None:
        found = await db.value(conn, by_key, (title_key(title), *params))
    return str(found) if found is not None else None


# --- delete, prune, meta ------------------------------------------------------------------


async def delete_sessions(conn: AsyncConnection, ids: list[str]) -> int:
    """Delete sessions and their messages; their children are orphaned, never deleted."""
    if not ids:
        return 0
    await db.run(
        conn,
        "UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id = ANY(%s)",
        (ids,),
    )
    await db.run(conn, "DELETE FROM messages WHERE session_id = ANY(%s)", (ids,))
    return await db.run(conn, "DELETE FROM sessions WHERE id = ANY(%s)", (ids,))


async def delete_session(conn: AsyncConnection, session_id: str) -> None:
    if await delete_sessions(conn, [session_id]) == 0:
        raise SessionNotFound(session_id)


async def prune_candidates(
    conn: AsyncConnection,
    older_than_days: float,
    source: str | None,
    now: float,
    limit: int = PRUNE_CHUNK,
    protected: frozenset[str] = frozenset(),
) -> list[str]:
    sql = (
        "SELECT id FROM sessions WHERE ended_at IS NOT NULL "
        "AND COALESCE(last_active, started_at) < %s"
    )
    params: list[object] = [now - older_than_days * 86400]
    if source:
        sql += " AND source = %s"
        params.append(source)
    found = await db.tuples(
        conn, sql + " ORDER BY last_active NULLS FIRST LIMIT %s", (*params, limit + len(protected))
    )
    return [r[0] for r in found if r[0] not in protected][:limit]


async def prune_chunk(
    conn: AsyncConnection,
    older_than_days: float,
    source: str | None,
    now: float,
    protected: frozenset[str],
) -> int:
    ids = await prune_candidates(conn, older_than_days, source, now, protected=protected)
    return await delete_sessions(conn, ids)


async def get_meta(conn: AsyncConnection, key: str) -> str | None:
    found = await db.value(conn, "SELECT value FROM state_meta WHERE key = %s", (key,))
    return None if found is None else str(found)


async def set_meta(conn: AsyncConnection, key: str, value: str | None) -> None:
    if value is None:
        await db.run(conn, "DELETE FROM state_meta WHERE key = %s", (key,))
    else:
        await db.run(
            conn,
            "INSERT INTO state_meta(key, value) VALUES (%s, %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )


async def claim_meta_stamp(
    conn: AsyncConnection, key: str, min_interval_s: float, now: float
) -> bool:
    """Take a periodic job's turn across every process sharing the database: the row lock
    makes the check and the stamp one step."""
    await db.run(
        conn, "INSERT INTO state_meta(key, value) VALUES (%s, NULL) ON CONFLICT DO NOTHING", (key,)
    )
    last = await db.value(conn, "SELECT value FROM state_meta WHERE key = %s FOR UPDATE", (key,))
    if last is not None:
        try:
            if now - float(last) < min_interval_s:
                return False
        except ValueError:
            pass
    await set_meta(conn, key, repr(now))
    return True


async def vacuum_pruned(conn: AsyncConnection) -> None:
    """Make the pruned rows' space reusable (on an autocommit connection: VACUUM cannot run
    inside a transaction)."""
    await db.run(
        conn, "VACUUM (ANALYZE) sessions, messages, platform_messages, session_model_usage"
    )


# --- lineage repair, statistics --------------------------------------------------------


async def count_dangling_parents(conn: AsyncConnection) -> int:
    return int(
        await db.value(
            conn,
            "SELECT COUNT(*) FROM sessions c WHERE c.parent_session_id IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM sessions p WHERE p.id = c.parent_session_id)",
        )
    )


async def clear_dangling_parents(conn: AsyncConnection) -> int:
    return await db.run(
        conn,
        "UPDATE sessions c SET parent_session_id = NULL WHERE c.parent_session_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM sessions p WHERE p.id = c.parent_session_id)",
    )


async def stats(conn: AsyncConnection) -> UsageStats:
    per_source: list[SourceUsage] = [
        {
            "source": r[0],
            "sessions": int(r[1]),
            "messages": int(r[2] or 0),
            "input_tokens": int(r[3] or 0),
            "output_tokens": int(r[4] or 0),
            "estimated_cost_usd": float(r[5] or 0.0),
            "actual_cost_usd": float(r[6] or 0.0),
        }
        for r in await db.tuples(
            conn,
            "SELECT source, COUNT(*), SUM(message_count), SUM(input_tokens), SUM(output_tokens), "
            "SUM(estimated_cost_usd), SUM(actual_cost_usd) FROM sessions GROUP BY source "
            "ORDER BY COUNT(*) DESC",
        )
    ]
    t = (
        await db.tuples(
            conn,
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE ended_at IS NULL), SUM(input_tokens), "
            "SUM(output_tokens), SUM(cache_read_tokens), SUM(cache_write_tokens), "
            "SUM(reasoning_tokens), SUM(estimated_cost_usd), SUM(actual_cost_usd), "
            "(SELECT COUNT(*) FROM messages), pg_database_size(current_database()) FROM sessions",
        )
    )[0]
    return {
        "sessions": int(t[0]),
        "live_sessions": int(t[1] or 0),
        "messages": int(t[9]),
        "input_tokens": int(t[2] or 0),
        "output_tokens": int(t[3] or 0),
        "cache_read_tokens": int(t[4] or 0),
        "cache_write_tokens": int(t[5] or 0),
        "reasoning_tokens": int(t[6] or 0),
        "estimated_cost_usd": float(t[7] or 0.0),
        "actual_cost_usd": float(t[8] or 0.0),
        "per_source": per_source,
        "db_bytes": int(t[10] or 0),
        "wal_bytes": 0,
        "computed_at": time.time(),
    }


# --- export / import ---------------------------------------------------------------------


async def export_page(
    conn: AsyncConnection,
    after: tuple[float, str] | None,
    limit: int,
    source: str | None,
    session_ids: list[str] | None,
) -> list[ExportRecord]:
    sql = "SELECT * FROM sessions WHERE TRUE"
    params: list[object] = []
    if after is not None:
        sql += " AND (started_at, id) > (%s, %s)"
        params += [after[0], after[1]]
    if source:
        sql += " AND source = %s"
        params.append(source)
    if session_ids:
        sql += " AND id = ANY(%s)"
        params.append(session_ids)
    found = await db.rows(conn, sql + " ORDER BY started_at, id LIMIT %s", (*params, limit))
    out: list[ExportRecord] = []
    for s in found:
        msgs = await messages.get_messages(conn, s["id"])
        for m in msgs:
            m.pop("session_id", None)
        session = cast(SessionRow, {k: v for k, v in s.items() if k not in DERIVED_SESSION_COLUMNS})
        out.append({"format": FORMAT_VERSION, "session": session, "messages": msgs})
    return out


async def _free_title(conn: AsyncConnection, title: str, session_id: str) -> str:
    owner = await sessions.title_owner(conn, title)
    if owner is None or owner == session_id:
        return title
    n = 1
    while True:
        candidate = f"{title} (imported)" if n == 1 else f"{title} (imported {n})"
        candidate = candidate[-100:] if len(candidate) > 100 else candidate
        if await sessions.title_owner(conn, candidate) is None:
            return candidate
        n += 1


async def _columns(conn: AsyncConnection, table: str) -> set[str]:
    found = await db.tuples(
        conn,
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND table_schema = current_schema()",
        (table,),
    )
    return {r[0] for r in found}


async def import_records(
    conn: AsyncConnection, records: list[Mapping[str, Any]], report: ImportReport
) -> None:
    session_cols = await _columns(conn, "sessions")
    message_cols = set(messages.MESSAGE_FIELDS)
    for rec in records:
        sess = rec.get("session")
        if not isinstance(sess, Mapping) or not isinstance(sess.get("id"), str):
            report.errors.append("a line without a session id was skipped")
            continue
        sid = sess["id"]
        if await db.value(conn, "SELECT 1 FROM sessions WHERE id = %s", (sid,)):
            report.skipped_existing += 1
            continue
        if not sess.get("source") or sess.get("started_at") is None:
            report.errors.append(f"{sid}: missing source or started_at; skipped")
            continue
        fields = {
            k: (to_json_text(v) if isinstance(v, (dict, list)) else v)
            for k, v in sess.items()
            if k in session_cols
            and k not in DERIVED_SESSION_COLUMNS
            and k != "title"
            and k not in ("message_count", "tool_call_count", "preview")
        }
        await sessions.insert_session(conn, fields)
        title = sess.get("title")
        if isinstance(title, str) and title.strip():
            free = await _free_title(conn, title, sid)
            try:
                await sessions.set_title(conn, sid, free)
            except TitleTaken:
                report.errors.append(f"{sid}: title {title!r} could not be kept")
            if free != title:
                report.renamed_titles.append((title, free))
        batch = []
        for msg in rec.get("messages") or []:
            if not isinstance(msg, Mapping) or "role" not in msg:
                continue
            row = {k: v for k, v in msg.items() if k in message_cols}
            row.setdefault("timestamp", sess["started_at"])
            batch.append(row)  # append_messages encodes structured content
        if batch:
            await messages.append_messages(conn, sid, batch)
        report.messages += len(batch)
        await db.run(
            conn,
            "UPDATE sessions SET preview = %s, last_active = %s WHERE id = %s",
            (sess.get("preview"), sess.get("last_active") or sess["started_at"], sid),
        )
        report.imported += 1


async def orphan_dangling(conn: AsyncConnection, ids: list[str]) -> int:
    return await db.run(
        conn,
        "UPDATE sessions c SET parent_session_id = NULL WHERE c.id = ANY(%s) "
        "AND c.parent_session_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM sessions p WHERE p.id = c.parent_session_id)",
        (ids,),
    )


# --- the server, for doctor ------------------------------------------------------------


async def server_status(conn: AsyncConnection) -> dict[str, Any]:
    """The server's version, whether it is a standby (and how far its replay is behind),
    and, on a primary, each standby it streams to with its replay lag in seconds."""
    ((version, standby, behind),) = await db.tuples(
        conn,
        "SELECT current_setting('server_version'), pg_is_in_recovery(), "
        "CASE WHEN pg_is_in_recovery() "
        "THEN EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())::float8 END",
    )
    standbys = await db.rows(
        conn,
        "SELECT application_name AS name, state, "
        "EXTRACT(EPOCH FROM replay_lag)::float8 AS lag FROM pg_stat_replication "
        "ORDER BY application_name",
    )
    return {
        "version": version,
        "standby": bool(standby),
        "replay_behind": behind,
        "standbys": [dict(r) for r in standbys],
    }
