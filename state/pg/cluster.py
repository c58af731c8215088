"""Several replicas on one PostgreSQL database: session-key leases with fencing, routes
(the shared sessions.json), live background jobs and replica wake-ups (what a gone replica
left is state/pg/takeover.py's).

A replica *incarnation* is a number drawn from `replica_incarnations` at each start; it is
live while its session-level advisory lock `(space, incarnation)` shows in `pg_locks` (held
on the replica's control connection, state/pg/control.py), so a killed replica's leases are
free the moment its connection closes, with no TTL. `space` keeps schemas apart (one lock
space per schema). A lease is taken with one statement that only succeeds when the route is
unowned, owned by this incarnation or owned by a dead one; every take bumps the epoch, and
fenced writes check owner and epoch under a row lock in their own transaction. The gateway
side (which key to lease when, what runs under it) is gateway/cluster.py's.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from psycopg import AsyncConnection

from ..errors import LeaseLost
from ..records import Accepted, BeginPlan, Fence, Release
from ..vocab import OPEN_STATES
from . import db, inbox
from .writer import register_batched, register_merged

# Incarnations whose control connection holds its lock, i.e. the live replicas.
LIVE = (
    "SELECT l.objid::bigint FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
    "AND l.objsubid = 2 AND l.classid::bigint = %(space)s "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
LEADER = 0  # the leader lock's second key; incarnations start at 1


# The take is an UPDATE of the routes that are free (no owner, this incarnation, or a dead
# one) and an insert of those that do not exist yet, not an upsert: a failed
# `INSERT ... ON CONFLICT DO UPDATE ... WHERE` still locks the row until the taker's batch
# commits, so the holder's fenced writes waited on every replica that asked for the key
# meanwhile, and batches locking keys in other orders deadlocked (923 deadlocks, each
# found after deadlock_timeout, with four clients per chat on three replicas).
# A take never waits for another transaction either: the free routes are locked with
# SKIP LOCKED (a route another replica's batch is freeing or taking counts as held: the
# taker waits for its NOTIFY or polls), and only keys with no route row at all are
# inserted (ON CONFLICT waits for an uncommitted index entry of the key, which every
# update of a route leaves). A take that waited deadlocked with the holder's batch when
# each also touched a key of the other's: 4-8 deadlocks in 5 s of four clients per chat
# on three replicas, a second each (deadlock_timeout) with a whole batch stalled; none
# since, and that run went from 134-153 to 285 messages/s (bench/cluster_bench.py --only 2).
def _take_ctes(keys: str) -> str:
    """The take's common table expressions (`taken`: the routes taken) for the keys the SQL
    array expression `keys` gives."""
    return f"""
free AS (
    SELECT session_key FROM session_routes
    WHERE session_key = ANY({keys})
      AND (lease_owner IS NULL OR lease_owner = %(me)s OR lease_owner NOT IN ({LIVE}))
    ORDER BY session_key FOR UPDATE SKIP LOCKED
), freed AS (
    UPDATE session_routes r SET lease_owner = %(me)s, lease_epoch = r.lease_epoch + 1
    FROM free f WHERE r.session_key = f.session_key
    RETURNING r.*
), fresh AS (
    INSERT INTO session_routes AS r (session_key, lease_owner, lease_epoch)
    SELECT k, %(me)s, 1 FROM unnest({keys}) AS u(k)
    WHERE NOT EXISTS (SELECT 1 FROM session_routes x WHERE x.session_key = u.k) ORDER BY k
    ON CONFLICT (session_key) DO NOTHING
    RETURNING r.*
), taken AS (SELECT * FROM freed UNION ALL SELECT * FROM fresh)"""


# What a take returns of each taken route (session_routes' 12 columns, then 16 more)
_TAKEN_COLUMNS = f"""t.*, rs.ended_at AS route_ended, rs.id AS route_found,
       rs.end_reason AS route_end_reason, rs.title AS route_title,
       rs.message_count AS route_messages,
       ls.id AS live_id, ls.origin_json AS live_origin, ls.started_at AS live_started,
       ls.last_active AS live_active, ls.source AS live_source, ls.chat_type AS live_chat_type,
       ls.parent_session_id AS live_parent, ls.child_kind AS live_kind,
       ls.message_count AS live_messages,
       COALESCE(rs.last_active, 0) AS route_active,
       ARRAY(SELECT j.name FROM live_jobs j WHERE j.session_id = COALESCE(t.session_id, ls.id)
             AND j.owner IN ({LIVE}) ORDER BY j.name) AS jobs"""
_TAKEN_WIDTH = 28  # a column more in session_routes: one more here (the UNION says so)
_TAKEN_FROM = """
FROM taken t
LEFT JOIN sessions rs ON rs.id = t.session_id
LEFT JOIN LATERAL (SELECT * FROM sessions s WHERE s.session_key = t.session_key
                   AND s.ended_at IS NULL) ls ON true
