"""The hourly activity tallies behind insights: after every kind of write they
equal a recount from the messages themselves."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from state import SessionDB
from state.sqlite import schema

H = 3600.0
RECOUNT = (
    "SELECT CAST(m.timestamp / 3600 AS INTEGER), s.source, "
    "CASE WHEN m.role = 'tool' THEN COALESCE(NULLIF(m.tool_name, ''), '?') ELSE '' END, "
    "COUNT(*) FROM messages m JOIN sessions s ON s.id = m.session_id GROUP BY 1, 2, 3"
)


def tallies(path: Path) -> tuple[dict[tuple[int, str, str], int], dict[tuple[int, str, str], int]]:
    """(the table's non-zero tallies, a recount from messages)."""
    conn = sqlite3.connect(path)
    try:
        kept = {
            (h, s, t): n
            for h, s, t, n in conn.execute(
                "SELECT hour, source, tool, messages FROM activity_hourly WHERE messages != 0"
            )
        }
        recount = {(h, s, t): n for h, s, t, n in conn.execute(RECOUNT)}
    finally:
        conn.close()
    return kept, recount


async def _fill(db: SessionDB) -> None:
    for i, source in enumerate(("telegram", "slack", "cli")):
        sid = await db.create_session(f"s{i}", source, started_at=10 * H)
        await db.append_message(sid, "user", "hello", timestamp=10 * H + i)
        await db.append_message(sid, "tool", "out", tool_name="web", timestamp=11 * H + 5)
        await db.append_messages(
            sid,
            [
                {"role": "assistant", "content": "a", "timestamp": 12 * H},
                {"role": "tool", "content": "b", "tool_name": None, "timestamp": 12 * H + 1},
                {"role": "tool", "content": "c", "tool_name": "", "timestamp": 12 * H + 2},
            ],
        )
    # concurrent appends reach the writer together: the batched path (append_many)
    await asyncio.gather(
        *(
            db.append_message(
                f"s{i % 3}",
                "tool" if i % 2 else "user",
                f"m{i}",
                tool_name="shell",
                timestamp=13 * H + i * 600,
            )
            for i in range(30)
        )
    )


async def test_tallies_equal_a_recount_after_appends_deletes_and_prune(
    db: SessionDB, tmp_path: Path
) -> None:
    path = tmp_path / "state.db"
    await _fill(db)
    kept, recount = tallies(path)
    assert kept == recount and sum(recount.values()) == 45
    assert recount[(12, "slack", "?")] == 2  # unnamed and empty-named tools
    await db.clear_messages("s0")
    kept, recount = tallies(path)
    assert kept == recount and sum(recount.values()) == 30
    await db.delete_session("s1")
    kept, recount = tallies(path)
    assert kept == recount and {s for _, s, _ in recount} == {"cli"}
    await db.end_session("s2", "idle", now=20 * H)
    assert await db.prune_sessions(1, now=30 * 86400) == 1
    kept, recount = tallies(path)
    assert kept == recount == {}


async def test_rows_another_program_writes_and_deletes_are_counted(
    db: SessionDB, tmp_path: Path
) -> None:
    path = tmp_path / "state.db"
    sid = await db.create_session("ours", "telegram", started_at=10 * H)
    await db.append_message(sid, "user", "from switchboard", timestamp=10 * H)
    # Hermes Agent writes through its own connection: no sb_written, no Python of ours
    hermes = sqlite3.connect(path)
    hermes.execute(
        "INSERT INTO sessions(id, source, started_at) VALUES ('theirs', 'discord', ?)", (10 * H,)
    )
    hermes.executemany(
        "INSERT INTO messages(session_id, role, content, tool_name, timestamp) VALUES (?,?,?,?,?)",
        [
            ("theirs", "user", "hi", None, 10 * H + 1),
            ("theirs", "tool", "r", "grep", 11 * H),
            ("ours", "assistant", "reply", None, 10 * H + 2),
        ],
    )
    hermes.commit()
    await db.append_message(sid, "user", "next", timestamp=11 * H)  # absorbs the queue
    kept, recount = tallies(path)
    assert kept == recount and sum(recount.values()) == 5
    assert recount[(11, "discord", "grep")] == 1
    out = await db.insights(10 * H, 12 * H)
    assert out["messages"] == 5 and out["top_tools"] == [{"tool": "grep", "calls": 1}]
    hermes.execute("DELETE FROM messages WHERE session_id = 'theirs'")
    hermes.commit()
    hermes.close()
    kept, recount = tallies(path)
    assert kept == recount and sum(recount.values()) == 3
    assert (await db.insights(10 * H, 12 * H, "discord"))["messages"] == 0


async def test_an_existing_file_is_tallied_by_the_migration(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    old = await SessionDB.open(path, schema_target=10)
    await old.close()
    # rows as switchboard at schema 10 wrote them
    conn = sqlite3.connect(path)
    assert schema.current_version(conn) == 10
    for i, source in enumerate(("telegram", "slack", "cli")):
        conn.execute(
            "INSERT INTO sessions(id, source, started_at, last_active) VALUES (?, ?, ?, ?)",
            (f"s{i}", source, 10 * H, 14 * H),
        )
        conn.executemany(
            "INSERT INTO messages(session_id, role, content, tool_name, timestamp, sb_written) "
            "VALUES (?, ?, 'x', ?, ?, 1)",
            [
                (f"s{i}", "user", None, 10 * H + i),
                (f"s{i}", "tool", "web", 11 * H + 5),
                (f"s{i}", "tool", None, 12 * H),
                (f"s{i}", "user", None, 13 * H + 1500),
            ],
        )
    conn.commit()
    assert (
        conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'activity_hourly'").fetchone()
        is None
    )
    conn.close()
    db = await SessionDB.open(path)
    try:
        kept, recount = tallies(path)
        assert kept == recount and sum(recount.values()) == 12
        assert (await db.insights(0, 100 * H))["messages"] == 12
        # partial first and last hours are read from the messages, whole hours from tallies
        edges = await db.insights(10 * H + 1, 13 * H + 1200)
        assert edges["messages"] == 12 - 1 - 3  # s0's first, and the three at 13h + 1500
        assert edges["top_tools"] == [{"tool": "?", "calls": 3}, {"tool": "web", "calls": 3}]
        assert (await db.insights(10 * H + 1, 10 * H + 2, "slack"))["messages"] == 1
    finally:
        await db.close()


async def test_imported_sessions_are_tallied(db: SessionDB, tmp_path: Path) -> None:
    await _fill(db)
    records = [r async for r in db.export_all()]
    other = await SessionDB.open(tmp_path / "other" / "state.db")
    try:
        report = await other.import_records(records)
        assert report.messages == 45
        kept, recount = tallies(tmp_path / "other" / "state.db")
        assert kept == recount and sum(recount.values()) == 45
    finally:
        await other.close()
