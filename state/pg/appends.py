"""Many appends in a few statements: the writer's fast path for runs of appends in one
batch (the hot path of every turn), the PostgreSQL counterpart of state/sqlite/messages.py's
`append_many`.

One statement locks the sessions in id order (two daemons appending to the same sessions
cannot deadlock), draws the message ids from the sequence (each caller gets its own),
inserts the rows (sent as one JSON text: db.json_rows), claims their platform ids and
updates the sessions' counts. Anything unusual (a missing session, a platform id another
writer claimed meanwhile) raises, and the writer redoes the batch one operation at a time,
where each caller gets its own answer.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from psycopg import AsyncConnection

from ..content import content_text
from ..errors import SessionNotFound, StateError
from ..message_rows import LAST_ACTIVE_RESOLUTION_S, row_values, tool_call_count
from ..rows import make_preview
from . import db, usage
from .messages import append_and_read, append_messages, conversation, to_pg
from .tsearch import index_text
from .writer import register_batched

_COLUMNS = (
    ("id", "bigint"),
    ("session_id", "text"),
    ("role", "text"),
    ("content", "text"),
    ("content_enc", "smallint"),
    ("tool_call_id", "text"),
    ("tool_calls", "text"),
    ("tool_name", "text"),
    ("timestamp", "double precision"),
    ("token_count", "bigint"),
    ("finish_reason", "text"),
    ("reasoning", "text"),
    ("reasoning_details", "text"),
    ("codex_reasoning_items", "text"),
    ("platform_message_id", "text"),
    ("tsv", "text"),
    ("seg_tsv", "text"),
    ("tool_tsv", "text"),
    ("ntok", "integer"),
    ("aux_ntok", "integer"),
)
_CAST = {"tsv": "::tsvector", "seg_tsv": "::tsvector", "tool_tsv": "::tsvector"}
# One statement writes a run of appends: the sessions locked in id order (`lk`, read
# first: the result's first rows), the rows' ids drawn from the sequence in row order
# (`n`), the rows inserted, their platform ids claimed on their sessions' chats (`ON
# CONFLICT DO NOTHING`: the ids claimed come back, and one a caller must settle that another
# writer took meanwhile makes the batch redo one by one), the sessions' counts, activity and
# the calls' tokens (usage.tokens_set, where `u.tk`) updated, and those tokens' usage rows
# upserted on each session's billing route (usage.routed_usage). One round trip instead of
# five: a statement costs this writer's client about 0.15-0.35 ms of CPU and the server
# about as much again, whatever it does (docs/benchmarks.md). A session missing fails the
# foreign key from messages, checked at the statement's end as the one from
# platform_messages to messages is, after both inserts. The result's rows: (2, NULL, NULL,
# id, source, chat) per session locked, (0, n, id) per drawn id and (1, NULL, message id)
# per claim. The last two parameters are the usage rows' first and last seen. The sessions'
# update names their ids as the lock does (`s.id = ANY(...)`, redundant with the join): a
# generic plan made while the table is new and small (before its first ANALYZE) then still
# probes the primary key instead of hashing a scan of every session at each batch. (A run
# without rows locks its sessions with `_LOCK` alone.)
_LOCK = "SELECT id, source, chat_id FROM sessions WHERE id = ANY(%s) ORDER BY id FOR UPDATE"
_ROWS_CTES = (
    f"WITH lk AS MATERIALIZED ({_LOCK}), "
    "ids AS MATERIALIZED (SELECT n, nextval(pg_get_serial_sequence('messages', 'id')) "
    "AS id FROM generate_series(1, %s) AS g(n) ORDER BY n), "
    f"ins AS (INSERT INTO messages ({', '.join(c for c, _ in _COLUMNS)}, active) "
    f"SELECT ids.id, {', '.join(c + _CAST.get(c, '') for c, _ in _COLUMNS[1:])}, 1 FROM "
    + db.rowset("%s", [t for _, t in _COLUMNS[1:]], ordinality=True)
    + f" AS u({', '.join(c for c, _ in _COLUMNS[1:])}, n) JOIN ids USING (n)), "
    "claim AS (INSERT INTO platform_messages SELECT lk.source, lk.chat_id, p.p, ids.id FROM "
    + db.rowset("%s", ("text", "text", "bigint"))
    + " AS p(sid, p, n) JOIN ids USING (n) JOIN lk ON lk.id = p.sid "
    "WHERE lk.source IS NOT NULL AND lk.chat_id IS NOT NULL "
    "ON CONFLICT DO NOTHING RETURNING message_id), "
    "upd AS (UPDATE sessions s SET message_count = COALESCE(s.message_count, 0) + u.n, "
    "tool_call_count = COALESCE(s.tool_call_count, 0) + u.t, preview = COALESCE(s.preview, u.pv), "
    f"last_active = CASE WHEN COALESCE(s.last_active, 0) <= u.ts - {LAST_ACTIVE_RESOLUTION_S} "
    f"THEN u.ts ELSE s.last_active END, {usage.tokens_set()} "
    "FROM "
    + db.rowset(
        "%s",
        ("text", "bigint", "bigint", "text", "double precision", "bigint", "bigint", "boolean"),
    )
    + " AS u(sid, n, t, pv, ts, i, o, tk) "
    f"WHERE s.id = u.sid AND s.id = ANY(%s) RETURNING {usage.ROUTED_RETURNING}), "
    f"used AS ({usage.upsert_from(usage.routed_usage('upd'))})"
)
_ROWS_SELECT = (
    " SELECT 2, NULL::bigint, NULL::bigint, id, source, chat_id FROM lk UNION ALL "
    "SELECT 0, n, id, NULL, NULL, NULL FROM ids UNION ALL "
    "SELECT 1, NULL, message_id, NULL, NULL, NULL FROM claim"
)


@functools.cache
def _rows(also: str | None) -> str:
    """_ROWS's statement, with `also` (a data-modifying statement that may name `ids`, the
    rows' drawn ids by their place in the run, `n` from 1) as one more of its CTEs."""
    return _ROWS_CTES + ("" if also is None else f", w AS ({also})") + _ROWS_SELECT


