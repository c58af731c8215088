"""Messages: append (single and batch), read in order, windows around a message, replay
in OpenAI chat format, clear.

Order within a session is the message id (AUTOINCREMENT), never the timestamp, so a clock
that jumps backwards cannot reorder a conversation.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..content import SQL_DECODED_CONTENT, content_text
from ..errors import SessionNotFound
from ..message_rows import (  # MESSAGE_FIELDS and ROLES stay importable from here
    LAST_ACTIVE_RESOLUTION_S,
    MESSAGE_FIELDS,  # noqa: F401
    ROLES,  # noqa: F401
    decode_message,
    row_values,
    tool_call_count,
)
from ..records import MessageRow
from ..rows import make_preview, row_dict
from ..textindex import aux_row
from . import activity, usage
from .batches import chunks, statement
from .dispatch import Dispatch
from .windows import as_read, windows_of
from .writer import register_batched

_INSERT = (
    "INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, tool_name, "
    "timestamp, token_count, finish_reason, reasoning, reasoning_details, "
    "codex_reasoning_items, platform_message_id, sb_written, active) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,1,1)"
)
_UPDATE_SESSION = (
    "UPDATE sessions SET message_count = COALESCE(message_count, 0) + ?, "
    "tool_call_count = COALESCE(tool_call_count, 0) + ?, "
    "preview = COALESCE(preview, ?) WHERE id = ?"
)
_MOVE_LAST_ACTIVE = (
    "UPDATE sessions SET last_active = ?1 WHERE id = ?2 "
    f"AND COALESCE(last_active, 0) <= ?1 - {LAST_ACTIVE_RESOLUTION_S}"
)


Dedupe = tuple[str, str]  # (source, chat_id): where a platform message id must be unique


def is_stored(
    conn: sqlite3.Connection, source: str, chat_id: str, platform_message_id: str
) -> bool:
    """True if a message with this platform id was already stored for that chat."""
    sql = "SELECT " + _DUPLICATE_IN_CHAT.format(src="?", chat="?", pmid="?")
    return bool(conn.execute(sql, (source, chat_id, platform_message_id)).fetchone()[0])


def _is_duplicate(
    conn: sqlite3.Connection, dedupe: Dedupe | None, msgs: list[Mapping[str, Any]]
) -> bool:
    if dedupe is None:
        return False
    return any(
        m.get("platform_message_id") is not None
        and is_stored(conn, dedupe[0], dedupe[1], str(m["platform_message_id"]))
        for m in msgs
    )


def _add_tokens(
    conn: sqlite3.Connection, session_id: str, tokens: Mapping[str, int] | None
) -> None:
    """A turn's token counts: the session totals and its model's usage row (state/sqlite/usage.py,
    the one accounting path)."""
    if tokens and (tokens.get("input_tokens") or tokens.get("output_tokens")):
        usage.update_token_counts(conn, session_id, tokens)


def append_messages(
    conn: sqlite3.Connection,
    session_id: str,
    messages: Iterable[Mapping[str, Any]],
    dedupe: Dedupe | None = None,
    tokens: Mapping[str, int] | None = None,
) -> list[int]:
    """Insert messages in order and keep the session's counters right. Returns the ids.

    With `dedupe`, nothing is stored (and [] returned) if a message's platform id was
    already stored for that chat: the check and the insert are one transaction. `tokens`
    adds input/output token counts in the same transaction.
    """
    batch = list(messages)
    if _is_duplicate(conn, dedupe, batch):
        return []
    now = time.time()
    ids: list[int] = []
    tool_calls = 0
    preview: str | None = None
    last_ts = 0.0
    rows: list[tuple[Any, ...]] = []
    for msg in batch:
        values = row_values(session_id, msg, now)
        rows.append(values)
        cur = conn.execute(_INSERT, values)
        mid = int(cur.lastrowid or 0)
        ids.append(mid)
        tool_calls += tool_call_count(values[4])
        last_ts = max(last_ts, values[6])
        if preview is None and values[1] == "user":
            preview = make_preview(content_text(values[2]))
        aux = aux_row(content_text(values[2]), values[5], values[4])
        if aux is not None:
            conn.execute(
                "INSERT INTO messages_aux(message_id, seg_text, tool_text) VALUES (?, ?, ?)",
                (mid, aux[0], aux[1]),
            )
    if not ids:
        if tokens:
            _add_tokens(conn, session_id, tokens)
        return ids
    cur = conn.execute(_UPDATE_SESSION, (len(ids), tool_calls, preview, session_id))
    if cur.rowcount == 0:
        raise SessionNotFound(session_id)  # the savepoint rolls the inserts back
    (source,) = conn.execute("SELECT source FROM sessions WHERE id = ?", (session_id,)).fetchone()
    activity.add(
        conn,
        activity.tally((source, mid, v[6], v[1], v[5]) for mid, v in zip(ids, rows, strict=True)),
    )
    conn.execute(_MOVE_LAST_ACTIVE, (last_ts, session_id))
    _add_tokens(conn, session_id, tokens)
    return ids


# A batch of appends is a few statements of one step each (state/sqlite/batches.py).
_INSERT_ROWS = (
    "INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, tool_name, "
    "timestamp, token_count, finish_reason, reasoning, reasoning_details, "
    "codex_reasoning_items, platform_message_id, sb_written, active) VALUES "
)


def _insert_messages(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Insert the rows in order (their ids consecutive under the write lock)."""
    for n, params in chunks(rows, 13):
        conn.execute(statement(_INSERT_ROWS, 13, n, constants=",1,1"), params)


