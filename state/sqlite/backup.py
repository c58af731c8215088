"""Online snapshots of a state.db and their verification. SQLite's backup API copies a
consistent image of a live WAL database inside one read transaction (the daemon's writer is
never blocked), and the copy is made self-contained: a rollback-journal file with no -wal or
-shm beside it. A file copy of a live WAL database is never a backup."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..errors import DatabaseError
from . import maintenance, schema


@dataclass(frozen=True)
class SnapshotSummary:
    """What a state.db holds, and whether SQLite and the search indexes find it sound."""

    schema_version: int
    sessions: int
    live_sessions: int
    messages: int
    problems: tuple[str, ...]  # empty when the file and its search indexes are healthy

    @property
    def ok(self) -> bool:
        return not self.problems


def snapshot(source: Path, dest: Path) -> None:
    """Copy `source` (a state.db, live or not) to `dest` as one consistent image."""
    if not source.is_file():
        raise DatabaseError(str(source), "does not exist")
    try:
        src = sqlite3.connect(source, timeout=30)
    except sqlite3.Error as exc:
        raise DatabaseError(str(source), str(exc)) from exc
    try:
        dst = sqlite3.connect(dest)
        try:
            # pages=-1: every page in one step, so the copy is one read transaction's image
            src.backup(dst, pages=-1)
            dst.execute("PRAGMA journal_mode=DELETE")
        finally:
            dst.close()
    except sqlite3.Error as exc:
        raise DatabaseError(str(source), f"cannot be backed up: {exc}") from exc
    finally:
        src.close()


def verify(path: Path) -> SnapshotSummary:
    """SQLite's full integrity check, the search indexes' own checks against the messages
    they index, and the counts. Runs on a snapshot (it writes nothing a reader would see)."""
    try:
        conn = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error as exc:
        raise DatabaseError(str(path), str(exc)) from exc
    try:
        problems = maintenance.integrity_check(conn, quick=False)
        version = schema.current_version(conn)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if {"sessions", "messages"} - tables:
            return SnapshotSummary(version, 0, 0, 0, ("not a switchboard state.db",))
        if version >= 9:  # the search indexes as this switchboard builds them
            problems += maintenance.check_search_index(conn)
        sessions, live = conn.execute(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE ended_at IS NULL) FROM sessions"
        ).fetchone()
        (messages,) = conn.execute("SELECT COUNT(*) FROM messages").fetchone()
        return SnapshotSummary(version, sessions, live, messages, tuple(problems))
    except sqlite3.DatabaseError as exc:
        return SnapshotSummary(0, 0, 0, 0, (str(exc),))
    finally:
        conn.close()