class _Redo(StateError):
    """The merged path cannot answer this batch; the writer redoes it one by one."""


async def append_many(conn: AsyncConnection, calls: Sequence[tuple[Any, ...]]) -> list[list[int]]:
    """Several `append_messages(session_id, batch, dedupe=None, tokens=None)` calls at once."""
    run = planned(calls, await _duplicates(conn, calls))
    if run.statement is None:
        found = await db.tuples(conn, _LOCK, (run.wanted,))
    else:
        found = await db.tuples(conn, *run.statement)
    out = settled(run, found)
    if run.rest:  # tokens of calls whose messages were all duplicates
        await usage.add_tokens_many(conn, run.rest)
    return out


async def _duplicates(conn: AsyncConnection, calls: Sequence[tuple[Any, ...]]) -> set[int]:
    """The calls (with `dedupe` only, as on SQLite) whose messages are duplicates: a
    platform id already stored for that chat, or one an earlier call of this batch brings."""
    probes: list[tuple[str, str, str, int]] = [
        (call[2][0], call[2][1], str(m["platform_message_id"]), i)
        for i, call in enumerate(calls)
        if len(call) > 2 and call[2] is not None
        for m in call[1]
        if m.get("platform_message_id") is not None
    ]
    if not probes:
        return set()
    stored = await db.tuples(
        conn,
        "SELECT u.i FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[]) AS u(s, c, p, i) "
        "JOIN platform_messages pm ON pm.source = u.s AND pm.chat_id = u.c "
        "AND pm.platform_message_id = u.p",
        (
            [p[0] for p in probes],
            [p[1] for p in probes],
            [p[2] for p in probes],
            [p[3] for p in probes],
        ),
    )
    dup = {int(r[0]) for r in stored}
    first: dict[tuple[str, str, str], int] = {}
    for source, chat, pmid, i in probes:
        if first.setdefault((source, chat, pmid), i) != i:
            dup.add(i)
    return dup


class Run(NamedTuple):
    """A run of appends ready to send (`planned`)."""

    statement: tuple[str, tuple[Any, ...]] | None  # None: no call brings a row
    wanted: list[str]  # the sessions, in id order
    per_call: list[int]  # each call's rows (-1: a duplicate, nothing stored)
    claims: list[tuple[str, str, int, tuple[str, str] | None]]  # _platform_claims
    rest: list[tuple[str, int, int]]  # tokens of sessions whose calls brought no row


