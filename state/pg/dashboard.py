"""The dashboard's queries on PostgreSQL: keyset pages of sessions, a session's lineage
tree, empty sessions, and insights over a period. The SQL builders and the shaping are
the SQLite store's (state/sqlite/keyset.py, family.py, insights.py); insights count the period's
messages directly (there are no hourly tallies here), which costs a scan of the period's
messages instead of its hours."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import AsyncConnection

from ..accounting import RECORDED_COST
from ..columns import PRUNE_CHUNK
from ..pruning import in_chunks
from ..records import Period
from ..rows import Row
from ..sqlite.family import build_tree
from ..sqlite.insights import assemble
from ..sqlite.keyset import PageQuery, cut_page, page_sql
from . import admin, db, lineage
from .dispatch import Dispatch

_EMPTY = (
    "FROM sessions s WHERE ended_at IS NOT NULL AND COALESCE(archived, 0) = 0 "
    "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id)"
)


async def session_page(
    conn: AsyncConnection, q: PageQuery
) -> tuple[list[Row], tuple[float, str] | None]:
    sql, params, col, limit = page_sql(q, mark="%s")
    return cut_page(await db.rows(conn, sql, params), col, limit)


async def lineage_tree(conn: AsyncConnection, session_id: str, limit: int = 2000) -> Row | None:
    found = await db.row(conn, "SELECT * FROM sessions WHERE id = %s", (session_id,))
    if found is None:
        return None
    up = await lineage.ancestors(conn, session_id)
    root: Row = dict(up[-1]) if up else found
    return build_tree(root, (await lineage.descendants(conn, root["id"]))[:limit])


async def count_empty(conn: AsyncConnection) -> int:
    return int(await db.value(conn, f"SELECT COUNT(*) {_EMPTY}"))


async def delete_empty_chunk(conn: AsyncConnection, protected: frozenset[str]) -> int:
    found = await db.tuples(
        conn, f"SELECT id {_EMPTY} ORDER BY started_at LIMIT %s", (PRUNE_CHUNK + len(protected),)
    )
    ids = [r[0] for r in found if r[0] not in protected][:PRUNE_CHUNK]
    return await admin.delete_sessions(conn, ids)


async def insights(conn: AsyncConnection, p: Period) -> dict[str, Any]:
    src = " AND s.source = %s" if p.source else ""
    src_params = [p.source] if p.source else []
    messages = await db.tuples(
        conn,
        "SELECT floor(m.timestamp / 3600)::bigint AS h, s.source, "
        "CASE WHEN m.role = 'tool' THEN COALESCE(NULLIF(m.tool_name, ''), '?') ELSE '' END AS t, "
        "COUNT(*) FROM messages m JOIN sessions s ON s.id = m.session_id "
        f"WHERE m.timestamp >= %s AND m.timestamp < %s{src} GROUP BY 1, 2, 3",
        (p.since, p.until, *src_params),
    )
    plain = src.replace("s.source", "source")
    models = await db.tuples(
        conn,
        "SELECT COALESCE(model, ''), SUM(COALESCE(input_tokens, 0)), "
        "SUM(COALESCE(output_tokens, 0)), COUNT(*), COUNT(*) FILTER (WHERE started_at >= %s), "
        f"SUM({RECORDED_COST}) FROM sessions WHERE last_active >= %s AND started_at < %s{plain} "
        "GROUP BY 1 ORDER BY 2 DESC",
        (p.since, p.since, p.until, *src_params),
    )
    by_end = await db.tuples(
        conn,
        "SELECT COALESCE(end_reason, ''), "
        "COUNT(*) FILTER (WHERE ended_at >= %s AND ended_at < %s), "
        "COUNT(*) FILTER (WHERE ended_at IS NULL) FROM sessions "
        f"WHERE (ended_at IS NULL OR (ended_at >= %s AND ended_at < %s)){plain} GROUP BY 1",
        (p.since, p.until, p.since, p.until, *src_params),
    )
    rows = [(int(h), s, t, int(n)) for h, s, t, n in messages]
    return assemble(p, rows, models, by_end)


class DashboardOps(Dispatch):
    """PgStore's dashboard queries: keyset pages, lineage trees, empty sessions, insights."""

    async def session_page(self, q: Any) -> tuple[list[Row], tuple[float, str] | None]:
        """One keyset page of sessions (a `state.sqlite.keyset.PageQuery`) and the next cursor."""
        return await self._read(session_page, q)

    async def lineage_tree(self, session_id: str) -> Row | None:
        return await self._read(lineage_tree, session_id)

    async def count_empty_sessions(self) -> int:
        return await self._read(count_empty)

    async def delete_empty_sessions(self, protected: Iterable[str] = ()) -> int:
        """Delete ended sessions that have no messages, a chunk per transaction."""
        keep = frozenset(protected)

        async def chunk() -> int:
            return await self._write(delete_empty_chunk, keep)

        return await in_chunks(chunk)

    async def insights(self, since: float, until: float, source: str | None = None) -> Row:
        """Activity figures for [since, until) (see state/sqlite/insights.py)."""
        return await self._read(insights, Period(since, until, source))
