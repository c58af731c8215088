"""The inbox: every inbound message a platform handed the gateway, committed before the
platform is acknowledged, and how far its turn got.

A row is `received` when the gateway took the message (the platform may now be told),
`started` once the user's message is in its session (the turn's first write, which also
reads the history: derived from that message, so it costs no write of its own),
`answered` with the turn's last write (the reply), or `dropped` with a reason. The unique (platform, chat_id, platform_message_id) key makes every redelivery of
an answered message a duplicate across restarts; rows left `received`/`started` by a crash
are run again at start-up. Sessions, locks and replies are the gateway's; this module only
keeps the rows.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ..records import (
    Accept,
    # noqa: F401
    Fence,
    InboxEntry,
    Release,
)
from ..rows import payload_of  # noqa: F401
from ..vocab import ANSWERED, DROPPED, OPEN_STATES, RECEIVED, STARTED  # noqa: F401
from .batches import chunks, statement
from .dispatch import Dispatch
from .messages import append_many, conversations_after
from .windows import keeps_windows, windows_of
from .writer import register_batched

CREATE_SQL = """
CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    platform TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    platform_message_id TEXT,
    payload TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'received',
    reason TEXT,
    session_id TEXT,
    message_id INTEGER,
    received_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    reply_state TEXT,
    reply_message_id INTEGER,
    reply_ref TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS idx_inbox_platform_message
    ON inbox(platform, chat_id, platform_message_id);