# Both take the rows [session id, count, tool calls, newest timestamp, preview, input
# tokens, output tokens].
_SESSION_ROWS = "WITH j(sid, n, t, ts, pv, i, o) AS (VALUES "
_UPDATE_SESSIONS = (
    ") UPDATE sessions SET "
    "message_count = COALESCE(message_count, 0) + j.n, "
    "tool_call_count = COALESCE(tool_call_count, 0) + j.t, "
    "preview = COALESCE(preview, j.pv), "
    "input_tokens = COALESCE(input_tokens, 0) + j.i, "
    "output_tokens = COALESCE(output_tokens, 0) + j.o, "
    # as usage.update_token_counts leaves an accounted session (the token counts' other
    # columns default to 0; this one to NULL)
    "estimated_cost_usd = CASE WHEN j.i OR j.o THEN COALESCE(estimated_cost_usd, 0) "
    "ELSE estimated_cost_usd END "
    "FROM j WHERE sessions.id = j.sid"
)
_MOVE_LAST_ACTIVE_ROWS = (
    ") UPDATE sessions SET last_active = j.ts FROM j "
    f"WHERE sessions.id = j.sid AND COALESCE(sessions.last_active, 0) <= j.ts - {LAST_ACTIVE_RESOLUTION_S} "
    "RETURNING sessions.id, sessions.last_active"
)


def _sources(conn: sqlite3.Connection, wanted: set[str]) -> dict[str, str]:
    """Each session's source; raises SessionNotFound for one that does not exist. The
    writer's connection remembers them beside its history windows (valid as long as they
    are: state/sqlite/windows.py), so a session met before costs no statement."""
    windows = windows_of(conn)
    known: dict[str, str] = {}
    if windows is not None:
        windows.check(conn)
        known = windows.sources
        if all(sid in known for sid in wanted):
            return known
    missing = sorted(wanted.difference(known))
    found = dict(
        conn.execute(
            "SELECT id, source FROM sessions WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(missing),),
        ).fetchall()
    )
    for sid in missing:
        if sid not in found:
            raise SessionNotFound(sid)
    if windows is None:
        return found
    known.update(found)
    return known


