"""The state.db schema and its numbered migrations.

switchboard's own schema version lives in `state_meta` under `switchboard.schema_version`,
so a state.db created by Hermes Agent (whose `schema_version` table counts *its* migrations)
can be opened: every migration only adds what is missing and never rewrites foreign data.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from ..columns import MESSAGE_COLUMNS, META_VERSION_KEY, SESSION_COLUMNS  # noqa: F401
from ..errors import DatabaseError, SchemaTooNew
from ..hermes import foreign
from ..rows import exec_script
from ..textindex import aux_row
from ..titles import lineage_key, title_key
from . import activity, inbox, pairing, sends

log = logging.getLogger("state.schema")

OWNS_SCHEMA_VERSION_KEY = "switchboard.owns_schema_version"  # set by schema <= 8 only

# switchboard's main search index. Hermes Agent names its own (differently defined) index
# `messages_fts` with triggers `messages_fts_insert/_delete/_update` and repairs them at every
# start, so switchboard's objects use names Hermes never touches.
FTS_TABLE = "sb_messages_fts"
_LEGACY_FTS_TRIGGERS = ("messages_fts_insert", "messages_fts_delete", "messages_fts_update")

# Hermes Agent 0.19 tables (schema 10): per-model usage, compression leases, the gateway's
# routing entries and delegations. Same definitions as Hermes, so either program can use them.
HERMES_TABLES_SQL = """
CREATE TABLE IF NOT EXISTS session_model_usage (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    model TEXT NOT NULL,
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
    api_call_count INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd REAL NOT NULL DEFAULT 0,
    actual_cost_usd REAL NOT NULL DEFAULT 0,
    cost_status TEXT,
    cost_source TEXT,
    first_seen REAL,
    last_seen REAL,
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task)
);
CREATE INDEX IF NOT EXISTS idx_session_model_usage_session ON session_model_usage(session_id);
CREATE INDEX IF NOT EXISTS idx_session_model_usage_model ON session_model_usage(model);
CREATE TABLE IF NOT EXISTS gateway_routing (
    scope TEXT NOT NULL DEFAULT '',
    session_key TEXT NOT NULL,
    entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope, session_key)
);
CREATE TABLE IF NOT EXISTS compression_locks (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_compression_locks_expires ON compression_locks(expires_at);
CREATE TABLE IF NOT EXISTS async_delegations (
    delegation_id TEXT PRIMARY KEY,
    origin_session TEXT NOT NULL,
    origin_ui_session_id TEXT NOT NULL DEFAULT '',
    parent_session_id TEXT,
    state TEXT NOT NULL,
    dispatched_at REAL NOT NULL,
    completed_at REAL,
    updated_at REAL NOT NULL,
    event_json TEXT,
    result_json TEXT,
    delivery_state TEXT NOT NULL DEFAULT 'pending',
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    delivered_at REAL,
    owner_pid INTEGER,
    owner_started_at INTEGER,
    task_json TEXT,
    delivery_claim TEXT,
    delivery_claimed_at REAL
);
CREATE INDEX IF NOT EXISTS idx_async_delegations_delivery
    ON async_delegations(delivery_state, completed_at);
"""

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


def ensure_title_index(conn: sqlite3.Connection) -> int:
    """The unique index on titles, created if missing. Files written without it (old Hermes
    Agent versions) may hold duplicates: the newest row keeps the title, older rows lose it,
    no session is deleted. Returns how many titles were cleared."""
    sql = (
        "CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique ON sessions(title) "
        "WHERE title IS NOT NULL"
    )
    try:
        conn.execute(sql)
        return 0
    except sqlite3.IntegrityError:
        have = _columns(conn, "sessions")
        derived = [c for c in ("title_key", "title_base", "title_number") if c in have]
        sets = ", ".join(["title = NULL", *(f"{c} = NULL" for c in derived)])
        cleared = conn.execute(
            f"UPDATE sessions SET {sets} WHERE title IS NOT NULL AND EXISTS (SELECT 1 FROM "
            "sessions n WHERE n.title = sessions.title AND n.rowid > sessions.rowid)"
        ).rowcount
        log.warning("cleared %d duplicate session titles to restore their unique index", cleared)
        conn.execute(sql)
        return cleared


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
    ensure_title_index(conn)
    # The main search index and its triggers are migration 9's (sb_messages_fts): the
    # names Hermes Agent uses for its own index are left to it.
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
    exec_script(
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


def _create_messages_fts(conn: sqlite3.Connection, prefixes: str, name: str = FTS_TABLE) -> None:
    option = f", prefix='{prefixes}'" if prefixes else ""
    conn.execute(
        f"CREATE VIRTUAL TABLE {name} USING fts5(content, content=messages, "
        f"content_rowid=id{option})"
    )
    # Merge segments in larger steps: group commits write many small segments, and
    # automerge=8 measured 10-15% faster appends than the default 4 (bench/).
    conn.execute(f"INSERT INTO {name}({name}, rank) VALUES ('automerge', 8)")
    conn.execute(f"INSERT INTO {name}({name}) VALUES ('rebuild')")


def _migration_6(conn: sqlite3.Connection) -> None:
    """Every per-session message read orders by id, so (session_id, timestamp) only cost a
    random index page per append; (session_id, id) serves them all."""
    conn.execute("DROP INDEX IF EXISTS idx_messages_session")


def _migration_7(conn: sqlite3.Connection) -> None:
    """Nothing: switchboard's index with prefix indexes is migration 9's, under a name of
    its own (the number stays so files keep counting the same way)."""


# FTS5 merges segments in quanta of 64 leaf pages per level, inside whichever commit crosses
# the quantum's write counter; with 4,050-byte leaves (the default) one quantum took ~20 ms
# and set the append p99 at 2,000 appends/s (35 ms). 1,000-byte leaves make each quantum a
# quarter of the work: p99 11-13 ms, 1.5% more bytes per message, the same query latency
# on a million messages (bench/state_bench.py, bench/search_bench.py).
FTS_PAGE_SIZE = 1000


def _migration_8(conn: sqlite3.Connection) -> None:
    """Nothing: migration 9 creates sb_messages_fts with the smaller leaves."""


def _own_legacy_fts(conn: sqlite3.Connection) -> str | None:
    """The SQL of a `messages_fts` that switchboard (schema <= 8) made, else None.

    Schema 7 rebuilt the table with a prefix index, which no Hermes version declares; on a
    file switchboard created, the table is its own whatever its shape."""
    row = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'messages_fts' AND type = 'table'"
    ).fetchone()
    if row is None:
        return None
    sql = row[0] or ""
    owns = conn.execute(
        "SELECT 1 FROM state_meta WHERE key = ?", (OWNS_SCHEMA_VERSION_KEY,)
    ).fetchone()
    return sql if ("prefix=" in sql or owns is not None) else None


_FTS_TRIGGERS_SQL = """
CREATE TRIGGER IF NOT EXISTS sb_messages_fts_ai AFTER INSERT ON messages BEGIN
    INSERT INTO sb_messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER IF NOT EXISTS sb_messages_fts_ad AFTER DELETE ON messages BEGIN
    INSERT INTO sb_messages_fts(sb_messages_fts, rowid, content)
    VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER IF NOT EXISTS sb_messages_fts_au AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO sb_messages_fts(sb_messages_fts, rowid, content)
    VALUES ('delete', old.id, old.content);
    INSERT INTO sb_messages_fts(rowid, content) VALUES (new.id, new.content);
END;
"""


def _legacy_triggers_are_ours(conn: sqlite3.Connection) -> bool:
    """All three legacy triggers exist with switchboard's external-content bodies (a file
    Hermes <= v10 wrote has only an insert trigger; Hermes >= v11 deletes by rowid)."""
    rows = dict(
        conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name IN (?, ?, ?)",
            _LEGACY_FTS_TRIGGERS,
        ).fetchall()
    )
    if set(rows) != set(_LEGACY_FTS_TRIGGERS):
        return False
    deletes = "VALUES ('delete', old.id, old.content)"
    return all(
        deletes in (rows[name] or "") for name in ("messages_fts_delete", "messages_fts_update")
    ) and "new.content" in (rows["messages_fts_insert"] or "")


def _migration_9(conn: sqlite3.Connection) -> None:
    """Share a file with Hermes Agent without harming either side.

    * switchboard's index becomes `sb_messages_fts` with `sb_` triggers; a `messages_fts`
      switchboard made is moved (kept, when all three of its triggers are intact) or dropped
      together with every trigger of that name, so Hermes recreates its own at its next
      start. A `messages_fts` of Hermes's is left exactly as it is.
    * the number switchboard <= 8 wrote into Hermes's `schema_version` is removed: Hermes
      then records its own version once instead of replaying its migrations at every start.
    * `messages.sb_written` marks rows switchboard wrote; triggers queue other programs' rows
      for the derived columns (state.hermes.foreign).
    """
    legacy = _own_legacy_fts(conn)
    have_new = _table_exists(conn, FTS_TABLE)
    if legacy is not None:
        intact = "prefix=" in legacy and _legacy_triggers_are_ours(conn)
        for name in _LEGACY_FTS_TRIGGERS:
            conn.execute(f"DROP TRIGGER IF EXISTS {name}")
        if intact and not have_new:
            conn.execute(f"ALTER TABLE messages_fts RENAME TO {FTS_TABLE}")
            have_new = True
        else:
            conn.execute("DROP TABLE messages_fts")
    if not have_new:
        (count,) = conn.execute("SELECT COUNT(*) FROM messages").fetchone()
        if count > 50_000:
            log.info("building the search index (%d messages)", count)
        _create_messages_fts(conn, FTS_PREFIXES)
    conn.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rank) VALUES ('pgsz', ?)", (FTS_PAGE_SIZE,))
    exec_script(conn, _FTS_TRIGGERS_SQL)
    if "sb_written" not in _columns(conn, "messages"):
        conn.execute("ALTER TABLE messages ADD COLUMN sb_written INTEGER")
    if conn.execute(
        "SELECT 1 FROM state_meta WHERE key = ?", (OWNS_SCHEMA_VERSION_KEY,)
    ).fetchone():
        conn.execute("DELETE FROM schema_version")
        conn.execute("DELETE FROM state_meta WHERE key = ?", (OWNS_SCHEMA_VERSION_KEY,))
    foreign.install(conn)


def _migration_10(conn: sqlite3.Connection) -> None:
    """Every column and table of Hermes Agent 0.19's store (rows Hermes left NULL in
    `active` count as active, as Hermes heals them)."""
    _ensure_table(conn, "sessions", SESSION_COLUMNS)
    _ensure_table(conn, "messages", MESSAGE_COLUMNS)
    exec_script(conn, HERMES_TABLES_SQL)
    conn.execute(
        "CREATE INDEX IF NOT EXISTS idx_messages_active_null ON messages(active) "
        "WHERE active IS NULL"
    )
    conn.execute("UPDATE messages SET active = 1 WHERE active IS NULL")


def _migration_11(conn: sqlite3.Connection) -> None:
    """Hourly message tallies for insights (state.sqlite.activity), and the dashboard's chat-type
    filter as an index walk in either sort order: a rare or absent chat type otherwise
    scans every session."""
    (count,) = conn.execute("SELECT COUNT(*) FROM messages").fetchone()
    if count > 50_000:
        log.info("tallying activity per hour (%d messages)", count)
    activity.install(conn)
    conn.execute(
        "CREATE INDEX IF NOT EXISTS idx_sessions_chat_type_active "
        "ON sessions(chat_type, last_active DESC) WHERE chat_type IS NOT NULL"
    )
    conn.execute(
        "CREATE INDEX IF NOT EXISTS idx_sessions_chat_type_started "
        "ON sessions(chat_type, started_at DESC) WHERE chat_type IS NOT NULL"
    )


def _migration_12(conn: sqlite3.Connection) -> None:
    """The inbox (state.sqlite.inbox): inbound messages committed before the platform is
    acknowledged, with how far each turn got."""
    exec_script(conn, inbox.CREATE_SQL)


def _migration_13(conn: sqlite3.Connection) -> None:
    """The operator's tables: DM pairing (state.sqlite.pairing: one-time codes for unknown users
    and the decisions on them) and the outbox of one-off sends (state.sqlite.sends)."""
    exec_script(conn, pairing.CREATE_SQL)
    exec_script(conn, sends.CREATE_SQL)


def _migration_14(conn: sqlite3.Connection) -> None:
    """The live sessions with a key, indexed apart: start-up reads them (the session index,
    the untold resets) in time that grows with the live sessions, not the stored ones."""
    conn.execute(
        "CREATE INDEX IF NOT EXISTS idx_sessions_live ON sessions(session_key, started_at) "
        "WHERE session_key IS NOT NULL AND ended_at IS NULL"
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
    (9, _migration_9),
    (10, _migration_10),
    (11, _migration_11),
    (12, _migration_12),
    (13, _migration_13),
    (14, _migration_14),
]
LATEST = MIGRATIONS[-1][0]


def _refresh_stale_statistics(conn: sqlite3.Connection) -> None:
    """If planner statistics exist but miss an index (one added after the last ANALYZE),
    the planner can prefer that index blindly; analyse those indexes. One index at a time,
    not its table: the work is the index's size (a partial index's few rows), not every
    message in the store."""
    if not _table_exists(conn, "sqlite_stat1"):
        return
    stale = conn.execute(
        "SELECT m.name FROM sqlite_master m WHERE m.type = 'index' "
        "AND m.tbl_name IN ('sessions', 'messages') "
        "AND m.tbl_name IN (SELECT tbl FROM sqlite_stat1) "
        "AND m.name NOT IN (SELECT idx FROM sqlite_stat1 WHERE idx IS NOT NULL)"
    ).fetchall()
    if stale:
        log.debug("refreshing planner statistics for %s", ", ".join(i for (i,) in stale))
    for (index,) in stale:
        conn.execute(f'ANALYZE "{index}"')


def current_version(conn: sqlite3.Connection) -> int:
    if not _table_exists(conn, "state_meta"):
        return 0
    row = conn.execute("SELECT value FROM state_meta WHERE key = ?", (META_VERSION_KEY,)).fetchone()
    return int(row[0]) if row else 0


def migrate(
    conn: sqlite3.Connection, path: str, *, target: int = LATEST, absorb_limit: int | None = None
) -> int:
    """Bring the file up to `target` inside one IMMEDIATE transaction. Returns the version.
    Rows another program wrote get their derived values: every title, and the messages up
    to `absorb_limit` (None: all; the rest wait for later write batches).

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
                log.log(
                    logging.DEBUG if fresh else logging.INFO,
                    "migrating %s to schema %d",
                    path,
                    version,
                )
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
        # Hermes Agent's `schema_version` is never written: an empty table makes Hermes
        # record its own number once, a number of ours made it replay its migrations.
        if found >= 1:
            ensure_title_index(conn)  # another program may have dropped it
        if found >= 10:
            # Hermes's inserts may leave `active` NULL on legacy columns without a default.
            conn.execute("UPDATE messages SET active = 1 WHERE active IS NULL")
        if target >= 9:
            foreign.absorb(conn, limit=None, kind="title")
            foreign.absorb(conn, limit=absorb_limit, kind="message")
        conn.execute("COMMIT")
        return max(found, target)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
