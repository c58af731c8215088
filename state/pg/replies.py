"""Replies after their turn on PostgreSQL (the rules of state/sqlite/replies.py): the fate of
a reply's send, the replies committed but not confirmed sent, and the stored reply to one
platform message (the user message by (source, chat_id, platform_message_id) across the
chat's sessions, then the turn's last assistant text before the chat's next user message)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from psycopg import AsyncConnection

from ..content import content_text
from ..records import StoredReply, UnsentReply
from . import db
from .dispatch import Dispatch
from .writer import register_batched

log = logging.getLogger("state.pg")

_USER_MESSAGE = (
    "SELECT m.id, m.session_id, s.session_key FROM sessions s JOIN messages m "
    "ON m.session_id = s.id WHERE s.source = %s AND s.chat_id = %s "
    "AND m.platform_message_id = %s AND m.role = 'user' ORDER BY m.id LIMIT 1"
)
_REPLY = (
    "SELECT content FROM messages WHERE session_id = %(sid)s AND id > %(mid)s "
    "AND id < COALESCE((SELECT MIN(id) FROM messages WHERE session_id = %(sid)s "
    "AND id > %(mid)s AND role = 'user'), 9223372036854775807) "
    "AND role = 'assistant' AND content IS NOT NULL AND content != '' "
    "AND tool_calls IS NULL ORDER BY id DESC LIMIT 1"
)


async def reply_to(
    conn: AsyncConnection, source: str, chat_id: str, platform_message_id: str
) -> StoredReply | None:
    cur = await conn.execute(_USER_MESSAGE, (source, chat_id, platform_message_id))
    row = await cur.fetchone()
    if row is None:
        return None
    message_id, session_id, session_key = int(row[0]), str(row[1]), row[2]
    cur = await conn.execute(_REPLY, {"sid": session_id, "mid": message_id})
    found = await cur.fetchone()
    text = content_text(found[0]) if found is not None else None
    return StoredReply(session_id, session_key, message_id, text or None)


async def mark_reply(
    conn: AsyncConnection, inbox_id: int, reply_state: str, ref: str | None
) -> None:
    """The reply's fate after the send: 'sent' (with the platform's ids) or 'failed'."""
    await mark_replies_many(conn, [(inbox_id, reply_state, ref)])


async def mark_replies_many(
    conn: AsyncConnection, calls: Sequence[tuple[int, str, str | None]]
) -> list[None]:
    final = {c[0]: c for c in calls}  # a row marked twice in one batch: the last call wins
    await db.run(
        conn,
        "UPDATE inbox SET reply_state = u.rs, reply_ref = u.ref "
        f"FROM {db.rowset('%s', ('bigint', 'text', 'text'))} AS u(id, rs, ref) "
        "WHERE inbox.id = u.id",
        (db.json_rows(final.values()),),
    )
    return [None] * len(calls)


register_batched(mark_reply, mark_replies_many, place=1)  # a fate: nothing reads it back


async def unsent_replies(conn: AsyncConnection) -> list[UnsentReply]:
    """Replies committed but not confirmed sent, oldest first, with their text."""
    return await db.rows_as(
        UnsentReply,
        conn,
        "SELECT i.id, i.payload, i.reply_state, i.reply_message_id, i.received_at, "
        "m.session_id, m.content FROM inbox i LEFT JOIN messages m ON m.id = i.reply_message_id "
        "WHERE i.reply_state IN ('ready', 'sending') ORDER BY i.id",
    )


class ReplyOps(Dispatch):
    """PgStore's replies after their turn: marks of their sends, the unsent, stored replies."""

    _posted: set[asyncio.Task[None]]  # mark_reply_soon's writes, awaited at close

    async def mark_reply(self, inbox_id: int, reply_state: str, ref: str | None = None) -> None:
        await self._write(mark_reply, inbox_id, reply_state, ref)

    def mark_reply_soon(self, inbox_id: int, reply_state: str, ref: str | None = None) -> None:
        """`mark_reply` without waiting: a task of the store's own, awaited at close."""
        task = asyncio.get_running_loop().create_task(self._mark_logged(inbox_id, reply_state, ref))
        self._posted.add(task)
        task.add_done_callback(self._posted.discard)

    async def _mark_logged(self, inbox_id: int, reply_state: str, ref: str | None) -> None:
        try:
            await self.mark_reply(inbox_id, reply_state, ref)
        except Exception as exc:  # the row stays unconfirmed: counted at the next start
            log.warning("inbox row %d: the reply's fate could not be stored (%s)", inbox_id, exc)

    async def unsent_replies(self) -> list[UnsentReply]:
        return await self._read(unsent_replies)

    async def reply_to_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> StoredReply | None:
        return await self._read(reply_to, source, chat_id, platform_message_id)
