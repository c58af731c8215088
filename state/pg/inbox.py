"""The inbox on PostgreSQL: the same rows and states as state/sqlite/inbox.py (received, started,
answered, dropped), kept with SQL of its own.

The unique (platform, chat_id, platform_message_id) key decides what is a redelivery,
across processes too: an insert that meets it does nothing and the earlier row is read
back. `begin_turn` locks its rows, so two daemons re-running the same turn append the user's
message once. Every write here also has a many-calls form for the writer's fast path.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

from psycopg import AsyncConnection

from ..records import Accept, InboxEntry
from ..vocab import ANSWERED, RECEIVED, STARTED
from . import db
from .appends import append_many, planned, settled
from .windows import Histories, histories
from .writer import register_batched

# The rows' ids drawn in call order (`n`) and the rows inserted (`ins`: their ids and keys),
# as common table expressions: accept_many's statement, and turns.turns_many's, which
# takes the inserted rows' keys in the same statement. Each drawn id, and whether its row
# went in, is _ACCEPTED's select (cluster.py widens it with the take's columns).
ACCEPT_CTES = (
    "ids AS MATERIALIZED (SELECT n, nextval(pg_get_serial_sequence('inbox', 'id')) AS i "
    "FROM generate_series(1, %(a_n)s) AS g(n) ORDER BY n), "
    "ins AS (INSERT INTO inbox (id, platform, chat_id, platform_message_id, payload, state, "
    "received_at, updated_at, session_key, replica) SELECT ids.i, p, c, m, pl, %(a_state)s, t, "
    "t, k, r FROM "
    + db.rowset(
        "%(a_rows)s",
        ("text", "text", "text", "text", "double precision", "text", "bigint"),
        ordinality=True,
    )
    + " AS u(p, c, m, pl, t, k, r, n) JOIN ids USING (n) ORDER BY n "
    "ON CONFLICT (platform, chat_id, platform_message_id) DO NOTHING RETURNING id, session_key)"
)
_ACCEPTED = "SELECT ids.i, ins.id IS NOT NULL FROM ids LEFT JOIN ins ON ins.id = ids.i"
_INSERT = f"WITH {ACCEPT_CTES} {_ACCEPTED} ORDER BY ids.n"


def accept_params(calls: Sequence[Accept | Routed]) -> dict[str, Any]:
    """ACCEPT_CTES's parameters for these calls, in call order."""
    chosen = [(*c, None, None)[:7] for c in calls]
    return {"a_rows": db.json_rows(chosen), "a_n": len(calls), "a_state": RECEIVED}


# One call: Accept, plus the message's session key and the replica taking it (several
# replicas on one database; None for one daemon).
Routed = tuple[str, str, "str | None", str, float, "str | None", "int | None"]
# A separate statement, so it sees a conflicting row another transaction committed while
# the insert waited for it (one statement's snapshot would not).
_FIND = (
    "SELECT u.n, i.id, i.state FROM unnest(%s::text[], %s::text[], %s::text[]) "
    "WITH ORDINALITY AS u(p, c, m, n) JOIN inbox i ON i.platform = u.p AND i.chat_id = u.c "
    "AND i.platform_message_id = u.m"
)


async def accept(
    conn: AsyncConnection,
    platform: str,
    chat_id: str,
    pmid: str | None,
    payload: str,
    now: float,
    session_key: str | None = None,
    replica: int | None = None,
) -> tuple[int, str, bool]:
    """Take one message: (its inbox id, its state, whether it is new). A platform id seen
    before returns the earlier row and stores nothing."""
    return (
        await accept_many(conn, [(platform, chat_id, pmid, payload, now, session_key, replica)])
    )[0]


