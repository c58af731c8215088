"""Which replica runs which shard of a platform's gateway connection (`platform_shards`).

A shard belongs to one incarnation at a time: a replica takes the shards whose owner is
not live (liveness is the owner's advisory lock, as in state/pg/cluster.py), adding one to
the shard's epoch on each take, so a replica that finds its epoch moved knows it lost the
shard. Rows are per shard count: replicas started with another count keep their own rows
until their owners are gone.
"""

from __future__ import annotations

import time

from psycopg import AsyncConnection

from . import db
from .cluster import LIVE

_SEED = (
    "INSERT INTO platform_shards (platform, shard_count, shard_id) "
    "SELECT %(platform)s, %(count)s, g FROM generate_series(0, %(count)s - 1) g "
    "ON CONFLICT DO NOTHING"
)
# Shards with no live owner; a concurrent take re-checks the row after the other commits,
# and sees an owner that is live.
_TAKE = (
    "UPDATE platform_shards SET owner = %(me)s, epoch = epoch + 1, taken_at = %(now)s "
    "WHERE platform = %(platform)s AND shard_count = %(count)s "
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


async def claim(
    conn: AsyncConnection, platform: str, count: int, me: int, space: int
) -> dict[int, int]:
    """Take every shard of `count` without a live owner; the shards `me` owns afterwards,
    shard id -> epoch."""
    params = {"platform": platform, "count": count, "me": me, "space": space, "now": time.time()}
    await db.run(conn, _SEED, params)
    await db.run(conn, _TAKE, params)
    await db.run(conn, _FORGET, params)
    return {int(s): int(e) for s, e in await db.tuples(conn, _MINE, params)}
