"""One daemon: the trivial topology. A key's lease is its in-process lock (no fence, never
taken away), the index is sessions.json, and what a crash left is read from the inbox at
start-up, before intake."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.index import RouteIndex
from gateway.messages import InboundMessage
from gateway.session_keys import SessionKey
from gateway.topology.base import LOCAL_LEASE, KeyLease, PlanBegin, ResendRow, TurnLease
from gateway.topology.coordinator import KeyHold, LocalCoordinator
from gateway.topology.leases import InboxRow, ResetNotice, Stored
from state import STARTED, Store


class LocalTopology:
    """One daemon's keys, locks and recovery rows (see the module docstring)."""

    ages_under_lease = False
    cluster = None  # no replicas

    def __init__(
        self, db: Store, index: RouteIndex, coordinator: LocalCoordinator | None = None
    ) -> None:
        self.db = db
        self.index = index
        self.coordinator = coordinator = coordinator or LocalCoordinator()
        self.try_lock = coordinator.try_session_lock
        self.lease: Callable[[str, int], KeyHold] = coordinator.hold

    async def accept(
        self, k: str, key: SessionKey, msg: InboundMessage, *, lease: bool, begin: PlanBegin
    ) -> tuple[int, str, bool, Stored | None]:
        """The plain accept: one daemon's turn begins in its accept only on the fast path
        (intake's, under the lock taken before the commit)."""
        src = msg.source
        inbox_id, state, new = await self.db.accept_inbound(
            src.platform, src.chat_id, msg.platform_message_id, msg.as_payload()
        )
        return inbox_id, state, new, None

    def turn_lease(
        self, lease: KeyLease, row: InboxRow, last: bool, stored: Stored | None
    ) -> TurnLease:
        return LOCAL_LEASE  # the key's lock: nothing to fence, nothing to ask

    def ran(self, lease: KeyLease, row: InboxRow) -> None:
        """Nothing to tell: no other process took the row."""

    async def row_open(self, inbox_id: int) -> bool:
        return True  # a hold's row is the one it was taken for

    def shards(self, platform: str) -> None:
        return None  # one daemon runs every connection

    def use_reset_notice(self, notice: ResetNotice) -> None:
        """Notices live in this process's memory (the Resetter words them at the reset)."""

    async def startup_rows(self) -> Sequence[InboxRow] | None:
        return await self.db.open_inbound()

    async def orphans(self, read_early: Sequence[InboxRow] | None) -> Sequence[InboxRow]:
        """A key's begun turn (its message stored: at most one per key) held the key's lock
        when the crash came, so it goes first: inbox ids follow the commits, and a message
        to an idle key takes the lock before its commit, which may land after a waiting
        one's. Then the others, oldest first; each key's lock keeps that order."""
        rows = read_early if read_early is not None else await self.db.open_inbound()
        return sorted(rows, key=lambda r: (r["state"] != STARTED, r["id"]))

    async def resend_unconfirmed(self, resend: ResendRow) -> None:
        for row in await self.db.unsent_replies():  # read before any turn runs
            await resend(row)

    async def claim_reply(self, inbox_id: int) -> bool:
        return True  # no other process sends this home's replies
