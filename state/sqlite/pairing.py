"""DM pairing in the `pairing` table: one row per (platform, user): a pending one-time code
with its expiry, or the operator's decision (approved, denied, revoked).

A code is handed out only within the limits the caller passes (one pending code per user,
none again within the user's interval, at most so many pending per platform), is unique
while it is pending, and works once: a decision clears it. Approved rows extend the
platform's allowlist. The gateway decides what a code looks like and what to say; this
module only keeps the rows. state/pg/pairing.py runs the same rules on PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ..records import PAIRING_COLUMNS as COLUMNS
from ..vocab import APPROVED, DENIED, REVOKED, TAKEN  # noqa: F401
from ..vocab import PAIRING_PENDING as PENDING
from .dispatch import Dispatch

CREATE_SQL = """
CREATE TABLE IF NOT EXISTS pairing (
    platform TEXT NOT NULL,
    user_id TEXT NOT NULL,
    user_name TEXT,
    chat_id TEXT,
    code TEXT UNIQUE,
    state TEXT NOT NULL,
    requested_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    decided_at REAL,
    PRIMARY KEY (platform, user_id)
);
"""


def _row(values: Any) -> dict[str, Any]:
    return dict(zip(COLUMNS, values, strict=True))


def offer(
    conn: sqlite3.Connection,
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
    """Record `code` as the user's pending code and return it, or None when the user may
    not have one now (approved, a code still pending, asked within the interval, or the
    platform has `max_pending` codes pending); TAKEN when `code` is pending for another."""
    found = conn.execute(
        "SELECT state, expires_at, requested_at FROM pairing WHERE platform = ? AND user_id = ?",
        (platform, user_id),
    ).fetchone()
    if found is not None:
        state, expires_at, requested_at = found
        if state == APPROVED or (state == PENDING and expires_at > now):
            return None
        if requested_at + user_interval_s > now:
            return None
    (pending,) = conn.execute(
        "SELECT COUNT(*) FROM pairing WHERE platform = ? AND state = ? AND expires_at > ?",
        (platform, PENDING, now),
    ).fetchone()
    if pending >= max_pending:
        return None
    conn.execute("UPDATE pairing SET code = NULL WHERE code = ? AND expires_at <= ?", (code, now))
    if conn.execute("SELECT 1 FROM pairing WHERE code = ?", (code,)).fetchone():
        return TAKEN
    conn.execute(
        "INSERT INTO pairing (platform, user_id, user_name, chat_id, code, state, requested_at, "
        "expires_at, decided_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL) "
        "ON CONFLICT (platform, user_id) DO UPDATE SET user_name = excluded.user_name, "
        "chat_id = excluded.chat_id, code = excluded.code, state = excluded.state, "
        "requested_at = excluded.requested_at, expires_at = excluded.expires_at, decided_at = NULL",
        (platform, user_id, user_name, chat_id, code, PENDING, now, now + ttl_s),
    )
    return code


def decide(conn: sqlite3.Connection, code: str, state: str, now: float) -> dict[str, Any] | None:
    """Approve or deny the pending, unexpired request holding `code` (which then works no
    more); None when no such request is pending."""
    found = conn.execute(
        f"UPDATE pairing SET state = ?, code = NULL, decided_at = ? WHERE code = ? "
        f"AND state = ? AND expires_at > ? RETURNING {', '.join(COLUMNS)}",
        (state, now, code, PENDING, now),
    ).fetchone()
    return _row(found) if found else None


def revoke(conn: sqlite3.Connection, platform: str, user_id: str, now: float) -> bool:
    return (
        conn.execute(
            "UPDATE pairing SET state = ?, decided_at = ? WHERE platform = ? AND user_id = ? "
            "AND state = ?",
            (REVOKED, now, platform, user_id, APPROVED),
        ).rowcount
        == 1
    )


def approved(conn: sqlite3.Connection, platform: str, user_id: str) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM pairing WHERE platform = ? AND user_id = ? AND state = ?",
            (platform, user_id, APPROVED),
        ).fetchone()
        is not None
    )


def listing(conn: sqlite3.Connection, now: float) -> list[dict[str, Any]]:
    """Pending requests (unexpired) and approved users, oldest first."""
    return [
        _row(r)
        for r in conn.execute(
            f"SELECT {', '.join(COLUMNS)} FROM pairing WHERE state = ? "
            "OR (state = ? AND expires_at > ?) ORDER BY requested_at, platform, user_id",
            (APPROVED, PENDING, now),
        )
    ]


class PairingOps(Dispatch):
    """SessionDB's DM pairing."""

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
        """Record `code` as the user's pending pairing code within the limits; the code,
        None when the user may not have one now, or TAKEN (draw another)."""
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
        """Approve or deny the pending request holding `code` (single use); None if none."""
        return await self._write(decide, code, state, now)

    async def pairing_revoke(self, platform: str, user_id: str, now: float) -> bool:
        return await self._write(revoke, platform, user_id, now)

    async def pairing_approved(self, platform: str, user_id: str) -> bool:
        return await self._read(approved, platform, user_id)

    async def pairing_list(self, now: float) -> list[dict[str, Any]]:
        return await self._read(listing, now)
