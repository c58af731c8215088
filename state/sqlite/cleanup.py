"""Empty sessions: ended, unarchived sessions that never got a message (a /new nobody used,
a reset before anyone wrote), found and deleted in small transactions like a prune."""

from __future__ import annotations

import sqlite3

from . import archive
from .maintenance import PRUNE_CHUNK


def empty_sessions(
    conn: sqlite3.Connection, limit: int = PRUNE_CHUNK, protected: frozenset[str] = frozenset()
) -> list[str]:
    """Ended sessions without messages (live ones are never touched)."""
    rows = conn.execute(
        "SELECT id FROM sessions s WHERE ended_at IS NOT NULL AND COALESCE(archived, 0) = 0 "
        "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id) "
        "ORDER BY started_at LIMIT ?",
        (limit + len(protected),),
    ).fetchall()
    return [r[0] for r in rows if r[0] not in protected][:limit]


def count_empty(conn: sqlite3.Connection) -> int:
    row = conn.execute(
        "SELECT COUNT(*) FROM sessions s WHERE ended_at IS NOT NULL AND COALESCE(archived, 0) = 0 "
        "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id)"
    ).fetchone()
    return int(row[0])


def delete_empty_chunk(conn: sqlite3.Connection, protected: frozenset[str]) -> int:
    return len(archive.delete_many(conn, empty_sessions(conn, PRUNE_CHUNK, protected)))