"""
_TAKE = f"WITH {_take_ctes('%(keys)s::text[]')}\nSELECT {_TAKEN_COLUMNS}{_TAKEN_FROM}"
# The key's live session is a LATERAL lookup so it is read by its index for each taken key:
# a plain join let the planner hash every live session of the database, per take.
# The open rows and a dead runner's unsent replies are a statement of their own: a take
# that waited on the route row (another replica's release or fenced write) must see what
# that transaction committed. One statement's snapshot, taken before the wait, would not:
# a row closed there would run twice, and a reply committed there would be in neither
# list (no longer open, not yet unsent), so the key's next reply overtook it.
_OPEN_FOR_KEY = (
    "SELECT id, payload, replica, state, session_id, received_at, session_key FROM inbox "
    "WHERE session_key = ANY(%s) AND state IN ('received', 'started') ORDER BY id"
)
_OPEN_AND_UNSENT = f"""
SELECT i.session_key, false AS unsent, i.id, i.payload, i.replica, i.state, i.session_id,
       i.received_at, NULL AS reply_state, NULL::bigint AS reply_message_id, NULL AS content
FROM inbox i WHERE i.session_key = ANY(%(keys)s) AND i.state IN ('received', 'started')
UNION ALL
SELECT i.session_key, true, i.id, i.payload, NULL, i.state, m.session_id, i.received_at,
       i.reply_state, i.reply_message_id, m.content
FROM inbox i LEFT JOIN messages m ON m.id = i.reply_message_id
WHERE i.session_key = ANY(%(keys)s) AND i.reply_state IN ('ready', 'sending')
  AND (i.runner IS NULL OR i.runner NOT IN ({LIVE}))
