"""Delete and prune, the key/value meta table, lineage repair, statistics and the server's
status on PostgreSQL (the rules of state/sqlite/maintenance.py)."""

from __future__ import annotations

import time
from typing import Any

from psycopg import AsyncConnection

from ..columns import PRUNE_CHUNK
from ..errors import SessionNotFound
from ..pruning import Pruning
from ..records import (
    SourceUsage,
    UsageStats,
)
from . import db, schema
from .dispatch import Dispatch

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


class AdminOps(Pruning, Dispatch):
    """PgStore's delete, prune, meta, lineage repair, statistics and schema version."""

    async def _prune_chunk(
        self, older_than_days: float, source: str | None, now: float, keep: frozenset[str]
    ) -> int:
        return await self._write(prune_chunk, older_than_days, source, now, keep)

    async def _prune_candidates(
        self, older_than_days: float, source: str | None, now: float, limit: int
    ) -> list[str]:
        return await self._read(prune_candidates, older_than_days, source, now, limit)

    async def _claim_meta_stamp(self, key: str, interval_s: float, now: float) -> bool:
        return await self._write(claim_meta_stamp, key, interval_s, now)

    async def _vacuum_after_prune(self, min_bytes: int, min_share: float) -> bool:
        """A plain VACUUM of the pruned tables, always: unlike SQLite's it rewrites nothing
        and blocks no writer, so it needs no size threshold (`min_*` are SQLite's)."""
        await self._read(vacuum_pruned)
        return True

    async def stats(self) -> UsageStats:
        return await self._read(stats)

    async def server_status(self) -> dict[str, Any]:
        """The server's version and replication state (server_status above), for doctor."""
        return await self._read(server_status)

    async def delete_session(self, session_id: str) -> None:
        await self._write(delete_session, session_id)

    async def get_meta(self, key: str) -> str | None:
        return await self._read(get_meta, key)

    async def set_meta(self, key: str, value: str | None) -> None:
        await self._write(set_meta, key, value)

    async def schema_version(self) -> int:
        return await self._read(schema.current_version)

    def latest_schema_version(self) -> int:
        return schema.LATEST

    async def count_dangling_parents(self) -> int:
        return await self._read(count_dangling_parents)

    async def clear_dangling_parents(self) -> int:
        return await self._write(clear_dangling_parents)
