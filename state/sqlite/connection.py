"""The SQLite write connection and SQLite's errors: the connection opened with the writer's
pragmas (WAL, synchronous, busy timeout, a capped WAL size), closed quietly (a last PRAGMA
optimize), the file's identity (so a replaced file is noticed), and SQLite's result codes
read: busy or locked (worth retrying), full, read-only, damaged, I/O, translated into the
store's DatabaseError.
"""

from __future__ import annotations

import logging
import os
import sqlite3

from ..errors import DatabaseError
from .windows import WriterConnection

log = logging.getLogger("state.writer")


def connect_writer(path: str, synchronous: str, busy_timeout_s: float) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path,
        isolation_level=None,
        check_same_thread=False,
        timeout=busy_timeout_s,
        factory=WriterConnection,
        cached_statements=256,  # the batch statements come in a shape per batch size
    )
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
    # The WAL file keeps its largest size unless told otherwise; cap what stays after a reset.
    conn.execute("PRAGMA journal_size_limit=16777216")
    return conn


def error_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of an sqlite3 error (extended codes folded), or None."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_busy(exc: BaseException) -> bool:
    """Another connection holds the lock (SQLITE_BUSY / SQLITE_LOCKED): worth retrying."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = error_code(exc)
    if code is None:  # raised by hand, not by SQLite: only its text can tell
        return "locked" in str(exc)
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def close_quietly(conn: sqlite3.Connection, optimize: bool = False) -> None:
    if optimize:
        try:
            # best effort: refresh planner statistics where they drifted; another process
            # holding the write lock just means "next time"
            conn.execute("PRAGMA busy_timeout=200")
            conn.execute("PRAGMA optimize")
        except sqlite3.Error as exc:
            log.debug("PRAGMA optimize skipped at close: %s", exc)
    try:
        conn.close()
    except sqlite3.Error as exc:
        log.warning("closing the write connection: %s", exc)


def identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def translate_error(exc: BaseException, path: str) -> BaseException:
    """Map raw sqlite3 errors to typed store errors; leave ours alone."""
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.IntegrityError):
        code = error_code(exc)
        if code == sqlite3.SQLITE_FULL:
            return DatabaseError(path, "the disk is full; nothing was written")
        if code == sqlite3.SQLITE_READONLY:
            return DatabaseError(path, "the database is read-only; nothing was written")
        if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            return DatabaseError(path, f"the database is damaged: {exc}")
        if code == sqlite3.SQLITE_IOERR:
            return DatabaseError(path, f"disk I/O error: {exc}")
    return exc