ORDER BY id
"""
_JOBS = (
    f"SELECT session_id, name FROM live_jobs WHERE owner IN ({LIVE}) "
    "AND (%(sids)s::text[] IS NULL OR session_id = ANY(%(sids)s))"
)


async def take_lease(conn: AsyncConnection, key: str, me: int, space: int) -> dict[str, Any] | None:
    """Take `key`'s lease for incarnation `me` (creating its route row on first contact):
    the route with the live session state (`live_*`, the route's own session's `route_*`),
    the key's open inbox rows (`open`, id order) and the session's live jobs (`jobs`); None
    while a live replica holds it. The route's session's end reason, title and message count
    and the live session's parent, kind and message count tell a reset that committed
    without its route being written back (gateway/routes.py words its notice)."""
    return (await take_leases_many(conn, [(key, me, space)]))[0]


async def take_leases_many(
    conn: AsyncConnection, calls: Sequence[tuple[str, int, int]]
) -> list[dict[str, Any] | None]:
    """Many takes in two statements (one replica's writer: one `me`, one `space`). Keys
    are taken in key order, so two replicas' batches never deadlock on each other's rows;
    a key twice in one batch is taken by its first call (the second waits, as it would)."""
    out: list[dict[str, Any] | None] = [None] * len(calls)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (_key, me, space) in enumerate(calls):
        groups.setdefault((me, space), []).append(i)
    for (me, space), which in groups.items():
        first: dict[str, int] = {}
        for i in which:
            first.setdefault(calls[i][0], i)
        found = {
            str(r["session_key"]): dict(r)
            for r in await db.rows(conn, _TAKE, {"keys": list(first), "me": me, "space": space})
        }
        for key, route in (await _with_open(conn, found, space)).items():
            out[first[key]] = route
    return out


async def _with_open(
    conn: AsyncConnection, found: dict[str, dict[str, Any]], space: int
) -> dict[str, dict[str, Any]]:
    """The taken routes (by key) with their keys' open rows and unsent replies, read by a
    statement after the take's (_OPEN_AND_UNSENT)."""
    if not found:
        return found
    for route in found.values():
        route["open"], route["unsent"] = [], []
        route["jobs"] = [str(j) for j in route["jobs"] or ()]
    for row in await db.rows(conn, _OPEN_AND_UNSENT, {"keys": list(found), "space": space}):
        route = found[str(row.pop("session_key"))]
        if row.pop("unsent"):
            del row["replica"]
            route["unsent"].append(row)
        else:
            for name in ("reply_state", "reply_message_id", "content"):
                del row[name]
            route["open"].append(row)
    return found


register_batched(take_lease, take_leases_many)


class AcceptTake(NamedTuple):
    """accept_take's arguments, as the writer hands a batch of them to turns_many: the
    first seven are inbox.accept's."""

    platform: str
    chat_id: str
    pmid: str | None
    payload: str
    now: float
    key: str
    me: int
    space: int
    begin: BeginPlan | None


# turn_write_fenced's arguments
FencedWrite = tuple[Fence, str, "inbox.Begin | inbox.End", "Release | None"]


async def accept_take(
    conn: AsyncConnection,
    platform: str,
    chat_id: str,
    pmid: str | None,
    payload: str,
    now: float,
    key: str,
    me: int,
    space: int,
    begin: BeginPlan | None = None,
) -> Accepted:
    """`inbox.accept` for replica `me` and, when the row is new, `take_lease` on its key in
    the same transaction: (inbox id, state, new, the take's route or None, begun). The
    message's turn then starts under the lease without a write of its own to take it. With
    `begin`, when its test names a session for the taken route, the turn's begin too (the
    message stored in that session, the row started, the history read: `begun`, as
    begin_turn returns it), so the turn waits for one commit less."""
    call = AcceptTake(platform, chat_id, pmid, payload, now, key, me, space, begin)
    return (await turns_many(conn, [call], ()))[0][0]


@functools.cache
def _accepts_taking(release: bool) -> str:
    """One statement for a batch's accepts and the takes of the keys of the rows that went
    in (and, with `release`, the batch's lease releases, whose keys no accept here takes):
    three of a batch's round trips in one. Each row says what it is: 0 an accept's drawn
    id and whether its row went in (as inbox._ACCEPTED), 1 a route released, 2 a route
    taken (as _TAKE's, after four columns), 3 a wake-up sent. The keys' open rows are still
    read by a statement of their own (_OPEN_AND_UNSENT says why). A mixed batch commits in
    8 round trips instead of 10; its CPU, alternated with the three statements this
    replaces (docs/benchmarks.md), moved less than the runs' spread."""
    pad = ", NULL" * (_TAKEN_WIDTH - 1)
    keys = "ARRAY(SELECT DISTINCT session_key FROM ins WHERE session_key IS NOT NULL)"
    parts = [
        f"SELECT 2 AS kind, NULL::bigint AS n, NULL::bigint AS drawn, NULL::boolean AS fresh, "
        f"{_TAKEN_COLUMNS}{_TAKEN_FROM}",
        f"SELECT 0, ids.n, ids.i, ins.id IS NOT NULL, NULL{pad} "
        "FROM ids LEFT JOIN ins ON ins.id = ids.i",
    ]
    if release:
        parts.append(f"SELECT 1, NULL, NULL, NULL, session_key{pad} FROM rel")
        parts.append(f"SELECT 3, NULL, NULL, NULL, NULL{pad} {_NOTIFY}")
    ctes = ([_RELEASE_CTES] if release else []) + [inbox.ACCEPT_CTES, _take_ctes(keys)]
    return f"WITH {', '.join(ctes)}\n" + "\nUNION ALL ".join(parts)


async def _accept_take_release(
    conn: AsyncConnection,
    accepts: Sequence[AcceptTake],
    frees: Sequence[tuple[Fence, Mapping[str, Any] | None, Sequence[tuple[int, int]]]],
) -> tuple[list[tuple[int, str, bool]], dict[int, dict[str, Any] | None], list[bool]]:
    """The accepts (one replica's: one `me`, one `space`), the takes of the keys of the rows
    that went in and the releases `frees`, in one statement (_accepts_taking): the accepts'
    results, the route each new row's call took (the first call of each key) and whether
    each release freed its lease."""
    me, space = accepts[0].me, accepts[0].space
    params = inbox.accept_params([c[:7] for c in accepts])
    params.update(me=me, space=space)
    if frees:
        params.update(_release_params(frees))
    drawn: dict[int, tuple[int, bool]] = {}
    found: dict[str, dict[str, Any]] = {}
    freed: set[str] = set()
    for row in await db.rows(conn, _accepts_taking(bool(frees)), params):
        kind = row.pop("kind")
        if kind == 0:
            drawn[int(row["n"])] = (int(row["drawn"]), bool(row["fresh"]))
        elif kind == 1:
            freed.add(str(row["session_key"]))
        elif kind == 2:
            for name in ("n", "drawn", "fresh"):
                del row[name]
            found[str(row["session_key"])] = row
    accepted = await inbox.accept_many(
        conn, [c[:7] for c in accepts], [drawn[n] for n in range(1, len(accepts) + 1)]
    )
    routes = await _with_open(conn, found, space)
    route_of: dict[int, dict[str, Any] | None] = {}
    for i, (_id, _state, new) in enumerate(accepted):
        if new:  # a key's route goes to its first call; a later one's turn takes it later
            route_of[i] = routes.pop(accepts[i].key, None)
    return accepted, route_of, [f[0].session_key in freed for f in frees]


async def turns_many(
    conn: AsyncConnection,
    accepts: Sequence[AcceptTake],
    fenced: Sequence[FencedWrite],
) -> tuple[list[Accepted], list[Any]]:
    """A batch's accept_take and turn_write_fenced calls at once, so the turns they begin
    and end share one append and one inbox update of each kind: the fences checked, the
    rows accepted and their keys taken, the begins and the fenced writes, then the leases
    those writes free (or, when every one frees its lease, those freed first instead of
    the check, in the accepts' statement when there are accepts: _accepts_taking). (The
    accepts' takes only meet keys no fence here holds: a replica takes a key in an
    accept only while no work of its own holds it.)"""
    frees = [(c[0], *c[3]) for c in fenced if c[3] is not None]
    # every fenced write frees its lease (the HTTP API's turns): the release is the fence
    # check, done first (its row locks hold to the commit as FOR SHARE's would): one
    # statement less, and none with accepts, whose statement releases too. A lease lost
    # fails the batch, as the check would.
    free_first = bool(fenced) and len(frees) == len(fenced)
    if fenced and not free_first:
        await check_fences(conn, [c[0] for c in fenced])
    route_of: dict[int, dict[str, Any] | None] = {}
    freed: list[bool] = []
    if accepts and len({(c.me, c.space) for c in accepts}) == 1:
        accepted, route_of, freed = await _accept_take_release(
            conn, accepts, frees if free_first else ()
        )
    else:
        if free_first:
            freed = await release_leases_many(conn, frees)
        accepted = await inbox.accept_many(conn, [c[:7] for c in accepts]) if accepts else []
        fresh = [i for i, (_id, _state, new) in enumerate(accepted) if new]
        calls = [(accepts[i].key, accepts[i].me, accepts[i].space) for i in fresh]
        routes = await take_leases_many(conn, calls) if fresh else []
        route_of = dict(zip(fresh, routes, strict=True))
    if free_first:
        lost = next((c[0] for c, ok in zip(fenced, freed, strict=True) if not ok), None)
        if lost is not None:
            raise LeaseLost(lost.session_key, lost.epoch)
    begins: list[tuple[int, inbox.Begin]] = []
    for i, route in route_of.items():
        plan = accepts[i].begin
        if route is None or plan is None:
            continue
        message, last, begins_in = plan
        sid = begins_in(route, accepted[i][0])
        if sid is not None:
            begins.append((i, (accepted[i][0], sid, dict(message), last)))
    writes: list[tuple[str, inbox.Begin | inbox.End]] = [(c[1], c[2]) for c in fenced]
    writes += [(inbox.BEGIN, b) for _i, b in begins]
    runners = [c[0].owner for c in fenced] + [accepts[i].me for i, _b in begins]
    got = (
        await inbox.turn_writes_many(
            conn, writes, runners=runners, inserted=[b[0] for _i, b in begins]
        )
        if writes
        else []
    )
    begun = {i: g for (i, _b), g in zip(begins, got[len(fenced) :], strict=True)}
    if frees and not free_first:  # the fences hold (checked above, rows locked): all freed
        await release_leases_many(conn, frees)
    done = [Accepted(*a, route_of.get(i), begun.get(i)) for i, a in enumerate(accepted)]
    return done, got[: len(fenced)]


async def _turns_merged(
    conn: AsyncConnection, items: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]
) -> list[Any]:
    """The writer's merged run of accept_take and turn_write_fenced calls (turns_many)."""
    accepts = [AcceptTake(*args) for fn, args in items if fn is accept_take]
    fenced = [_fenced_args(*args) for fn, args in items if fn is not accept_take]
    done, wrote = await turns_many(conn, accepts, fenced)
    a, w = iter(done), iter(wrote)
    return [next(a) if fn is accept_take else next(w) for fn, _args in items]


