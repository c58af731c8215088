"""The inbox: every inbound message a platform handed the gateway, committed before the
platform is acknowledged, and how far its turn got.

A row is `received` when the gateway took the message (the platform may now be told),
`started` once the user's message is in its session (the turn's first write, which also
reads the history), `answered` with the turn's last write (the reply), or `dropped` with a
reason. The unique (platform, chat_id, platform_message_id) key makes every redelivery of
an answered message a duplicate across restarts; rows left `received`/`started` by a crash
are run again at start-up. Sessions, locks and replies are the gateway's; this module only
keeps the rows.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from typing import Any

from .messages import append_many, conversations
from .writer import register_batched

RECEIVED, STARTED, ANSWERED, DROPPED = "received", "started", "answered", "dropped"
OPEN_STATES = (RECEIVED, STARTED)

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
    updated_at REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS idx_inbox_platform_message
    ON inbox(platform, chat_id, platform_message_id);
CREATE INDEX IF NOT EXISTS idx_inbox_open ON inbox(id) WHERE state IN ('received', 'started');
CREATE INDEX IF NOT EXISTS idx_inbox_updated ON inbox(updated_at);
"""

# One call: (platform, chat_id, platform_message_id or None, payload JSON text, now).
Accept = tuple[str, str, "str | None", str, float]


def accept(
    conn: sqlite3.Connection, platform: str, chat_id: str, pmid: str | None, payload: str,
    now: float,
) -> tuple[int, str, bool]:  # fmt: skip
    """Take one message: (its inbox id, its state, whether it is new). A platform id seen
    before returns the earlier row and stores nothing."""
    return accept_many(conn, [(platform, chat_id, pmid, payload, now)])[0]


_FIND_JSON = (
    "SELECT json_extract(j.value, '$[3]'), i.id, i.state FROM json_each(?) j "
    "JOIN inbox i ON i.platform = json_extract(j.value, '$[0]') "
    "AND i.chat_id = json_extract(j.value, '$[1]') "
    "AND i.platform_message_id = json_extract(j.value, '$[2]')"
)
_INSERT_JSON = (
    "INSERT INTO inbox(platform, chat_id, platform_message_id, payload, state, received_at, "
    "updated_at) SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
    "json_extract(value, '$[2]'), json_extract(value, '$[3]'), 'received', "
    "json_extract(value, '$[4]'), json_extract(value, '$[4]') FROM json_each(?) ORDER BY key"
)


def accept_many(conn: sqlite3.Connection, calls: list[Accept]) -> list[tuple[int, str, bool]]:
    """Many `accept` calls in three statements: find the ids seen before, insert the rest in
    order (AUTOINCREMENT hands out consecutive ids under the write lock)."""
    probes = [(c[0], c[1], c[2], i) for i, c in enumerate(calls) if c[2] is not None]
    out: list[tuple[int, str, bool] | None] = [None] * len(calls)
    if probes:
        for i, rid, state in conn.execute(_FIND_JSON, (json.dumps(probes),)):
            out[int(i)] = (int(rid), str(state), False)
    fresh: list[int] = []
    first_of: dict[tuple[str, str, str], int] = {}
    for i, c in enumerate(calls):
        if out[i] is not None:
            continue
        if c[2] is not None:  # the same platform id twice in this batch: the first wins
            first = first_of.setdefault((c[0], c[1], c[2]), i)
            if first != i:
                continue
        fresh.append(i)
    if fresh:
        (first_id,) = conn.execute(
            "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'inbox'), 0), "
            "COALESCE((SELECT MAX(id) FROM inbox), 0)) + 1"
        ).fetchone()
        conn.execute(_INSERT_JSON, (json.dumps([calls[i] for i in fresh], ensure_ascii=False),))
        for n, i in enumerate(fresh):
            out[i] = (first_id + n, RECEIVED, True)
    for i, c in enumerate(calls):  # batch-internal repeats point at their first
        if out[i] is None:
            j = first_of[(c[0], c[1], str(c[2]))]
            first = out[j]
            assert first is not None
            out[i] = (first[0], first[1], False)
    return [o for o in out if o is not None]


register_batched(accept, accept_many)


def begin_turn(
    conn: sqlite3.Connection, inbox_id: int, session_id: str, message: Mapping[str, Any],
    last: int | None,
) -> tuple[int, list[dict[str, Any]]]:  # fmt: skip
    """The turn's first write: the user's message into its session (once: a turn run again
    after a crash finds it there), the row `started`, and the history up to that message."""
    return begin_turns_many(conn, [(inbox_id, session_id, message, last)])[0]