def _update_sessions(conn: sqlite3.Connection, updates: list[list[Any]]) -> None:
    """Add each session's appended messages, tool calls and tokens to its counters, set its
    preview when it has none, and move its last_active."""
    for n, params in chunks(updates, 7):
        conn.execute(statement(_SESSION_ROWS, 7, n, _UPDATE_SESSIONS), params)
    _move_last_active(conn, updates)


def _move_last_active(conn: sqlite3.Connection, updates: list[list[Any]]) -> None:
    """Move each session's last_active to its newest message when that is at least
    LAST_ACTIVE_RESOLUTION_S later (every index on last_active is rewritten when it moves).
    Skipped when the writer saw every one of them active within that time already."""
    windows = windows_of(conn)
    seen = windows.active_at if windows is not None else {}
    if windows is not None and all(
        seen.get(u[0], 0.0) > u[3] - LAST_ACTIVE_RESOLUTION_S for u in updates
    ):
        return
    for n, params in chunks(updates, 7):
        for sid, moved_to in conn.execute(
            statement(_SESSION_ROWS, 7, n, _MOVE_LAST_ACTIVE_ROWS), params
        ):
            seen[sid] = moved_to


# Duplicate checks walk the chat's sessions, then (session_id, platform_message_id): platform
# ids repeat across chats, so starting from the id would visit every chat that used it.
_DUPLICATE_IN_CHAT = (
    "EXISTS (SELECT 1 FROM sessions s CROSS JOIN messages m "
    "WHERE s.source = {src} AND s.chat_id = {chat} "
    "AND m.session_id = s.id AND m.platform_message_id = {pmid})"
)
_DUPLICATES_JSON = (
    "SELECT DISTINCT json_extract(j.value, '$[3]') FROM json_each(?) j WHERE "
    + _DUPLICATE_IN_CHAT.format(
        src="json_extract(j.value, '$[0]')",
        chat="json_extract(j.value, '$[1]')",
        pmid="json_extract(j.value, '$[2]')",
    )
)


