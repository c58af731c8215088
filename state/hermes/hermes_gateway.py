"""Gateway session lookups in Hermes Agent's shape, for `state.hermes.compat`: the peer a session
serves, recovering a session after a restart, listing live gateway sessions, finding the
session for a message's origin. SQL functions over a connection."""

from __future__ import annotations

import sqlite3
from typing import Any

from ..rows import Row
from .hermes_listing import session_row

# End reasons Hermes records by mistake for sessions that are still wanted (its TUI reaper,
# an agent close): such sessions can be recovered.
RECOVERABLE = ("agent_close", "ws_orphan_reap")

_PEER_COLUMNS = ("source", "user_id", "session_key", "chat_id", "chat_type", "thread_id")


def record_peer(
    conn: sqlite3.Connection,
    session_id: str,
    peer: dict[str, Any],
    display_name: str | None,
    origin_json: str | None,
) -> None:
    """Overwrite the routing columns; keep display name and origin when None is passed."""
    if not session_id or not peer.get("session_key"):
        return
    sets = [f"{c} = ?" for c in _PEER_COLUMNS]
    params = [peer.get(c) for c in _PEER_COLUMNS]
    for col, value in (("display_name", display_name), ("origin_json", origin_json)):
        if value is not None:
            sets.append(f"{col} = ?")
            params.append(value)
    conn.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id = ?", (*params, session_id))


def _latest(conn: sqlite3.Connection, where: str, params: list[Any]) -> Row | None:
    marks = ", ".join("?" for _ in RECOVERABLE)
    row = conn.execute(
        f"SELECT id FROM sessions WHERE {where} "
        f"AND (ended_at IS NULL OR end_reason IN ({marks})) "
        "AND EXISTS (SELECT 1 FROM messages m WHERE m.session_id = sessions.id) "
        "ORDER BY started_at DESC, id DESC LIMIT 1",
        (*params, *RECOVERABLE),
    ).fetchone()
    return session_row(conn, row[0]) if row else None


def latest_for_peer(
    conn: sqlite3.Connection,
    source: str,
    user_id: str | None,
    session_key: str | None,
    chat_id: str | None,
    chat_type: str | None,
    thread_id: str | None,
) -> Row | None:
    if not session_key:
        return None
    found = _latest(conn, "session_key = ? AND source = ?", [session_key, source])
    if found is not None or not (chat_id and chat_type):
        return found
    return _latest(
        conn,
        "source = ? AND COALESCE(user_id, '') = ? AND COALESCE(chat_id, '') = ? "
        "AND COALESCE(chat_type, '') = ? AND COALESCE(thread_id, '') = ?",
        [source, user_id or "", chat_id, chat_type, thread_id or ""],
    )


def list_gateway(conn: sqlite3.Connection, platform: str | None, active_only: bool) -> list[Row]:
    """Per session key the newest session (live ones only by default), newest activity first."""
    where = "s.session_key IS NOT NULL AND s.session_key != ''"
    params: list[Any] = []
    if platform:
        where += " AND lower(s.source) = ?"
        params.append(platform.lower())
    if active_only:
        where += " AND s.ended_at IS NULL"
    ids = [
        r[0]
        for r in conn.execute(
            f"SELECT s.id FROM sessions s WHERE {where} AND s.id = (SELECT t.id FROM sessions t "
            "WHERE t.session_key = s.session_key"
            + (" AND t.ended_at IS NULL" if active_only else "")
            + " ORDER BY t.started_at DESC, t.id DESC LIMIT 1)",
            params,
        )
    ]
    rows = [r for r in (session_row(conn, i) for i in ids) if r is not None]
    rows.sort(key=lambda r: r["last_active"] or 0, reverse=True)
    return rows


def by_origin(
    conn: sqlite3.Connection,
    platform: str,
    chat_id: str,
    thread_id: str | None,
    user_id: str | None,
) -> str | None:
    cands = conn.execute(
        "SELECT id, user_id FROM sessions WHERE ended_at IS NULL AND session_key IS NOT NULL "
        "AND lower(source) = ? AND chat_id = ? AND COALESCE(thread_id, '') = ? "
        "ORDER BY started_at DESC, id DESC",
        (platform.lower(), str(chat_id), thread_id or ""),
    ).fetchall()
    if not cands:
        return None
    if user_id is not None:
        exact = [sid for sid, uid in cands if uid == user_id]
        if exact:
            return str(exact[0])
        return str(cands[0][0]) if len(cands) == 1 else None
    if len({uid for _, uid in cands}) > 1:
        return None
    return str(cands[0][0])