async def open_for_key(conn: AsyncConnection, key: str) -> list[dict[str, Any]]:
    """The key's open inbox rows, oldest first (what the lease holder runs next)."""
    return await db.rows(conn, _OPEN_FOR_KEY, ([key],))


async def check_fence(conn: AsyncConnection, fence: Fence) -> None:
    """Raise LeaseLost unless the key's lease still has this owner and epoch; the row stays
    share-locked until the caller's transaction ends, so no takeover commits in between."""
    await check_fences(conn, [fence])


async def check_fences(conn: AsyncConnection, fences: Sequence[Fence]) -> None:
    """check_fence for many (rows locked in key order); the first lost one raises."""
    keys = sorted({f.session_key for f in fences})
    held = {
        str(k): (o, e)
        for k, o, e in await db.tuples(
            conn,
            "SELECT session_key, lease_owner, lease_epoch FROM session_routes "
            "WHERE session_key = ANY(%s) ORDER BY session_key FOR SHARE",
            (keys,),
        )
    }
    for f in fences:
        if held.get(f.session_key) != (f.owner, f.epoch):
            raise LeaseLost(f.session_key, f.epoch)


_ROUTE_COLUMNS = (
    "session_id",
    "origin",
    "display_name",
    "platform",
    "chat_type",
    "created_at",
    "updated_at",
    "pending_notice",
    "listing",
)
_ROUTE_TYPES = (
    "text",
    "text",
    "text",
    "text",
    "text",
    "double precision",
    "double precision",
    "text",
    "text",
)
CHANNEL = "switchboard_replica_"  # + an incarnation: the channel it LISTENs on
# The release: the routes freed (where the fence still holds) and written back, and in the
# same statement the wake-ups: each replica with a row still open for a freed key
# (`k:<key>`) and the given ones (`d:<inbox id>`). One statement, not three: every turn's
# end frees a lease, and a batch's round trips are most of a replica's cost.
_RELEASE_CTES = (
    "rel AS (UPDATE session_routes r SET lease_owner = NULL, "
    + ", ".join(f"{c} = CASE WHEN u.w THEN u.{c} ELSE r.{c} END" for c in _ROUTE_COLUMNS)
    + " FROM unnest(%(r_k)s::text[], %(r_o)s::bigint[], %(r_e)s::bigint[], %(r_w)s::boolean[], "
    + ", ".join(f"%(r_{c})s::{t}[]" for c, t in zip(_ROUTE_COLUMNS, _ROUTE_TYPES, strict=True))
    + ") AS u(k, o, e, w, "
    + ", ".join(_ROUTE_COLUMNS)
    + ") "
    "WHERE r.session_key = u.k AND r.lease_owner = u.o AND r.lease_epoch = u.e "
    "RETURNING r.session_key, u.o AS owner), "
    f"wake AS (SELECT DISTINCT '{CHANNEL}' || i.replica AS c, 'k:' || i.session_key AS p "
    "FROM rel f JOIN inbox i ON i.session_key = f.session_key "
    "WHERE i.state IN ('received', 'started') AND i.replica IS NOT NULL AND i.replica <> f.owner "
    "UNION SELECT * FROM unnest(%(r_wc)s::text[], %(r_wp)s::text[]))"
)
_NOTIFY = "FROM wake, LATERAL pg_notify(wake.c, wake.p)"
_RELEASE = f"WITH {_RELEASE_CTES} SELECT session_key FROM rel UNION ALL SELECT NULL {_NOTIFY}"