def append_many(conn: sqlite3.Connection, calls: list[tuple[Any, ...]]) -> list[list[int]]:
    """Many append_messages calls in a few statements; the writer uses it for runs of
    appends. Raises (so the writer falls back to one savepoint per call) if any session is
    missing."""
    now = time.time()
    source_of = _sources(conn, {call[0] for call in calls})
    # Duplicates (a platform id already stored for that chat), found in one query.
    probes = [
        (call[2][0], call[2][1], str(m["platform_message_id"]), i)
        for i, call in enumerate(calls)
        if len(call) > 2 and call[2] is not None
        for m in call[1]
        if m.get("platform_message_id") is not None
    ]
    dup_calls: set[int] = set()
    if probes:
        dup_calls = {int(r[0]) for r in conn.execute(_DUPLICATES_JSON, (json.dumps(probes),))}
        first_seen: dict[tuple[str, str, str], int] = {}
        for source, chat, pmid, i in probes:  # the same id twice within this batch
            if first_seen.setdefault((source, chat, pmid), i) != i:
                dup_calls.add(i)
    rows: list[tuple[Any, ...]] = []
    per_call: list[int] = []
    agg: dict[str, list[Any]] = {}  # sid -> [count, tool calls, last ts, preview, in, out]
    for i, call in enumerate(calls):
        session_id, batch = call[0], call[1]
        tokens: Mapping[str, int] | None = call[3] if len(call) > 3 else None
        if i in dup_calls:
            per_call.append(-1)  # a duplicate: nothing stored
            continue
        a = agg.setdefault(session_id, [0, 0, 0.0, None, 0, 0])
        n = 0
        for msg in batch:
            values = row_values(session_id, msg, now)
            rows.append(values)
            n += 1
            a[0] += 1
            if values[4] is not None:
                a[1] += tool_call_count(values[4])
            a[2] = max(a[2], values[6])
            if a[3] is None and values[1] == "user":
                a[3] = make_preview(content_text(values[2]))
        per_call.append(n)
        if tokens:
            a[4] += int(tokens.get("input_tokens", 0))
            a[5] += int(tokens.get("output_tokens", 0))
    ids: list[int] = []
    if rows:
        # Under the write lock AUTOINCREMENT hands out consecutive ids, starting one past
        # the larger of the sequence and the current maximum (one statement more is
        # cheaper than RETURNING's row per message).
        first = conn.execute(
            "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0), "
            "COALESCE((SELECT MAX(id) FROM messages), 0)) + 1"
        ).fetchone()[0]
        _insert_messages(conn, rows)
        ids = list(range(first, first + len(rows)))
        windows = windows_of(conn)
        if windows:  # the sessions' kept windows take the rows (state/sqlite/windows.py)
            for mid, values in zip(ids, rows, strict=True):
                windows.extend(values[0], mid, as_read(values))
        aux_rows = []
        for mid, values in zip(ids, rows, strict=True):
            aux = aux_row(content_text(values[2]), values[5], values[4])
            if aux is not None:
                aux_rows.append((mid, aux[0], aux[1]))
        if aux_rows:
            conn.executemany(
                "INSERT INTO messages_aux(message_id, seg_text, tool_text) VALUES (?, ?, ?)",
                aux_rows,
            )
        activity.add(
            conn,
            activity.tally(
                (source_of[v[0]], mid, v[6], v[1], v[5]) for mid, v in zip(ids, rows, strict=True)
            ),
        )
    updates = [[sid, *vals] for sid, vals in agg.items() if vals[0] or vals[4] or vals[5]]
    if updates:
        _update_sessions(conn, updates)
    usage.add_turn_usage(conn, [(sid, vals[4], vals[5]) for sid, vals in agg.items()])
    out: list[list[int]] = []
    pos = 0
    for n in per_call:
        if n < 0:
            out.append([])
            continue
        out.append(ids[pos : pos + n])
        pos += n
    return out


register_batched(append_messages, append_many)


def append_and_read(
    conn: sqlite3.Connection,
    session_id: str,
    messages: Iterable[Mapping[str, Any]],
    dedupe: Dedupe | None,
    last: int | None,
) -> tuple[list[int], list[dict[str, Any]]]:
    """Append, then read the newest `last` messages in the same transaction: the turn's
    history arrives with the write (no separate read). A duplicate returns ([], [])."""
    ids = append_messages(conn, session_id, messages, dedupe)
    return (ids, conversation(conn, session_id, last)) if ids else ([], [])


def append_and_read_many(
    conn: sqlite3.Connection, calls: list[tuple[Any, ...]]
) -> list[tuple[list[int], list[dict[str, Any]]]]:
    ids = append_many(conn, [(sid, batch, dedupe) for sid, batch, dedupe, _last in calls])
    stored = [i for i, got in enumerate(ids) if got]
    histories: dict[int, list[dict[str, Any]]] = {}
    by_length: dict[int | None, list[int]] = {}
    for i in stored:
        by_length.setdefault(calls[i][3], []).append(i)
    for last, which in by_length.items():
        got = conversations(conn, [(calls[i][0], ids[i][-1]) for i in which], last)
        histories.update(zip(which, got, strict=True))
    return [(got, histories[i]) if got else ([], []) for i, got in enumerate(ids)]


register_batched(append_and_read, append_and_read_many)


def get_messages(
    conn: sqlite3.Connection,
    session_id: str,
    *,
    limit: int | None = None,
    after_id: int | None = None,
    last: int | None = None,
) -> list[MessageRow]:
    """Messages in order. `last=N` gives the newest N (still in order)."""
    if last is not None:
        cur = conn.execute(
            "SELECT * FROM (SELECT * FROM messages WHERE session_id = ? ORDER BY id DESC "
            "LIMIT ?) ORDER BY id",
            (session_id, last),
        )
    else:
        cur = conn.execute(
            "SELECT * FROM messages WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?",
            (session_id, after_id or 0, -1 if limit is None else limit),
        )
    return [decode_message(row_dict(cur, r)) for r in cur.fetchall()]


