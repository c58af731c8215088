"""The queries the gateway's session index (sessions.json) is rebuilt and checked from:
which session is live for each session key, and whether indexed sessions still exist.

The index itself (the file, its cache) belongs to gateway/index.py; this module only reads
the routing columns of `sessions`.
"""

from __future__ import annotations

import json
import sqlite3

from ..records import LiveSession, UntoldReset
from .dispatch import Dispatch

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
        # `+started_at`: sorting the few live rows beats walking idx_sessions_started over
        # every stored session, which a plain ORDER BY would have the planner do
        f"SELECT {', '.join(_LIVE_COLUMNS)} FROM sessions "
        "WHERE session_key IS NOT NULL AND ended_at IS NULL ORDER BY +started_at"
    )
    return [
        {
            "session_key": r[0],
            "id": r[1],
            "started_at": r[2],
            "last_active": r[3],
            "origin_json": r[4],
            "source": r[5],
            "chat_type": r[6],
        }
        for r in rows
    ]


def live_session_for_key(conn: sqlite3.Connection, key: str) -> LiveSession | None:
    """The newest live session with this key, if any: what the daemon adopts for a key its
    index lacks (written by another process, e.g. `import --from-hermes`)."""
    r = conn.execute(
        f"SELECT {', '.join(_LIVE_COLUMNS)} FROM sessions WHERE session_key = ? "
        "AND ended_at IS NULL ORDER BY started_at DESC, id DESC LIMIT 1",
        (key,),
    ).fetchone()
    if r is None:
        return None
    return {
        "session_key": r[0],
        "id": r[1],
        "started_at": r[2],
        "last_active": r[3],
        "origin_json": r[4],
        "source": r[5],
        "chat_type": r[6],
    }


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


_UNTOLD_RESETS = (
    "SELECT c.session_key, c.id, p.id, p.title, p.message_count, p.end_reason "
    "FROM sessions c JOIN sessions p ON p.id = c.parent_session_id "
    "WHERE c.ended_at IS NULL AND c.session_key IS NOT NULL AND c.child_kind = 'reset' "
    "AND COALESCE(c.message_count, 0) = 0 AND p.end_reason IN ('idle', 'daily')"
)


def untold_resets(conn: sqlite3.Connection) -> list[UntoldReset]:
    """Live reset children still empty, with the idle/daily session each replaced: after a
    restart, the resets whose notice the chat may not have had (it lived in memory)."""
    return [
        {
            "session_key": r[0],
            "session_id": r[1],
            "old_id": r[2],
            "old_title": r[3],
            "old_messages": int(r[4] or 0),
            "end_reason": r[5],
        }
        for r in conn.execute(_UNTOLD_RESETS)
    ]


class RoutingOps(Dispatch):
    """SessionDB's queries the gateway's session index is built and checked from."""

    async def live_sessions_by_key(self) -> list[LiveSession]:
        """The newest live (not ended) session per session_key: the index's source of truth."""
        return await self._read(live_sessions_by_key)

    async def live_session_for_key(self, key: str) -> LiveSession | None:
        """The newest live session with this session_key, or None."""
        return await self._read(live_session_for_key, key)

    async def newest_live_session_by_key(self) -> dict[str, str]:
        """session_key -> id of its newest live session: what the index checks itself
        against at start-up."""
        return await self._read(newest_live_session_by_key)

    async def session_states(self, ids: list[str]) -> dict[str, tuple[float | None, str | None]]:
        """id -> (ended_at, end_reason) for the ids that exist."""
        return await self._read(session_states, ids)

    async def untold_resets(self) -> list[UntoldReset]:
        """Live, still empty reset children and the idle/daily sessions they replaced."""
        return await self._read(untold_resets)
