"""Opening files: fresh, older switchboard, Hermes Agent's state.db, newer switchboard,
and files that are not (or no longer) databases."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from state import DatabaseError, SchemaTooNew, SessionDB
from state.sqlite import routing, schema
from tests.state.legacy_files import make_switchboard_8_file

HERMES_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (9);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, model TEXT, model_config TEXT,
    system_prompt TEXT, parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL,
    end_reason TEXT, message_count INTEGER DEFAULT 0, tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0, title TEXT,
    hermes_only_column TEXT, FOREIGN KEY (parent_session_id) REFERENCES sessions(id));
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT,
    timestamp REAL NOT NULL, token_count INTEGER, finish_reason TEXT, hermes_flags TEXT);
CREATE UNIQUE INDEX idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL;
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, content_rowid=id);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content); END;
CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END;
CREATE TABLE cron_jobs (id TEXT PRIMARY KEY, spec TEXT);
INSERT INTO cron_jobs VALUES ('job1', '0 9 * * *');
INSERT INTO sessions (id, source, model, started_at, ended_at, end_reason, message_count,
    title, hermes_only_column) VALUES
    ('20250101_090000_aaaaaaaa', 'telegram', 'm1', 1735722000.0, 1735725600.0, 'compression', 2,
     'Hermes Title', 'keep me'),
    ('20250101_100000_bbbbbbbb', 'telegram', 'm1', 1735725600.0, NULL, NULL, 1,
     'Hermes Title #2', NULL),
    ('20250102_090000_cccccc', 'cli', NULL, 1735808400.0, NULL, NULL, 1, NULL, NULL);
UPDATE sessions SET parent_session_id = '20250101_090000_aaaaaaaa' WHERE id = '20250101_100000_bbbbbbbb';
INSERT INTO messages (session_id, role, content, timestamp, hermes_flags) VALUES
    ('20250101_090000_aaaaaaaa', 'user', 'deploy the flux capacitor', 1735722001.0, 'x'),
    ('20250101_090000_aaaaaaaa', 'assistant', 'flux deployed', 1735722002.0, NULL),
    ('20250101_100000_bbbbbbbb', 'user', '修改youer服务端', 1735725601.0, NULL),
    ('20250102_090000_cccccc', 'user', 'terminal question', 1735808401.0, NULL);
"""


