"""The history windows the PostgreSQL writer keeps between turns (state/sqlite/windows.py's, with
a check that holds across replicas).

A turn reads the newest `history_messages` (200) of its session for the agent. Read whole,
that is up to 200 rows sent by the server and turned into dicts by the replica, per
message: at 800 messages/s on one replica, with sessions of only 30-60 messages, 19% of
the daemon's samples (py-spy) were in that read. Between two turns of a session only a
few messages are new, so the writer keeps each session's last window and reads the rows
after it.

On SQLite one writer sees every change and `PRAGMA data_version` tells another process's;
here other replicas, the CLI and a background job write the same sessions. What keeps a
window right is the session's `message_count`, kept as the window's mark:

* every statement that inserts or deletes a session's messages moves its
  `sessions.message_count` in the same transaction (appends add, `clear_messages` sets 0,
  a deleted session has none), and nothing updates a message in place;
* a window is kept only when, in the snapshot it was read in, the session had no message
  after the window's newest one: then every later change to the messages at or before it
  moves the count without adding a row after it;
* so at the next turn the window still holds exactly when
  count now = count kept + the rows read after the window (one statement reads both, in
  one snapshot, after the batch's own append locked the session row: no other writer can
  be between the two). Otherwise the session is read whole, as before: a failed check
  costs one full read, never a wrong history.

The writer forgets every window when a batch or one of its operations fails (a window may
have been advanced by a statement that was rolled back), and a new connection starts
with none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import AsyncConnection

from ..history import HistoryWindows
from . import db
from .messages import chat_message

# For each (session, newest message id, after id, inbox row): the session's message count,
# how many of its messages come after the newest (a window is kept only when none do), and
# the newest `last` messages with after < id <= newest, in order. The newest id, when not
# given, is the inbox row's message (its turn's, set by a statement before this one in the
# same transaction: the read then goes in the same round trip as the append, whose ids it
# does not know).
# The window's bounds are (session, id) row comparisons, which only idx_messages_session_order
# can search: with `id <= upto AND id > after`, the writer's generic plan made on a new,
# never analyzed table walked the primary key backwards from the window's end through every
# session's rows (396 rows read for 2 kept in a bench run: 0.18 -> 0.44 ms of the server
# per read).
_READ = (
    "SELECT u.n, s.message_count AS count, l.later, m.* FROM "
    + db.rowset("%s", ("text", "bigint", "bigint", "bigint"), ordinality=True)
    + " AS u(sid, upto, after, row, n) "
    "CROSS JOIN LATERAL (SELECT COALESCE(u.upto, "
    "(SELECT i.message_id FROM inbox i WHERE i.id = u.row)) AS upto OFFSET 0) e "
    "LEFT JOIN sessions s ON s.id = u.sid "
    "CROSS JOIN LATERAL (SELECT count(*) AS later FROM messages x "
    "WHERE x.session_id = u.sid AND x.id > e.upto) l "
    "LEFT JOIN LATERAL (SELECT id, role, content, content_enc, tool_calls, tool_call_id, "
    "tool_name, reasoning FROM messages WHERE session_id = u.sid "
    "AND (session_id, id) <= (u.sid, e.upto) AND (session_id, id) > (u.sid, u.after) "
    "ORDER BY id DESC LIMIT %s) m ON true ORDER BY u.n, m.id"
)


class WriterConnection(db.LoopConnection):
    """The writer's connection, carrying its windows and its statements' direct path
    (`windows` and `direct` are set by whoever connects)."""

    windows: HistoryWindows
    direct: db.Direct


def windows_of(conn: AsyncConnection) -> HistoryWindows | None:
    """The writer connection's windows; None on any other connection (no caching there)."""
    return getattr(conn, "windows", None)


def forget_windows(conn: AsyncConnection | None) -> None:
    windows = windows_of(conn) if conn is not None else None
    if windows is not None:
        windows.clear()


Read = tuple[int | None, int, list[dict[str, Any]]]  # message count, later messages, window


# A write the caller would send on its own just before the read (sql, params): sent as a
# data-modifying CTE of the read's statement instead, so the two cost one round trip. It
# must not change what the read reads (the read's snapshot does not see it).
Before = tuple[str, tuple[Any, ...]]
# What a history ends at: (session, its message's id) or (session, None, the inbox row
# whose message it is, stored by an earlier statement of the same transaction)
Upto = tuple[str, int | None, int | None]


