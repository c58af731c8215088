"""Messages on PostgreSQL: append (with the platform-message dedupe a unique key
enforces), read in order, windows, replay in OpenAI chat format, clear.

Rows are prepared by state/message_rows.py's `row_values` (validation, JSON columns,
structured content) and indexed by state/pg/tsearch.py. PostgreSQL text cannot hold NUL,
so content that does (structured content starts with one) is stored re-encoded and
`content_enc` says how; readers get back exactly what the SQLite store returns.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from psycopg import AsyncConnection

from ..columns import MESSAGE_COLUMNS
from ..content import SENTINEL, content_text, decode_content
from ..errors import SessionNotFound
from ..message_rows import (
    LAST_ACTIVE_RESOLUTION_S,
    MESSAGE_FIELDS,
    decode_message,
    row_values,
    tool_call_count,
)
from ..records import MessageRow
from ..rows import from_json_text, make_preview
from . import db, usage
from .dispatch import Dispatch
from .tsearch import index_text

__all__ = ["MESSAGE_FIELDS"]

Dedupe = tuple[str, str]
PLAIN, STRUCTURED, ESCAPED = 0, 1, 2
READ_COLUMNS = ", ".join(
    [
        "id",
        "session_id",
        *(c for c in MESSAGE_COLUMNS if c not in ("id", "session_id", "sb_written")),
        "content_enc",
    ]
)


def to_pg(stored: str | None) -> tuple[str | None, int]:
    """(text PostgreSQL can hold, content_enc) for content as state/content.py stores it."""
    if stored is None:
        return None, PLAIN
    if stored.startswith(SENTINEL) and "\x00" not in stored[len(SENTINEL) :]:
        return stored[len(SENTINEL) :], STRUCTURED
    if "\x00" in stored:
        return json.dumps(stored), ESCAPED
    return stored, PLAIN


def from_pg(text: str | None, enc: int) -> str | None:
    if text is None or enc == PLAIN:
        return text
    return SENTINEL + text if enc == STRUCTURED else str(json.loads(text))


def _message(row: dict[str, Any]) -> MessageRow:
    row["content"] = from_pg(row["content"], row.pop("content_enc"))
    return decode_message(row)


class _Duplicate(Exception):
    """Raised inside an append to roll it back: another writer stored the id first."""


_INSERT = (
    "INSERT INTO messages (session_id, role, content, content_enc, tool_call_id, tool_calls, "
    "tool_name, timestamp, token_count, finish_reason, reasoning, reasoning_details, "
    "codex_reasoning_items, platform_message_id, active, tsv, seg_tsv, tool_tsv, ntok, aux_ntok) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 1, "
    "%s::tsvector, %s::tsvector, %s::tsvector, %s, %s) RETURNING id"
)
_UPDATE_SESSION = (
    "UPDATE sessions SET message_count = COALESCE(message_count, 0) + %s, "
    "tool_call_count = COALESCE(tool_call_count, 0) + %s, preview = COALESCE(preview, %s), "
    "last_active = CASE WHEN COALESCE(last_active, 0) <= %s - "
    f"{LAST_ACTIVE_RESOLUTION_S} THEN %s ELSE last_active END "
    "WHERE id = %s RETURNING source, chat_id"
)
_DUPLICATE_IN_CHAT = (
    "SELECT 1 FROM platform_messages WHERE source = %s AND chat_id = %s "
    "AND platform_message_id = ANY(%s) LIMIT 1"
)


async def is_stored(conn: AsyncConnection, source: str, chat_id: str, pmid: str) -> bool:
    return bool(await db.value(conn, _DUPLICATE_IN_CHAT, (source, chat_id, [pmid])))


async def append_messages(
    conn: AsyncConnection,
    session_id: str,
    messages: Iterable[Mapping[str, Any]],
    dedupe: Dedupe | None = None,
    tokens: Mapping[str, int] | None = None,
) -> list[int]:
    """Insert in order and keep the session's counters right; returns the ids. With
    `dedupe`, nothing is stored (and [] returned) when a message's platform id is already
    stored for that chat: the unique key on platform_messages decides, so two processes
    cannot both store it."""
    batch = list(messages)
    pmids = [
        str(m["platform_message_id"]) for m in batch if m.get("platform_message_id") is not None
    ]
    if dedupe is not None and pmids and await db.value(conn, _DUPLICATE_IN_CHAT, (*dedupe, pmids)):
        return []
    try:
        async with conn.transaction():
            ids = await _insert(conn, session_id, batch, dedupe, pmids)
            if tokens and (tokens.get("input_tokens") or tokens.get("output_tokens")):
                await usage.update_token_counts(conn, session_id, tokens)
            return ids
    except _Duplicate:
        return []


async def _insert(
    conn: AsyncConnection,
    session_id: str,
    batch: list[Mapping[str, Any]],
    dedupe: Dedupe | None,
    pmids: list[str],
) -> list[int]:
    if not batch:
        return []
    now = time.time()
    rows, tool_calls, preview, last_ts = [], 0, None, 0.0
    for msg in batch:
        v = row_values(session_id, msg, now)
        content, enc = to_pg(v[2])
        idx = index_text(v[2], v[5], v[4])
        rows.append(
            (
                v[0],
                v[1],
                content,
                enc,
                *v[3:],
                idx.tsv,
                idx.seg_tsv,
                idx.tool_tsv,
                idx.ntok,
                idx.aux_ntok,
            )
        )
        tool_calls += tool_call_count(v[4])
        last_ts = max(last_ts, v[6])
        if preview is None and v[1] == "user":
            preview = make_preview(content_text(v[2]))
    # The session row first: it must exist, and its lock orders concurrent appends.
    found = await db.tuples(
        conn, _UPDATE_SESSION, (len(rows), tool_calls, preview, last_ts, last_ts, session_id)
    )
    if not found:
        raise SessionNotFound(session_id)
    ids: list[int] = []
    async with conn.cursor() as cur:
        await cur.executemany(_INSERT.encode(), rows, returning=True)
        while True:
            got = await cur.fetchone()
            assert got is not None
            ids.append(int(got[0]))
            if not cur.nextset():
                break
    # stored ids are keyed by the session's chat (what has_platform_message asks); the key
    # settles a race only when the caller dedupes in that same chat, as it always does
    chat = (found[0][0], found[0][1])
    if pmids and chat[0] is not None and chat[1] is not None:
        first: dict[str, int] = {}
        for mid, msg in zip(ids, batch, strict=True):
            if msg.get("platform_message_id") is not None:
                first.setdefault(str(msg["platform_message_id"]), mid)
        claimed = await db.tuples(
            conn,
            "INSERT INTO platform_messages SELECT %s, %s, p, m FROM unnest(%s::text[], %s::bigint[]) "
            "AS u(p, m) ON CONFLICT DO NOTHING RETURNING 1",
            (chat[0], chat[1], list(first), list(first.values())),
        )
        if dedupe is not None and tuple(dedupe) == chat and len(claimed) < len(first):
            raise _Duplicate()
    return ids


async def append_and_read(
    conn: AsyncConnection,
    session_id: str,
    messages: Iterable[Mapping[str, Any]],
    dedupe: Dedupe | None,
    last: int | None,
) -> tuple[list[int], list[dict[str, Any]]]:
    ids = await append_messages(conn, session_id, messages, dedupe)
    return (ids, await conversation(conn, session_id, last)) if ids else ([], [])


async def get_messages(
    conn: AsyncConnection,
    session_id: str,
    *,
    limit: int | None = None,
    after_id: int | None = None,
    last: int | None = None,
) -> list[MessageRow]:
    if last is not None:
        found = await db.rows(
            conn,
            f"SELECT * FROM (SELECT {READ_COLUMNS} FROM messages WHERE session_id = %s "
            "ORDER BY id DESC LIMIT %s) t ORDER BY id",
            (session_id, last),
        )
    else:
        found = await db.rows(
            conn,
            f"SELECT {READ_COLUMNS} FROM messages WHERE session_id = %s AND id > %s "
            "ORDER BY id LIMIT %s",
            (session_id, after_id or 0, limit),
        )
    return [_message(r) for r in found]


async def get_messages_around(
    conn: AsyncConnection, session_id: str, message_id: int, window: int
) -> list[MessageRow]:
    found = await db.rows(
        conn,
        f"(SELECT {READ_COLUMNS} FROM messages WHERE session_id = %s AND id <= %s "
        "ORDER BY id DESC LIMIT %s) UNION ALL "
        f"(SELECT {READ_COLUMNS} FROM messages WHERE session_id = %s AND id > %s "
        "ORDER BY id LIMIT %s) ORDER BY id",
        (session_id, message_id, window + 1, session_id, message_id, window),
    )
    return [_message(r) for r in found]


def chat_message(r: Mapping[str, Any]) -> dict[str, Any]:
    """A stored row in OpenAI chat format, as state/sqlite/messages.py's SQL builds it: content
    always, the optional keys only when they have a value."""
    out: dict[str, Any] = {
        "role": r["role"],
        "content": decode_content(from_pg(r["content"], r["content_enc"])),
    }
    calls = r["tool_calls"]
    if calls is not None:
        parsed = from_json_text(calls)
        if parsed is not None:
            out["tool_calls"] = parsed
    if r["role"] == "tool":
        if r["tool_call_id"] is not None:
            out["tool_call_id"] = r["tool_call_id"]
        if r["tool_name"] is not None:
            out["name"] = r["tool_name"]
    if r["reasoning"] is not None:
        out["reasoning"] = r["reasoning"]
    return out


async def conversation(
    conn: AsyncConnection, session_id: str, last: int | None = None, upto: int | None = None
) -> list[dict[str, Any]]:
    """The newest `last` messages (all when None) up to message `upto`, in chat format."""
    found = await db.rows(
        conn,
        "SELECT * FROM (SELECT id, role, content, content_enc, tool_calls, tool_call_id, "
        "tool_name, reasoning FROM messages WHERE session_id = %s AND id <= %s "
        "ORDER BY id DESC LIMIT %s) t ORDER BY id",
        (session_id, upto if upto is not None else 2**63 - 1, last),
    )
    return [chat_message(r) for r in found]


async def count_messages(conn: AsyncConnection, session_id: str | None = None) -> int:
    if session_id:
        return int(
            await db.value(
                conn, "SELECT COUNT(*) FROM messages WHERE session_id = %s", (session_id,)
            )
        )
    return int(await db.value(conn, "SELECT COUNT(*) FROM messages"))


async def count_outside(
    conn: AsyncConnection, session_id: str, first_id: int, last_id: int
) -> tuple[int, int]:
    found = await db.tuples(
        conn,
        "SELECT (SELECT COUNT(*) FROM messages WHERE session_id = %s AND id < %s), "
        "(SELECT COUNT(*) FROM messages WHERE session_id = %s AND id > %s)",
        (session_id, first_id, session_id, last_id),
    )
    return int(found[0][0]), int(found[0][1])


async def clear_messages(conn: AsyncConnection, session_id: str) -> int:
    n = await db.run(conn, "DELETE FROM messages WHERE session_id = %s", (session_id,))
    if not await db.run(
        conn,
        "UPDATE sessions SET message_count = 0, tool_call_count = 0, preview = NULL WHERE id = %s",
        (session_id,),
    ):
        raise SessionNotFound(session_id)
    return n


def rows_for_copy(history: list[MessageRow]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k in MESSAGE_FIELDS} for m in history]


class MessageOps(Dispatch):
    """PgStore's messages: appends (the hot path), reads in order, counts."""

    async def append_message(
        self, session_id: str, role: str, content: str | None = None, **fields: Any
    ) -> int:
        bad = [k for k in fields if k not in MESSAGE_FIELDS]
        if bad:
            raise TypeError(f"unknown message field(s): {', '.join(bad)}")
        msg = {"role": role, "content": content, **fields}
        ids = await self._write(append_messages, session_id, (msg,))
        return ids[0]

    async def append_messages(
        self,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        dedupe: tuple[str, str] | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> list[int]:
        tokens = None
        if input_tokens or output_tokens:
            tokens = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        return await self._write(append_messages, session_id, list(batch), dedupe, tokens)

    async def append_and_read(
        self,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        dedupe: tuple[str, str] | None = None,
        last: int | None = None,
    ) -> tuple[list[int], list[dict[str, Any]]]:
        return await self._write(append_and_read, session_id, list(batch), dedupe, last)

    async def get_messages(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        after_id: int | None = None,
        last: int | None = None,
    ) -> list[MessageRow]:
        async def read(conn: AsyncConnection) -> list[MessageRow]:
            return await get_messages(conn, session_id, limit=limit, after_id=after_id, last=last)

        return await self._read(read)

    async def get_messages_around(
        self, session_id: str, message_id: int, window: int = 5
    ) -> list[MessageRow]:
        return await self._read(get_messages_around, session_id, message_id, window)

    async def count_messages_outside(
        self, session_id: str, first_id: int, last_id: int
    ) -> tuple[int, int]:
        return await self._read(count_outside, session_id, first_id, last_id)

    async def clear_messages(self, session_id: str) -> int:
        return await self._write(clear_messages, session_id)

    async def message_count(self, session_id: str | None = None) -> int:
        return await self._read(count_messages, session_id)

    async def has_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> bool:
        return await self._read(is_stored, source, chat_id, platform_message_id)
