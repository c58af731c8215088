"""The stored reply to one platform message: what an idempotent client (the HTTP API's
`Idempotency-Key`) is given again instead of a second turn. It finds the user message by
(source, chat_id, platform_message_id) across the chat's sessions and the turn's final
assistant text after it; it never writes.
"""

from __future__ import annotations

import sqlite3

from ..content import content_text
from ..records import StoredReply

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
