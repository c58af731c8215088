"""The state.db schema and its numbered migrations.

switchboard's own schema version lives in `state_meta` under `switchboard.schema_version`,
so a state.db created by Hermes Agent (whose `schema_version` table counts *its* migrations)
can be opened: every migration only adds what is missing and never rewrites foreign data.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from . import textindex
from .errors import DatabaseError, SchemaTooNew
from .titles import lineage_key, title_key

log = logging.getLogger("state.schema")

META_VERSION_KEY = "switchboard.schema_version"

SESSION_COLUMNS: dict[str, str] = {
    # Baseline (Hermes Agent's documented sessions table).
    "id": "TEXT PRIMARY KEY",
    "source": "TEXT NOT NULL",
    "user_id": "TEXT",
    "model": "TEXT",
    "model_config": "TEXT",
    "system_prompt": "TEXT",
    "parent_session_id": "TEXT REFERENCES sessions(id)",
    "started_at": "REAL NOT NULL",
    "ended_at": "REAL",
    "end_reason": "TEXT",
    "message_count": "INTEGER DEFAULT 0",
    "tool_call_count": "INTEGER DEFAULT 0",
    "input_tokens": "INTEGER DEFAULT 0",
    "output_tokens": "INTEGER DEFAULT 0",
    "cache_read_tokens": "INTEGER DEFAULT 0",
    "cache_write_tokens": "INTEGER DEFAULT 0",
    "reasoning_tokens": "INTEGER DEFAULT 0",
    "billing_provider": "TEXT",
    "billing_base_url": "TEXT",
    "billing_mode": "TEXT",
    "estimated_cost_usd": "REAL",
    "actual_cost_usd": "REAL",
    "cost_status": "TEXT",
    "cost_source": "TEXT",
    "pricing_version": "TEXT",
    "title": "TEXT",
    # Routing and lifecycle (names shared with Hermes Agent where it has them).
    "session_key": "TEXT",
    "chat_id": "TEXT",
    "chat_type": "TEXT",
    "thread_id": "TEXT",
    "origin_json": "TEXT",
    "handoff_state": "TEXT",
    "handoff_platform": "TEXT",
    "handoff_error": "TEXT",
    "archived": "INTEGER DEFAULT 0",
    # switchboard additions.
    "child_kind": "TEXT",
    "last_active": "REAL",
    "preview": "TEXT",
    "title_key": "TEXT",
    "handoff_updated_at": "REAL",
}

MESSAGE_COLUMNS: dict[str, str] = {
    "id": "INTEGER PRIMARY KEY AUTOINCREMENT",
    "session_id": "TEXT NOT NULL REFERENCES sessions(id)",
    "role": "TEXT NOT NULL",
    "content": "TEXT",
    "tool_call_id": "TEXT",
    "tool_calls": "TEXT",
    "tool_name": "TEXT",
    "timestamp": "REAL NOT NULL",
    "token_count": "INTEGER",
    "finish_reason": "TEXT",
    "reasoning": "TEXT",
    "reasoning_details": "TEXT",
    "codex_reasoning_items": "TEXT",
    "platform_message_id": "TEXT",
}

# Columns that ALTER TABLE ADD COLUMN cannot add as declared (PRIMARY KEY, NOT NULL
# without default); they exist in any table that has the baseline shape.
_NOT_ADDABLE = {"id", "source", "started_at", "session_id", "role", "timestamp"}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _table_exists(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE name = ? AND type IN ('table', 'view')", (name,)
    ).fetchone()
    return row is not None


def _ensure_table(conn: sqlite3.Connection, table: str, columns: dict[str, str]) -> None:
    if not _table_exists(conn, table):
        body = ", ".join(f"{name} {decl}" for name, decl in columns.items())
        conn.execute(f"CREATE TABLE {table} ({body})")
        return
    have = _columns(conn, table)
    missing = [c for c in columns if c not in have]
    bad = [c for c in missing if c in _NOT_ADDABLE]
    if bad:
        raise DatabaseError("state.db", f"table {table} lacks required column(s) {', '.join(bad)}")
    for name in missing:
        decl = columns[name].replace(" REFERENCES sessions(id)", "")
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")


def _exec_script(conn: sqlite3.Connection, script: str) -> None:
    """Run statements one by one: executescript() would commit the open transaction."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            conn.execute(pending)
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement: {pending.strip()[:60]}")


def _fts_triggers_present(conn: sqlite3.Connection, fts: str, table: str) -> bool:
    rows = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?", (table,)
    ).fetchall()
    return any(fts in (r[0] or "") for r in rows)


