"""Handoffs and the gateway index's source queries on PostgreSQL: the handoff state machine
of state/sqlite/handoffs.py (pending -> running -> completed/failed, the claim atomic across
processes) and the queries of state/sqlite/routing.py that sessions.json is rebuilt and
checked from."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import cast

from psycopg import AsyncConnection

from ..records import HandoffClaim, LiveSession, UntoldReset
from ..vocab import STALE_ERROR
from . import db, sessions
from .dispatch import Dispatch

# --- handoffs (state/sqlite/handoffs.py's state machine) --------------------------------------


async def request_handoff(
    conn: AsyncConnection, session_id: str, platform: str, now: float
) -> bool:
    n = await db.run(
        conn,
        "UPDATE sessions SET handoff_state = 'pending', handoff_platform = %s, handoff_error = NULL, "
        "handoff_updated_at = %s WHERE id = %s "
        "AND COALESCE(handoff_state, '') NOT IN ('pending', 'running')",
        (platform, now, session_id),
    )
    if n == 0:
        await sessions.require_session(conn, session_id)
    return n == 1


# Under READ COMMITTED a plain `WHERE id = (SELECT ... LIMIT 1)` lets two claimers pick the
# same row and both update it (the second re-checks only `id`). SKIP LOCKED makes the second
# pass over a row the first holds, and the outer state check refuses a row that changed.
_CLAIM = (
    "UPDATE sessions SET handoff_state = 'running', handoff_updated_at = %s WHERE id = ("
    "SELECT id FROM sessions WHERE handoff_state = 'pending' AND handoff_platform = ANY(%s) "
    "ORDER BY handoff_updated_at LIMIT 1 FOR UPDATE SKIP LOCKED) "
    "AND handoff_state = 'pending' RETURNING id, handoff_platform"
)


async def claim_handoff(
    conn: AsyncConnection, platforms: Sequence[str], now: float
) -> HandoffClaim | None:
    found = await db.tuples(conn, _CLAIM, (now, list(platforms)))
    return {"id": found[0][0], "platform": found[0][1]} if found else None


async def finish_handoff(
    conn: AsyncConnection, session_id: str, state: str | None, error: str | None, expect: str | None
) -> bool:
    sql = (
        "UPDATE sessions SET handoff_state = %s, handoff_error = %s, handoff_updated_at = %s "
        "WHERE id = %s"
    )
    params: list[object] = [state, error, time.time(), session_id]
    if expect is not None:
        sql += " AND handoff_state = %s"
        params.append(expect)
    return await db.run(conn, sql, params) == 1


async def fail_stale_handoffs(conn: AsyncConnection, older_than_s: float, now: float) -> list[str]:
    found = await db.tuples(
        conn,
        "UPDATE sessions SET handoff_state = 'failed', handoff_error = %s, handoff_updated_at = %s "
        "WHERE handoff_state = 'running' AND handoff_updated_at < %s RETURNING id",
        (STALE_ERROR, now, now - older_than_s),
    )
    return sorted(r[0] for r in found)


# --- the gateway index's source queries (state/sqlite/routing.py) ------------------------------

_LIVE = "session_key, id, started_at, last_active, origin_json, source, chat_type"


async def live_sessions_by_key(conn: AsyncConnection) -> list[LiveSession]:
    found = await db.rows(
        conn,
        f"SELECT {_LIVE} FROM sessions WHERE session_key IS NOT NULL AND ended_at IS NULL "
        "ORDER BY started_at, id",
    )
    return cast(list[LiveSession], found)


async def live_session_for_key(conn: AsyncConnection, key: str) -> LiveSession | None:
    found = await db.row(
        conn,
        f"SELECT {_LIVE} FROM sessions WHERE session_key = %s AND ended_at IS NULL "
        "ORDER BY started_at DESC, id DESC LIMIT 1",
        (key,),
    )
    return cast(LiveSession | None, found)


async def newest_live_session_by_key(conn: AsyncConnection) -> dict[str, str]:
    found = await db.tuples(
        conn,
        "SELECT DISTINCT ON (session_key) session_key, id FROM sessions "
        "WHERE session_key IS NOT NULL AND ended_at IS NULL "
        "ORDER BY session_key, started_at DESC, id DESC",
    )
    return {k: v for k, v in found}


async def session_states(
    conn: AsyncConnection, ids: list[str]
) -> dict[str, tuple[float | None, str | None]]:
    found = await db.tuples(
        conn, "SELECT id, ended_at, end_reason FROM sessions WHERE id = ANY(%s)", (ids,)
    )
    return {r[0]: (r[1], r[2]) for r in found}


async def untold_resets(conn: AsyncConnection) -> list[UntoldReset]:
    """See state.sqlite.routing.untold_resets."""
    found = await db.tuples(
        conn,
        "SELECT c.session_key, c.id, p.id, p.title, p.message_count, p.end_reason "
        "FROM sessions c JOIN sessions p ON p.id = c.parent_session_id "
        "WHERE c.ended_at IS NULL AND c.session_key IS NOT NULL AND c.child_kind = 'reset' "
        "AND COALESCE(c.message_count, 0) = 0 AND p.end_reason IN ('idle', 'daily')",
    )
    return [
        {
            "session_key": r[0],
            "session_id": r[1],
            "old_id": r[2],
            "old_title": r[3],
            "old_messages": int(r[4] or 0),
            "end_reason": r[5],
        }
        for r in found
    ]


class RoutingOps(Dispatch):
    """PgStore's handoffs and the queries the gateway's session index is built from."""

    async def request_handoff(
        self, session_id: str, platform: str, *, now: float | None = None
    ) -> bool:
        return await self._write(
            request_handoff, session_id, platform, time.time() if now is None else now
        )

    async def claim_handoff(
        self, platforms: Iterable[str], *, now: float | None = None
    ) -> HandoffClaim | None:
        """Atomically take the oldest pending handoff for one of `platforms`: of any number
        of daemons sharing the database, one wins (`_CLAIM` above)."""
        wanted = list(platforms)
        if not wanted:
            return None
        return await self._write(claim_handoff, wanted, time.time() if now is None else now)

    async def finish_handoff(
        self,
        session_id: str,
        state: str | None,
        error: str | None = None,
        *,
        expect: str | None = None,
    ) -> bool:
        return await self._write(finish_handoff, session_id, state, error, expect)

    async def fail_stale_handoffs(
        self, older_than_s: float, *, now: float | None = None
    ) -> list[str]:
        return await self._write(
            fail_stale_handoffs, older_than_s, time.time() if now is None else now
        )

    async def live_sessions_by_key(self) -> list[LiveSession]:
        return await self._read(live_sessions_by_key)

    async def live_session_for_key(self, key: str) -> LiveSession | None:
        return await self._read(live_session_for_key, key)

    async def newest_live_session_by_key(self) -> dict[str, str]:
        return await self._read(newest_live_session_by_key)

    async def session_states(self, ids: list[str]) -> dict[str, tuple[float | None, str | None]]:
        return await self._read(session_states, ids)

    async def untold_resets(self) -> list[UntoldReset]:
        return await self._read(untold_resets)
