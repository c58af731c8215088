"""Which replica runs which shard of a platform's gateway connection (`platform_shards`).

A shard belongs to one incarnation at a time: a replica takes the shards whose owner is
not live (liveness is the owner's advisory lock, as in state/pg/cluster.py), adding one to
the shard's epoch on each take, so a replica that finds its epoch moved knows it lost the
shard. Rows are per shard count: replicas started with another count keep their own rows
until their owners are gone.

Shares are balanced: every claim marks its replica a member of the platform's shards
(`platform_shard_members`), and the live members that claimed lately split the shards,
each `quota` of them (`plan`). A replica takes free shards up to its share; one holding
more than its share while another holds too few is told how many to hand over, which it
does by closing their connections and only then releasing them (`release`: no owner). A
released shard is kept for replicas under their quota for a while (so the one that let it
go does not take it back), then anyone may take it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from psycopg import AsyncConnection

from . import db
from .cluster import LIVE
from .dispatch import Dispatch

MEMBER_ROUNDS = 3  # a member that has not claimed for this many rounds takes no share
RESERVE_ROUNDS = 2  # a released shard waits this many rounds for a replica under quota
HANDOVERS_PER_ROUND = 2  # at most this many shards let go by one replica per round

_NOW = "extract(epoch FROM clock_timestamp())"  # the database's clock: one for all replicas
_SEED = (
    "INSERT INTO platform_shards (platform, shard_count, shard_id) "
    "SELECT %(platform)s, %(count)s, g FROM generate_series(0, %(count)s - 1) g "
    "ON CONFLICT DO NOTHING"
)
_JOIN = (
    "INSERT INTO platform_shard_members (platform, shard_count, member, seen_at) "
    f"VALUES (%(platform)s, %(count)s, %(me)s, {_NOW}) "
    "ON CONFLICT (platform, shard_count, member) DO UPDATE SET seen_at = excluded.seen_at"
)
_MEMBERS = (
    "SELECT member FROM platform_shard_members WHERE platform = %(platform)s "
    f"AND shard_count = %(count)s AND seen_at > {_NOW} - %(fresh)s AND member IN ({LIVE}) "
    "ORDER BY member"
)
_GONE_MEMBERS = (
    f"DELETE FROM platform_shard_members WHERE platform = %(platform)s AND member NOT IN ({LIVE})"
)
# Every shard of the count, locked (in shard order, so concurrent claims queue rather than
# deadlock): its live owner, or whether it was released lately.
_VIEW = (
    f"SELECT shard_id, CASE WHEN owner IN ({LIVE}) THEN owner END, "
    f"owner IS NULL AND released_at > {_NOW} - %(reserve)s "
    "FROM platform_shards WHERE platform = %(platform)s AND shard_count = %(count)s "
    "ORDER BY shard_id FOR UPDATE"
)
# Of the chosen shards, those still without a live owner.
_TAKE = (
    "UPDATE platform_shards SET owner = %(me)s, epoch = epoch + 1, taken_at = %(now)s "
    "WHERE platform = %(platform)s AND shard_count = %(count)s AND shard_id = ANY(%(take)s) "
    f"AND (owner IS NULL OR owner NOT IN ({LIVE}))"
)
_FORGET = (
    "DELETE FROM platform_shards WHERE platform = %(platform)s AND shard_count <> %(count)s "
    f"AND (owner IS NULL OR owner NOT IN ({LIVE}))"
)
_MINE = (
    "SELECT shard_id, epoch FROM platform_shards WHERE platform = %(platform)s "
    "AND shard_count = %(count)s AND owner = %(me)s"
)
# Only at the epoch the caller ran it at: a shard taken meanwhile is not the caller's.
_RELEASE = (
    f"UPDATE platform_shards AS p SET owner = NULL, released_at = {_NOW} "
    "FROM unnest(%(shards)s::integer[], %(epochs)s::bigint[]) AS r(shard_id, epoch) "
    "WHERE p.platform = %(platform)s AND p.shard_count = %(count)s AND p.owner = %(me)s "
    "AND p.shard_id = r.shard_id AND p.epoch = r.epoch"
)


@dataclass(frozen=True)
class Plan:
    take: list[int]  # shard ids to take now, lowest first
    give: int  # how many of its shards the replica should hand over now


def quota(count: int, members: Sequence[int], member: int) -> int:
    """`member`'s fair share of `count` shards among `members` (ascending incarnations):
    floor(count / L), one more for the first count % L. A replica joining (a new, higher
    incarnation) so leaves the earlier members' quotas as they were."""
    lo, extra = divmod(count, len(members))
    return lo + (members.index(member) < extra)