async def accept_many(
    conn: AsyncConnection,
    calls: Sequence[Accept | Routed],
    drawn: Sequence[tuple[int, bool]] | None = None,
) -> list[tuple[int, str, bool]]:
    """Many `accept` calls: one insert in call order, ids drawn in it (a platform id twice
    in the batch: the first wins), one read of the rows that were there before. A row
    pruned between the two is inserted anew. `drawn`: the first insert's result (each
    call's drawn id and whether its row went in), when the caller's statement ran it."""
    out: list[tuple[int, str, bool] | None] = [None] * len(calls)
    pending = list(range(len(calls)))
    while pending:
        if drawn is None:
            drawn = await db.tuples(conn, _INSERT, accept_params([calls[i] for i in pending]))
        for i, (rid, inserted) in zip(pending, drawn, strict=True):
            if inserted:
                out[i] = (int(rid), RECEIVED, True)
        drawn = None
        pending = [i for i in pending if out[i] is None]  # each has a platform id
        if not pending:
            break
        seen = [calls[i] for i in pending]
        for n, rid, state in await db.tuples(
            conn, _FIND, ([c[0] for c in seen], [c[1] for c in seen], [c[2] for c in seen])
        ):
            out[pending[int(n) - 1]] = (int(rid), str(state), False)
        pending = [i for i in pending if out[i] is None]
    return [o for o in out if o is not None]


register_batched(accept, accept_many)


async def begin_turn(
    conn: AsyncConnection,
    inbox_id: int,
    session_id: str,
    message: Mapping[str, Any],
    last: int | None,
) -> tuple[int, list[dict[str, Any]]]:
    """The turn's first write: the user's message into its session (once: a turn run again
    after a crash finds it there), the row `started`, and the history up to that message."""
    return (await begin_turns_many(conn, [(inbox_id, session_id, message, last)]))[0]


# A batch's begun rows (`u.b`: started, in a session, with their message and runner) and
# ended ones (answered, with their replies in the outbox) in one update, each kind leaving
# the other's columns as they were. `_TURN_ROWS_AT` is its form for a CTE of the batch's
# append (appends._rows): a message not stored before is named by its place in the run
# (`mpos`, `rpos`: the append's `ids`), its id not known yet.
def _turn_rows(mid: str, rmid: str) -> str:
    return (
        "UPDATE inbox SET updated_at = %s, "
        f"state = CASE WHEN u.b THEN '{STARTED}' ELSE '{ANSWERED}' END, "
        "session_id = CASE WHEN u.b THEN u.sid ELSE inbox.session_id END, "
        f"message_id = CASE WHEN u.b THEN {mid} ELSE inbox.message_id END, "
        "runner = CASE WHEN u.b THEN COALESCE(u.runner, inbox.runner) ELSE inbox.runner END, "
        "reason = CASE WHEN u.b THEN inbox.reason END, "
        "reply_state = CASE WHEN u.b THEN inbox.reply_state ELSE u.rs END, "
        f"reply_message_id = CASE WHEN u.b THEN inbox.reply_message_id ELSE {rmid} END FROM "
    )


_TURN_ROWS = (
    _turn_rows("u.mid", "u.rmid")
    + db.rowset("%s", ("bigint", "boolean", "text", "bigint", "bigint", "text", "bigint"))
    + " AS u(id, b, sid, mid, runner, rs, rmid) WHERE inbox.id = u.id"
)
_TURN_ROWS_AT = (
    _turn_rows("COALESCE(u.mid, m.id)", "r.id")
    + db.rowset("%s", ("bigint", "boolean", "text", "bigint", "bigint", "bigint", "text", "bigint"))
    + " AS u(id, b, sid, mid, mpos, runner, rs, rpos) "
    "LEFT JOIN ids m ON m.n = u.mpos LEFT JOIN ids r ON r.n = u.rpos WHERE inbox.id = u.id"
)
Begin = tuple[int, str, Mapping[str, Any], "int | None"]  # inbox id, session, message, last
End = tuple[int, str, list[Mapping[str, Any]], "Mapping[str, int] | None", str]  # + reply state
BEGIN, END = "begin", "end"


async def begin_turns_many(
    conn: AsyncConnection, calls: Sequence[Begin], runners: Sequence[int] | None = None
) -> list[tuple[int, list[dict[str, Any]]]]:
    """`runners` (replicas): each call's incarnation, recorded as its row's runner in the
    same update that starts the row."""
    return await turn_writes_many(conn, [(BEGIN, c) for c in calls], runners)