async def release_lease(
    conn: AsyncConnection,
    fence: Fence,
    route: Mapping[str, Any] | None,
    answered: Sequence[tuple[int, int]],
) -> bool:
    """Write the route as the holder leaves it (None: unchanged), free the lease, and wake
    other replicas: the origin of each row answered here (`d:<inbox id>`) and of each row
    still open for the key (`k:<key>`: the lease is free). False when the lease was lost
    (nothing written)."""
    return (await release_leases_many(conn, [(fence, route, answered)]))[0]


async def release_leases_many(
    conn: AsyncConnection,
    calls: Sequence[tuple[Fence, Mapping[str, Any] | None, Sequence[tuple[int, int]]]],
) -> list[bool]:
    """Many releases in one statement (their wake-ups with them)."""
    freed = {
        str(r[0])
        for r in await db.tuples(conn, _RELEASE, _release_params(calls))
        if r[0] is not None
    }
    return [c[0].session_key in freed for c in calls]


def _release_params(
    calls: Sequence[tuple[Fence, Mapping[str, Any] | None, Sequence[tuple[int, int]]]],
) -> dict[str, Any]:
    """_RELEASE_CTES's parameters: the routes in key order, and the wake-ups of the rows
    answered here that other replicas took (`d:<inbox id>`)."""
    order = sorted(calls, key=lambda c: c[0].session_key)
    params: dict[str, Any] = {
        "r_k": [c[0].session_key for c in order],
        "r_o": [c[0].owner for c in order],
        "r_e": [c[0].epoch for c in order],
        "r_w": [c[1] is not None for c in order],
    }
    for c in _ROUTE_COLUMNS:
        params[f"r_{c}"] = [(route[1] or {}).get(c) for route in order]
    answered = [
        (channel(origin), f"d:{inbox_id}")
        for fence, _route, done in calls
        for origin, inbox_id in done
        if origin != fence.owner
    ]
    params["r_wc"] = [c for c, _p in answered]
    params["r_wp"] = [p for _c, p in answered]
    return params


