"""The outbox of one-off sends (`switchboard send` through the daemon): each message is a
row before it goes out, `pending` until the platform took it (`sent`) or refused it, or
the daemon gave up (`failed`). A pending row is what the daemon sends again later (after
the platform was unreachable, or after a crash): at least once.

The gateway decides when to send and what counts as refused; this module keeps the rows.
state/pg/sends.py keeps the same rows on PostgreSQL."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..records import OUTBOX_COLUMNS as COLUMNS  # noqa: F401
from ..records import outbox_item as row_of
from ..vocab import SEND_FAILED as FAILED  # noqa: F401
from ..vocab import SEND_PENDING as PENDING
from ..vocab import SEND_SENT as SENT  # noqa: F401
from .dispatch import Dispatch

CREATE_SQL = """
CREATE TABLE IF NOT EXISTS sends (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    platform TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    thread_id TEXT,
    text TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    message_ids TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_sends_pending ON sends(updated_at) WHERE state = 'pending';
"""


def add(
    conn: sqlite3.Connection,
    platform: str,
    chat_id: str,
    thread_id: str | None,
    text: str,
    now: float,
) -> int:
    cur = conn.execute(
        "INSERT INTO sends (platform, chat_id, thread_id, text, state, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (platform, chat_id, thread_id, text, PENDING, now, now),
    )
    return int(cur.lastrowid or 0)


def finish(
    conn: sqlite3.Connection,
    send_id: int,
    state: str,
    error: str | None,
    message_ids: Sequence[str],
    now: float,
) -> None:
    """One attempt's outcome: `sent`, `failed`, or still `pending` (attempts counted)."""
    conn.execute(
        "UPDATE sends SET state = ?, error = ?, message_ids = ?, attempts = attempts + 1, "
        "updated_at = ? WHERE id = ? AND state = ?",
        (
            state,
            error,
            json.dumps(list(message_ids)) if message_ids else None,
            now,
            send_id,
            PENDING,
        ),
    )


def claim_due(
    conn: sqlite3.Connection, before: float, now: float, limit: int
) -> list[dict[str, Any]]:
    """Take the pending rows last tried (or added) before `before`, oldest first: each is
    stamped `now`, so no other scan takes it while this attempt runs."""
    found = [
        row_of(r)
        for r in conn.execute(
            f"UPDATE sends SET updated_at = ? WHERE id IN (SELECT id FROM sends WHERE state = ? "
            f"AND updated_at < ? ORDER BY updated_at LIMIT ?) AND state = ? AND updated_at < ? "
            f"RETURNING {', '.join(COLUMNS)}",
            (now, PENDING, before, limit, PENDING, before),
        ).fetchall()
    ]
    return sorted(found, key=lambda r: (r["created_at"], r["id"]))


def pending_count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM sends WHERE state = ?", (PENDING,)).fetchone()[0])


class SendOps(Dispatch):
    """SessionDB's outbox of one-off sends."""

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
