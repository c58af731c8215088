"""DM pairing on PostgreSQL: the same rows and rules as state/sqlite/pairing.py, shared by every
replica, so a code one replica handed out is approved once for all of them.

A replica's new code never raises inside the writer's batch: a code another replica holds
(or the same user asking on two replicas at once) makes the insert do nothing, and the
caller draws again."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from ..records import PAIRING_COLUMNS as COLUMNS
from ..vocab import APPROVED, REVOKED, TAKEN
from ..vocab import PAIRING_PENDING as PENDING
from . import db
from .dispatch import Dispatch

CREATE_SQL = """
CREATE TABLE pairing (
    platform text NOT NULL,
    user_id text NOT NULL,
    user_name text,
    chat_id text,
    code text UNIQUE,
    state text NOT NULL,
    requested_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    decided_at double precision,
    PRIMARY KEY (platform, user_id)
);
"""
_COLS = ", ".join(COLUMNS)


async def offer(
    conn: AsyncConnection,
    platform: str,
    user_id: str,
    user_name: str | None,
    chat_id: str,
    code: str,
    now: float,
    ttl_s: float,
    user_interval_s: float,
    max_pending: int,
) -> str | None:
    found = await db.tuples(
        conn,
        "SELECT state, expires_at, requested_at FROM pairing WHERE platform = %s AND user_id = %s",
        (platform, user_id),
    )
    if found:
        state, expires_at, requested_at = found[0]
        if state == APPROVED or (state == PENDING and expires_at > now):
            return None
        if requested_at + user_interval_s > now:
            return None
    pending = await db.value(
        conn,
        "SELECT COUNT(*) FROM pairing WHERE platform = %s AND state = %s AND expires_at > %s",
        (platform, PENDING, now),
    )
    if int(pending) >= max_pending:
        return None
    await db.run(
        conn, "UPDATE pairing SET code = NULL WHERE code = %s AND expires_at <= %s", (code, now)
    )
    if found:
        await db.run(
            conn, "DELETE FROM pairing WHERE platform = %s AND user_id = %s", (platform, user_id)
        )
    inserted = await db.tuples(
        conn,
        "INSERT INTO pairing (platform, user_id, user_name, chat_id, code, state, requested_at, "
        "expires_at, decided_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL) "
        "ON CONFLICT DO NOTHING RETURNING code",
        (platform, user_id, user_name, chat_id, code, PENDING, now, now + ttl_s),
    )
    return str(inserted[0][0]) if inserted else TAKEN


async def decide(conn: AsyncConnection, code: str, state: str, now: float) -> dict[str, Any] | None:
    return await db.row(
        conn,
        f"UPDATE pairing SET state = %s, code = NULL, decided_at = %s WHERE code = %s "
        f"AND state = %s AND expires_at > %s RETURNING {_COLS}",
        (state, now, code, PENDING, now),
    )


async def revoke(conn: AsyncConnection, platform: str, user_id: str, now: float) -> bool:
    changed = await db.run(
        conn,
        "UPDATE pairing SET state = %s, decided_at = %s WHERE platform = %s AND user_id = %s "
        "AND state = %s",
        (REVOKED, now, platform, user_id, APPROVED),
    )
    return changed == 1


async def approved(conn: AsyncConnection, platform: str, user_id: str) -> bool:
    found = await db.value(
        conn,
        "SELECT 1 FROM pairing WHERE platform = %s AND user_id = %s AND state = %s",
        (platform, user_id, APPROVED),
    )
    return found is not None


async def listing(conn: AsyncConnection, now: float) -> list[dict[str, Any]]:
    return await db.rows(
        conn,
        f"SELECT {_COLS} FROM pairing WHERE state = %s OR (state = %s AND expires_at > %s) "
        "ORDER BY requested_at, platform, user_id",
        (APPROVED, PENDING, now),
    )


class PairingOps(Dispatch):
    """PgStore's DM pairing."""

    async def pairing_offer(
        self,
        platform: str,
        user_id: str,
        user_name: str | None,
        chat_id: str,
        code: str,
        *,
        now: float,
        ttl_s: float,
        user_interval_s: float,
        max_pending: int,
    ) -> str | None:
        return await self._write(
            offer,
            platform,
            user_id,
            user_name,
            chat_id,
            code,
            now,
            ttl_s,
            user_interval_s,
            max_pending,
        )

    async def pairing_decide(self, code: str, state: str, now: float) -> dict[str, Any] | None:
        return await self._write(decide, code, state, now)

    async def pairing_revoke(self, platform: str, user_id: str, now: float) -> bool:
        return await self._write(revoke, platform, user_id, now)

    async def pairing_approved(self, platform: str, user_id: str) -> bool:
        return await self._read(approved, platform, user_id)

    async def pairing_list(self, now: float) -> list[dict[str, Any]]:
        return await self._read(listing, now)
