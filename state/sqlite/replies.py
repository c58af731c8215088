"""Replies after their turn: the fate of a reply's send ('sent' with the platform's ids,
or 'failed'), the replies committed but not confirmed sent, and the stored reply to one
platform message: what an idempotent client (the HTTP API's `Idempotency-Key`) is given
again instead of a second turn. That one finds the user message by (source, chat_id,
platform_message_id) across the chat's sessions and the turn's final assistant text after
it; it never writes.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from typing import cast

from ..content import content_text
from ..errors import WriterClosed
from ..records import StoredReply, UnsentReply
from .batches import chunks, statement
from .dispatch import Dispatch
from .windows import keeps_windows
from .writer import register_batched

log = logging.getLogger("state.store")

# The chat's sessions first, then (session_id, platform_message_id), as the duplicate
# check in state/sqlite/messages.py does: platform ids repeat across chats.
_USER_MESSAGE = (
    "SELECT m.id, m.session_id, s.session_key FROM sessions s CROSS JOIN messages m "
    "WHERE s.source = ? AND s.chat_id = ? AND m.session_id = s.id "
    "AND m.platform_message_id = ? AND m.role = 'user' ORDER BY m.id LIMIT 1"
)
_NEXT_USER = "SELECT MIN(id) FROM messages WHERE session_id = ? AND id > ? AND role = 'user'"
# A session runs one turn at a time and stores its user message before the agent runs, so
# the turn's reply is the last assistant text after that message and before the next one.
_REPLY = (
    "SELECT content FROM messages WHERE session_id = ?1 AND id > ?2 AND id < ?3 "
    "AND role = 'assistant' AND content IS NOT NULL AND content != '' "
    "AND tool_calls IS NULL ORDER BY id DESC LIMIT 1"
)


def reply_to(
    conn: sqlite3.Connection, source: str, chat_id: str, platform_message_id: str
) -> StoredReply | None:
    """The reply to the user message with this platform id in this chat, or None when no
    such message was stored."""
    row = conn.execute(_USER_MESSAGE, (source, chat_id, platform_message_id)).fetchone()
    if row is None:
        return None
    message_id, session_id, session_key = int(row[0]), str(row[1]), row[2]
    (next_user,) = conn.execute(_NEXT_USER, (session_id, message_id)).fetchone()
    bound = next_user if next_user is not None else 2**63 - 1
    found = conn.execute(_REPLY, (session_id, message_id, bound)).fetchone()
    text = content_text(found[0]) if found is not None else None
    return StoredReply(session_id, session_key, message_id, text or None)


def mark_reply(conn: sqlite3.Connection, inbox_id: int, reply_state: str, ref: str | None) -> None:
    """The reply's fate after the send: 'sent' (with the platform's ids) or 'failed'."""
    mark_replies_many(conn, [(inbox_id, reply_state, ref)])


def mark_replies_many(
    conn: sqlite3.Connection, calls: list[tuple[int, str, str | None]]
) -> list[None]:
    for n, params in chunks(calls, 3):
        conn.execute(statement(_MARK_ROWS, 3, n, _MARK), params)
    return [None] * len(calls)


_MARK_ROWS = "WITH j(id, reply_state, ref) AS (VALUES "
_MARK = (
    ") UPDATE inbox SET reply_state = j.reply_state, reply_ref = j.ref FROM j WHERE inbox.id = j.id"
)


register_batched(mark_reply, mark_replies_many)
# a reply's fate leaves the history windows the writer keeps as they are (state.sqlite.windows)
keeps_windows(mark_reply, mark_replies_many)


def unsent_replies(conn: sqlite3.Connection) -> list[UnsentReply]:
    """Replies committed but not confirmed sent, oldest first, with their text: 'ready'
    ones are sent at start-up, 'sending' ones (the send may have happened) only counted."""
    cur = conn.execute(
        "SELECT i.id, i.payload, i.reply_state, i.reply_message_id, i.received_at, "
        "m.session_id, m.content FROM inbox i LEFT JOIN messages m ON m.id = i.reply_message_id "
        "WHERE i.reply_state IN ('ready', 'sending') ORDER BY i.id"
    )
    names = [d[0] for d in cur.description]
    return [cast(UnsentReply, dict(zip(names, row, strict=True))) for row in cur.fetchall()]


class ReplyOps(Dispatch):
    """SessionDB's replies after their turn: marks of their sends, the unsent, stored replies."""

    _marks: list[tuple[int, str, str | None]]  # mark_reply_soon's, not yet posted

    async def mark_reply(self, inbox_id: int, reply_state: str, ref: str | None = None) -> None:
        """After the send: 'sent' (with the platform's message ids) or 'failed'."""
        await self._write(mark_reply, inbox_id, reply_state, ref)

    def mark_reply_soon(self, inbox_id: int, reply_state: str, ref: str | None = None) -> None:
        """`mark_reply` posted to the writer: no future, no task (one per turn otherwise),
        and the marks of one turn of the event loop go as one operation (each operation
        queued wakes the writer's thread)."""
        if self._closed:
            raise WriterClosed("the store is closed")
        self._marks.append((inbox_id, reply_state, ref))
        if len(self._marks) == 1:
            asyncio.get_running_loop().call_soon(self._post_marks)

    def _post_marks(self) -> None:
        marks, self._marks = self._marks, []
        if not marks:
            return
        try:
            self._writer.post(mark_replies_many, marks)
        except WriterClosed as exc:  # the rows stay unconfirmed, as after a crash
            log.warning("%d sent mark(s) not stored: %s", len(marks), exc)

    async def unsent_replies(self) -> list[UnsentReply]:
        """Replies committed but not confirmed sent ('ready' and 'sending'), oldest first."""
        return await self._read(unsent_replies)

    async def reply_to_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> StoredReply | None:
        return await self._read(reply_to, source, chat_id, platform_message_id)