register_batched(release_lease, release_leases_many)


def channel(incarnation: int) -> str:
    """The LISTEN channel one replica incarnation is woken on."""
    return f"{CHANNEL}{incarnation}"


async def routes(conn: AsyncConnection, space: int) -> list[dict[str, Any]]:
    """Every route with a session (the reset sweep's view), and whether a live replica
    leases it."""
    return await db.rows(
        conn,
        f"SELECT r.*, (r.lease_owner IN ({LIVE})) AS leased FROM session_routes r "
        "WHERE r.session_id IS NOT NULL",
        {"space": space},
    )


async def live_jobs(conn: AsyncConnection, space: int) -> list[tuple[str, str]]:
    """(session id, job name) of every background job a live replica runs."""
    return [
        (str(r[0]), str(r[1])) for r in await db.tuples(conn, _JOBS, {"space": space, "sids": None})
    ]


async def add_job(
    conn: AsyncConnection, session_id: str, name: str, owner: int, now: float
) -> None:
    await db.run(
        conn,
        "INSERT INTO live_jobs (session_id, name, owner, started_at) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (session_id, name) DO UPDATE SET owner = excluded.owner",
        (session_id, name, owner, now),
    )


async def drop_job(conn: AsyncConnection, session_id: str, name: str) -> None:
    await db.run(
        conn, "DELETE FROM live_jobs WHERE session_id = %s AND name = %s", (session_id, name)
    )


