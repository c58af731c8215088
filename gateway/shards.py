"""Shards of an adapter's gateway connection, owned by one replica each.

An adapter whose platform splits its event stream into shards (and allows a session per
shard only once) asks a `ShardLedger` which shards to run: `claim` takes the shards no live
replica owns and answers with those this replica owns now, each with its epoch. The adapter
runs exactly those, closes one whose epoch moved or that is gone from the answer (another
replica took it), and asks again every few seconds. The answer also says how many of its
shards to hand over (a replica joined and holds fewer than its fair share): the adapter
closes their connections first and only then `release`s them, so the other replica's next
claim takes them and no shard is connected twice. With one daemon (SQLite) there is no
ledger and the adapter runs every shard itself.

`Receiver` is the same ledger with a count of 1 for an adapter whose platform sends every
event to every connection (a Matrix /sync, a Mattermost websocket, signal-cli's event
stream, an IMAP folder): shard 0 is its receiving connection, so one replica receives and
the others only send.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.errors import InvalidToken

if TYPE_CHECKING:  # psycopg is the postgres extra: only PgShardLedger's users have it
    from state import ClusterStore, ReplicaLink

log = logging.getLogger("gateway.shards")

CLAIM_EVERY_S = 3.0  # how often a replica takes over the shards of replicas that are gone


@dataclass(frozen=True)
class Claim:
    owned: dict[int, int] = field(default_factory=dict)  # shard id -> epoch, all ours now
    give: int = 0  # how many of them to hand over now (highest ids first)


class ShardLedger(Protocol):
    async def claim(self, count: int) -> Claim:
        """Take this replica's share of the shards of `count` that no live replica owns;
        every shard it owns afterwards, and how many of them to hand over."""
        ...

    async def release(self, count: int, shards: Mapping[int, int]) -> None:
        """Let go of `shards` (id -> the epoch they ran at), whose connections are closed."""
        ...


class PgShardLedger:
    """The ledger in the shared database, under this replica's current incarnation (after a
    lost control connection that is a new one, so the old incarnation's shards are lost)."""

    def __init__(self, store: ClusterStore, link: ReplicaLink, platform: str) -> None:
        self.store = store
        self.link = link
        self.platform = platform

    async def claim(self, count: int) -> Claim:
        owned, give = await self.store.claim_shards(
            self.platform, count, self.link.incarnation, self.link.space, CLAIM_EVERY_S
        )
        return Claim(owned, give)

    async def release(self, count: int, shards: Mapping[int, int]) -> None:
        await self.store.release_shards(self.platform, count, self.link.incarnation, shards)


class Receiver:
    """An adapter's receiving connection, run on one replica at a time: the owner of shard 0
    of a one-shard ledger runs `begin` (which starts its receive loop from the cursors in
    the store, so it goes on where the last owner stopped) and `end` when the shard's epoch
    moved (it stalled while another took it). The others send only, and ask the ledger
    again every CLAIM_EVERY_S, so a gone owner's connection is taken within seconds. With
    no ledger (one daemon) it receives from `start` to `stop`."""

    def __init__(
        self,
        platform: str,
        begin: Callable[[], Awaitable[None]],
        end: Callable[[], Awaitable[None]],
    ) -> None:
        self.platform = platform
        self._begin, self._end = begin, end
        self._ledger: ShardLedger | None = None
        self._claims: asyncio.Task[None] | None = None
        self.receiving = False
        self.epoch: int | None = None  # shard 0's epoch when this replica took it
        self.last_error: str | None = None

    def use(self, ledger: ShardLedger) -> None:
        self._ledger = ledger

    async def start(self) -> None:
        if self._ledger is None:
            await self._begin()
            self.receiving = True
            return
        await self.sync()  # a refused token or an unreachable database fails the start
        self._claims = asyncio.create_task(self._claim_loop(), name=f"{self.platform}.receiver")

    async def stop(self) -> None:
        claims, self._claims = self._claims, None
        if claims is not None:
            claims.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await claims
        if self.receiving:
            self.receiving = False
            await self._end()

    async def sync(self) -> None:
        """Receive exactly while this replica owns shard 0 at the epoch it took it at."""
        assert self._ledger is not None
        epoch = (await self._ledger.claim(1)).owned.get(0)  # one shard: none to give
        if self.receiving and epoch != self.epoch:
            log.warning(
                "%s: the receiving connection is no longer ours (epoch %s, now %s); closing it",
                self.platform,
                self.epoch,
                epoch,
            )
            self.receiving = False
            await self._end()
        if epoch is not None and not self.receiving:
            await self._begin()
            self.receiving, self.epoch = True, epoch
            log.info("%s: receiving on this replica (epoch %d)", self.platform, epoch)

    async def _claim_loop(self) -> None:
        while True:
            await asyncio.sleep(CLAIM_EVERY_S)
            try:
                await self.sync()
                self.last_error = None
            except InvalidToken as exc:  # every replica has the same credentials: give up
                self.last_error = f"receiver: {exc}"
                log.error(
                    "%s: the platform refused the credentials on takeover (%s); "
                    "no longer claiming the receiving connection",
                    self.platform,
                    exc,
                )
                return
            except Exception as exc:  # the database or the platform: asked again next round
                self.last_error = f"receiver: {type(exc).__name__}: {exc}"
                log.warning("%s: receiver claim failed: %s", self.platform, self.last_error)

    def health(self) -> dict[str, object]:
        """Whether this replica runs the receiving connection (always, with one daemon)."""
        found: dict[str, object] = {"receiving": self.receiving}
        if self._ledger is not None:
            found["receiver_epoch"] = self.epoch if self.receiving else None
            if self.last_error:
                found["receiver_error"] = self.last_error
        return found