CREATE INDEX IF NOT EXISTS idx_inbox_open ON inbox(id) WHERE state IN ('received', 'started');
CREATE INDEX IF NOT EXISTS idx_inbox_unsent ON inbox(id) WHERE reply_state IN ('ready', 'sending');
"""
# No index on updated_at: every state change would rewrite it; the daily prune scans.

# One call: (platform, chat_id, platform_message_id or None, payload JSON text, now).


def accept(
    conn: sqlite3.Connection,
    platform: str,
    chat_id: str,
    pmid: str | None,
    payload: str,
    now: float,
) -> tuple[int, str, bool]:
    """Take one message: (its inbox id, its state, whether it is new). A platform id seen
    before returns the earlier row and stores nothing."""
    return accept_many(conn, [(platform, chat_id, pmid, payload, now)])[0]


_FIND_JSON = (
    "SELECT json_extract(j.value, '$[3]'), i.id, i.state FROM json_each(?) j "
    "JOIN inbox i ON i.platform = json_extract(j.value, '$[0]') "
    "AND i.chat_id = json_extract(j.value, '$[1]') "
    "AND i.platform_message_id = json_extract(j.value, '$[2]')"
)

_INSERT_ROWS = (
    "INSERT INTO inbox(platform, chat_id, platform_message_id, payload, received_at, "
    "updated_at, state) VALUES "
)
_INSERT_TAIL = " ON CONFLICT(platform, chat_id, platform_message_id) DO NOTHING"


def accept_many(conn: sqlite3.Connection, calls: list[Accept]) -> list[tuple[int, str, bool]]:
    """Many `accept` calls, in one statement when none was seen before (the steady state):
    insert in order, ignoring platform ids taken before; when every row went in, their ids
    are consecutive (AUTOINCREMENT under the write lock), else the taken ones are looked up."""
    out: list[tuple[int, str, bool] | None] = [None] * len(calls)
    fresh: list[int] = []
    first_of: dict[tuple[str, str, str], int] = {}
    for i, c in enumerate(calls):
        if c[2] is None or first_of.setdefault((c[0], c[1], c[2]), i) == i:
            fresh.append(i)  # a platform id twice in one batch: the first wins
    (first_id,) = conn.execute(
        "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'inbox'), 0), "
        "COALESCE((SELECT MAX(id) FROM inbox), 0)) + 1"
    ).fetchone()
    before = conn.total_changes
    rows = [(*calls[i], calls[i][4]) for i in fresh]  # received_at = updated_at = now
    for n, params in chunks(rows, 6):
        conn.execute(statement(_INSERT_ROWS, 6, n, _INSERT_TAIL, ",'received'"), params)
    if conn.total_changes - before == len(fresh):
        for n, i in enumerate(fresh):
            out[i] = (first_id + n, RECEIVED, True)
    else:  # some were seen before: ask which rows are whose
        probes = [(calls[i][0], calls[i][1], calls[i][2], i) for i in fresh if calls[i][2]]
        for i, rid, state in conn.execute(_FIND_JSON, (json.dumps(probes),)):
            out[int(i)] = (int(rid), str(state), int(rid) >= first_id)
        unnamed = [i for i in fresh if calls[i][2] is None]
        newest = conn.execute(
            "SELECT id FROM inbox WHERE id >= ? AND platform_message_id IS NULL ORDER BY id",
            (first_id,),
        ).fetchall()
        for i, (rid,) in zip(unnamed, newest, strict=True):
            out[i] = (int(rid), RECEIVED, True)
    for i, c in enumerate(calls):  # batch-internal repeats point at their first
        if out[i] is None:
            first = out[first_of[(c[0], c[1], str(c[2]))]]
            assert first is not None
            out[i] = (first[0], first[1], False)
    return [o for o in out if o is not None]


register_batched(accept, accept_many)


def begin_turn(
    conn: sqlite3.Connection,
    inbox_id: int,
    session_id: str,
    message: Mapping[str, Any],
    last: int | None,
) -> tuple[int, list[dict[str, Any]]]:
    """The turn's first write: the user's message into its session, once (a turn run again
    after a crash finds it there by its platform id), and the history up to it. The row is
    `started` from here on without a write of its own: its message is in a session."""
    return begin_turns_many(conn, [(inbox_id, session_id, message, last)])[0]


_STORED_JSON = (
    "SELECT json_extract(j.value, '$[2]'), m.id FROM json_each(?) j "
    "JOIN messages m ON m.session_id = json_extract(j.value, '$[0]') "
    "AND m.platform_message_id = json_extract(j.value, '$[1]') AND m.role = 'user'"
)


def begin_turns_many(
    conn: sqlite3.Connection,
    calls: list[tuple[int, str, Mapping[str, Any], int | None]],
    fresh: bool = False,
) -> list[tuple[int, list[dict[str, Any]]]]:
    """`fresh`: the rows were inserted in this transaction, so no message of theirs can be
    stored yet and the probe for one is skipped."""
    message_ids: list[int] = [0] * len(calls)
    probes = (
        []
        if fresh
        else [
            (c[1], str(c[2]["platform_message_id"]), i)
            for i, c in enumerate(calls)
            if c[2].get("platform_message_id") is not None
        ]
    )
    if probes:  # one indexed probe for the batch: (session, platform id) stored already?
        for i, mid in conn.execute(_STORED_JSON, (json.dumps(probes),)):
            if not message_ids[int(i)]:
                message_ids[int(i)] = int(mid)
    to_append: list[int] = []
    repeats: list[tuple[int, int]] = []  # (call, the earlier call of this batch it repeats)
    first_of: dict[tuple[int, str], int] = {}
    for i, (inbox_id, session_id, _msg, _last) in enumerate(calls):
        if message_ids[i]:
            continue  # stored before a crash: run the turn on it again
        if (inbox_id, session_id) in first_of:
            repeats.append((i, first_of[(inbox_id, session_id)]))
        else:
            first_of[(inbox_id, session_id)] = i
            to_append.append(i)
    if to_append:
        ids = append_many(conn, [(calls[i][1], [calls[i][2]]) for i in to_append])
        for i, got in zip(to_append, ids, strict=True):
            message_ids[i] = got[0]
    for i, j in repeats:
        message_ids[i] = message_ids[j]
    return list(zip(message_ids, _histories(conn, calls, message_ids), strict=True))


def _histories(
    conn: sqlite3.Connection,
    calls: list[tuple[int, str, Mapping[str, Any], int | None]],
    message_ids: list[int],
) -> list[list[dict[str, Any]]]:
    """Each call's history up to its message: read whole, or only what is new since the
    window the writer keeps for the session (`state.sqlite.windows`)."""
    windows = windows_of(conn)
    if windows is not None:
        windows.check(conn)
    sessions = Counter(c[1] for c in calls)
    histories: list[list[dict[str, Any]]] = [[] for _ in calls]
    by_length: dict[int | None, list[int]] = {}
    for i, call in enumerate(calls):
        by_length.setdefault(call[3], []).append(i)
    for last, which in by_length.items():
        length = -1 if last is None else last
        # a session twice in one batch: its kept window cannot serve both, read it whole
        afters = [
            windows.since(calls[i][1], length)
            if windows is not None and sessions[calls[i][1]] == 1
            else 0
            for i in which
        ]
        # a window kept past the message (a turn run again) cannot serve it either; one
        # that ends at it (the appends extend the windows) is the whole history
        afters = [a if a <= message_ids[i] else 0 for i, a in zip(which, afters, strict=True)]
        reads = [(i, a) for i, a in zip(which, afters, strict=True) if a != message_ids[i]]
        got = (
            conversations_after(conn, [(calls[i][1], message_ids[i], a) for i, a in reads], last)
            if reads
            else []
        )
        new = dict(zip((i for i, _a in reads), got, strict=True))
        for i, after in zip(which, afters, strict=True):
            history = new.get(i, [])
            if windows is not None and sessions[calls[i][1]] == 1:
                history = windows.advance(calls[i][1], length, after, message_ids[i], history)
            histories[i] = history
    if windows is not None:
        windows.trim()  # only now: every `since` above had its window until its advance
    return histories


register_batched(begin_turn, begin_turns_many)


def accept_begin(
    conn: sqlite3.Connection,
    platform: str,
    chat_id: str,
    pmid: str | None,
    payload: str,
    now: float,
    session_id: str,
    message: Mapping[str, Any],
    last: int | None,
) -> tuple[int, str, bool, tuple[int, list[dict[str, Any]]] | None]:
    """`accept` and, for a new row, `begin_turn` in the same transaction: the router's fast
    path when the key is idle (one commit before the platform's acknowledgement instead of
    two). The last item is begin_turn's result, None for a row taken before."""
    return accept_begins_many(
        conn, [(platform, chat_id, pmid, payload, now, session_id, message, last)]
    )[0]


