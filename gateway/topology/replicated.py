"""Several replicas on one PostgreSQL database: a key's lease is its row in
`session_routes` with a fence (gateway.cluster's `PgCoordinator`), the index is the shared
route table (gateway.routes' `PgRouteIndex`), and recovery is the takeover scan of rows
whose replica is gone, each run under its key's lease."""

from __future__ import annotations

from typing import Any

from gateway.cluster import PgCoordinator
from gateway.topology.base import ResendRow


class ReplicatedTopology:
    """One replica's view of the shared keys (see the module docstring)."""

    ages_under_lease = True  # another replica may answer a row meanwhile: judged under it

    def __init__(self, cluster: PgCoordinator) -> None:
        self.cluster = cluster
        self.coordinator = cluster
        self.index = cluster.routes

    async def startup_rows(self) -> list[dict[str, Any]] | None:
        return None  # read in the takeover scan

    async def orphans(self, read_early: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
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
