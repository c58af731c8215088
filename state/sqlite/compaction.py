"""Keeping the search indexes compact between bursts of writes.

FTS5 adds a segment (a b-tree) per committed write transaction and merges them only when
`automerge` (8) accumulate on one level, so an index written one commit per message holds
about twenty segments, and a query looks each term up once per segment: a rare two-word
MATCH over 15,000 messages reads five times fewer pages from one segment than from twenty.
Merging is writing, so it runs only when nobody waits to write: the daemon's writer takes
bounded steps when its queue has been empty for a while (state/sqlite/writer.py), between
which any waiting write goes first; the Hermes facade's direct store takes them at close,
as many as the writes it made paid for (state/hermes/direct.py).

A step is one FTS5 'merge' of at most `pages` pages on each index, in its own transaction.
With `usermerge` 2, any two segments on one level are merged (FTS5's default, 4, leaves
three or four behind); a step that changed fewer than two rows found nothing to merge
(FTS5 documents this), and the indexes stay compact until the next write.
"""

from __future__ import annotations

import sqlite3

from .connection import is_busy

# schema.FTS_TABLE and the side index (schema imports the writer, which imports this)
TABLES = ("sb_messages_fts", "messages_aux_fts")
USERMERGE = 2
STEP_PAGES = 32  # pages one step merges per index: about a millisecond of work
# After each step the writer rests this many times as long as the step took: a first merge
# of a large, fragmented index rewrites much of it, and spread out it takes at most a fifth
# of a core from the searches running meanwhile.
REST = 4
REST_MIN_S = 0.001


def prepare(conn: sqlite3.Connection) -> tuple[str, ...]:
    """Set `usermerge` on each index where it differs (inside a write transaction); the
    indexes the file has (an old schema may lack one)."""
    have = {
        r[0]
        for r in conn.execute(
            f"SELECT name FROM sqlite_master WHERE name IN ({', '.join('?' for _ in TABLES)})",
            TABLES,
        )
    }
    tables = tuple(t for t in TABLES if t in have)
    for t in tables:
        row = conn.execute(f"SELECT v FROM {t}_config WHERE k = 'usermerge'").fetchone()
        if row is None or row[0] != USERMERGE:
            conn.execute(f"INSERT INTO {t}({t}, rank) VALUES ('usermerge', {USERMERGE})")
    return tables


def step(conn: sqlite3.Connection, tables: tuple[str, ...], pages: int = STEP_PAGES) -> bool:
    """One bounded merge on each index (inside a write transaction); whether any merged
    something (then more may be left)."""
    worked = False
    for t in tables:
        before = conn.total_changes
        conn.execute(f"INSERT INTO {t}({t}, rank) VALUES ('merge', ?)", (max(1, pages),))
        worked = worked or conn.total_changes - before >= 2
    return worked


def run_step(
    conn: sqlite3.Connection, tables: tuple[str, ...] | None, pages: int = STEP_PAGES
) -> tuple[tuple[str, ...], bool] | None:
    """`step` in a transaction of its own, never waiting for a lock another connection
    holds (then None: nothing done, left for the next idle moment). `tables`: those a
    step returned before, None at first (then `prepare` runs too). Returns the indexes
    and whether the step merged anything. The connection's busy timeout is put back."""
    timeout = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    conn.execute("PRAGMA busy_timeout=0")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if tables is None:
                tables = prepare(conn)
            worked = step(conn, tables, pages)
            conn.execute("COMMIT")
            return tables, worked
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except sqlite3.OperationalError as exc:
        if is_busy(exc):
            return None
        raise
    finally:
        conn.execute(f"PRAGMA busy_timeout={int(timeout)}")


def segments(conn: sqlite3.Connection, table: str) -> int:
    """How many segments the index holds (its structure record, id 10): a cookie of four
    bytes, then the levels and segments as varints."""
    row = conn.execute(f"SELECT block FROM {table}_data WHERE id = 10").fetchone()
    if row is None:
        return 0
    block, i = row[0], 4
    values = []
    for _ in range(2):
        value = 0
        for _ in range(9):
            byte = block[i]
            i += 1
            value = (value << 7) | (byte & 0x7F)
            if not byte & 0x80:
                break
        values.append(value)
    return int(values[1])
