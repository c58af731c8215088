"""One state.db opened in turn by the real Hermes Agent 0.19.0 (from the package registry,
run in a subprocess) and by switchboard, both writing: nothing lost, nothing re-indexed
twice, each program's search finds the other's rows, derived values exist for Hermes's rows.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from state import SessionDB, TitleTaken
from tests.hermes_pkg import run_hermes

IMAGE = [{"type": "text", "text": "look at this"}, {"type": "image_url", "image_url": {"url": "x"}}]


async def _switchboard_turn(path: Path) -> dict[str, object]:
    """switchboard reads Hermes's rows, then writes its own."""
    db = await SessionDB.open(path)
    try:
        listed = {r["id"]: r for r in await db.list_sessions(limit=50)}
        h1 = listed["h1"]
        got = {
            "h1_last_active": h1["last_active"],
            "h1_preview": h1["preview"],
            "hermes_word": [h["session_id"] for h in await db.search_messages("hermesword")],
            "hermes_cjk": [h["session_id"] for h in await db.search_messages("服务端")],
            "hermes_tool": [
                h["session_id"] for h in await db.search_messages("web_lookup", roles=["tool"])
            ],
            "hermes_image": [m["content"] for m in await db.get_messages("h1")][-1],
        }
        if "s1" not in listed:
            await db.create_session("s1", "telegram")
            await db.append_message("s1", "user", "switchboardword question")
            await db.append_message("s1", "user", IMAGE)
            await db.append_messages("s1", [{"role": "assistant", "content": IMAGE}] * 2)
        with pytest.raises(TitleTaken):
            await db.set_session_title("s1", "SHARED TITLE")  # Hermes set "shared title"
        got["own_index"] = await db.check_search_index()
        return got
    finally:
        await db.close()


_HERMES_WRITES = """
db.create_session("h1", "cli")
db.append_message("h1", "user", "hermesword first question\\nsecond line")
db.append_message("h1", "assistant", "修改服务端配置")
db.append_message("h1", "tool", "result text", tool_name="web_lookup", tool_call_id="c1")
db.append_message("h1", "user", [{"type": "text", "text": "look at this"},
                                   {"type": "image_url", "image_url": {"url": "x"}}])
db.set_session_title("h1", "shared title")
"""

_HERMES_READS = """
out = {
    "sb_word": [h["session_id"] for h in db.search_messages("switchboardword")],
    "s1_contents": [m["content"] for m in db.get_messages("s1")],
    "h1_count": len(db.get_messages("h1")),
    "integrity": [r[0] for r in db._conn.execute(
        "INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)"
    ).fetchall()],
}
"""


async def test_hermes_and_switchboard_take_turns_on_one_file(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first = run_hermes(path, _HERMES_WRITES)
    assert first["version_after"] == [22]

    got = await _switchboard_turn(path)
    assert got["h1_last_active"] is not None
    assert got["h1_preview"] == "hermesword first question second line"
    assert got["hermes_word"] == ["h1"] and got["hermes_cjk"] == ["h1"]
    assert got["hermes_tool"] == ["h1"]
    assert got["hermes_image"] == IMAGE
    assert got["own_index"] == []

    for _ in range(2):
        seen = run_hermes(path, _HERMES_READS)
        # Hermes finds its own number and repairs nothing: no replayed migration, no rebuild
        assert seen["version_before"] == [22] and seen["rebuilds"] == 0
        out = seen["out"]
        assert out["sb_word"] == ["s1"]
        assert out["s1_contents"] == ["switchboardword question", IMAGE, IMAGE, IMAGE]
        assert out["h1_count"] == 4
        again = await _switchboard_turn(path)
        assert again == got

    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone() == (8,)
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(22,)]
    conn.close()


async def test_a_file_switchboard_created_is_indexed_by_hermes_once(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = await SessionDB.open(path)
    await db.create_session("s0", "api")
    await db.append_message("s0", "user", "earlyword from switchboard")
    await db.close()

    first = run_hermes(path, 'out = [h["session_id"] for h in db.search_messages("earlyword")]')
    # an empty schema_version: Hermes records 22 and builds its own index from the rows once
    assert first["version_before"] == [] and first["version_after"] == [22]
    assert first["out"] == ["s0"]
    db = await SessionDB.open(path)
    await db.append_message("s0", "assistant", "laterword from switchboard")
    await db.close()
    second = run_hermes(path, 'out = [h["session_id"] for h in db.search_messages("laterword")]')
    assert second["version_before"] == [22] and second["rebuilds"] == 0
    assert second["out"] == ["s0"]


# A Hermes <= v10 file: external-content index with an insert trigger only.
_HERMES_V10 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (10);
CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, model TEXT,
    started_at REAL NOT NULL, ended_at REAL, end_reason TEXT, message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0, title TEXT, parent_session_id TEXT);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
    role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT,
    timestamp REAL NOT NULL, token_count INTEGER, finish_reason TEXT);
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, content_rowid=id);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END;
INSERT INTO sessions(id, source, started_at, message_count) VALUES ('v10', 'cli', 1.0, 2);
INSERT INTO messages(session_id, role, content, timestamp) VALUES
    ('v10', 'user', 'legacy question', 2.0), ('v10', 'assistant', 'legacy answer', 3.0);
"""


@pytest.mark.parametrize("opened_by_old_switchboard", [False, True])
async def test_hermes_v10_file_keeps_a_sound_index_through_clear_messages(
    tmp_path: Path, opened_by_old_switchboard: bool
) -> None:
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.executescript(_HERMES_V10)
    if opened_by_old_switchboard:
        # what switchboard schema 7 left: its prefix index under Hermes's name, with only
        # Hermes's insert trigger maintaining it
        conn.executescript(
            "DROP TABLE messages_fts;"
            "CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, "
            "content_rowid=id, prefix='4');"
            "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');"
        )
    conn.close()
    db = await SessionDB.open(path)
    try:
        await db.append_message("v10", "user", "newer question")
        assert len(await db.search_messages("question")) == 2
        await db.clear_messages("v10")
        assert await db.check_search_index() == []
        assert await db.search_messages("question") == []
        await db.append_message("v10", "user", "after clearing")
        assert [h["session_id"] for h in await db.search_messages("clearing")] == ["v10"]
    finally:
        await db.close()
    conn = sqlite3.connect(path)
    if not opened_by_old_switchboard:  # Hermes's own index and trigger are left as they were
        assert conn.execute(
            "SELECT name FROM sqlite_master WHERE name LIKE 'messages_fts%' AND type = 'trigger'"
        ).fetchall() == [("messages_fts_insert",)]
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(10,)]
    conn.close()


async def test_another_programs_update_reindexes_the_side_index_soundly(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = await SessionDB.open(path)
    await db.create_session("s", "cli")
    mid = await db.append_message("s", "tool", "result", tool_name="originaltool")
    await db.close()
    conn = sqlite3.connect(path)  # another program, knowing nothing of switchboard
    conn.execute("UPDATE messages SET tool_name = 'renamedtool' WHERE id = ?", (mid,))
    conn.commit()
    conn.close()
    db = await SessionDB.open(path)
    try:
        assert await db.search_messages("originaltool", roles=["tool"]) == []
        assert [h["id"] for h in await db.search_messages("renamedtool", roles=["tool"])] == [mid]
        assert await db.check_search_index() == []
    finally:
        await db.close()