def _make_hermes_db(path: Path) -> dict[str, list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    conn.executescript(HERMES_SCHEMA)
    conn.commit()
    snapshot = _snapshot(conn)
    conn.close()
    return snapshot


def _snapshot(conn: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
    """The Hermes-owned data, column by column, as Hermes wrote it."""
    cols_s = "id, source, user_id, model, parent_session_id, started_at, ended_at, end_reason, message_count, title, hermes_only_column"
    cols_m = "id, session_id, role, content, timestamp, hermes_flags"
    return {
        "sessions": conn.execute(f"SELECT {cols_s} FROM sessions ORDER BY id").fetchall(),
        "messages": conn.execute(f"SELECT {cols_m} FROM messages ORDER BY id").fetchall(),
        "cron_jobs": conn.execute("SELECT * FROM cron_jobs").fetchall(),
        "schema_version": conn.execute("SELECT version FROM schema_version").fetchall(),
        "fts": conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE name LIKE 'messages_fts%' ORDER BY name"
        ).fetchall(),
    }


async def test_fresh_file_gets_the_latest_schema(tmp_path: Path) -> None:
    db = await SessionDB.open(tmp_path / "home" / "state.db")
    await db.close()
    conn = sqlite3.connect(tmp_path / "home" / "state.db")
    assert schema.current_version(conn) == schema.LATEST
    # Hermes Agent's counter stays empty: Hermes records its own number at its first open
    assert conn.execute("SELECT version FROM schema_version").fetchall() == []
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cols = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
    assert {"session_key", "chat_id", "handoff_state", "child_kind", "last_active", "title"} <= cols
    conn.close()


async def test_older_switchboard_file_migrates_in_place(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    old = await SessionDB.open(path, schema_target=1)
    await old.close()
    # rows as a schema-1 switchboard wrote them (no side index existed yet)
    sid = "20250301_080000_0a0b0c0d"
    conn = sqlite3.connect(path)
    assert schema.current_version(conn) == 1
    conn.execute(
        "INSERT INTO sessions(id, source, started_at, last_active, title, title_key, message_count) "
        "VALUES (?, 'api', 1740816000, 1740816001, 'old one', 'old one', 1)",
        (sid,),
    )
    conn.execute(
        "INSERT INTO messages(session_id, role, content, timestamp) VALUES (?, 'user', ?, 1740816001)",
        (sid, "旧消息 with emoji 🎉"),
    )
    conn.commit()
    conn.close()

    db = await SessionDB.open(path)
    try:
        assert [m["content"] for m in await db.get_messages(sid)] == ["旧消息 with emoji 🎉"]
        # migration 2 indexed the old CJK/emoji message in the side index
        assert [h["session_id"] for h in await db.search_messages("消息")] == [sid]
        assert [h["session_id"] for h in await db.search_messages("🎉")] == [sid]
    finally:
        await db.close()
    conn = sqlite3.connect(path)
    assert schema.current_version(conn) == schema.LATEST
    conn.close()


async def test_search_index_leaves_shrink_in_place_and_old_and_new_segments_stay_searchable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    sid = "20250301_080000_0a0b0c0d"
    words = " ".join(f"filler{i}" for i in range(40))
    await make_switchboard_8_file(path, sid, [f"oldword {words}"] * 400)

    def leaves(conn: sqlite3.Connection) -> int:
        # id > 10 skips the structure and averages records; what is left are segment leaves
        return conn.execute(
            "SELECT MAX(length(block)) FROM sb_messages_fts_data WHERE id > 10"
        ).fetchone()[0]

    conn = sqlite3.connect(path)
    assert (
        conn.execute("SELECT MAX(length(block)) FROM messages_fts_data WHERE id > 10").fetchone()[0]
        > 2 * schema.FTS_PAGE_SIZE
    )  # written with FTS5's default 4,050-byte leaves
    conn.close()

    db = await SessionDB.open(path)
    try:
        await db.append_messages(sid, [{"role": "user", "content": f"newword {words}"}] * 400)
        assert len(await db.search_messages("oldword", limit=1000)) == 400
        assert len(await db.search_messages("newword", limit=1000)) == 400
    finally:
        await db.close()
    conn = sqlite3.connect(path)
    # the old index was moved under switchboard's own name, not rebuilt
    assert (
        conn.execute("SELECT name FROM sqlite_master WHERE name = 'messages_fts'").fetchall() == []
    )
    assert conn.execute("SELECT v FROM sb_messages_fts_config WHERE k = 'pgsz'").fetchone() == (
        schema.FTS_PAGE_SIZE,
    )
    conn.execute("INSERT INTO sb_messages_fts(sb_messages_fts) VALUES ('integrity-check')")
    # a full merge rewrites the old segment with the new leaf size, and still checks out
    conn.execute("INSERT INTO sb_messages_fts(sb_messages_fts) VALUES ('optimize')")
    conn.execute("INSERT INTO sb_messages_fts(sb_messages_fts) VALUES ('integrity-check')")
    conn.commit()
    assert leaves(conn) < 2 * schema.FTS_PAGE_SIZE
    assert conn.execute(
        "SELECT COUNT(*) FROM sb_messages_fts WHERE sb_messages_fts MATCH 'oldword OR newword'"
    ).fetchone() == (800,)
    conn.close()


async def test_hermes_state_db_opens_works_and_keeps_all_its_data(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    before = _make_hermes_db(path)
    db = await SessionDB.open(path)
    try:
        # reads
        s = await db.get_session("20250101_090000_aaaaaaaa")
        assert (
            s is not None and s["hermes_only_column"] == "keep me" and s["title"] == "Hermes Title"
        )
        assert await db.resolve_session_by_title("hermes title") == "20250101_100000_bbbbbbbb"
        assert (
            await db.get_compression_tip("20250101_090000_aaaaaaaa") == "20250101_100000_bbbbbbbb"
        )
        assert [h["id"] for h in await db.search_messages("flux")] == [2, 1] or [
            h["id"] for h in await db.search_messages("flux")
        ] == [1, 2]
        assert [h["session_id"] for h in await db.search_messages("服务端")] == [
            "20250101_100000_bbbbbbbb"
        ]
        listed = await db.list_sessions()  # the compression chain shows as its live tip
        assert {r["id"] for r in listed} == {"20250101_100000_bbbbbbbb", "20250102_090000_cccccc"}
        assert all(r["last_active"] for r in listed)
        assert next(r for r in listed if r["source"] == "cli")["preview"] == "terminal question"
    finally:
        await db.close()
    conn = sqlite3.connect(path)
    after = _snapshot(conn)
    triggers = conn.execute(
        "SELECT name FROM sqlite_master WHERE type='trigger' AND sql LIKE '%messages_fts(%'"
    ).fetchall()
    conn.close()
    assert after["schema_version"] == [(9,)]  # Hermes' own counter is not touched
    assert after["cron_jobs"] == before["cron_jobs"]
    assert after["sessions"] == before["sessions"]
    assert after["messages"][: len(before["messages"])] == before["messages"]
    # Hermes' index and triggers are left as they were; switchboard's have names of their own
    assert sorted(t[0] for t in triggers) == [
        "messages_fts_delete",
        "messages_fts_insert",
        "messages_fts_update",
        "sb_messages_fts_ad",
        "sb_messages_fts_ai",
        "sb_messages_fts_au",
    ]
    assert after["fts"] == before["fts"]
    # Writes go through Hermes' existing FTS triggers exactly once.
    db = await SessionDB.open(path)
    try:
        mid = await db.append_message("20250102_090000_cccccc", "assistant", "unique-zebra answer")
        assert [h["id"] for h in await db.search_messages("zebra")] == [mid]
        assert await db.check_search_index() == []
        with pytest.raises(Exception, match="already in use"):
            await db.set_session_title("20250102_090000_cccccc", "HERMES TITLE")
        row = await db.get_session("20250102_090000_cccccc")
        assert row is not None and row["message_count"] == 2
    finally:
        await db.close()


async def test_file_from_a_newer_switchboard_is_refused_naming_both_versions(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    db = await SessionDB.open(path)
    await db.set_meta(schema.META_VERSION_KEY, str(schema.LATEST + 5))
    await db.close()
    with pytest.raises(SchemaTooNew) as err:
        await SessionDB.open(path)
    msg = str(err.value)
    assert str(path) in msg and str(schema.LATEST + 5) in msg and str(schema.LATEST) in msg


@pytest.mark.parametrize(
    "content, phrase",
    [
        (b"this is a text file, not a database\n" * 10, "not an SQLite database"),
        (b"SQLite format 3\x00" + b"\xff" * 4000, "damaged"),
    ],
)
async def test_a_file_that_is_not_a_usable_database_gets_a_clear_error(
    tmp_path: Path, content: bytes, phrase: str
) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(content)
    with pytest.raises(DatabaseError) as err:
        await SessionDB.open(path)
    assert str(path) in str(err.value) and phrase in str(err.value)
    assert path.read_bytes() == content  # nothing was overwritten


async def test_a_directory_in_place_of_the_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "state.db").mkdir()
    with pytest.raises(DatabaseError, match="is a directory"):
        await SessionDB.open(tmp_path / "state.db")


async def test_corrupted_pages_are_reported_not_silently_empty(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = await SessionDB.open(path)
    sid = await db.create_session(source="api")
    for i in range(300):
        await db.append_message(sid, "user", f"message number {i} " * 20)
    await db.checkpoint("TRUNCATE")
    await db.close()
    raw = bytearray(path.read_bytes())
    page = 4096
    for off in range(2 * page, len(raw), page):  # wreck every page after the schema page
        raw[off : off + 64] = b"\xde\xad\xbe\xef" * 16
    path.write_bytes(bytes(raw))
    try:
        db = await SessionDB.open(path)
    except DatabaseError as exc:
        assert str(path) in str(exc)
        return
    try:
        problems = await db.integrity_check(quick=False)
        assert problems, "a wrecked file must not look healthy"
    finally:
        await db.close()


def _stat(path: Path, index: str) -> str | None:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT stat FROM sqlite_stat1 WHERE idx = ?", (index,)).fetchone()
        return row[0] if row else None
    finally:
        conn.close()


async def test_planner_statistics_are_refreshed_after_a_migration_not_on_every_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    old = await SessionDB.open(path, schema_target=4)  # before idx_messages_session_pmid
    sid = await old.create_session(source="telegram", chat_id="1")
    for i in range(30):
        await old.append_message(sid, "user", f"m{i}", platform_message_id=str(i))
    for _ in range(199):
        await old.create_session(source="telegram")
    await old.close()
    conn = sqlite3.connect(path)
    conn.execute("ANALYZE")
    conn.commit()
    conn.close()
    assert _stat(path, "idx_messages_session_pmid") is None

    db = await SessionDB.open(path)  # migrates: the new index gets its statistics
    await db.close()
    assert _stat(path, "idx_messages_session_pmid") is not None
    before = _stat(path, "idx_sessions_started")
    assert before is not None and before.startswith("200 ")

    # Plain opens leave the statistics alone, although the empty partial index
    # idx_sessions_handoff never has a row of its own.
    assert _stat(path, "idx_sessions_handoff") is None
    for _ in range(2):
        db = await SessionDB.open(path)
        for _ in range(25):
            await db.create_session(source="telegram")
        await db.close()
    assert _stat(path, "idx_sessions_started") == before


def _another_program_writes(path: Path, sessions: int, titled: int) -> None:
    """sqlite3 alone, knowing nothing of switchboard: one user message per session, and a
    title on the first `titled` sessions."""
    conn = sqlite3.connect(path)
    for i in range(sessions):
        conn.execute(
            "INSERT INTO sessions(id, source, started_at, title) VALUES (?, 'cli', ?, ?)",
            (f"o{i}", 1000.0 + i, f"Other Title {i}" if i < titled else None),
        )
        conn.execute(
            "INSERT INTO messages(session_id, role, content, timestamp) VALUES (?, 'user', ?, ?)",
            (f"o{i}", f"question number {i}", 1000.0 + i),
        )
    conn.commit()
    conn.close()


async def test_a_backlog_other_programs_wrote_is_indexed_after_open_not_during(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    await (await SessionDB.open(path)).close()
    _another_program_writes(path, sessions=30, titled=5)
    db = await SessionDB.open(path, absorb_at_open=10)
    try:
        previews = {r["id"]: r["preview"] for r in await db.list_sessions(limit=100)}
        assert sum(p is not None for p in previews.values()) == 10  # the open's bound
        for i in range(5):  # every title is resolved before open returns, whatever the bound
            assert await db.resolve_session_by_title(f"other title {i}") == f"o{i}"
        left: list[int] = []
        assert await db.catch_up(left.append) == 20
        # told before the first batch, after each, and at the end
        assert left[0] == 20 and left[-1] == 0 and left == sorted(left, reverse=True)
        previews = {r["id"]: r["preview"] for r in await db.list_sessions(limit=100)}
        assert previews == {f"o{i}": f"question number {i}" for i in range(30)}
        assert await db.check_search_index() == []
        assert await db.catch_up() == 0
    finally:
        await db.close()
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO messages(session_id, role, content, timestamp) VALUES "
        "('o0', 'tool', 'x', 2000), ('o1', 'tool', 'y', 2001)"
    )
    conn.commit()
    conn.close()
    db = await SessionDB.open(path)  # without a bound, open indexes all of it itself
    try:
        assert await db.catch_up() == 0
    finally:
        await db.close()


def _vm_steps(path: Path, fn: Callable[[sqlite3.Connection], object]) -> int:
    """How much work SQLite does for `fn` (virtual-machine steps, counted per 10)."""
    conn = sqlite3.connect(path)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, 10)
    fn(conn)
    conn.close()
    return steps


async def test_start_up_reads_the_live_sessions_without_reading_the_ended_ones(
    tmp_path: Path,
) -> None:
    """The session index and the untold resets read at start-up do work in proportion to
    the live sessions: 3,000 ended sessions beside the same 20 live ones add nothing."""
    small, large = tmp_path / "small.db", tmp_path / "large.db"
    for path, ended in ((small, 0), (large, 3000)):
        db = await SessionDB.open(path)
        for i in range(ended):
            await db.create_session(f"e{i}", "api", session_key=f"agent:main:api:dm:{i % 40}")
            await db.end_session(f"e{i}", "idle")
        for i in range(20):
            await db.create_session(f"l{i}", "api", session_key=f"agent:main:api:dm:{i}")
        await db.close()
    for fn in (
        routing.live_sessions_by_key,
        routing.newest_live_session_by_key,
        routing.untold_resets,
    ):
        assert len(fn(sqlite3.connect(large))) == len(fn(sqlite3.connect(small)))
        assert _vm_steps(large, fn) <= 2 * _vm_steps(small, fn) + 20, fn.__name__
