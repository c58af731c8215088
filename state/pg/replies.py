"""The stored reply to one platform message on PostgreSQL (the same rule as state/sqlite/replies.py:
the user message by (source, chat_id, platform_message_id) across the chat's sessions,
then the turn's last assistant text before the chat's next user message). Reads only."""

from __future__ import annotations

from psycopg import AsyncConnection

from ..content import content_text
from ..records import StoredReply

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
