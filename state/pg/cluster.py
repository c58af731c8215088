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

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import AsyncConnection

from ..errors import LeaseLost
from ..records import Fence, InboxEntry
from ..vocab import OPEN_STATES
from . import db
from .dispatch import Dispatch
from .writer import register_batched

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
TAKEN_COLUMNS = f"""t.*, rs.ended_at AS route_ended, rs.id AS route_found,
       rs.end_reason AS route_end_reason, rs.title AS route_title,
       rs.message_count AS route_messages,
       ls.id AS live_id, ls.origin_json AS live_origin, ls.started_at AS live_started,
       ls.last_active AS live_active, ls.source AS live_source, ls.chat_type AS live_chat_type,
       ls.parent_session_id AS live_parent, ls.child_kind AS live_kind,
       ls.message_count AS live_messages,
       COALESCE(rs.last_active, 0) AS route_active,
       ARRAY(SELECT j.name FROM live_jobs j WHERE j.session_id = COALESCE(t.session_id, ls.id)
             AND j.owner IN ({LIVE}) ORDER BY j.name) AS jobs"""
TAKEN_WIDTH = 28  # a column more in session_routes: one more here (the UNION says so)
TAKEN_FROM = """
FROM taken t
LEFT JOIN sessions rs ON rs.id = t.session_id
LEFT JOIN LATERAL (SELECT * FROM sessions s WHERE s.session_key = t.session_key
                   AND s.ended_at IS NULL) ls ON true
"""
_TAKE = f"WITH {_take_ctes('%(keys)s::text[]')}\nSELECT {TAKEN_COLUMNS}{TAKEN_FROM}"
# The key's live session is a LATERAL lookup so it is read by its index for each taken key:
# a plain join let the planner hash every live session of the database, per take.
# The open rows and a dead runner's unsent replies are a statement of their own, after the
# take's in the same round trip (db.rows_then): a take that waited on the route row (another
# replica's release or fenced write) must see what that transaction committed. One
# statement's snapshot, taken before the wait, would not: a row closed there would run
# twice, and a reply committed there would be in neither list (no longer open, not yet
# unsent), so the key's next reply overtook it. A statement after it takes its snapshot
# when it starts, after the take's waits, even sent before the take has answered.
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
        taken, opened = await db.rows_then(
            conn,
            (_TAKE, {"keys": list(first), "me": me, "space": space}),
            open_read(list(first), space),
        )
        found = {str(r["session_key"]): dict(r) for r in taken}
        for key, route in with_open(found, opened).items():
            out[first[key]] = route
    return out


def open_read(keys: Sequence[str], space: int) -> tuple[str, dict[str, Any]]:
    """The statement that reads `keys`' open rows and unsent replies (_OPEN_AND_UNSENT),
    sent with the take's (db.rows_then: one round trip, its snapshot taken after the take's
    waits)."""
    return _OPEN_AND_UNSENT, {"keys": list(keys), "space": space}


