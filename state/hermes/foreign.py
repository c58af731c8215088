"""Rows other programs (Hermes Agent) write into a shared state.db.

switchboard keeps denormalised columns (`last_active`, `preview`, `title_key/base/number`)
and a segmented side index (`messages_aux`) that its own write path fills in Python. Another
program writing the same file fills none of them, so:

* SQL triggers (they fire on every connection, whoever writes) keep `last_active` right at
  once and queue the rows whose derived values need Python in `sb_pending`;
* `absorb` computes those values from the queue: before every write batch, and at open, where
  the titles are all done and the messages up to the opener's bound (a daemon opens with one
  and indexes the rest in write batches after it serves: `SessionDB.catch_up`).

A message row switchboard writes carries `sb_written = 1`; the triggers skip those (their
values are computed inline), so switchboard's own appends pay nothing extra. The triggers
use only core SQL: a program that never heard of switchboard can still write through them.
"""

from __future__ import annotations

import logging
import sqlite3

from ..content import content_text
from ..rows import exec_script, make_preview
from ..sqlite.writer import register_before_batch
from ..textindex import aux_row
from ..titles import lineage_key, title_key

log = logging.getLogger("state.foreign")

# Rows absorbed per write batch: a large foreign import is caught up over several batches
# instead of stalling one caller's write (500 adds a few tens of milliseconds to a batch;
# a turn's writes take several batches while a backlog lasts).
BATCH_LIMIT = 500
# Messages a daemon absorbs at open before it serves (a fraction of a second of work); a larger
# backlog (a store another program filled, restored or moved in) is caught up after.
OPEN_LIMIT = 2000

TRIGGERS_SQL = """
CREATE TABLE IF NOT EXISTS sb_pending (
    kind TEXT NOT NULL,
    ref TEXT NOT NULL,
    PRIMARY KEY (kind, ref)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS sb_foreign_message_insert AFTER INSERT ON messages
WHEN new.sb_written IS NULL BEGIN
    UPDATE sessions SET last_active = new.timestamp
        WHERE id = new.session_id AND COALESCE(last_active, 0) < new.timestamp;
    INSERT OR IGNORE INTO sb_pending(kind, ref) VALUES ('message', CAST(new.id AS TEXT));
END;
CREATE TRIGGER IF NOT EXISTS sb_foreign_message_update
AFTER UPDATE OF content, tool_name, tool_calls ON messages BEGIN
    INSERT OR IGNORE INTO sb_pending(kind, ref) VALUES ('message', CAST(new.id AS TEXT));
END;
CREATE TRIGGER IF NOT EXISTS sb_foreign_session_insert AFTER INSERT ON sessions
WHEN new.last_active IS NULL OR (new.title IS NOT NULL AND new.title_key IS NULL) BEGIN
    UPDATE sessions SET last_active = COALESCE(last_active, new.started_at) WHERE id = new.id;
    INSERT OR IGNORE INTO sb_pending(kind, ref)
        SELECT 'title', new.id WHERE new.title IS NOT NULL AND new.title_key IS NULL;
END;
CREATE TRIGGER IF NOT EXISTS sb_foreign_session_title AFTER UPDATE OF title ON sessions
WHEN new.title IS NOT old.title AND new.title_key IS old.title_key BEGIN
    INSERT OR IGNORE INTO sb_pending(kind, ref) VALUES ('title', new.id);
END;
"""


def install(conn: sqlite3.Connection) -> None:
    """Create the queue and the triggers (idempotent; runs inside the migration)."""
    exec_script(conn, TRIGGERS_SQL)


def _absorb_message(conn: sqlite3.Connection, message_id: int) -> None:
    row = conn.execute(
        "SELECT session_id, role, content, tool_name, tool_calls FROM messages WHERE id = ?",
        (message_id,),
    ).fetchone()
    if row is None:
        return  # deleted since; the cascade trigger removed its aux row
    session_id, role, content, tool_name, tool_calls = row
    text = content_text(content)
    aux = aux_row(text, tool_name, tool_calls)
    # DELETE then INSERT, never INSERT OR REPLACE: REPLACE removes the old row without
    # firing the delete trigger, which would leave its terms in messages_aux_fts.
    conn.execute("DELETE FROM messages_aux WHERE message_id = ?", (message_id,))
    if aux is not None:
        conn.execute(
            "INSERT INTO messages_aux(message_id, seg_text, tool_text) VALUES (?, ?, ?)",
            (message_id, aux[0], aux[1]),
        )
    if role == "user":
        preview = make_preview(text)
        if preview:
            conn.execute(
                "UPDATE sessions SET preview = ? WHERE id = ? AND preview IS NULL",
                (preview, session_id),
            )


def _absorb_title(conn: sqlite3.Connection, session_id: str) -> None:
    row = conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        return
    (title,) = row
    if title is None:
        conn.execute(
            "UPDATE sessions SET title_key = NULL, title_base = NULL, title_number = NULL "
            "WHERE id = ?",
            (session_id,),
        )
        return
    base, number = lineage_key(title)
    conn.execute(
        "UPDATE sessions SET title_key = ?, title_base = ?, title_number = ? WHERE id = ?",
        (title_key(title), base, number, session_id),
    )


def absorb(
    conn: sqlite3.Connection, limit: int | None = BATCH_LIMIT, kind: str | None = None
) -> int:
    """Compute derived values for queued foreign rows (of one `kind`, 'message' or 'title',
    or both), in the caller's transaction.

    Returns how many queue entries were handled. A failure here is logged and rolled back
    to a savepoint: catching up on another program's rows must never fail our own write.
    """
    try:
        if conn.execute("SELECT 1 FROM sb_pending LIMIT 1").fetchone() is None:
            return 0
    except sqlite3.OperationalError:
        return 0  # not migrated yet (the open path runs absorb after migrating)
    sql = "SELECT kind, ref FROM sb_pending"
    if kind is not None:
        sql += " WHERE kind = ?"
    sql += " ORDER BY kind, ref"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    conn.execute("SAVEPOINT sb_absorb")
    try:
        items = conn.execute(sql, () if kind is None else (kind,)).fetchall()
        messages = sorted(int(ref) for what, ref in items if what == "message")
        for mid in messages:
            _absorb_message(conn, mid)
        for what, ref in items:
            if what == "title":
                _absorb_title(conn, ref)
        conn.executemany("DELETE FROM sb_pending WHERE kind = ? AND ref = ?", items)
    except sqlite3.Error:
        conn.execute("ROLLBACK TO sb_absorb")
        conn.execute("RELEASE sb_absorb")
        log.warning("could not index rows written by another program", exc_info=True)
        return 0
    conn.execute("RELEASE sb_absorb")
    return len(items)


def count_pending(conn: sqlite3.Connection) -> int:
    """How many rows another program wrote wait for their derived values."""
    try:
        return int(conn.execute("SELECT count(*) FROM sb_pending").fetchone()[0])
    except sqlite3.OperationalError:
        return 0  # a file from before the queue existed


register_before_batch(absorb)
