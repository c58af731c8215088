"""One daemon: the trivial topology. A key's lease is its in-process lock (no fence, never
taken away), the index is sessions.json, and what a crash left is read from the inbox at
start-up, before intake."""

from __future__ import annotations

from typing import Any

from gateway.coordinator import Coordinator, LocalCoordinator
from gateway.index import RouteIndex
from gateway.topology.base import ResendRow
from state import Store
from state.inbox import STARTED


class LocalTopology:
    """One daemon's keys, locks and recovery rows (see the module docstring)."""

    ages_under_lease = False
    cluster = None  # no replicas

    def __init__(self, db: Store, index: RouteIndex, coordinator: Coordinator | None = None):
        self.db = db
        self.index = index
        self.coordinator: Coordinator = coordinator or LocalCoordinator()

    async def startup_rows(self) -> list[dict[str, Any]] | None:
        return await self.db.open_inbound()

    async def orphans(self, read_early: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
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
