"""Several replicas on one PostgreSQL database: a key's lease is its row in
`session_routes` with a fence (gateway.topology.cluster's `PgCoordinator`), the index is the shared
route table (gateway.topology.routes' `PgRouteIndex`), and recovery is the takeover scan of rows
whose replica is gone, each run under its key's lease."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence

from gateway.messages import InboundMessage
from gateway.session_keys import SessionKey
from gateway.shards import PgShardLedger
from gateway.topology.base import KeyLease, PlanBegin, ResendRow, TurnLease
from gateway.topology.cluster import PgCoordinator
from gateway.topology.leases import InboxRow, Lease, ResetNotice, Stored


class ReplicatedTopology:
    """One replica's view of the shared keys (see the module docstring)."""

    ages_under_lease = True  # another replica may answer a row meanwhile: judged under it

    def __init__(self, cluster: PgCoordinator) -> None:
        self.cluster = cluster
        self.coordinator = cluster
        self.index = cluster.routes

    async def accept(
        self, k: str, key: SessionKey, msg: InboundMessage, *, lease: bool, begin: PlanBegin
    ) -> tuple[int, str, bool, Stored | None]:
        """The row names its key and this replica; with `lease`, the key's lease comes with
        the commit when the key is idle here, and the turn's begin when `begin` plans one
        and the take allows it (PgCoordinator.accept)."""
        src = msg.source
        return await self.cluster.accept(
            k,
            src.platform,
            src.chat_id,
            msg.platform_message_id,
            msg.as_payload(),
            lease=lease,
            begin=begin(msg, key) if lease else None,
        )

    def try_lock(self, k: str) -> Callable[[], None] | None:
        return None  # a lease cannot be taken without waiting on the database

    def lease(self, k: str, inbox_id: int) -> contextlib.AbstractAsyncContextManager[Lease | None]:
        return self.cluster.lease(k, inbox_id)

    def turn_lease(
        self, lease: KeyLease, row: InboxRow, last: bool, stored: Stored | None
    ) -> TurnLease:
        """The lease's fence, a read of whether it still holds, and for the last row the
        hand-back that frees the lease with its reply's commit."""
        own = _own(lease)
        held = TurnLease(own.fence, functools.partial(self.cluster.holds, own.fence), stored)
        if last:
            held.hand_back = self.cluster.hand_back(own, _taken_elsewhere(row, self.cluster.me))
        return held

    def ran(self, lease: KeyLease, row: InboxRow) -> None:
        """A row another replica took is recorded, so the lease's release wakes it to
        answer its caller."""
        _own(lease).answered.extend(_taken_elsewhere(row, self.cluster.me))

    async def row_open(self, inbox_id: int) -> bool:
        return await self.cluster.row_open(inbox_id)

    def shards(self, platform: str) -> PgShardLedger:
        """The platform's shards, each run by one live replica at a time."""
        return PgShardLedger(self.cluster.store, self.cluster.link, platform)

    def use_reset_notice(self, notice: ResetNotice) -> None:
        self.cluster.use_reset_notice(notice)

    async def startup_rows(self) -> Sequence[InboxRow] | None:
        return None  # read in the takeover scan

    async def orphans(self, read_early: Sequence[InboxRow] | None) -> Sequence[InboxRow]:
        return await self.cluster.orphaned_inbound()

    async def resend_unconfirmed(self, resend: ResendRow) -> None:
        """A dead runner's replies go out under their key's lease, so no new turn of the
        key (on any replica) sends its reply in between; the take returns them. A key held
        meanwhile is left to its holder, whose take returned them the same way."""
        keyless = []
        keys: dict[str, None] = {}
        for row in await self.cluster.orphaned_replies():
            if row.get("session_key") is None:  # taken before replicas
                keyless.append(row)
            else:
                keys[str(row["session_key"])] = None
        for row in keyless:
            await resend(row)
        for key in keys:
            async with self.cluster.lease_now(key) as lease:
                for row in lease.unsent if lease is not None else ():
                    await resend(row)

    async def claim_reply(self, inbox_id: int) -> bool:
        return await self.cluster.claim_reply(inbox_id)


def _own(lease: KeyLease) -> Lease:
    """A lease the pipeline hands back: one this topology's `lease` gave it."""
    assert isinstance(lease, Lease), f"not a replica's lease: {lease!r}"
    return lease


def _taken_elsewhere(row: InboxRow, me: int) -> list[tuple[int, int]]:
    """(the replica that took the row, its inbox id) when that is another replica, whose
    caller waits for the answer: the lease's release wakes it."""
    origin = row.get("replica")
    return [(int(origin), int(row["id"]))] if origin is not None and int(origin) != me else []