def planned(
    calls: Sequence[tuple[Any, ...]],
    dup: Collection[int] = (),
    also: tuple[str, tuple[Any, ...]] | None = None,
) -> Run:
    """The calls' run (the calls in `dup` store nothing): the statement that appends its
    rows, with `also` (sql, params) as one more of its CTEs (`_rows`)."""
    now = time.time()
    wanted = sorted({c[0] for c in calls})
    rows: list[tuple[Any, ...]] = []
    per_call: list[int] = []
    agg: dict[str, list[Any]] = {}  # sid -> [count, tool calls, preview, last ts, in, out]
    for i, call in enumerate(calls):
        if i in dup:
            per_call.append(-1)
            continue
        a = agg.setdefault(call[0], [0, 0, None, 0.0, 0, 0])
        for msg in call[1]:
            v = row_values(call[0], msg, now)
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
            a[0] += 1
            a[1] += tool_call_count(v[4])
            if a[2] is None and v[1] == "user":
                a[2] = make_preview(content_text(v[2]))
            a[3] = max(a[3], v[6])
        per_call.append(len(call[1]))
        tokens: Mapping[str, int] | None = call[3] if len(call) > 3 else None
        if tokens:
            a[4] += int(tokens.get("input_tokens", 0))
            a[5] += int(tokens.get("output_tokens", 0))
    totals = {sid: (a[4], a[5]) for sid, a in agg.items() if a[4] or a[5]}
    rest = sorted((sid, *t) for sid, t in totals.items() if not agg[sid][0])
    claims = _platform_claims(calls, per_call)
    if not rows:
        return Run(None, wanted, per_call, claims, rest)
    # every session in `live` has rows, and every one with rows is in it
    live = [(sid, a) for sid, a in agg.items() if a[0]]
    params = (
        wanted,
        len(rows),
        db.json_rows(rows),
        db.json_rows(c[:3] for c in claims),
        db.json_rows((s, *a[:6], bool(a[4] or a[5])) for s, a in live),
        wanted,
        now,
        now,
    )
    if also is None:
        return Run((_rows(None), params), wanted, per_call, claims, rest)
    return Run((_rows(also[0]), (*params, *also[1])), wanted, per_call, claims, rest)


def settled(run: Run, found: Sequence[Sequence[Any]]) -> list[list[int]]:
    """Each call's message ids, from the run's statement's rows (or, for a run without
    rows, `_LOCK`'s): raises SessionNotFound for a session missing, and _Redo for a
    platform id a caller settles on that another writer claimed since the check."""
    if run.statement is None:
        chats = {r[0]: (r[1], r[2]) for r in found}
        ids: list[int] = []
    else:
        chats = {r[3]: (r[4], r[5]) for r in found if r[0] == 2}
        ids = [int(r[2]) for r in sorted((r for r in found if r[0] == 0), key=lambda r: r[1])]
        got = {int(r[2]) for r in found if r[0] == 1}
        if any(
            dedupe is not None
            and tuple(dedupe) == chats.get(sid)
            and None not in dedupe
            and ids[pos - 1] not in got
            for sid, _pmid, pos, dedupe in run.claims
        ):
            raise _Redo()  # another writer stored one of these platform ids since the check
    if len(chats) != len(run.wanted):  # (with rows, the foreign key from messages fails first)
        raise SessionNotFound(next(s for s in run.wanted if s not in chats))
    out: list[list[int]] = []
    pos = 0
    for n in run.per_call:
        out.append([] if n < 0 else ids[pos : pos + n])
        pos += max(n, 0)
    return out


def _platform_claims(
    calls: Sequence[tuple[Any, ...]], per_call: list[int]
) -> list[tuple[str, str, int, tuple[str, str] | None]]:
    """The platform ids the appended rows bring, claimed on their sessions' chats (as in
    messages._insert): (session, platform id, the row's place in the run from 1, the call's
    `dedupe`: the caller settles on the claim when that is its session's own chat, and then
    it must not find it taken)."""
    keys: list[tuple[str, str, int, tuple[str, str] | None]] = []
    pos = 0
    for call, n in zip(calls, per_call, strict=True):
        if n < 0:
            continue
        dedupe = tuple(call[2]) if len(call) > 2 and call[2] is not None else None
        for j, m in enumerate(call[1]):
            pmid = m.get("platform_message_id")
            if pmid is not None:
                keys.append((call[0], str(pmid), pos + j + 1, dedupe))
        pos += n
    return keys


async def append_and_read_many(
    conn: AsyncConnection, calls: Sequence[tuple[Any, ...]]
) -> list[tuple[list[int], list[dict[str, Any]]]]:
    ids = await append_many(conn, [(sid, batch, dedupe) for sid, batch, dedupe, _ in calls])
    out = []
    for (sid, _, _, last), got in zip(calls, ids, strict=True):
        # each history ends at its own caller's last message
        out.append((got, await conversation(conn, sid, last, upto=got[-1])) if got else ([], []))
    return out


register_batched(append_messages, append_many)
register_batched(append_and_read, append_and_read_many)