async def lease_holds(conn: AsyncConnection, fence: Fence) -> bool:
    """Does the key's lease still have the fence's owner and epoch? (A read: nothing is
    locked, so it only tells how things stood.)"""
    got = await db.tuples(
        conn,
        "SELECT 1 FROM session_routes WHERE session_key = %s AND lease_owner = %s "
        "AND lease_epoch = %s",
        (fence.session_key, fence.owner, fence.epoch),
    )
    return bool(got)


async def row_states(conn: AsyncConnection, ids: Sequence[int]) -> dict[int, str]:
    return {
        int(i): str(s)
        for i, s in await db.tuples(
            conn, "SELECT id, state FROM inbox WHERE id = ANY(%s)", (list(ids),)
        )
    }


# --- fenced forms of the turn's writes (state/pg/inbox.py's, after check_fence) ----------


async def turn_write_fenced(
    conn: AsyncConnection,
    fence: Fence,
    kind: str,
    call: inbox.Begin | inbox.End,
    release: Release | None = None,
) -> Any:
    """inbox.begin_turn (kind BEGIN) or inbox.end_turn (END) while `fence` holds, and with
    `release` the lease freed in the same commit. One function for all, so the writer
    merges a batch's begins, ends and such releases (and its accept_takes, turns_many)
    into one fence check, one append and one release. One lost fence fails the batch; the
    writer then redoes it one call at a time. Each begun row records its runner (whose
    turn started it)."""
    return (await turns_many(conn, (), [(fence, kind, call, release)]))[1][0]


def _fenced_args(
    fence: Fence, kind: str, call: inbox.Begin | inbox.End, release: Release | None = None
) -> FencedWrite:
    return fence, kind, call, release


# A turn's writes (under its key's lease; what they depend on committed before they were
# queued) and the accepts that take an idle key (a key no work of this replica holds) go
# first in their batch, merged into one run (turns_many)
register_merged((turn_write_fenced, accept_take), _turns_merged, place=-1)


async def finish_fenced(
    conn: AsyncConnection, fence: Fence, inbox_id: int, state: str, reason: str | None
) -> None:
    await finish_fenced_many(conn, [(fence, inbox_id, state, reason)])


async def finish_fenced_many(
    conn: AsyncConnection, calls: Sequence[tuple[Fence, int, str, str | None]]
) -> list[None]:
    await check_fences(conn, [c[0] for c in calls])
    return await inbox.finish_many(conn, [c[1:] for c in calls])


register_batched(finish_fenced, finish_fenced_many)


def route_fields(
    session_id: str | None,
    origin: Mapping[str, Any] | None,
    display_name: str | None,
    platform: str | None,
    chat_type: str | None,
    created_at: float | None,
    updated_at: float | None,
    notice: str | None,
    listing: Sequence[str] | None,
) -> dict[str, Any]:
    """A route row's columns from the gateway's values (what release_lease writes)."""
    return {
        "session_id": session_id,
        "origin": None if origin is None else json.dumps(dict(origin), ensure_ascii=False),
        "display_name": display_name,
        "platform": platform,
        "chat_type": chat_type,
        "created_at": created_at,
        "updated_at": updated_at,
        "pending_notice": notice,
        "listing": None if listing is None else json.dumps(list(listing)),
    }


__all__ = ["LEADER", "LIVE", "OPEN_STATES", "channel"]
