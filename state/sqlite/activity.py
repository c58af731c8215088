"""Hourly message tallies (`activity_hourly`) that insights read instead of the messages.

One row per (UTC hour, session source, tool): `tool` is '' for messages that are not tool
results, else the tool's name ('?' when it has none). `first_id`/`last_id` bound the ids of
the hour's messages (never tightened on delete, so they stay bounds), which lets insights
read a period's partial first and last hours by a short rowid range scan.

Who keeps it right, all inside the writing transaction:
* switchboard's appends: one upsert per group commit, from tallies made in Python
  (`tally` + `add`), so a turn pays no extra statement per message;
* rows other programs insert (`sb_written IS NULL`, Hermes Agent): a trigger, so they are
  counted the moment they land, whichever program writes;
* deletes by anyone (delete, prune, clear, empty-session cleanup, Hermes): a trigger that
  decrements; a per-row trigger costs only on deletes, and catches every delete path.
The session must still exist when its messages are deleted (switchboard deletes messages
first); `recount` rebuilds the table from the messages for a file that drifted.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from ..rows import exec_script
from .batches import chunks, statement


# the tool key of a message row, in SQL (a table alias prefix may be given)
def tool_sql(alias: str = "") -> str:
    a = f"{alias}." if alias else ""
    return f"CASE WHEN {a}role = 'tool' THEN COALESCE(NULLIF({a}tool_name, ''), '?') ELSE '' END"


def tool_key(role: str, tool_name: str | None) -> str:
    return (tool_name or "?") if role == "tool" else ""


def hour_of(ts: float) -> int:
    return int(ts // 3600)


_UPSERT_TAIL = (
    "ON CONFLICT(hour, source, tool) DO UPDATE SET "
    "messages = messages + excluded.messages, "
    "first_id = MIN(first_id, excluded.first_id), last_id = MAX(last_id, excluded.last_id)"
)

CREATE_SQL = f"""
CREATE TABLE IF NOT EXISTS activity_hourly (
    hour INTEGER NOT NULL,
    source TEXT NOT NULL,
    tool TEXT NOT NULL,
    messages INTEGER NOT NULL,
    first_id INTEGER NOT NULL,
    last_id INTEGER NOT NULL,
    PRIMARY KEY (hour, source, tool)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS sb_activity_foreign_insert AFTER INSERT ON messages
WHEN new.sb_written IS NULL BEGIN
    INSERT INTO activity_hourly(hour, source, tool, messages, first_id, last_id)
    SELECT CAST(new.timestamp / 3600 AS INTEGER), s.source, {tool_sql("new")}, 1, new.id, new.id
    FROM sessions s WHERE s.id = new.session_id
    {_UPSERT_TAIL};
END;
CREATE TRIGGER IF NOT EXISTS sb_activity_delete AFTER DELETE ON messages BEGIN
    UPDATE activity_hourly SET messages = messages - 1
    WHERE hour = CAST(old.timestamp / 3600 AS INTEGER)
    AND source = (SELECT source FROM sessions WHERE id = old.session_id)
    AND tool = {tool_sql("old")};
END;
"""

# Backfill step: rowid ranges keep each GROUP BY's sorter small on a big file.
BACKFILL_CHUNK = 250_000

_BACKFILL = (
    "INSERT INTO activity_hourly(hour, source, tool, messages, first_id, last_id) "
    f"SELECT CAST(m.timestamp / 3600 AS INTEGER) AS h, s.source, {tool_sql('m')} AS t, "
    "COUNT(*), MIN(m.id), MAX(m.id) FROM messages m JOIN sessions s ON s.id = m.session_id "
    "WHERE m.id >= ? AND m.id < ? GROUP BY h, s.source, t "
    "ORDER BY h, s.source, t " + _UPSERT_TAIL  # upserts in key order
)


def recount(conn: sqlite3.Connection) -> None:
    """Recompute every tally from the messages (the migration's backfill)."""
    conn.execute("DELETE FROM activity_hourly")
    lo, hi = conn.execute("SELECT MIN(id), MAX(id) FROM messages").fetchone()
    if lo is None:
        return
    for start in range(lo, hi + 1, BACKFILL_CHUNK):
        conn.execute(_BACKFILL, (start, start + BACKFILL_CHUNK))


def install(conn: sqlite3.Connection) -> None:
    exec_script(conn, CREATE_SQL)
    recount(conn)


Tallies = dict[tuple[int, str, str], list[int]]  # key -> [count, first id, last id]


def tally(rows: Iterable[tuple[str, int, float, str, str | None]]) -> Tallies:
    """Tallies of (session source, id, timestamp, role, tool_name) rows. On every append's
    path, so hour_of and tool_key are inlined."""
    out: Tallies = {}
    get = out.get
    for source, mid, ts, role, tool_name in rows:
        key = (int(ts // 3600), source, (tool_name or "?") if role == "tool" else "")
        t = get(key)
        if t is None:
            out[key] = [1, mid, mid]
            continue
        t[0] += 1
        if mid < t[1]:
            t[1] = mid
        elif mid > t[2]:
            t[2] = mid
    return out


_ADD_ROWS = "INSERT INTO activity_hourly(hour, source, tool, messages, first_id, last_id) VALUES "


def add(conn: sqlite3.Connection, tallies: Tallies) -> None:
    """Apply tallies in one statement (one sqlite3 step: state/sqlite/batches.py)."""
    if tallies:
        rows = [(h, s, t, *v) for (h, s, t), v in tallies.items()]
        try:
            for n, params in chunks(rows, 6):
                conn.execute(statement(_ADD_ROWS, 6, n, " " + _UPSERT_TAIL), params)
        except sqlite3.OperationalError as e:
            # a file opened below schema 11 (schema_target) has no tallies yet; the
            # migration counts every message once it runs
            if "no such table: activity_hourly" not in str(e):
                raise