def get_messages_around(
    conn: sqlite3.Connection, session_id: str, message_id: int, window: int
) -> list[MessageRow]:
    """Up to `window` messages before and after `message_id` (included), in order."""
    cur = conn.execute(
        "SELECT * FROM (SELECT * FROM messages WHERE session_id = ? AND id <= ? "
        "ORDER BY id DESC LIMIT ?) "
        "UNION ALL SELECT * FROM (SELECT * FROM messages WHERE session_id = ? AND id > ? "
        "ORDER BY id LIMIT ?) ORDER BY id",
        (session_id, message_id, window + 1, session_id, message_id, window),
    )
    return [decode_message(row_dict(cur, r)) for r in cur.fetchall()]


# SQLite builds the chat messages themselves: json_patch drops the optional keys whose value
# is NULL (content stays, null or not), so json.loads returns the final dicts.
_HISTORY_ARRAY = (
    "SELECT json_group_array(json_patch(json_object('role', role, 'content', "
    + SQL_DECODED_CONTENT
    + "), "
    "json_object('tool_calls', CASE WHEN json_valid(tool_calls) THEN json(tool_calls) "
    "ELSE tool_calls END, "
    "'tool_call_id', CASE WHEN role = 'tool' THEN tool_call_id END, "
    "'name', CASE WHEN role = 'tool' THEN tool_name END, "
    "'reasoning', reasoning))) "
    "FROM (SELECT * FROM (SELECT role, content, tool_calls, tool_call_id, tool_name, reasoning, id "
    "FROM messages WHERE session_id = {sid} AND id <= {upto} AND id > {after} "
    "ORDER BY id DESC LIMIT {last}) "
    "ORDER BY id)"
)
_CONVERSATION_JSON = _HISTORY_ARRAY.format(
    sid="?1", last="?2", upto="9223372036854775807", after="0"
)
# Many histories of the same length in one step, each ending at a given message id (a
# session can appear twice in a batch): [[session, last id], ...] -> {"0": [...], ...}.
_CONVERSATIONS_JSON = (
    "SELECT json_group_object(j.key, json(("
    + _HISTORY_ARRAY.format(
        sid="json_extract(j.value, '$[0]')",
        upto="json_extract(j.value, '$[1]')",
        last="?2",
        after="json_extract(j.value, '$[2]')",
    )
    + "))) FROM json_each(?1) AS j"
)


def conversation(
    conn: sqlite3.Connection, session_id: str, last: int | None = None
) -> list[dict[str, Any]]:
    """The newest `last` messages (all when None) in OpenAI chat format, for replay: one
    sqlite3 step and one json.loads (state/sqlite/batches.py says why steps matter)."""
    (raw,) = conn.execute(_CONVERSATION_JSON, (session_id, -1 if last is None else last)).fetchone()
    out: list[dict[str, Any]] = json.loads(raw or "[]")
    return out


def conversations(
    conn: sqlite3.Connection, ends: list[tuple[str, int]], last: int | None = None
) -> list[list[dict[str, Any]]]:
    """`conversation` for many (session, last message id) pairs in one statement and one
    step: each history ends at its message, whatever was appended after it."""
    return conversations_after(conn, [(sid, upto, 0) for sid, upto in ends], last)


def conversations_after(
    conn: sqlite3.Connection, ranges: list[tuple[str, int, int]], last: int | None = None
) -> list[list[dict[str, Any]]]:
    """For each (session, last id, after id): the newest `last` of the session's messages
    with after < id <= last id, in order (the history window cache reads only what is new
    since the window it keeps; after = 0 reads the whole window)."""
    (raw,) = conn.execute(
        _CONVERSATIONS_JSON, (json.dumps(ranges), -1 if last is None else last)
    ).fetchone()
    by_key: dict[str, list[dict[str, Any]]] = json.loads(raw or "{}")
    return [by_key[str(i)] for i in range(len(ranges))]


