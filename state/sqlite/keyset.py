"""Keyset-paged session listing for the dashboard: filters, two sort orders, and a cursor
(the last row's sort value and id) instead of OFFSET, so page 500 costs what page 1 does.

The plain newest-first listing for chats lives in state/sqlite/listing.py; this module adds the
filters a person browsing every session wants (chat type, titled, live/ended, date range).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..pruning import in_chunks
from ..rows import Row, row_dict
from .dispatch import Dispatch
from .listing import LIST_COLUMNS, folded_lineage, with_chat_name

SORTS = {"active": "last_active", "started": "started_at"}


@dataclass(frozen=True)
class PageQuery:
    """One page of sessions. `since`/`until` bound the sort column (epoch seconds)."""

    source: str | None = None
    chat_type: str | None = None
    titled: bool | None = None  # None: both
    live: bool | None = None  # True: not ended; False: ended; None: both
    since: float | None = None
    until: float | None = None
    include_children: bool = False  # False: the folded listing (listing.folded_lineage)
    sort: str = "active"
    descending: bool = True
    after: tuple[float, str] | None = None  # the cursor: the previous page's last row
    limit: int = 50


def page(conn: sqlite3.Connection, q: PageQuery) -> tuple[list[Row], tuple[float, str] | None]:
    """Rows of the page and the cursor for the next one (None on the last page)."""
    sql, params, col, limit = page_sql(q)
    cur = conn.execute(sql, params)
    return cut_page([row_dict(cur, r) for r in cur.fetchall()], col, limit)


def page_sql(q: PageQuery, mark: str = "?") -> tuple[str, list[object], str, int]:
    """(the page's SELECT, its parameters, the sort column, the page size) with `mark` as
    the placeholder: both stores run it."""
    col = SORTS.get(q.sort)
    if col is None:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}")
    clauses: list[str] = []
    params: list[object] = []
    for column, value in (("source", q.source), ("chat_type", q.chat_type)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if q.titled is not None:
        clauses.append("title IS NOT NULL" if q.titled else "title IS NULL")
    if q.live is not None:
        clauses.append("ended_at IS NULL" if q.live else "ended_at IS NOT NULL")
    if q.since is not None:
        clauses.append(f"{col} >= ?")
        params.append(q.since)
    if q.until is not None:
        clauses.append(f"{col} < ?")
        params.append(q.until)
    if not q.include_children:
        clauses.append(folded_lineage())
    clauses.append("COALESCE(archived, 0) = 0")
    op, direction = ("<", "DESC") if q.descending else (">", "ASC")
    if q.after is not None:
        # a row value keeps the comparison on the sort column's index
        clauses.append(f"({col}, id) {op} (?, ?)")
        params.extend(q.after)
    limit = max(1, min(q.limit, 500))
    sql = (
        f"SELECT {LIST_COLUMNS}, started_at AS started FROM sessions "
        f"WHERE {' AND '.join(clauses)} ORDER BY {col} {direction}, id {direction} LIMIT {mark}"
    )
    return sql.replace("?", mark), [*params, limit + 1], col, limit


def cut_page(rows: list[Row], col: str, limit: int) -> tuple[list[Row], tuple[float, str] | None]:
    """The page's rows (one more was asked for) and the next cursor."""
    for r in rows:
        r.pop("started", None)
        with_chat_name(r)
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = (float(rows[-1][col]), str(rows[-1]["id"])) if more and rows else None
    return rows, cursor


class DashboardOps(Dispatch):
    """SessionDB's dashboard queries: keyset pages, lineage trees, empty sessions, insights."""

    async def session_page(self, q: Any) -> tuple[list[Row], tuple[float, str] | None]:
        """One keyset page of sessions (a `state.sqlite.PageQuery`) and the next cursor."""

        rows, cursor = await self._read(page, q)
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

        keep = frozenset(protected)

        async def chunk() -> int:
            return int(await self._write(cleanup.delete_empty_chunk, keep))

        return await in_chunks(chunk)

    async def insights(self, since: float, until: float, source: str | None = None) -> Row:
        """Activity figures for [since, until) (see state/sqlite/insights.py)."""
        from . import insights

        return dict(await self._read(insights.insights, insights.Period(since, until, source)))
