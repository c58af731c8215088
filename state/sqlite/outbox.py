"""The outbox's view of a session's replies: which of its assistant messages (a turn's
reply, by `inbox.reply_message_id`) have not reached their chat, and how their delivery
stands (`reply_state`: ready / sending while held, unconfirmed, failed, refused, expired;
`reply_ref` holds the reason of a refused or expired one). Reads only; the states are
written through inbox.mark_reply. state/pg/outbox.py answers the same on PostgreSQL."""

from __future__ import annotations

import sqlite3

from ..vocab import UNDELIVERED
from .dispatch import Dispatch


def undelivered_replies(
    conn: sqlite3.Connection, session_id: str
) -> dict[int, tuple[str, str | None]]:
    """The session's replies not (yet) delivered: message id -> (reply_state, reason).
    Few rows are undelivered, and the inbox keeps only inbox.retention_days of rows."""
    marks = ", ".join("?" for _ in UNDELIVERED)
    rows = conn.execute(
        "SELECT i.reply_message_id, i.reply_state, i.reply_ref FROM inbox i "
        "JOIN messages m ON m.id = i.reply_message_id "
        f"WHERE i.reply_state IN ({marks}) AND m.session_id = ?",
        (*UNDELIVERED, session_id),
    ).fetchall()
    return {int(m): (str(s), r if s in ("refused", "expired") else None) for m, s, r in rows}


class OutboxOps(Dispatch):
    """SessionDB's view of the outbox."""

    async def undelivered_replies(self, session_id: str) -> dict[int, tuple[str, str | None]]:
        """The session's replies not delivered: message id -> (reply_state, reason)."""
        return await self._read(undelivered_replies, session_id)
