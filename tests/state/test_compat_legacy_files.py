"""Old Hermes Agent files (its schema 2 and 10) opened through `state.hermes.compat`: the store
behaviour Hermes's two migration tests check besides its own version counter (which the
facade leaves to Hermes, see hermes_suite_lists.py): missing columns are added with their
defaults, titles can be set, and tool names and call arguments of old rows are searchable."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from state.hermes.compat import SessionDB

_HERMES_V2 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (2);
CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, model TEXT,
    model_config TEXT, system_prompt TEXT, parent_session_id TEXT, started_at REAL NOT NULL,
    ended_at REAL, end_reason TEXT, message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0, input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
    role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT,
    timestamp REAL NOT NULL, token_count INTEGER, finish_reason TEXT);
INSERT INTO sessions (id, source, started_at) VALUES ('old', 'cli', 1000.0);
"""

_HERMES_V10 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (10);
CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT, started_at REAL, ended_at REAL,
    title TEXT, parent_session_id TEXT, message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0, api_call_count INTEGER DEFAULT 0);
CREATE TABLE messages (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, timestamp REAL NOT NULL,
    role TEXT NOT NULL, content TEXT, tool_name TEXT, tool_calls TEXT, tool_call_id TEXT,
    token_count INTEGER, finish_reason TEXT, reasoning TEXT);
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, content_rowid=id);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
"""


def _write(path: Path, script: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.executescript(script)
    return conn


def test_a_hermes_v2_file_gains_the_missing_columns_and_takes_titles(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _write(path, _HERMES_V2).close()
    db = SessionDB(path)
    try:
        row = db.get_session("old")
        assert row is not None and row["title"] is None and row["api_call_count"] == 0
        assert db.set_session_title("old", "Migrated Title") is True
        assert db.get_session("old")["title"] == "Migrated Title"
    finally:
        db.close()


def test_tool_names_and_arguments_of_a_hermes_v10_file_are_searchable(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = _write(path, _HERMES_V10)
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s1', 'cli', 1000.0)")
    calls = {"function": {"name": "web_search", "arguments": json.dumps({"q": "LEGACYARG"})}}
    conn.execute(
        "INSERT INTO messages (session_id, timestamp, role, content, tool_name, tool_calls) "
        "VALUES ('s1', 1001.0, 'assistant', '', 'LEGACYTOOL', ?)",
        (json.dumps(calls),),
    )
    conn.commit()
    conn.close()
    db = SessionDB(path)
    try:
        for word in ("LEGACYTOOL", "LEGACYARG", "web_search"):
            assert [h["session_id"] for h in db.search_messages(word)] == ["s1"], word
    finally:
        db.close()