def _migration_1(conn: sqlite3.Connection) -> None:
    """Baseline tables, routing columns, indexes and the main FTS index."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS state_meta (key TEXT PRIMARY KEY, value TEXT)")
    _ensure_table(conn, "sessions", SESSION_COLUMNS)
    _ensure_table(conn, "messages", MESSAGE_COLUMNS)
    for sql in (
        "CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source)",
        "CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id)",
        "CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC)",
        "CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique ON sessions(title) "
        "WHERE title IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS idx_messages_session_order ON messages(session_id, id)",
        "CREATE INDEX IF NOT EXISTS idx_messages_platform_id ON messages(platform_message_id) "
        "WHERE platform_message_id IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS idx_sessions_last_active ON sessions(last_active DESC)",
        "CREATE INDEX IF NOT EXISTS idx_sessions_source_active "
        "ON sessions(source, last_active DESC)",
        "CREATE INDEX IF NOT EXISTS idx_sessions_title_key ON sessions(title_key) "
        "WHERE title_key IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS idx_sessions_session_key ON sessions(session_key)",
        "CREATE INDEX IF NOT EXISTS idx_sessions_handoff ON sessions(handoff_state) "
        "WHERE handoff_state IS NOT NULL",
    ):
        conn.execute(sql)
    if not _table_exists(conn, "messages_fts"):
        _create_messages_fts(conn, prefixes="")
    if not _fts_triggers_present(conn, "messages_fts", "messages"):
        _exec_script(
            conn,
            """
            CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
                INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
            END;
            CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
                INSERT INTO messages_fts(messages_fts, rowid, content)
                VALUES ('delete', old.id, old.content);
            END;
            CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
                INSERT INTO messages_fts(messages_fts, rowid, content)
                VALUES ('delete', old.id, old.content);
                INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
            END;
            """,
        )
    # Fill the denormalised columns for rows written by other programs.
    conn.execute(
        """UPDATE sessions SET last_active = COALESCE(
               (SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = sessions.id),
               started_at)
           WHERE last_active IS NULL"""
    )
    conn.execute(
        """UPDATE sessions SET preview = (
               SELECT substr(replace(replace(m.content, char(10), ' '), char(13), ' '), 1, 60)
               FROM messages m WHERE m.session_id = sessions.id AND m.role = 'user'
               ORDER BY m.id LIMIT 1)
           WHERE preview IS NULL"""
    )
    rows = conn.execute(
        "SELECT id, title FROM sessions WHERE title IS NOT NULL AND title_key IS NULL"
    ).fetchall()
    conn.executemany(
        "UPDATE sessions SET title_key = ? WHERE id = ?", [(title_key(t), i) for i, t in rows]
    )


def _migration_2(conn: sqlite3.Connection) -> None:
    """The segmented side index for CJK/emoji text and tool names/arguments."""
    _exec_script(
        conn,
        """
        CREATE TABLE IF NOT EXISTS messages_aux (
            message_id INTEGER PRIMARY KEY,
            seg_text TEXT,
            tool_text TEXT
        );
        CREATE VIRTUAL TABLE IF NOT EXISTS messages_aux_fts USING fts5(
            seg_text, tool_text, content=messages_aux, content_rowid=message_id
        );
        CREATE TRIGGER IF NOT EXISTS messages_aux_ai AFTER INSERT ON messages_aux BEGIN
            INSERT INTO messages_aux_fts(rowid, seg_text, tool_text)
            VALUES (new.message_id, new.seg_text, new.tool_text);
        END;
        CREATE TRIGGER IF NOT EXISTS messages_aux_ad AFTER DELETE ON messages_aux BEGIN
            INSERT INTO messages_aux_fts(messages_aux_fts, rowid, seg_text, tool_text)
            VALUES ('delete', old.message_id, old.seg_text, old.tool_text);
        END;
        CREATE TRIGGER IF NOT EXISTS messages_aux_au AFTER UPDATE ON messages_aux BEGIN
            INSERT INTO messages_aux_fts(messages_aux_fts, rowid, seg_text, tool_text)
            VALUES ('delete', old.message_id, old.seg_text, old.tool_text);
            INSERT INTO messages_aux_fts(rowid, seg_text, tool_text)
            VALUES (new.message_id, new.seg_text, new.tool_text);
        END;
        CREATE TRIGGER IF NOT EXISTS messages_aux_cascade AFTER DELETE ON messages BEGIN
            DELETE FROM messages_aux WHERE message_id = old.id;
        END;
        """,
    )
    conn.execute("INSERT INTO messages_aux_fts(messages_aux_fts, rank) VALUES ('automerge', 8)")
    rebuild_aux(conn)


def aux_row(
    content: str | None, tool_name: str | None, tool_calls: str | None
) -> tuple[str | None, str | None] | None:
    """The (seg_text, tool_text) a message needs in messages_aux, or None for no row."""
    seg = textindex.segment(content) if content and textindex.needs_aux(content) else None
    tools = textindex.tool_text(tool_name, tool_calls)
    if seg is None and tools is None:
        return None
    return seg, tools


def rebuild_aux(conn: sqlite3.Connection) -> int:
    """Recompute messages_aux from messages (also picks up rows other programs wrote)."""
    conn.execute("DELETE FROM messages_aux")
    cur = conn.execute(
        "SELECT id, content, tool_name, tool_calls FROM messages "
        "WHERE tool_name IS NOT NULL OR tool_calls IS NOT NULL "
        "OR (content IS NOT NULL AND content GLOB '*[^ -~]*')"
    )
    count = 0
    while batch := cur.fetchmany(2000):
        rows = []
        for mid, content, tname, tcalls in batch:
            aux = aux_row(content, tname, tcalls)
            if aux is not None:
                rows.append((mid, aux[0], aux[1]))
        conn.executemany(
            "INSERT INTO messages_aux(message_id, seg_text, tool_text) VALUES (?, ?, ?)", rows
        )
        count += len(rows)
    return count


def _migration_3(conn: sqlite3.Connection) -> None:
    """Indexes for owner-scoped listings (a chat's or a user's sessions, newest first)."""
    conn.execute(
        "CREATE INDEX IF NOT EXISTS idx_sessions_user_active ON sessions(user_id, last_active DESC)"
    )
    conn.execute(
        "CREATE INDEX IF NOT EXISTS idx_sessions_chat_active "
        "ON sessions(source, chat_id, last_active DESC)"
    )
    conn.execute("DROP INDEX IF EXISTS idx_sessions_chat")  # a prefix of the one above
    if _table_exists(conn, "sqlite_stat1"):
        # Statistics gathered before these indexes existed would steer the planner to
        # them for source-only listings; refresh them for this table.
        conn.execute("ANALYZE sessions")


def _migration_4(conn: sqlite3.Connection) -> None:
    """Lineage columns for titles, so numbering and "newest of a lineage" are index lookups."""
    have = _columns(conn, "sessions")
    for name, decl in (("title_base", "TEXT"), ("title_number", "INTEGER")):
        if name not in have:
            conn.execute(f"ALTER TABLE sessions ADD COLUMN {name} {decl}")
    rows = conn.execute("SELECT id, title FROM sessions WHERE title IS NOT NULL").fetchall()
    conn.executemany(
        "UPDATE sessions SET title_base = ?, title_number = ? WHERE id = ?",
        [(*lineage_key(t), i) for i, t in rows],
    )
    conn.execute(
        "CREATE INDEX IF NOT EXISTS idx_sessions_title_lineage ON sessions(title_base, title_number) "
        "WHERE title_base IS NOT NULL"
    )


def _migration_5(conn: sqlite3.Connection) -> None:
    """Platform message ids repeat across chats (Telegram numbers them per chat), so the
    duplicate check starts from the chat's sessions, then looks up (session, id)."""
    conn.execute(
        "CREATE INDEX IF NOT EXISTS idx_messages_session_pmid ON messages(session_id, platform_message_id) "
        "WHERE platform_message_id IS NOT NULL"
    )
    conn.execute("DROP INDEX IF EXISTS idx_messages_platform_id")


