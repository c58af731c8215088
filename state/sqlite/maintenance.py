"""Delete, prune, vacuum, checkpoints, search-index and integrity checks, lineage repair,
statistics and the shared state_meta key/value table."""

from __future__ import annotations

import os
import sqlite3
import time

from ..columns import AUTO_PRUNE_KEY, PRUNE_CHUNK  # noqa: F401
from ..errors import SessionNotFound
from ..pruning import Pruning
from ..records import SourceUsage, UsageStats
from . import schema
from .dispatch import Dispatch


def delete_sessions(conn: sqlite3.Connection, ids: list[str]) -> int:
    """Delete sessions and their messages; their children are orphaned, never deleted."""
    if not ids:
        return 0
    marks = ", ".join("?" for _ in ids)
    conn.execute(
        f"UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id IN ({marks})",
        ids,
    )
    conn.execute(f"DELETE FROM messages WHERE session_id IN ({marks})", ids)
    return conn.execute(f"DELETE FROM sessions WHERE id IN ({marks})", ids).rowcount


def delete_session(conn: sqlite3.Connection, session_id: str) -> None:
    if delete_sessions(conn, [session_id]) == 0:
        raise SessionNotFound(session_id)


def prune_candidates(
    conn: sqlite3.Connection,
    older_than_days: float,
    source: str | None,
    now: float,
    limit: int = PRUNE_CHUNK,
    protected: frozenset[str] = frozenset(),
) -> list[str]:
    """Ended sessions whose last activity is older than the cut-off."""
    cutoff = now - older_than_days * 86400
    sql = (
        "SELECT id FROM sessions WHERE ended_at IS NOT NULL "
        "AND COALESCE(last_active, started_at) < ?"
    )
    params: list[object] = [cutoff]
    if source:
        sql += " AND source = ?"
        params.append(source)
    rows = conn.execute(sql + " ORDER BY last_active LIMIT ?", (*params, limit + len(protected)))
    return [r[0] for r in rows if r[0] not in protected][:limit]


def prune_chunk(
    conn: sqlite3.Connection,
    older_than_days: float,
    source: str | None,
    now: float,
    protected: frozenset[str] = frozenset(),
) -> int:
    return delete_sessions(
        conn, prune_candidates(conn, older_than_days, source, now, protected=protected)
    )


