"""Compression leases (table `compression_locks`, shared with Hermes Agent): one holder per
session at a time, for a time-to-live, so two processes never compress the same session.

Functions take the write connection inside a transaction (BEGIN IMMEDIATE serialises the
check and the claim between processes).
"""

from __future__ import annotations

import sqlite3
import time


def try_acquire(conn: sqlite3.Connection, session_id: str, holder: str, ttl_s: float) -> bool:
    """Take the lease unless someone else holds a live one; True when `holder` owns it."""
    if not session_id:
        return False
    now = time.time()
    conn.execute(
        "DELETE FROM compression_locks WHERE session_id = ? AND expires_at <= ?", (session_id, now)
    )
    conn.execute(
        "INSERT OR IGNORE INTO compression_locks(session_id, holder, acquired_at, expires_at) "
        "VALUES (?, ?, ?, ?)",
        (session_id, holder, now, now + ttl_s),
    )
    row = conn.execute(
        "SELECT holder FROM compression_locks WHERE session_id = ?", (session_id,)
    ).fetchone()
    return row is not None and row[0] == holder


def refresh(conn: sqlite3.Connection, session_id: str, holder: str, ttl_s: float) -> bool:
    """Extend a live lease held by `holder`; False when it is not theirs or has expired."""
    if not session_id:
        return False
    now = time.time()
    cur = conn.execute(
        "UPDATE compression_locks SET expires_at = ? "
        "WHERE session_id = ? AND holder = ? AND expires_at > ?",
        (now + ttl_s, session_id, holder, now),
    )
    return cur.rowcount > 0


def release(conn: sqlite3.Connection, session_id: str, holder: str) -> None:
    if session_id:
        conn.execute(
            "DELETE FROM compression_locks WHERE session_id = ? AND holder = ?",
            (session_id, holder),
        )


def holder(conn: sqlite3.Connection, session_id: str) -> str | None:
    if not session_id:
        return None
    row = conn.execute(
        "SELECT holder FROM compression_locks WHERE session_id = ? AND expires_at > ?",
        (session_id, time.time()),
    ).fetchone()
    return str(row[0]) if row else None