async def turn_writes_many(
    conn: AsyncConnection,
    calls: Sequence[tuple[str, Begin | End]],
    runners: Sequence[int | None] | None = None,
    inserted: Collection[int] = (),
) -> list[Any]:
    """Turns' first and last writes (`begin_turn`'s and `end_turn`'s calls, tagged BEGIN
    or END) in call order, their messages in one append: a batch pays the statements of
    an append (and of replicas' fence check) once for both kinds. A begin returns (its
    message's id, the history), an end its messages' ids; `runners` as begin_turns_many.
    `inserted`: inbox rows this transaction inserted (an accept's), which no other can
    have begun or even seen: not read back."""
    return (await turn_writes_after(conn, None, calls, runners, inserted))[1]


async def turn_writes_after(
    conn: AsyncConnection,
    ahead: tuple[str, db.Params] | None,
    calls: Sequence[tuple[str, Begin | End]],
    runners: Sequence[int | None] | None = None,
    inserted: Collection[int] = (),
) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """turn_writes_many, after the statement `ahead` (sql, params), whose rows it returns
    beside its answer: a statement whose answer the writes do not need (a batch's lease
    releases, checked after) goes in the same round trip as the append.

    The append, the rows' update and the first history read go in one round trip: the
    update is a CTE of the append's statement (naming the new messages by their places in
    the run, _TURN_ROWS_AT), and the read a statement after it that finds each new message
    through its inbox row (Histories). A batch that begins a row twice, or begins and ends
    one, takes the longer way: the append, then the updates, the last with the read."""
    now = time.time()
    begins = [i for i, (kind, _c) in enumerate(calls) if kind == BEGIN]
    # Locked in id order: a second daemon beginning the same row waits, then reads the
    # message id this one stored.
    known: dict[int, tuple[str | None, int | None]] = {}
    earlier = sorted({calls[i][1][0] for i in begins} - set(inserted))
    if earlier:
        known = {
            int(r[0]): (r[1], r[2])
            for r in await db.tuples(
                conn,
                "SELECT id, session_id, message_id FROM inbox WHERE id = ANY(%s) ORDER BY id "
                "FOR UPDATE",
                (earlier,),
            )
        }
    message_ids: dict[int, int] = {}
    appends: list[tuple[int, tuple[Any, ...]]] = []  # (call, append_many's call)
    repeats: list[tuple[int, int]] = []  # (call, the earlier call of this batch it repeats)
    first_of: dict[tuple[int, str], int] = {}
    for i, (kind, c) in enumerate(calls):
        if kind == END:
            appends.append((i, (c[1], c[2], None, c[3])))
            continue
        inbox_id, session_id = c[0], c[1]
        sid, mid = known.get(inbox_id, (None, None))
        if mid is not None and sid == session_id:
            message_ids[i] = int(mid)  # stored before a crash: run the turn on it again
        elif (inbox_id, session_id) in first_of:
            repeats.append((i, first_of[(inbox_id, session_id)]))
        else:
            first_of[(inbox_id, session_id)] = i
            appends.append((i, (session_id, [c[2]])))
    last_call = {calls[i][1][0]: i for i in begins}  # a row begun twice: the last wins
    by_length: dict[int | None, list[int]] = {}
    for i in begins:
        by_length.setdefault(calls[i][1][3], []).append(i)  # type: ignore[arg-type]
    if (
        any(a[1] for _i, a in appends)
        and len(last_call) == len(begins)
        and not {c[0] for kind, c in calls if kind == END} & set(last_call)
    ):
        return await _short_way(conn, ahead, calls, runners, appends, message_ids, by_length, now)
    ahead_rows: list[tuple[Any, ...]] = []
    if ahead is not None:
        ahead_rows = await db.tuples(conn, *ahead)
    got = await append_many(conn, [a for _i, a in appends]) if appends else []
    stored = {i: ids for (i, _a), ids in zip(appends, got, strict=True)}
    for i in begins:
        if i in stored:
            message_ids[i] = stored[i][0]
    for i, j in repeats:
        message_ids[i] = message_ids[j]
    # the ended rows answered (finish_many's columns) with their replies in the outbox; a
    # row ended twice in one batch: the last call wins
    final_end = {
        c[0]: (cast(End, c)[4], stored[i][-1] if stored[i] else None)
        for i, (kind, c) in enumerate(calls)
        if kind == END
    }
    # id, begun, sid, mid, runner, reply state, reply message id (_TURN_ROWS's columns)
    begun: list[tuple[Any, ...]] = [
        (
            rid,
            True,
            calls[i][1][1],
            message_ids[i],
            None if runners is None else runners[i],
            None,
            None,
        )
        for rid, i in last_call.items()
    ]
    ends: list[tuple[Any, ...]] = [
        (rid, False, None, None, None, rs, rmid) for rid, (rs, rmid) in final_end.items()
    ]
    # one statement for both kinds; a row begun and ended in one batch: begun first
    parts = [begun, ends] if set(last_call) & set(final_end) else [begun + ends]
    updates = [(_TURN_ROWS, (now, db.json_rows(rows))) for rows in parts if rows]
    # with history reads to come, the last update rides with the first: one round trip less
    rides = updates.pop() if begins and updates else None
    for sql, params in updates:
        await db.run(conn, sql, params)
    read: dict[int, list[dict[str, Any]]] = {}
    for n, (last, which) in enumerate(by_length.items()):
        got_h = await histories(
            conn,
            [(calls[i][1][1], message_ids[i]) for i in which],
            last,
            before=rides if n == 0 else None,
        )
        for i, history in zip(which, got_h, strict=True):
            read[i] = history
    return ahead_rows, _answers(calls, message_ids, read, stored)


