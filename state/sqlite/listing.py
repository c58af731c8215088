"""Listing sessions for people: newest activity first, one page at a time.

The query walks `idx_sessions_last_active` (or the per-source index) and stops after the
page, so its cost follows the page size, not the number of sessions or messages.
"""

from __future__ import annotations

import sqlite3
from typing import cast

from ..filters import LIST_COLUMNS, Listing, SessionFilter, folded_lineage, with_chat_name  # noqa: F401
from ..records import SessionRow
from ..rows import row_dict
from .dispatch import Dispatch


def list_sessions(
    conn: sqlite3.Connection, flt: SessionFilter, limit: int = 20, offset: int = 0
) -> list[SessionRow]:
    where, params = flt.where()
    cur = conn.execute(
        f"SELECT {LIST_COLUMNS} FROM sessions WHERE {where} "
        "ORDER BY last_active DESC, id DESC LIMIT ? OFFSET ?",
        (*params, max(0, limit), max(0, offset)),
    )
    return [cast(SessionRow, with_chat_name(row_dict(cur, r))) for r in cur.fetchall()]


def sessions_by_start(
    conn: sqlite3.Connection, source: str | None, limit: int, offset: int
) -> list[SessionRow]:
    """Every session (children too), newest start first, whole rows: Hermes Agent's
    `search_sessions` listing."""
    where, params = ("WHERE source = ? ", [source]) if source else ("", [])
    cur = conn.execute(
        f"SELECT * FROM sessions {where}ORDER BY started_at DESC, id DESC LIMIT ? OFFSET ?",
        [*params, max(0, limit), max(0, offset)],
    )
    return [cast(SessionRow, row_dict(cur, r)) for r in cur.fetchall()]


def resolve_in_scope(conn: sqlite3.Connection, ref: str, flt: SessionFilter) -> str | None:
    """Id, unique id prefix or title (newest of its lineage) among the sessions `flt`
    allows. Sessions outside the scope are invisible: they never match, never make a
    prefix ambiguous, never show up in an error."""
    from ..errors import AmbiguousSession
    from ..rows import like_escape
    from ..titles import title_key
    from .sessions import clean_title, split_lineage

    ref = ref.strip()
    if not ref:
        return None
    where, params = flt.where()
    row = conn.execute(
        f"SELECT id FROM sessions WHERE id = ? AND {where}", (ref, *params)
    ).fetchone()
    if row:
        return str(row[0])
    rows = conn.execute(
        f"SELECT id FROM sessions WHERE id LIKE ? ESCAPE '\\' AND {where} ORDER BY id LIMIT 6",
        (like_escape(ref) + "%", *params),
    ).fetchall()
    if len(rows) > 1:
        raise AmbiguousSession(ref, [r[0] for r in rows])
    if rows:
        return str(rows[0][0])
    title = clean_title(ref)
    if not title:
        return None
    base, _ = split_lineage(title)
    if title != base:  # an explicit " #N": exactly that member
        row = conn.execute(
            f"SELECT id FROM sessions WHERE title_key = ? AND {where}", (title_key(title), *params)
        ).fetchone()
        return str(row[0]) if row else None
    row = conn.execute(
        f"SELECT id FROM sessions WHERE title_base = ? AND {where} "
        "ORDER BY title_number DESC, started_at DESC LIMIT 1",
        (title_key(base), *params),
    ).fetchone()
    if row:
        return str(row[0])
    row = conn.execute(
        f"SELECT id FROM sessions WHERE title_key = ? AND {where}", (title_key(title), *params)
    ).fetchone()
    return str(row[0]) if row else None


def count_sessions(conn: sqlite3.Connection, flt: SessionFilter) -> int:
    where, params = flt.where()
    return int(conn.execute(f"SELECT COUNT(*) FROM sessions WHERE {where}", params).fetchone()[0])


class ListingOps(Listing, Dispatch):
    """SessionDB's listings of sessions for people."""

    async def sessions_by_start(
        self, source: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]:
        """Every session, children included, newest start first, with all its columns."""
        return await self._read(sessions_by_start, source, limit, offset)

    async def resolve_in_scope(self, ref: str, flt: SessionFilter) -> str | None:
        """Id, unique prefix or title, among the sessions `flt` allows (None if none)."""
        return await self._read(resolve_in_scope, ref, flt)

    async def list_filtered(
        self, flt: SessionFilter, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]:
        return await self._read(list_sessions, flt, limit, offset)

    async def count_filtered(self, flt: SessionFilter) -> int:
        return await self._read(count_sessions, flt)
