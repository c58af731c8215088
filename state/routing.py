"""The queries the gateway's session index (sessions.json) is rebuilt and checked from:
which session is live for each session key, and whether indexed sessions still exist.

The index itself (the file, its cache) belongs to gateway/index.py; this module only reads
the routing columns of `sessions`.
"""

from __future__ import annotations

import json
import sqlite3

from .records import LiveSession

_LIVE_COLUMNS = (
    "session_key",
    "id",
    "started_at",
    "last_active",
    "origin_json",
    "source",
    "chat_type",
)
_IN_CHUNK = 500  # ids per IN (...) list, well under SQLite's parameter limit


def live_sessions_by_key(conn: sqlite3.Connection) -> list[LiveSession]:
    """Every live (not ended) session that has a session key, oldest start first."""
    rows = conn.execute(
        f"SELECT {', '.join(_LIVE_COLUMNS)} FROM sessions "
        "WHERE session_key IS NOT NULL AND ended_at IS NULL ORDER BY started_at"
    )
    return [
        {"session_key": r[0], "id": r[1], "started_at": r[2], "last_active": r[3],
         "origin_json": r[4], "source": r[5], "chat_type": r[6]}
        for r in rows
    ]  # fmt: skip


def newest_live_session_by_key(conn: sqlite3.Connection) -> dict[str, str]:
    """session_key -> id of its newest live session. SQLite groups along the key index and
    hands back one JSON object, so most of the work runs without the GIL and no row is
    built per session."""
    (text,) = conn.execute(
        # the bare `id` beside MAX() comes from the row holding the maximum
        "SELECT json_group_object(k, id) FROM (SELECT session_key AS k, id, MAX(started_at) "
        "FROM sessions WHERE session_key IS NOT NULL AND ended_at IS NULL GROUP BY session_key)"
    ).fetchone()
    return dict(json.loads(text)) if text else {}


def session_states(
    conn: sqlite3.Connection, ids: list[str]
) -> dict[str, tuple[float | None, str | None]]:
    """id -> (ended_at, end_reason) for the ids that exist."""
    out: dict[str, tuple[float | None, str | None]] = {}
    for i in range(0, len(ids), _IN_CHUNK):
        chunk = ids[i : i + _IN_CHUNK]
        marks = ", ".join("?" for _ in chunk)
        for sid, ended, reason in conn.execute(
            f"SELECT id, ended_at, end_reason FROM sessions WHERE id IN ({marks})", chunk
        ):
            out[sid] = (ended, reason)
    return out
