"""What a gone replica left behind: its open inbox rows and its committed but unsent
replies, for a live replica to run or send (the takeover scan), the claim that makes one
replica send each reply, and the replicas' health as doctor shows it. Liveness is
state/pg/cluster.py's (`LIVE`)."""

from __future__ import annotations

from psycopg import AsyncConnection

from ..records import InboxEntry, UnsentReply
from . import db
from .cluster import LEADER, LIVE
from .dispatch import Dispatch


async def orphans(
    conn: AsyncConnection, space: int, me: int | None = None, limit: int = 200
) -> list[InboxEntry]:
    """Open inbox rows nobody live works on: taken by a replica that is gone (or by a
    daemon before replicas), not started by a live one, and whose key no other live replica
    leases; and the open rows `me` took itself (the caller skips those it is running: the
    rest were left by a failure here). Oldest first."""
    return await db.rows(  # type: ignore[return-value]  # rows of that shape
        conn,
        f"WITH live AS ({LIVE}) SELECT i.id, i.payload, i.session_key, i.state, "
        "i.session_id, i.received_at FROM inbox i "
        "LEFT JOIN session_routes r ON r.session_key = i.session_key "
        "WHERE i.state IN ('received', 'started') "
        "AND (i.replica = %(me)s OR ("
        "(i.replica IS NULL OR i.replica NOT IN (SELECT * FROM live)) "
        "AND (i.runner IS NULL OR i.runner NOT IN (SELECT * FROM live)))) "
        "AND (r.lease_owner IS NULL OR r.lease_owner = %(me)s "
        "OR r.lease_owner NOT IN (SELECT * FROM live)) "
        "ORDER BY i.id LIMIT %(limit)s",
        {"space": space, "me": me, "limit": limit},
    )


async def orphan_replies(conn: AsyncConnection, space: int) -> list[UnsentReply]:
    """Replies committed but not confirmed sent whose turn ran on a replica that is gone,
    of keys no live replica leases (a holder sends its key's first: the take returns them):
    the shape of replies.unsent_replies, with the row's `session_key`."""
    return await db.rows(  # type: ignore[return-value]  # rows of that shape
        conn,
        f"WITH live AS ({LIVE}) "
        "SELECT i.id, i.payload, i.reply_state, i.reply_message_id, i.received_at, "
        "i.session_key, "
        "m.session_id, m.content FROM inbox i LEFT JOIN messages m ON m.id = i.reply_message_id "
        "LEFT JOIN session_routes r ON r.session_key = i.session_key "
        "WHERE i.reply_state IN ('ready', 'sending') "
        "AND (i.runner IS NULL OR i.runner NOT IN (SELECT * FROM live)) "
        "AND (r.lease_owner IS NULL OR r.lease_owner NOT IN (SELECT * FROM live)) "
        "ORDER BY i.id",
        {"space": space},
    )


async def claim_reply(conn: AsyncConnection, space: int, inbox_id: int, me: int) -> bool:
    """Make `me` the runner of an orphaned unconfirmed reply, unless a live replica claimed
    it first or another live replica leases its key (that holder sends it, before the key's
    next reply): the row lock makes two takers of one dead runner's reply take turns, and the
    second finds the first's (live) incarnation there. Only the claimer sends it again."""
    got = await db.tuples(
        conn,
        "UPDATE inbox SET runner = %(me)s WHERE id = %(id)s "
        "AND reply_state IN ('ready', 'sending') "
        f"AND (runner IS NULL OR runner NOT IN ({LIVE})) "
        "AND NOT EXISTS (SELECT 1 FROM session_routes r WHERE r.session_key = inbox.session_key "
        f"AND r.lease_owner <> %(me)s AND r.lease_owner IN ({LIVE})) RETURNING id",
        {"space": space, "id": inbox_id, "me": me},
    )
    return bool(got)


async def report(conn: AsyncConnection) -> dict[str, int]:
    """What `switchboard doctor` shows of the replicas: live replicas (their incarnation
    locks; the leader lock is a second lock of one of them), routes, routes whose session is
    no longer live (healed at their next lease), leases of replicas that are gone (taken
    over at the next message or scan), open inbox rows nobody live works on."""
    space = int(await db.value(conn, "SELECT hashtext(current_schema()) & 2147483647"))
    p = {"space": space}
    live = [int(r[0]) for r in await db.tuples(conn, LIVE, p) if int(r[0]) != LEADER]
    routes, stale = (
        await db.tuples(
            conn,
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE r.session_id IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM sessions s WHERE s.id = r.session_id AND s.ended_at IS NULL)) "
            "FROM session_routes r",
        )
    )[0]
    dead = await db.value(
        conn,
        "SELECT COUNT(*) FROM session_routes WHERE lease_owner IS NOT NULL "
        "AND NOT (lease_owner = ANY(%s))",
        (live,),
    )
    return {
        "live_replicas": len(live),
        "routes": int(routes),
        "stale_routes": int(stale),
        "dead_leases": int(dead),
        "orphaned_rows": len(await orphans(conn, space)),
    }


class TakeoverOps(Dispatch):
    """PgStore's takeover of what a gone replica left, and the replicas' report."""

    async def orphaned_inbound(self, space: int, me: int | None = None) -> list[InboxEntry]:
        return await self._read(orphans, space, me)

    async def orphaned_replies(self, space: int) -> list[UnsentReply]:
        return await self._read(orphan_replies, space)

    async def claim_orphaned_reply(self, space: int, inbox_id: int, me: int) -> bool:
        return await self._write(claim_reply, space, inbox_id, me)

    async def cluster_report(self) -> dict[str, int]:
        return await self._read(report)
