"""Listing sessions for people: newest activity first, one page at a time.

The query walks `idx_sessions_last_active` (or the per-source index) and stops after the
page, so its cost follows the page size, not the number of sessions or messages.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from .rows import Row, row_dict

LIST_COLUMNS = (
    "id, source, user_id, model, title, started_at, ended_at, end_reason, message_count, "
    "parent_session_id, child_kind, last_active, preview, session_key, chat_id, chat_type, "
    "thread_id, archived, handoff_state"
)


@dataclass(frozen=True)
class SessionFilter:
    """Who and what a listing (or a search) may show."""

    source: str | None = None
    sources: Sequence[str] = ()
    exclude_sources: Sequence[str] = ()
    user_id: str | None = None
    chat_id: str | None = None
    thread_id: str | None = None
    include_children: bool = False
    include_archived: bool = False
    titled_only: bool = False

    def where(self, alias: str = "") -> tuple[str, list[object]]:
        p = f"{alias}." if alias else ""
        clauses: list[str] = []
        params: list[object] = []
        wanted = [*self.sources, *([self.source] if self.source else [])]
        if wanted:
            clauses.append(f"{p}source IN ({', '.join('?' for _ in wanted)})")
            params.extend(wanted)
        if self.exclude_sources:
            clauses.append(f"{p}source NOT IN ({', '.join('?' for _ in self.exclude_sources)})")
            params.extend(self.exclude_sources)
        for col, value in (("user_id", self.user_id), ("chat_id", self.chat_id),
                           ("thread_id", self.thread_id)):  # fmt: skip
            if value is not None:
                clauses.append(f"{p}{col} = ?")
                params.append(value)
        if not self.include_children:
            # Roots and branches; compression/reset children are reached through lineage.
            clauses.append(f"({p}parent_session_id IS NULL OR {p}child_kind = 'branch')")
        if not self.include_archived:
            clauses.append(f"COALESCE({p}archived, 0) = 0")
        if self.titled_only:
            clauses.append(f"{p}title IS NOT NULL")
        return (" AND ".join(clauses) or "1"), params


def list_sessions(
    conn: sqlite3.Connection, flt: SessionFilter, limit: int = 20, offset: int = 0
) -> list[Row]:
    where, params = flt.where()
    cur = conn.execute(
        f"SELECT {LIST_COLUMNS} FROM sessions WHERE {where} "
        "ORDER BY last_active DESC, id DESC LIMIT ? OFFSET ?",
        (*params, max(0, limit), max(0, offset)),
    )
    return [row_dict(cur, r) for r in cur.fetchall()]


def count_sessions(conn: sqlite3.Connection, flt: SessionFilter) -> int:
    where, params = flt.where()
    return int(conn.execute(f"SELECT COUNT(*) FROM sessions WHERE {where}", params).fetchone()[0])