def with_open(
    found: dict[str, dict[str, Any]], rows: Sequence[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The taken routes (by key) with their keys' open rows and unsent replies, from the
    rows `open_read` read (a key not taken has rows there too: they are left out)."""
    for route in found.values():
        route["open"], route["unsent"] = [], []
        route["jobs"] = [str(j) for j in route["jobs"] or ()]
    for row in rows:
        mine = found.get(str(row.pop("session_key")))
        if mine is None:
            continue
        if row.pop("unsent"):
            del row["replica"]
            mine["unsent"].append(row)
        else:
            for name in ("reply_state", "reply_message_id", "content"):
                del row[name]
            mine["open"].append(row)
    return found


register_batched(take_lease, take_leases_many)


async def open_for_key(conn: AsyncConnection, key: str) -> list[InboxEntry]:
    """The key's open inbox rows, oldest first (what the lease holder runs next)."""
    return await db.rows_as(InboxEntry, conn, _OPEN_FOR_KEY, ([key],))


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
RELEASE_CTES = (
    "rel AS (UPDATE session_routes r SET lease_owner = NULL, "
    + ", ".join(f"{c} = CASE WHEN u.w THEN u.{c} ELSE r.{c} END" for c in _ROUTE_COLUMNS)
    + " FROM "
    + db.rowset("%(r_rows)s", ("text", "bigint", "bigint", "boolean", *_ROUTE_TYPES))
    + " AS u(k, o, e, w, "
    + ", ".join(_ROUTE_COLUMNS)
    + ") "
    "WHERE r.session_key = u.k AND r.lease_owner = u.o AND r.lease_epoch = u.e "
    "RETURNING r.session_key, u.o AS owner), "
    f"wake AS (SELECT DISTINCT '{CHANNEL}' || i.replica AS c, 'k:' || i.session_key AS p "
    "FROM rel f JOIN inbox i ON i.session_key = f.session_key "
    "WHERE i.state IN ('received', 'started') AND i.replica IS NOT NULL AND i.replica <> f.owner "
    f"UNION SELECT * FROM {db.rowset('%(r_wake)s', ('text', 'text'))} AS x(c, p))"
)
NOTIFY = "FROM wake, LATERAL pg_notify(wake.c, wake.p)"
_RELEASE = f"WITH {RELEASE_CTES} SELECT session_key FROM rel UNION ALL SELECT NULL {NOTIFY}"


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
    return freed_of(calls, await db.tuples(conn, *release_statement(calls)))


def release_statement(
    calls: Sequence[tuple[Fence, Mapping[str, Any] | None, Sequence[tuple[int, int]]]],
) -> tuple[str, dict[str, Any]]:
    """release_leases_many's statement, for a caller that sends it with others."""
    return _RELEASE, release_params(calls)


def freed_of(
    calls: Sequence[tuple[Fence, Mapping[str, Any] | None, Sequence[tuple[int, int]]]],
    found: Sequence[Sequence[Any]],
) -> list[bool]:
    """Whether each release freed its lease, from release_statement's rows."""
    freed = {str(r[0]) for r in found if r[0] is not None}
    return [c[0].session_key in freed for c in calls]


def release_params(
    calls: Sequence[tuple[Fence, Mapping[str, Any] | None, Sequence[tuple[int, int]]]],
) -> dict[str, Any]:
    """RELEASE_CTES's parameters: the routes in key order, and the wake-ups of the rows
    answered here that other replicas took (`d:<inbox id>`)."""
    order = sorted(calls, key=lambda c: c[0].session_key)
    routes = db.json_rows(
        (
            fence.session_key,
            fence.owner,
            fence.epoch,
            route is not None,
            *[(route or {}).get(c) for c in _ROUTE_COLUMNS],
        )
        for fence, route, _done in order
    )
    answered = db.json_rows(
        (channel(origin), f"d:{inbox_id}")
        for fence, _route, done in calls
        for origin, inbox_id in done
        if origin != fence.owner
    )
    return {"r_rows": routes, "r_wake": answered}


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


class ClusterOps(Dispatch):
    """PgStore's replica operations: leases, routes, live jobs, row states."""

    async def take_lease(self, key: str, me: int, space: int) -> dict[str, Any] | None:
        return await self._write(take_lease, key, me, space)

    async def release_lease(
        self,
        fence: Fence,
        route: Mapping[str, Any] | None,
        answered: Sequence[tuple[int, int]] = (),
    ) -> bool:
        return await self._write(release_lease, fence, route, list(answered))

    async def open_for_key(self, key: str) -> list[InboxEntry]:
        return await self._read(open_for_key, key)

    async def routes(self, space: int) -> list[dict[str, Any]]:
        return await self._read(routes, space)

    async def live_jobs(self, space: int) -> list[tuple[str, str]]:
        return await self._read(live_jobs, space)

    async def add_job(self, session_id: str, name: str, owner: int) -> None:
        await self._write(add_job, session_id, name, owner, time.time())

    async def drop_job(self, session_id: str, name: str) -> None:
        await self._write(drop_job, session_id, name)

    async def lease_holds(self, fence: Fence) -> bool:
        return await self._read(lease_holds, fence)

    async def inbox_states(self, ids: Sequence[int]) -> dict[int, str]:
        return await self._read(row_states, ids)