def plan(
    count: int,
    me: int,
    members: Sequence[int],
    owners: Mapping[int, int],
    reserved: Collection[int] = (),
) -> Plan:
    """What `me` does with `count` shards: `owners` maps the shards with a live owner to
    it, `reserved` are the ones released lately, the rest are free. Free shards are taken
    up to ceil(count / L) (a gone replica's shards come back fast), reserved ones only up to
    the quota. Shards are given up only when every one has a live owner, `me` holds more
    than ceil(count / L) or more than its quota while another member holds fewer than
    floor(count / L) (so a share within the fair range never moves), and only as many as
    the others lack, a few a round."""
    members = sorted({*members, me})
    lo, extra = divmod(count, len(members))
    hi = lo + (extra > 0)
    mine_quota = quota(count, members, me)
    held = Counter(owners.values())
    mine = held[me]
    unowned = [s for s in range(count) if s not in owners]
    kept = [s for s in unowned if s in reserved]
    free = [s for s in unowned if s not in reserved]
    take = kept[: max(0, mine_quota - mine)]
    take += free[: max(0, hi - mine - len(take))]
    give = 0
    others = [m for m in members if m != me]
    if not unowned and (mine > hi or (mine > mine_quota and any(held[m] < lo for m in others))):
        lacking = sum(max(0, quota(count, members, m) - held[m]) for m in others)
        give = min(mine - mine_quota, lacking, HANDOVERS_PER_ROUND)
    return Plan(sorted(take), max(0, give))


async def claim(
    conn: AsyncConnection, platform: str, count: int, me: int, space: int, every_s: float
) -> tuple[dict[int, int], int]:
    """Take the shards of `count` that `plan` says `me` takes; the shards `me` owns
    afterwards (shard id -> epoch) and how many of them to hand over now. `every_s`: how
    often each member claims."""
    params = {
        "platform": platform,
        "count": count,
        "me": me,
        "space": space,
        "now": time.time(),
        "fresh": MEMBER_ROUNDS * every_s,
        "reserve": RESERVE_ROUNDS * every_s,
    }
    await db.run(conn, _SEED, params)
    await db.run(conn, _JOIN, params)
    await db.run(conn, _GONE_MEMBERS, params)
    members = [int(m) for (m,) in await db.tuples(conn, _MEMBERS, params)]
    owners: dict[int, int] = {}
    reserved: set[int] = set()
    for shard, owner, kept in await db.tuples(conn, _VIEW, params):
        if owner is not None:
            owners[int(shard)] = int(owner)
        elif kept:
            reserved.add(int(shard))
    decided = plan(count, me, members, owners, reserved)
    if decided.take:
        await db.run(conn, _TAKE, {**params, "take": decided.take})
    await db.run(conn, _FORGET, params)
    mine = {int(s): int(e) for s, e in await db.tuples(conn, _MINE, params)}
    return mine, min(decided.give, len(mine))


async def release(
    conn: AsyncConnection, platform: str, count: int, me: int, shards: Mapping[int, int]
) -> int:
    """Let go of `shards` (shard id -> the epoch `me` ran it at), whose connections are
    closed; how many were still `me`'s."""
    return await db.run(
        conn,
        _RELEASE,
        {
            "platform": platform,
            "count": count,
            "me": me,
            "shards": list(shards),
            "epochs": [shards[s] for s in shards],
        },
    )


class ShardOps(Dispatch):
    """PgStore's shard ledger."""

    async def claim_shards(
        self, platform: str, count: int, me: int, space: int, every_s: float
    ) -> tuple[dict[int, int], int]:
        """The shards `me` owns after its claim (id -> epoch), and how many to hand over."""
        return await self._write(claim, platform, count, me, space, every_s)

    async def release_shards(
        self, platform: str, count: int, me: int, owned: Mapping[int, int]
    ) -> int:
        return await self._write(release, platform, count, me, owned)