def accept_begins_many(
    conn: sqlite3.Connection,
    calls: list[tuple[str, str, str | None, str, float, str, Mapping[str, Any], int | None]],
) -> list[tuple[int, str, bool, tuple[int, list[dict[str, Any]]] | None]]:
    taken = accept_many(conn, [c[:5] for c in calls])
    fresh = [i for i, (_id, _state, new) in enumerate(taken) if new]
    begun = (
        begin_turns_many(
            conn, [(taken[i][0], calls[i][5], calls[i][6], calls[i][7]) for i in fresh], fresh=True
        )
        if fresh
        else []
    )
    out: list[tuple[int, str, bool, tuple[int, list[dict[str, Any]]] | None]] = [
        (rid, state, new, None) for rid, state, new in taken
    ]
    for i, got in zip(fresh, begun, strict=True):
        out[i] = (*taken[i], got)
    return out


register_batched(accept_begin, accept_begins_many)


def end_turn(
    conn: sqlite3.Connection,
    inbox_id: int,
    session_id: str,
    batch: list[Mapping[str, Any]],
    tokens: Mapping[str, int] | None,
    reply_state: str,
) -> list[int]:
    """The turn's last write: the reply (and tool messages) into the session, the row
    `answered` and its reply in the outbox as `reply_state` ('ready': resent at start-up
    until marked sent; 'sending': never resent, at most once), in one transaction."""
    return end_turns_many(conn, [(inbox_id, session_id, batch, tokens, reply_state)])[0]


