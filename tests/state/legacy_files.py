"""state.db files as older programs left them, written with raw SQL (the code that wrote
them no longer exists): switchboard at schema 8 and Hermes Agent at its schema 10."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from state import SessionDB

# What switchboard <= schema 8 added on top of the tables: its index under Hermes's name,
# three triggers of Hermes's names, and its own number in Hermes's schema_version.
_SWITCHBOARD_8_FTS = """
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, content_rowid=id,
    prefix='4');
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
DELETE FROM schema_version;
INSERT INTO schema_version VALUES (8);
INSERT OR REPLACE INTO state_meta(key, value) VALUES ('switchboard.owns_schema_version', '1');
"""


async def make_switchboard_8_file(path: Path, session_id: str, contents: list[str]) -> None:
    """A file switchboard schema 8 created, holding one session with these user messages."""
    db = await SessionDB.open(path, schema_target=8)
    await db.close()
    conn = sqlite3.connect(path)
    conn.executescript(_SWITCHBOARD_8_FTS)
    conn.execute(
        "INSERT INTO sessions(id, source, started_at, last_active, message_count) "
        "VALUES (?, 'api', 1740816000, 1740816001, ?)",
        (session_id, len(contents)),
    )
    conn.executemany(
        "INSERT INTO messages(session_id, role, content, timestamp, sb_written) "
        "VALUES (?, 'user', ?, 1740816001, 1)",
        [(session_id, c) for c in contents],
    )
    conn.commit()
    conn.close()