def count_messages(conn: sqlite3.Connection, session_id: str | None = None) -> int:
    """Every message, or those of one session."""
    if session_id:
        row = conn.execute(
            "SELECT COUNT(*) FROM messages WHERE session_id = ?", (session_id,)
        ).fetchone()
    else:
        row = conn.execute("SELECT COUNT(*) FROM messages").fetchone()
    return int(row[0])


def count_outside(
    conn: sqlite3.Connection, session_id: str, first_id: int, last_id: int
) -> tuple[int, int]:
    """How many messages of the session come before `first_id` and after `last_id`."""
    before, after = conn.execute(
        "SELECT (SELECT COUNT(*) FROM messages WHERE session_id = ? AND id < ?), "
        "(SELECT COUNT(*) FROM messages WHERE session_id = ? AND id > ?)",
        (session_id, first_id, session_id, last_id),
    ).fetchone()
    return int(before), int(after)


def clear_messages(conn: sqlite3.Connection, session_id: str) -> int:
    cur = conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
    upd = conn.execute(
        "UPDATE sessions SET message_count = 0, tool_call_count = 0, preview = NULL WHERE id = ?",
        (session_id,),
    )
    if upd.rowcount == 0:
        raise SessionNotFound(session_id)
    return cur.rowcount


class MessageOps(Dispatch):
    """SessionDB's messages: appends (the hot path), reads in order, counts."""

    async def append_message(
        self, session_id: str, role: str, content: str | None = None, **fields: Any
    ) -> int:
        """Append one message; returns its id once it is committed."""
        msg = {"role": role, "content": content, **fields}
        bad = [k for k in fields if k not in MESSAGE_FIELDS]
        if bad:
            raise TypeError(f"unknown message field(s): {', '.join(bad)}")
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
        """Append several messages atomically, in order.

        `dedupe=(source, chat_id)`: store nothing and return [] if a message's
        platform_message_id was already stored for that chat (checked in the same
        transaction). Token counts, if given, are added in the same transaction."""
        tokens = None
        if input_tokens or output_tokens:
            tokens = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        if dedupe is None and tokens is None:
            return await self._write(append_messages, session_id, list(batch))
        return await self._write(append_messages, session_id, list(batch), dedupe, tokens)

    async def append_and_read(
        self,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        dedupe: tuple[str, str] | None = None,
        last: int | None = None,
    ) -> tuple[list[int], list[dict[str, Any]]]:
        """Append messages and return (their ids, the newest `last` messages in OpenAI chat
        format) from the same transaction. With `dedupe`, a duplicate returns ([], [])."""
        return await self._write(append_and_read, session_id, list(batch), dedupe, last)

    async def get_messages(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        after_id: int | None = None,
        last: int | None = None,
    ) -> list[MessageRow]:
        return await self._read(
            lambda c: get_messages(c, session_id, limit=limit, after_id=after_id, last=last)
        )

    async def get_messages_around(
        self, session_id: str, message_id: int, window: int = 5
    ) -> list[MessageRow]:
        return await self._read(get_messages_around, session_id, message_id, window)

    async def count_messages_outside(
        self, session_id: str, first_id: int, last_id: int
    ) -> tuple[int, int]:
        """How many messages of the session come before `first_id` and after `last_id`."""
        return await self._read(count_outside, session_id, first_id, last_id)

    async def clear_messages(self, session_id: str) -> int:
        return await self._write(clear_messages, session_id)

    async def message_count(self, session_id: str | None = None) -> int:
        return await self._read(count_messages, session_id)

    async def has_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> bool:
        """True if a message with this platform id was already stored for that chat."""
        return await self._read(is_stored, source, chat_id, platform_message_id)
