"""Shards of an adapter's gateway connection, owned by one replica each.

An adapter whose platform splits its event stream into shards (and allows a session per
shard only once) asks a `ShardLedger` which shards to run: `claim` takes the shards no live
replica owns and answers with those this replica owns now, each with its epoch. The adapter
runs exactly those, closes one whose epoch moved or that is gone from the answer (another
replica took it), and asks again every few seconds. With one daemon (SQLite) there is no
ledger and the adapter runs every shard itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # psycopg is the postgres extra: only PgShardLedger's users have it
    from state.pg.control import ControlLink
    from state.pg.store import PgStore

CLAIM_EVERY_S = 3.0  # how often a replica takes over the shards of replicas that are gone


class ShardLedger(Protocol):
    async def claim(self, count: int) -> dict[int, int]:
        """Take the shards of `count` with no live owner; shard id -> epoch of every shard
        this replica owns afterwards."""
        ...


class PgShardLedger:
    """The ledger in the shared database, under this replica's current incarnation (after a
    lost control connection that is a new one, so the old incarnation's shards are lost)."""

    def __init__(self, store: PgStore, link: ControlLink, platform: str) -> None:
        self.store = store
        self.link = link
        self.platform = platform

    async def claim(self, count: int) -> dict[int, int]:
        return await self.store.claim_shards(
            self.platform, count, self.link.incarnation, self.link.space
        )
