"""The outbox of one-off sends on PostgreSQL: the same rows and states as state/sqlite/sends.py,
shared by the replicas (the leader sends the pending ones again)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from ..records import OUTBOX_COLUMNS as COLUMNS
from ..records import outbox_item as row_of
from ..vocab import SEND_PENDING as PENDING
from . import db
from .dispatch import Dispatch

CREATE_SQL = """
CREATE TABLE sends (
    id bigserial PRIMARY KEY,
    platform text NOT NULL,
    chat_id text NOT NULL,
    thread_id text,
    text text NOT NULL,
    state text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    error text,
    message_ids text,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);
CREATE INDEX idx_sends_pending ON sends(updated_at) WHERE state = 'pending';
"""
_COLS = ", ".join(COLUMNS)


async def add(
    conn: AsyncConnection,
    platform: str,
    chat_id: str,
    thread_id: str | None,
    text: str,
    now: float,
) -> int:
    return int(
        await db.value(
            conn,
            "INSERT INTO sends (platform, chat_id, thread_id, text, state, created_at, updated_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (platform, chat_id, thread_id, text, PENDING, now, now),
        )
    )


async def finish(
    conn: AsyncConnection,
    send_id: int,
    state: str,
    error: str | None,
    message_ids: Sequence[str],
    now: float,
) -> None:
    await db.run(
        conn,
        "UPDATE sends SET state = %s, error = %s, message_ids = %s, attempts = attempts + 1, "
        "updated_at = %s WHERE id = %s AND state = %s",
        (
            state,
            error,
            json.dumps(list(message_ids)) if message_ids else None,
            now,
            send_id,
            PENDING,
        ),
    )


async def claim_due(
    conn: AsyncConnection, before: float, now: float, limit: int
) -> list[dict[str, Any]]:
    found = await db.tuples(
        conn,
        f"UPDATE sends SET updated_at = %s WHERE id IN (SELECT id FROM sends WHERE state = %s "
        f"AND updated_at < %s ORDER BY updated_at LIMIT %s) AND state = %s AND updated_at < %s "
        f"RETURNING {_COLS}",
        (now, PENDING, before, limit, PENDING, before),
    )
    return sorted((row_of(r) for r in found), key=lambda r: (r["created_at"], r["id"]))


async def pending_count(conn: AsyncConnection) -> int:
    return int(await db.value(conn, "SELECT COUNT(*) FROM sends WHERE state = %s", (PENDING,)))


class SendOps(Dispatch):
    """PgStore's outbox of one-off sends."""

    async def send_add(
        self, platform: str, chat_id: str, thread_id: str | None, text: str, now: float
    ) -> int:
        """A one-off message, stored `pending` before it is sent; its row id."""
        return await self._write(add, platform, chat_id, thread_id, text, now)

    async def send_finish(
        self, send_id: int, state: str, error: str | None, message_ids: Sequence[str], now: float
    ) -> None:
        await self._write(finish, send_id, state, error, message_ids, now)

    async def sends_claim_due(
        self, before: float, now: float, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Take pending sends last tried before `before` (stamped `now`) to try again."""
        return await self._write(claim_due, before, now, limit)

    async def sends_pending(self) -> int:
        return await self._read(pending_count)