# Prefix queries (`depl*`) on an index without prefix indexes merge the doclists of every
# term that starts with the prefix: 80 ms for a 4-letter prefix on a million messages. A
# prefix index for 4 characters answers those from one doclist, for half again the index
# size; longer prefixes match few terms and stay fast without one. A 3-character index as
# well measured twice the append p99 at 2,000 appends/s (21 ms against 11; 9 with none).
FTS_PREFIXES = "4"


def _create_messages_fts(conn: sqlite3.Connection, prefixes: str) -> None:
    option = f", prefix='{prefixes}'" if prefixes else ""
    conn.execute(
        "CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, "
        f"content_rowid=id{option})"
    )
    # Merge segments in larger steps: group commits write many small segments, and
    # automerge=8 measured 10-15% faster appends than the default 4 (bench/).
    conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('automerge', 8)")
    conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")


def _migration_6(conn: sqlite3.Connection) -> None:
    """Every per-session message read orders by id, so (session_id, timestamp) only cost a
    random index page per append; (session_id, id) serves them all."""
    conn.execute("DROP INDEX IF EXISTS idx_messages_session")


def _migration_7(conn: sqlite3.Connection) -> None:
    """The main index again, with prefix indexes (FTS_PREFIXES). The triggers name the table,
    so they keep working; the rebuild reads every message once (about 20 s per million)."""
    (count,) = conn.execute("SELECT COUNT(*) FROM messages").fetchone()
    if count > 50_000:
        log.info("rebuilding the search index with prefix indexes (%d messages)", count)
    conn.execute("DROP TABLE IF EXISTS messages_fts")
    _create_messages_fts(conn, FTS_PREFIXES)