def _statement(
    ranges: Sequence[tuple[str, int | None, int, int | None]],
    last: int | None,
    before: Before | None = None,
) -> tuple[str, tuple[Any, ...]]:
    """_READ for (session, newest id, after id, inbox row), `before` in it (see Before)."""
    params = (db.json_rows(ranges), last)
    if before is None:
        return _READ, params
    return f"WITH w AS ({before[0]}) {_READ}", (*before[1], *params)


def _reads(found: Sequence[Mapping[str, Any]], n: int) -> list[Read]:
    out: list[Read] = [(None, 0, []) for _ in range(n)]
    for r in found:
        i = int(r["n"]) - 1
        messages = out[i][2]
        if r["id"] is not None:  # a session without rows in the range: one row of NULLs
            messages.append(chat_message(r))
        out[i] = (r["count"], int(r["later"]), messages)
    return out


class Histories:
    """A read of histories in two steps: `statement`, which the caller sends (alone, or in
    one round trip with the statements it follows), then `settled` with its rows and the
    messages' ids. For each (session, message id or None and the inbox row, as Upto): the
    newest `last` messages up to that message, in chat format, read whole or only after
    the window kept for the session (a session twice in `ends` is read whole: one window
    cannot serve both). `before`: a write sent in the read's statement (see Before)."""

    __slots__ = ("ends", "last", "length", "windows", "twice", "afters", "statement")

    def __init__(
        self,
        conn: AsyncConnection,
        ends: Sequence[Upto],
        last: int | None,
        before: Before | None = None,
    ) -> None:
        self.ends, self.last = ends, last
        self.length = -1 if last is None else last
        self.windows = windows = windows_of(conn)
        self.twice = Counter(s for s, _m, _r in ends)
        self.afters = [0] * len(ends)
        for i, (sid, mid, _r) in enumerate(ends):
            after = 0
            if windows is not None and self.twice[sid] == 1:
                after = windows.since(sid, self.length)
            # a window kept past the message (a turn run again) cannot serve it; a message
            # whose id is not known yet is new, its id drawn after every one a window holds
            if mid is None or after < mid:
                self.afters[i] = after
        self.statement = _statement(
            [(s, m, a, r) for (s, m, r), a in zip(ends, self.afters, strict=True)], last, before
        )

    async def settled(
        self, conn: AsyncConnection, found: Sequence[Mapping[str, Any]], mids: Sequence[int]
    ) -> list[list[dict[str, Any]]]:
        """The histories, from the statement's rows; `mids`: the messages' ids."""
        got = _reads(found, len(self.ends))
        windows, last, afters = self.windows, self.last, self.afters
        if windows is None:
            return [h for _c, _l, h in got]
        ends = [(s, mid) for (s, _m, _r), mid in zip(self.ends, mids, strict=True)]
        # the windows that no longer hold: those sessions read whole
        stale = [
            i
            for i, (after, (count, later, new)) in enumerate(zip(afters, got, strict=True))
            if after
            and (count is None or later or count != windows.mark(ends[i][0]) + len(new))
            and (last is None or len(new) < last)  # `last` new ones: the window is all new
        ]
        if stale:
            sql, params = _statement([(*ends[i], 0, None) for i in stale], last)
            again = _reads(await db.rows(conn, sql, params), len(stale))
            for i, read in zip(stale, again, strict=True):
                afters[i], got[i] = 0, read
        length = self.length
        out: list[list[dict[str, Any]]] = []
        for (sid, mid), after, (count, later, new) in zip(ends, afters, got, strict=True):
            if self.twice[sid] > 1:
                out.append(new)
                continue
            if after and last is not None and len(new) >= last:
                after = 0  # the newest `last` are all new: nothing of the window is kept
                windows.forget(sid)
            history = windows.advance(sid, length, after, mid, new, count or 0)
            if count is None or later:
                windows.forget(sid)  # cannot be checked next time: not kept
            out.append(history)
        windows.trim()  # only now: every `since` above had its window until its advance
        return out


async def histories(
    conn: AsyncConnection,
    ends: Sequence[tuple[str, int]],
    last: int | None,
    before: Before | None = None,
) -> list[list[dict[str, Any]]]:
    """For each (session, message id): the newest `last` messages up to that message
    (Histories, read in one statement of its own)."""
    read = Histories(conn, [(s, m, None) for s, m in ends], last, before)
    return await read.settled(conn, await db.rows(conn, *read.statement), [m for _s, m in ends])