async def _short_way(
    conn: AsyncConnection,
    ahead: tuple[str, db.Params] | None,
    calls: Sequence[tuple[str, Begin | End]],
    runners: Sequence[int | None] | None,
    appends: Sequence[tuple[int, tuple[Any, ...]]],
    message_ids: dict[int, int],
    by_length: Mapping[int | None, list[int]],
    now: float,
) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """turn_writes_after's round trip: `ahead`, the append with the rows' update in it, and
    the read of the histories of the begins asking for the first length (any other
    length is read after, the messages' ids known). Each row is begun or ended once, and
    the calls bring a message to append."""
    place: dict[int, int] = {}  # each append's first message's place in the run, from 1
    pos = 1
    for i, a in appends:
        place[i] = pos
        pos += len(a[1])
    # _TURN_ROWS_AT's columns: id, begun, sid, mid, its place, runner, reply state, its place
    rows: list[tuple[Any, ...]] = [
        (
            calls[i][1][0],
            True,
            calls[i][1][1],
            message_ids.get(i),
            None if i in message_ids else place[i],
            None if runners is None else runners[i],
            None,
            None,
        )
        for i, (kind, _c) in enumerate(calls)
        if kind == BEGIN
    ]
    final = {c[0]: i for i, (kind, c) in enumerate(calls) if kind == END}  # the last wins
    for rid, i in final.items():
        end = cast(End, calls[i][1])
        at = place[i] + len(end[2]) - 1 if end[2] else None  # its last message, if any
        rows.append((rid, False, None, None, None, None, end[4], at))
    run = planned([a for _i, a in appends], also=(_TURN_ROWS_AT, (now, db.json_rows(rows))))
    groups = list(by_length.items())
    first = None
    if groups:  # each message by its id, or by its inbox row when it is new
        ends = [
            (calls[i][1][1], message_ids.get(i), None if i in message_ids else calls[i][1][0])
            for i in groups[0][1]
        ]
        first = Histories(conn, ends, groups[0][0])
    assert run.statement is not None  # the calls bring a message
    statements = [*([ahead] if ahead is not None else []), run.statement]
    found = await db.piped(
        conn,
        [*statements, *([first.statement] if first else [])],
        [False] * len(statements) + [True] * bool(first),
    )
    ahead_rows = found.pop(0) if ahead is not None else []
    stored = dict(zip((i for i, _a in appends), settled(run, found[0]), strict=True))
    for i, ids in stored.items():
        if calls[i][0] == BEGIN:
            message_ids[i] = ids[0]
    read: dict[int, list[dict[str, Any]]] = {}
    for n, (last, which) in enumerate(groups):
        mids = [message_ids[i] for i in which]
        if n == 0 and first is not None:
            got = await first.settled(conn, found[1], mids)
        else:
            got = await histories(
                conn, [(calls[i][1][1], m) for i, m in zip(which, mids, strict=True)], last
            )
        read.update(zip(which, got, strict=True))
    return ahead_rows, _answers(calls, message_ids, read, stored)