def begin_turns_many(
    conn: sqlite3.Connection, calls: list[tuple[int, str, Mapping[str, Any], int | None]]
) -> list[tuple[int, list[dict[str, Any]]]]:
    now = time.time()
    known: dict[int, tuple[str | None, int | None]] = {
        int(r[0]): (r[1], r[2])
        for r in conn.execute(
            "SELECT id, session_id, message_id FROM inbox WHERE id IN "
            "(SELECT value FROM json_each(?))",
            (json.dumps([c[0] for c in calls]),),
        )
    }
    message_ids: list[int] = [0] * len(calls)
    to_append: list[int] = []
    repeats: list[tuple[int, int]] = []  # (call, the earlier call of this batch it repeats)
    first_of: dict[tuple[int, str], int] = {}
    for i, (inbox_id, session_id, _msg, _last) in enumerate(calls):
        sid, mid = known.get(inbox_id, (None, None))
        if mid is not None and sid == session_id:
            message_ids[i] = int(mid)  # stored before a crash: run the turn on it again
        elif (inbox_id, session_id) in first_of:
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
    conn.execute(
        "UPDATE inbox SET state = 'started', session_id = json_extract(j.value, '$[1]'), "
        "message_id = json_extract(j.value, '$[2]'), updated_at = ?2 "
        "FROM json_each(?1) j WHERE inbox.id = json_extract(j.value, '$[0]')",
        (json.dumps([[c[0], c[1], message_ids[i]] for i, c in enumerate(calls)]), now),
    )
    histories: list[list[dict[str, Any]]] = [[] for _ in calls]
    by_length: dict[int | None, list[int]] = {}
    for i, call in enumerate(calls):
        by_length.setdefault(call[3], []).append(i)
    for last, which in by_length.items():
        got = conversations(conn, [(calls[i][1], message_ids[i]) for i in which], last)
        for i, history in zip(which, got, strict=True):
            histories[i] = history
    return list(zip(message_ids, histories, strict=True))


register_batched(begin_turn, begin_turns_many)


def end_turn(
    conn: sqlite3.Connection, inbox_id: int, session_id: str,
    batch: list[Mapping[str, Any]], tokens: Mapping[str, int] | None,
) -> list[int]:  # fmt: skip
    """The turn's last write: the reply (and tool messages) into the session, the row
    `answered`, in one transaction."""
    return end_turns_many(conn, [(inbox_id, session_id, batch, tokens)])[0]


def end_turns_many(
    conn: sqlite3.Connection,
    calls: list[tuple[int, str, list[Mapping[str, Any]], Mapping[str, int] | None]],
) -> list[list[int]]:
    ids = append_many(conn, [(sid, batch, None, tokens) for _i, sid, batch, tokens in calls])
    finish_many(conn, [(c[0], ANSWERED, None) for c in calls])
    return ids


register_batched(end_turn, end_turns_many)


def finish(conn: sqlite3.Connection, inbox_id: int, state: str, reason: str | None) -> None:
    """Close a row without a reply of the agent's: a command answered, or dropped."""
    finish_many(conn, [(inbox_id, state, reason)])


def finish_many(conn: sqlite3.Connection, calls: list[tuple[int, str, str | None]]) -> list[None]:
    conn.execute(
        "UPDATE inbox SET state = json_extract(j.value, '$[1]'), "
        "reason = json_extract(j.value, '$[2]'), updated_at = ?2 "
        "FROM json_each(?1) j WHERE inbox.id = json_extract(j.value, '$[0]')",
        (json.dumps([list(c) for c in calls]), time.time()),
    )
    return [None] * len(calls)  # one result per call, as the writer's merged path expects


register_batched(finish, finish_many)


def open_rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Rows a crash left `received`/`started`, oldest first."""
    cur = conn.execute(
        "SELECT id, platform, chat_id, platform_message_id, payload, state, session_id, "
        "message_id, received_at FROM inbox WHERE state IN ('received', 'started') ORDER BY id"
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Rows per state (the open ones by index; all of them by a scan: for doctor)."""
    return {str(s): int(n) for s, n in conn.execute("SELECT state, COUNT(*) FROM inbox GROUP BY 1")}


def open_count(conn: sqlite3.Connection) -> int:
    (n,) = conn.execute(
        "SELECT COUNT(*) FROM inbox WHERE state IN ('received', 'started')"
    ).fetchone()
    return int(n)


def prune(conn: sqlite3.Connection, older_than: float) -> int:
    """Forget closed rows last touched before `older_than` (never a message)."""
    cur = conn.execute(
        "DELETE FROM inbox WHERE state IN ('answered', 'dropped') AND updated_at < ?",
        (older_than,),
    )
    return cur.rowcount


def payload_of(values: Mapping[str, Any]) -> str:
    """The payload as ASCII JSON: text a platform delivered with a lone surrogate is kept
    (escaped), so taking a message never fails on its text (storing it may, later)."""
    return json.dumps(values, ensure_ascii=True, separators=(",", ":"))