def end_turns_many(
    conn: sqlite3.Connection,
    calls: list[tuple[int, str, list[Mapping[str, Any]], Mapping[str, int] | None, str]],
) -> list[list[int]]:
    ids = append_many(conn, [(sid, batch, None, tokens) for _i, sid, batch, tokens, _r in calls])
    rows = [(c[0], c[4], got[-1] if got else None) for c, got in zip(calls, ids, strict=True)]
    now = time.time()
    for n, params in chunks(rows, 3):
        conn.execute(statement(_ANSWERED_ROWS, 3, n, _ANSWERED), [*params, now])
    return ids


_ANSWERED_ROWS = "WITH j(id, reply_state, reply_id) AS (VALUES "
_ANSWERED = (
    ") UPDATE inbox SET state = 'answered', reply_state = j.reply_state, "
    "reply_message_id = j.reply_id, updated_at = ? FROM j WHERE inbox.id = j.id"
)


register_batched(end_turn, end_turns_many)


def finish(conn: sqlite3.Connection, inbox_id: int, state: str, reason: str | None) -> None:
    """Close a row without a reply of the agent's: a command answered, or dropped."""
    finish_many(conn, [(inbox_id, state, reason)])


def finish_many(conn: sqlite3.Connection, calls: list[tuple[int, str, str | None]]) -> list[None]:
    now = time.time()
    for n, params in chunks(calls, 3):
        conn.execute(statement(_FINISH_ROWS, 3, n, _FINISH), [*params, now])
    return [None] * len(calls)  # the writer hands each batched call its own result


_FINISH_ROWS = "WITH j(id, state, reason) AS (VALUES "
_FINISH = (
    ") UPDATE inbox SET state = j.state, reason = j.reason, updated_at = ? "
    "FROM j WHERE inbox.id = j.id"
)


register_batched(finish, finish_many)


_OPEN_ROWS = (
    "SELECT o.*, m.session_id FROM (SELECT i.id, i.platform, i.chat_id, "
    "i.platform_message_id, i.payload, i.received_at, "
    "(SELECT m.id FROM sessions s JOIN messages m ON m.session_id = s.id "
    " WHERE s.source = i.platform AND s.chat_id = i.chat_id AND m.role = 'user' "
    " AND m.platform_message_id = i.platform_message_id ORDER BY m.id LIMIT 1) AS mid "
    "FROM inbox i WHERE i.state IN ('received', 'started')) o "
    "LEFT JOIN messages m ON m.id = o.mid ORDER BY o.id"
)


def open_rows(conn: sqlite3.Connection) -> list[InboxEntry]:
    """Rows a crash left open, oldest first; `started` (with its session and message) when
    the turn's message is stored, else `received`."""
    return [
        {
            "id": rid,
            "platform": platform,
            "chat_id": chat,
            "platform_message_id": pmid,
            "payload": payload,
            "state": STARTED if mid is not None else RECEIVED,
            "session_id": sid,
            "message_id": mid,
            "received_at": received,
        }
        for rid, platform, chat, pmid, payload, received, mid, sid in conn.execute(_OPEN_ROWS)
    ]