# FTS5 merges segments in quanta of 64 leaf pages per level, inside whichever commit crosses
# the quantum's write counter; with 4,050-byte leaves (the default) one quantum took ~20 ms
# and set the append p99 at 2,000 appends/s (35 ms). 1,000-byte leaves make each quantum a
# quarter of the work: p99 11-13 ms, 1.5% more bytes per message, the same query latency
# on a million messages (bench/state_bench.py, bench/search_bench.py).
FTS_PAGE_SIZE = 1000


def _migration_8(conn: sqlite3.Connection) -> None:
    """Smaller index leaves (FTS_PAGE_SIZE). Existing segments keep their leaves until a
    merge rewrites them; FTS5 reads leaves of either size."""
    conn.execute(
        "INSERT INTO messages_fts(messages_fts, rank) VALUES ('pgsz', ?)", (FTS_PAGE_SIZE,)
    )


MIGRATIONS: list[tuple[int, Callable[[sqlite3.Connection], None]]] = [
    (1, _migration_1),
    (2, _migration_2),
    (3, _migration_3),
    (4, _migration_4),
    (5, _migration_5),
    (6, _migration_6),
    (7, _migration_7),
    (8, _migration_8),
]
LATEST = MIGRATIONS[-1][0]


def _refresh_stale_statistics(conn: sqlite3.Connection) -> None:
    """If planner statistics exist but miss an index (one added after the last ANALYZE),
    the planner can prefer that index blindly; re-analyse the tables concerned."""
    if not _table_exists(conn, "sqlite_stat1"):
        return
    stale = conn.execute(
        "SELECT DISTINCT m.tbl_name FROM sqlite_master m WHERE m.type = 'index' "
        "AND m.tbl_name IN ('sessions', 'messages') "
        "AND m.tbl_name IN (SELECT tbl FROM sqlite_stat1) "
        "AND m.name NOT IN (SELECT idx FROM sqlite_stat1 WHERE idx IS NOT NULL)"
    ).fetchall()
    for (table,) in stale:
        log.info("refreshing planner statistics for %s", table)
        conn.execute(f"ANALYZE {table}")


def current_version(conn: sqlite3.Connection) -> int:
    if not _table_exists(conn, "state_meta"):
        return 0
    row = conn.execute("SELECT value FROM state_meta WHERE key = ?", (META_VERSION_KEY,)).fetchone()
    return int(row[0]) if row else 0


def migrate(conn: sqlite3.Connection, path: str, *, target: int = LATEST) -> int:
    """Bring the file up to `target` inside one IMMEDIATE transaction. Returns the version.

    The caller holds no transaction. Raises SchemaTooNew for files from a newer switchboard.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = current_version(conn)
        if found > LATEST:
            raise SchemaTooNew(path, found, LATEST)
        fresh = not _table_exists(conn, "sessions")
        for version, step in MIGRATIONS:
            if found < version <= target:
                # a new file's steps are one creation, not news; an older file's are
                log.log(logging.DEBUG if fresh else logging.INFO,
                        "migrating %s to schema %d", path, version)  # fmt: skip
                step(conn)
                conn.execute(
                    "INSERT INTO state_meta(key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (META_VERSION_KEY, str(version)),
                )
        if found < target:
            # Only a migration adds indexes. (Checking on every open re-analysed the table
            # each time: an empty partial index, such as idx_sessions_handoff, never gets
            # a statistics row; 83 ms per start-up at 100k sessions.)
            _refresh_stale_statistics(conn)
        if fresh:
            # A file we created: its schema_version is ours to keep.
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version(version) VALUES (?)", (target,))
            conn.execute(
                "INSERT OR REPLACE INTO state_meta(key, value) VALUES ('switchboard.owns_schema_version', '1')"
            )
        elif conn.execute(
            "SELECT 1 FROM state_meta WHERE key = 'switchboard.owns_schema_version'"
        ).fetchone():
            conn.execute("UPDATE schema_version SET version = ?", (target,))
        conn.execute("COMMIT")
        return max(found, target)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