def get_meta(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM state_meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else row[0]


def set_meta(conn: sqlite3.Connection, key: str, value: str | None) -> None:
    if value is None:
        conn.execute("DELETE FROM state_meta WHERE key = ?", (key,))
    else:
        conn.execute(
            "INSERT INTO state_meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )


def claim_meta_stamp(conn: sqlite3.Connection, key: str, min_interval_s: float, now: float) -> bool:
    """Atomically take a periodic job's turn: True (and stamp `now`) if it is due."""
    last = get_meta(conn, key)
    if last is not None:
        try:
            if now - float(last) < min_interval_s:
                return False
        except ValueError:
            pass
    set_meta(conn, key, repr(now))
    return True


def freeable_bytes(conn: sqlite3.Connection) -> tuple[int, int]:
    """(free pages * page size, total file bytes) as SQLite reports them."""
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    total = conn.execute("PRAGMA page_count").fetchone()[0]
    return free * page, total * page


def vacuum(conn: sqlite3.Connection) -> tuple[int, int]:
    """VACUUM (outside any transaction); returns file bytes before and after."""
    _, before = freeable_bytes(conn)
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _, after = freeable_bytes(conn)
    return before, after


CHECKPOINT_MODES = ("PASSIVE", "FULL", "RESTART", "TRUNCATE")


def checkpoint(conn: sqlite3.Connection, mode: str) -> tuple[int, int, int]:
    """PRAGMA wal_checkpoint (outside any transaction): (busy, WAL frames, frames copied)."""
    if mode not in CHECKPOINT_MODES:  # the mode is spliced into the PRAGMA: whitelist it
        raise ValueError("checkpoint mode must be PASSIVE, FULL, RESTART or TRUNCATE")
    busy, frames, copied = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
    return int(busy), int(frames), int(copied)


def integrity_check(conn: sqlite3.Connection, quick: bool) -> list[str]:
    """SQLite's own page-level check; an empty list when the file is healthy."""
    pragma = "quick_check" if quick else "integrity_check"
    found = [r[0] for r in conn.execute(f"PRAGMA {pragma}").fetchall()]
    return [] if found == ["ok"] else found


# --- the two FTS5 indexes (sb_messages_fts, and messages_aux_fts for CJK/emoji and tools) ---

_FTS_TABLES = (schema.FTS_TABLE, "messages_aux_fts")


def rebuild_search_index(conn: sqlite3.Connection) -> int:
    """Rebuild both FTS indexes from the messages table; returns the aux row count."""
    conn.execute(f"INSERT INTO {schema.FTS_TABLE}({schema.FTS_TABLE}) VALUES ('rebuild')")
    return schema.rebuild_aux(conn)


def optimize_search_index(conn: sqlite3.Connection) -> None:
    """Merge every index's segments into one (fewer pages to read per query)."""
    for table in _FTS_TABLES:
        conn.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")


def check_search_index(conn: sqlite3.Connection) -> list[str]:
    """FTS5 integrity checks; the problems found (empty when healthy)."""
    problems = []
    for table in _FTS_TABLES:
        try:
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)")
        except sqlite3.DatabaseError as exc:
            problems.append(f"{table}: {exc}")
    return problems


# --- lineage repair (for `doctor --fix`) -------------------------------------------------


def count_dangling_parents(conn: sqlite3.Connection) -> int:
    """Sessions whose parent_session_id names a session that no longer exists."""
    (n,) = conn.execute(
        "SELECT COUNT(*) FROM sessions c WHERE c.parent_session_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM sessions p WHERE p.id = c.parent_session_id)"
    ).fetchone()
    return int(n)


def clear_dangling_parents(conn: sqlite3.Connection) -> int:
    """Make those sessions roots (deleting a parent orphans its children, never deletes
    them); returns how many were changed."""
    return conn.execute(
        "UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id IS NOT NULL "
        "AND parent_session_id NOT IN (SELECT id FROM sessions)"
    ).rowcount


def stats(conn: sqlite3.Connection, path: str) -> UsageStats:
    per_source: list[SourceUsage] = [
        {
            "source": r[0],
            "sessions": r[1],
            "messages": r[2] or 0,
            "input_tokens": r[3] or 0,
            "output_tokens": r[4] or 0,
            "estimated_cost_usd": r[5] or 0.0,
            "actual_cost_usd": r[6] or 0.0,
        }
        for r in conn.execute(
            "SELECT source, COUNT(*), SUM(message_count), SUM(input_tokens), SUM(output_tokens), "
            "SUM(estimated_cost_usd), SUM(actual_cost_usd) FROM sessions GROUP BY source "
            "ORDER BY COUNT(*) DESC"
        )
    ]
    totals = conn.execute(
        "SELECT COUNT(*), SUM(CASE WHEN ended_at IS NULL THEN 1 ELSE 0 END), "
        "SUM(input_tokens), SUM(output_tokens), SUM(cache_read_tokens), SUM(cache_write_tokens), "
        "SUM(reasoning_tokens), SUM(estimated_cost_usd), SUM(actual_cost_usd) FROM sessions"
    ).fetchone()
    messages = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    sizes = {}
    for suffix in ("", "-wal", "-shm"):
        try:
            sizes[f"file{suffix or ''}"] = os.path.getsize(path + suffix)
        except OSError:
            sizes[f"file{suffix or ''}"] = 0
    return {
        "sessions": totals[0],
        "live_sessions": totals[1] or 0,
        "messages": messages,
        "input_tokens": totals[2] or 0,
        "output_tokens": totals[3] or 0,
        "cache_read_tokens": totals[4] or 0,
        "cache_write_tokens": totals[5] or 0,
        "reasoning_tokens": totals[6] or 0,
        "estimated_cost_usd": totals[7] or 0.0,
        "actual_cost_usd": totals[8] or 0.0,
        "per_source": per_source,
        "db_bytes": sizes["file"],
        "wal_bytes": sizes["file-wal"],
        "computed_at": time.time(),
    }


class MaintenanceOps(Pruning, Dispatch):
    """SessionDB's `Maintenance`: delete, prune, vacuum, meta, checkpoints, index and integrity checks."""

    async def _prune_chunk(
        self, older_than_days: float, source: str | None, now: float, keep: frozenset[str]
    ) -> int:
        return await self._write(prune_chunk, older_than_days, source, now, keep)

    async def _prune_candidates(
        self, older_than_days: float, source: str | None, now: float, limit: int
    ) -> list[str]:
        return await self._read(prune_candidates, older_than_days, source, now, limit)

    async def _claim_meta_stamp(self, key: str, interval_s: float, now: float) -> bool:
        return await self._write(claim_meta_stamp, key, interval_s, now)

    async def _vacuum_after_prune(self, min_bytes: int, min_share: float) -> bool:
        """VACUUM rewrites the whole file and holds the write lock meanwhile: only when it
        frees `min_bytes`, or `min_share` of the file."""
        free, total = await self._read(freeable_bytes)
        if free >= min_bytes or (total and free / total >= min_share):
            await self.vacuum()
            return True
        return False

    async def stats(self) -> UsageStats:
        """Totals over the store (sessions, messages, tokens, cost, file sizes)."""
        return await self._read(stats, str(self.path))

    async def delete_session(self, session_id: str) -> None:
        """Delete a session and its messages; its children become roots."""
        await self._write(delete_session, session_id)

    async def vacuum(self) -> tuple[int, int]:
        """VACUUM; returns the file size in bytes before and after."""
        return await self._writer.exclusive(vacuum)

    async def get_meta(self, key: str) -> str | None:
        return await self._read(get_meta, key)

    async def set_meta(self, key: str, value: str | None) -> None:
        await self._write(set_meta, key, value)

    async def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """Copy WAL frames back into the file: (busy, frames in the WAL, frames copied)."""
        if mode not in CHECKPOINT_MODES:
            raise ValueError("checkpoint mode must be PASSIVE, FULL, RESTART or TRUNCATE")
        return await self._writer.exclusive(checkpoint, mode)

    async def rebuild_search_index(self) -> int:
        """Rebuild both FTS indexes from the messages table; returns the aux row count."""
        return await self._write(rebuild_search_index)

    async def optimize_search_index(self) -> None:
        await self._write(optimize_search_index)

    async def check_search_index(self) -> list[str]:
        """FTS integrity checks; returns a list of problems (empty when healthy)."""
        return await self._write(check_search_index)

    async def integrity_check(self, quick: bool = True) -> list[str]:
        return await self._read(integrity_check, quick)

    async def schema_version(self) -> int:
        """The schema version the file is at (0 for a file switchboard never migrated)."""
        return await self._read(schema.current_version)

    def latest_schema_version(self) -> int:
        """The newest schema version this switchboard knows (and migrates files to)."""
        return schema.LATEST

    async def count_dangling_parents(self) -> int:
        """Sessions whose parent no longer exists (written by another program)."""
        return await self._read(count_dangling_parents)

    async def clear_dangling_parents(self) -> int:
        """Make those sessions roots; returns how many were changed."""
        return await self._write(clear_dangling_parents)
