"""Listing sessions for people on PostgreSQL (the rules of state/sqlite/listing.py and
state/filters.py): newest activity first, by start, counts, and a reference resolved
within a filter's scope."""

from __future__ import annotations

from typing import cast

from psycopg import AsyncConnection

from ..errors import AmbiguousSession
from ..filters import LIST_COLUMNS, Listing, SessionFilter, with_chat_name
from ..records import (
    SessionRow,
)
from ..rows import like_escape
from ..titles import clean_title, split_lineage, title_key
from . import db
from .dispatch import Dispatch

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


class ListingOps(Listing, Dispatch):
    """PgStore's listings of sessions for people."""

    async def sessions_by_start(
        self, source: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]:
        return await self._read(sessions_by_start, source, limit, offset)

    async def resolve_in_scope(self, ref: str, flt: SessionFilter) -> str | None:
        return await self._read(resolve_in_scope, ref, flt)

    async def list_filtered(
        self, flt: SessionFilter, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]:
        return await self._read(list_sessions, flt, limit, offset)

    async def count_filtered(self, flt: SessionFilter) -> int:
        return await self._read(count_filtered, flt)
