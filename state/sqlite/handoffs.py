"""The handoff state machine in `sessions.handoff_*`: pending -> running -> completed/failed.

A terminal asks (`request`), one daemon claims (`claim`, atomic across processes), and the
claimer finishes it (`finish`); `fail_stale` ends claims whose daemon went away. The gateway
decides what a handoff does; this module only moves the state.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence

from ..records import HandoffClaim
from ..vocab import STALE_ERROR  # noqa: F401
from .dispatch import Dispatch
from .sessions import require_session


def request(conn: sqlite3.Connection, session_id: str, platform: str, now: float) -> bool:
    """Mark a session `pending` for `platform`; False if a handoff is already in flight."""
    cur = conn.execute(
        "UPDATE sessions SET handoff_state = 'pending', handoff_platform = ?, handoff_error = NULL, "
        "handoff_updated_at = ? WHERE id = ? AND COALESCE(handoff_state, '') NOT IN ('pending', 'running')",
        (platform, now, session_id),
    )
    if cur.rowcount == 0:
        require_session(conn, session_id)
    return cur.rowcount == 1


def claim(conn: sqlite3.Connection, platforms: Sequence[str], now: float) -> HandoffClaim | None:
    """Take the oldest pending handoff for one of `platforms` (pending -> running) in one
    statement: inside the writer's IMMEDIATE transaction, of two daemons one wins."""
    marks = ", ".join("?" for _ in platforms)
    row = conn.execute(
        "UPDATE sessions SET handoff_state = 'running', handoff_updated_at = ? WHERE id = ("
        f"SELECT id FROM sessions WHERE handoff_state = 'pending' AND handoff_platform IN ({marks}) "
        "ORDER BY handoff_updated_at LIMIT 1) RETURNING id, handoff_platform",
        (now, *platforms),
    ).fetchone()
    return {"id": row[0], "platform": row[1]} if row else None


def finish(
    conn: sqlite3.Connection,
    session_id: str,
    state: str | None,
    error: str | None,
    expect: str | None,
    now: float | None = None,
) -> bool:
    """Set the handoff's final (or reset) state; with `expect`, only from that state."""
    sql = "UPDATE sessions SET handoff_state = ?, handoff_error = ?, handoff_updated_at = ? WHERE id = ?"
    params: list[object] = [state, error, time.time() if now is None else now, session_id]
    if expect is not None:
        sql += " AND handoff_state = ?"
        params.append(expect)
    return conn.execute(sql, params).rowcount == 1


def fail_stale(conn: sqlite3.Connection, older_than_s: float, now: float) -> list[str]:
    """`running` handoffs not touched for `older_than_s`: failed, never stuck."""
    rows = conn.execute(
        "UPDATE sessions SET handoff_state = 'failed', handoff_error = ?, handoff_updated_at = ? "
        "WHERE handoff_state = 'running' AND handoff_updated_at < ? RETURNING id",
        (STALE_ERROR, now, now - older_than_s),
    ).fetchall()
    return [r[0] for r in rows]


class HandoffOps(Dispatch):
    """SessionDB's terminal-to-chat handoffs."""

    async def request_handoff(
        self, session_id: str, platform: str, *, now: float | None = None
    ) -> bool:
        """Mark a session `pending` for `platform`; False if a handoff is already in flight."""
        at = time.time() if now is None else now
        return await self._write(request, session_id, platform, at)

    async def claim_handoff(
        self, platforms: Iterable[str], *, now: float | None = None
    ) -> HandoffClaim | None:
        """Atomically take the oldest pending handoff for one of `platforms` (pending ->
        running). Of two daemons sharing the file, one wins."""
        wanted = list(platforms)
        if not wanted:
            return None
        at = time.time() if now is None else now
        return await self._write(claim, wanted, at)

    async def finish_handoff(
        self,
        session_id: str,
        state: str | None,
        error: str | None = None,
        *,
        expect: str | None = None,
    ) -> bool:
        """Set the handoff's final (or reset) state; with `expect`, only from that state."""
        return await self._write(finish, session_id, state, error, expect)

    async def fail_stale_handoffs(
        self, older_than_s: float, *, now: float | None = None
    ) -> list[str]:
        """`running` handoffs whose daemon went away: failed, never stuck."""
        at = time.time() if now is None else now
        return await self._write(fail_stale, older_than_s, at)