def _answers(
    calls: Sequence[tuple[str, Begin | End]],
    message_ids: Mapping[int, int],
    read: Mapping[int, list[dict[str, Any]]],
    stored: Mapping[int, list[int]],
) -> list[Any]:
    """turn_writes_many's answer: for a begin (its message's id, the history), for an end
    its messages' ids."""
    return [
        (message_ids[i], read[i]) if kind == BEGIN else stored[i]
        for i, (kind, _c) in enumerate(calls)
    ]


register_batched(begin_turn, begin_turns_many)


async def accept_begin(
    conn: AsyncConnection,
    platform: str,
    chat_id: str,
    pmid: str | None,
    payload: str,
    now: float,
    session_id: str,
    message: Mapping[str, Any],
    last: int | None,
) -> tuple[int, str, bool, tuple[int, list[dict[str, Any]]] | None]:
    """`accept` and, for a new row, `begin_turn`, in the same transaction (see the SQLite
    twin)."""
    return (
        await accept_begins_many(
            conn, [(platform, chat_id, pmid, payload, now, session_id, message, last)]
        )
    )[0]


async def accept_begins_many(
    conn: AsyncConnection,
    calls: Sequence[tuple[str, str, str | None, str, float, str, Mapping[str, Any], int | None]],
) -> list[tuple[int, str, bool, tuple[int, list[dict[str, Any]]] | None]]:
    taken = await accept_many(conn, [c[:5] for c in calls])
    fresh = [i for i, (_id, _state, new) in enumerate(taken) if new]
    begun = (
        await turn_writes_many(
            conn,
            [(BEGIN, (taken[i][0], calls[i][5], calls[i][6], calls[i][7])) for i in fresh],
            inserted=[taken[i][0] for i in fresh],
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


async def end_turn(
    conn: AsyncConnection,
    inbox_id: int,
    session_id: str,
    batch: list[Mapping[str, Any]],
    tokens: Mapping[str, int] | None,
    reply_state: str,
) -> list[int]:
    """The turn's last write: the reply (and tool messages) into the session with the
    turn's tokens, the row `answered` and its reply in the outbox as `reply_state`, in one
    transaction."""
    return (await end_turns_many(conn, [(inbox_id, session_id, batch, tokens, reply_state)]))[0]


async def end_turns_many(conn: AsyncConnection, calls: Sequence[End]) -> list[list[int]]:
    return await turn_writes_many(conn, [(END, c) for c in calls])


register_batched(end_turn, end_turns_many)


_FINISHED = db.rowset("%s", ("bigint", "text", "text"))


async def finish(conn: AsyncConnection, inbox_id: int, state: str, reason: str | None) -> None:
    """Close a row without a reply of the agent's: a command answered, or dropped."""
    await finish_many(conn, [(inbox_id, state, reason)])


async def finish_many(
    conn: AsyncConnection, calls: Sequence[tuple[int, str, str | None]]
) -> list[None]:
    final = {c[0]: c for c in calls}  # a row closed twice in one batch: the last call wins
    await db.run(
        conn,
        "UPDATE inbox SET state = u.state, reason = u.reason, updated_at = %s "
        f"FROM {_FINISHED} AS u(id, state, reason) WHERE inbox.id = u.id",
        (time.time(), db.json_rows(final.values())),
    )
    return [None] * len(calls)


register_batched(finish, finish_many)


async def open_rows(conn: AsyncConnection) -> list[InboxEntry]:
    """Rows a crash left `received`/`started`, oldest first."""
    return await db.rows_as(
        InboxEntry,
        conn,
        "SELECT id, platform, chat_id, platform_message_id, payload, state, session_id, "
        "message_id, received_at FROM inbox WHERE state IN ('received', 'started') ORDER BY id",
    )


async def counts(conn: AsyncConnection) -> dict[str, int]:
    """Rows per state."""
    found = await db.tuples(conn, "SELECT state, COUNT(*) FROM inbox GROUP BY 1")
    return {str(s): int(n) for s, n in found}


async def prune(conn: AsyncConnection, older_than: float) -> int:
    """Forget closed rows last touched before `older_than` (never a message)."""
    return await db.run(
        conn,
        "DELETE FROM inbox WHERE state IN ('answered', 'dropped') AND updated_at < %s",
        (older_than,),
    )
