"""state/sqlite/outbox.py's read on PostgreSQL: a session's replies that have not reached
their chat, with their delivery state and the reason of a refused or expired one."""

from __future__ import annotations

from psycopg import AsyncConnection

from ..vocab import UNDELIVERED
from . import db
from .dispatch import Dispatch


async def undelivered_replies(
    conn: AsyncConnection, session_id: str
) -> dict[int, tuple[str, str | None]]:
    rows = await db.tuples(
        conn,
        "SELECT i.reply_message_id, i.reply_state, i.reply_ref FROM inbox i "
        "JOIN messages m ON m.id = i.reply_message_id "
        "WHERE i.reply_state = ANY(%s) AND m.session_id = %s",
        (list(UNDELIVERED), session_id),
    )
    return {int(m): (str(s), r if s in ("refused", "expired") else None) for m, s, r in rows}


class OutboxOps(Dispatch):
    """PgStore's view of the outbox."""

    async def undelivered_replies(self, session_id: str) -> dict[int, tuple[str, str | None]]:
        """The session's replies not delivered: message id -> (reply_state, reason)."""
        return await self._read(undelivered_replies, session_id)
