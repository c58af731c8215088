"""The Discord shards this process runs: which ones it owns (all of them alone, its share of
a ShardLedger among replicas), one gateway connection each, taken and let go as the ledger
says. Turning their messages into InboundMessage stays with the adapter (discord.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.shards import CLAIM_EVERY_S

if TYPE_CHECKING:
    from gateway.shards import ShardLedger

log = logging.getLogger("gateway.adapters.discord")


@dataclass
class Shard:
    """One shard running here: the epoch it was taken at, its connection and when it was
    opened (monotonic)."""

    epoch: int
    client: Any
    task: asyncio.Task[None]
    opened: float


class Shards:
    """The shards running here. `new_client(shard, gate)` makes a shard's client (its
    messages pass once `gate` opens), `login` and `connect` run it (connect returns when the
    connection ended for good), `note` records a failure for /health, `stopping()` is true
    once the adapter stops."""

    def __init__(
        self,
        count: int,
        *,
        new_client: Callable[[int, asyncio.Event], Any],
        login: Callable[[Any], Awaitable[None]],
        connect: Callable[[Any], Coroutine[Any, Any, None]],
        note: Callable[[str], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.count = count
        self.ledger: ShardLedger | None = None
        self.running: dict[int, Shard] = {}
        self._new_client, self._login, self._connect = new_client, login, connect
        self._note, self._stopping = note, stopping
        self._claims: asyncio.Task[None] | None = None

    @property
    def sharded(self) -> bool:
        return self.ledger is not None or self.count > 1

    def clients(self) -> list[Any]:
        return [run.client for run in self.running.values()]

    async def start(self) -> None:
        """Connect the shards owned now, then claim again every CLAIM_EVERY_S."""
        await self.sync()
        self._claims = asyncio.create_task(self._claim_loop(), name="discord.shards")

    async def stop(self) -> None:
        if self._claims is not None:
            self._claims.cancel()
            await asyncio.gather(self._claims, return_exceptions=True)
            self._claims = None
        for shard in list(self.running):
            await self._close(shard)

    def health(self) -> dict[str, int]:
        return {str(k): r.epoch for k, r in sorted(self.running.items())}

    async def sync(self) -> None:
        """Run exactly the shards owned now: close the ones taken elsewhere (their epoch
        moved), connect the ones newly taken."""
        give = 0
        if self.ledger is None:
            owned = dict.fromkeys(range(self.count), 0)
        else:
            claim = await self.ledger.claim(self.count)
            owned, give = claim.owned, claim.give
        for shard, run in list(self.running.items()):
            if owned.get(shard) != run.epoch:
                log.warning(
                    "discord shard %d/%d is no longer ours (epoch %d, now %s); "
                    "closing its connection",
                    shard,
                    self.count,
                    run.epoch,
                    owned.get(shard),
                )
                await self._close(shard)
            elif run.task.done():  # its connection gave up (logged): connect it again
                await self._close(shard)
        for shard, epoch in sorted(owned.items()):
            if shard not in self.running and not self._stopping():
                await self._open(shard, epoch)
        if give and self.ledger is not None and not self._stopping():
            await self._hand_over(give)

    async def _hand_over(self, give: int) -> None:
        """Let go of `give` shards for a replica holding too few: the highest ids that ran
        here for a round at least (one just taken is kept, so a share does not flap). Each
        connection is closed before the ledger hears of it, so the taker cannot connect it
        while it is still open here; what arrives in between, the taker catches up."""
        assert self.ledger is not None
        ready = time.monotonic() - CLAIM_EVERY_S
        going = [k for k in sorted(self.running, reverse=True) if self.running[k].opened <= ready]
        epochs = {k: self.running[k].epoch for k in going[:give]}
        if not epochs:
            return
        for shard in epochs:
            await self._close(shard)
        await self.ledger.release(self.count, epochs)
        log.info(
            "discord shard(s) %s/%d handed over to a replica with fewer", sorted(epochs), self.count
        )

    async def _open(self, shard: int, epoch: int) -> None:
        client = self._new_client(shard, asyncio.Event())
        try:
            await self._login(client)
        except BaseException:  # cancelled by stop(), or refused: nothing left open
            if not client.is_closed():
                await client.close()
            raise
        task = asyncio.create_task(self._connect(client), name=f"discord.gateway:{shard}")
        self.running[shard] = run = Shard(epoch, client, task, time.monotonic())
        try:
            async with asyncio.timeout(30):
                await client.wait_until_ready()
        except TimeoutError:  # kept: discord.py goes on trying, the next claim keeps it
            log.warning("discord shard %d/%d not ready after 30 s", shard, self.count)
            return
        finally:
            run.opened = time.monotonic()
        log.info("discord shard %d/%d connected (epoch %d)", shard, self.count, epoch)

    async def _close(self, shard: int) -> None:
        run = self.running.pop(shard)
        if not run.client.is_closed():
            await run.client.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run.task, 5)

    async def _claim_loop(self) -> None:
        """Every CLAIM_EVERY_S: take the shards of replicas that are gone, let go of ours
        that were taken."""
        while True:
            await asyncio.sleep(CLAIM_EVERY_S)
            try:
                await self.sync()
            except Exception as exc:  # the database is away: keep what runs, ask again
                self._note(f"shards: {exc}")
                log.warning("discord shard claim failed: %s", exc)
