"""Pruning, the part both stores share: ended sessions deleted a chunk per transaction (so
live traffic flows between chunks) until a chunk comes back short, and the automatic prune
run at most once per interval across every process sharing the store (a stamp in
state_meta), with a VACUUM after it when the backend finds one worthwhile.

Each backend's maintenance part (state/sqlite/maintenance.py `MaintenanceOps`,
state/pg/admin.py `AdminOps`) supplies the steps in its own SQL.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable

from .columns import AUTO_PRUNE_KEY, PRUNE_CHUNK
from .records import AutoPruneResult


async def in_chunks(step: Callable[[], Awaitable[int]]) -> int:
    """Run `step` (one transaction deleting at most PRUNE_CHUNK rows) until it deletes
    fewer; the total."""
    total = 0
    while True:
        n = await step()
        total += n
        if n < PRUNE_CHUNK:
            return total


class Pruning:
    """prune_sessions, prune_candidates and maybe_auto_prune_and_vacuum over a backend's
    steps (`_prune_chunk`, `_prune_candidates`, `_claim_meta_stamp`, `_vacuum_after_prune`)."""

    async def _prune_chunk(
        self, older_than_days: float, source: str | None, now: float, keep: frozenset[str]
    ) -> int:
        raise NotImplementedError

    async def _prune_candidates(
        self, older_than_days: float, source: str | None, now: float, limit: int
    ) -> list[str]:
        raise NotImplementedError

    async def _claim_meta_stamp(self, key: str, interval_s: float, now: float) -> bool:
        raise NotImplementedError

    async def _vacuum_after_prune(self, min_bytes: int, min_share: float) -> bool:
        raise NotImplementedError

    async def prune_sessions(
        self,
        older_than_days: float = 90,
        source: str | None = None,
        *,
        now: float | None = None,
        protected: Iterable[str] = (),
    ) -> int:
        """Delete ended sessions idle for longer than `older_than_days`; returns the count.
        Runs in small transactions so live traffic keeps flowing during a large prune."""
        at = time.time() if now is None else now
        keep = frozenset(protected)
        return await in_chunks(lambda: self._prune_chunk(older_than_days, source, at, keep))

    async def prune_candidates(
        self,
        older_than_days: float,
        source: str | None = None,
        *,
        now: float | None = None,
        limit: int = 1000,
    ) -> list[str]:
        at = time.time() if now is None else now
        return await self._prune_candidates(older_than_days, source, at, limit)

    async def maybe_auto_prune_and_vacuum(
        self,
        retention_days: float = 90,
        min_interval_hours: float = 24,
        vacuum: bool = True,
        *,
        now: float | None = None,
        min_vacuum_bytes: int = 8 * 1024 * 1024,
        min_vacuum_share: float = 0.2,
    ) -> AutoPruneResult:
        """Prune at most once per interval across every process sharing the store (the
        stamp lives in state_meta); then, if it pruned and `vacuum`, the backend's VACUUM
        when it finds one worthwhile (`_vacuum_after_prune`)."""
        at = time.time() if now is None else now
        due = await self._claim_meta_stamp(AUTO_PRUNE_KEY, min_interval_hours * 3600, at)
        if not due:
            return {"ran": False, "pruned": 0, "vacuumed": False}
        pruned = await self.prune_sessions(retention_days, now=at)
        vacuumed = False
        if vacuum and pruned:
            vacuumed = await self._vacuum_after_prune(min_vacuum_bytes, min_vacuum_share)
        return {"ran": True, "pruned": pruned, "vacuumed": vacuumed}