def started_rows(conn: sqlite3.Connection) -> int:
    """Open rows whose message is already in a session: turns a crash stopped mid-way."""
    (n,) = conn.execute(
        "SELECT COUNT(*) FROM inbox i WHERE i.state IN ('received', 'started') "
        "AND i.platform_message_id IS NOT NULL AND EXISTS (SELECT 1 FROM messages m "
        "JOIN sessions s ON s.id = m.session_id WHERE m.platform_message_id = "
        "i.platform_message_id AND s.source = i.platform AND s.chat_id = i.chat_id)"
    ).fetchone()
    return int(n)


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Rows per state (the open ones by index; all of them by a scan: for doctor)."""
    return {str(s): int(n) for s, n in conn.execute("SELECT state, COUNT(*) FROM inbox GROUP BY 1")}


def prune(conn: sqlite3.Connection, older_than: float) -> int:
    """Forget closed rows last touched before `older_than` (never a message)."""
    cur = conn.execute(
        "DELETE FROM inbox WHERE state IN ('answered', 'dropped') AND updated_at < ?",
        (older_than,),
    )
    return cur.rowcount


# appends and inbox bookkeeping: the history windows the writer keeps stay right (state.sqlite.windows)
keeps_windows(
    accept,
    accept_many,
    begin_turn,
    begin_turns_many,
    accept_begin,
    accept_begins_many,
    end_turn,
    end_turns_many,
    finish,
    finish_many,
)


class InboxOps(Dispatch):
    """SessionDB's inbox: inbound messages committed before the ack, and their turns."""

    async def accept_inbound(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        *,
        session_key: str | None = None,
        replica: int | None = None,
    ) -> tuple[int, str, bool]:
        """Commit an inbound message before its platform is acknowledged: (inbox id, state,
        whether it is new). A platform id taken before returns that row, storing nothing.
        (`session_key`/`replica` are for stores replicas share: one file has one daemon.)"""
        return await self._write(
            accept,
            platform,
            chat_id,
            platform_message_id,
            payload_of(payload),
            time.time(),
        )

    async def accept_and_begin(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        session_id: str,
        message: Mapping[str, Any],
        *,
        last: int | None = None,
    ) -> tuple[int, str, bool, tuple[int, list[dict[str, Any]]] | None]:
        """`accept_inbound` and, when the row is new, `begin_turn` in one transaction:
        (inbox id, state, whether new, begin_turn's result or None)."""
        return await self._write(
            accept_begin,
            platform,
            chat_id,
            platform_message_id,
            payload_of(payload),
            time.time(),
            session_id,
            dict(message),
            last,
        )

    async def begin_turn(
        self,
        inbox_id: int,
        session_id: str,
        message: Mapping[str, Any],
        *,
        last: int | None = None,
        fence: Fence | None = None,
    ) -> tuple[int, list[dict[str, Any]]]:
        """The user's message into its session, once (a turn a crash interrupted finds it
        there), and the newest `last` messages up to it in OpenAI chat format: (the
        message's id, the history). The inbox row counts as `started` from here."""
        return await self._write(begin_turn, inbox_id, session_id, dict(message), last)

    async def end_turn(
        self,
        inbox_id: int,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        reply_state: str = "ready",
        fence: Fence | None = None,
        release: Release | None = None,
    ) -> list[int]:
        """The reply into the session, the row `answered` and the reply in the outbox as
        `reply_state` ('ready', 'sending', or 'sent' for a reply given as its request's
        response), in one transaction. (No fences or leases here: one home, one daemon.)"""
        if release is not None:
            raise ValueError("a lease can only be freed by a fenced write (replicas)")
        tokens = (
            {"input_tokens": input_tokens, "output_tokens": output_tokens}
            if input_tokens or output_tokens
            else None
        )
        return await self._write(end_turn, inbox_id, session_id, list(batch), tokens, reply_state)

    async def finish_inbound(
        self, inbox_id: int, state: str, reason: str | None = None, *, fence: Fence | None = None
    ) -> None:
        """Close an inbox row without an agent reply (a command answered, or dropped)."""
        await self._write(finish, inbox_id, state, reason)

    async def open_inbound(self) -> list[InboxEntry]:
        """Rows a crash left `received`/`started`, oldest first."""
        return await self._read(open_rows)

    async def inbox_counts(self) -> dict[str, int]:
        """Rows per state, with `started` (open rows whose message is in a session) apart."""
        found = await self._read(counts)
        started = await self._read(started_rows)
        if started:
            found["received"] = found.get("received", 0) - started
            found["started"] = started
        return {k: v for k, v in found.items() if v}

    async def prune_inbox(self, older_than: float) -> int:
        """Forget closed inbox rows last touched before `older_than` (never a message)."""
        return await self._write(prune, older_than)
