"""`sessions import` keeps text no store can hold (NUL, lone surrogates) as U+FFFD, with the
rest of the text, and says how many characters it replaced: a state.db whose rows hold NULs
(as older versions stored them) moves to PostgreSQL whole, and reads the same in SQLite."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from state import SessionDB
from tests import pgserver
from tests.daemon import clean_env, switchboard


def sessions(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        switchboard(home, "sessions", *args),
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(**env),
    )


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.split("\n") if line]


@pytest.fixture
async def old_home(tmp_path: Path) -> tuple[Path, str]:
    """A state.db whose rows hold NULs, written as earlier versions stored them."""
    home = tmp_path / "old"
    db = await SessionDB.open(home / "state.db")
    sid = await db.create_session(source="telegram", user_id="u1")
    await db.append_messages(
        sid,
        [
            {"role": "user", "content": "placeholder"},
            {"role": "assistant", "content": "echo: fine"},
        ],
    )
    await db.close()
    with sqlite3.connect(home / "state.db") as conn:
        conn.execute(
            "UPDATE messages SET content = 'before' || char(0) || 'after' WHERE role = 'user'"
        )
        conn.execute(
            "UPDATE sessions SET user_id = 'u' || char(0) || '1', "
            "preview = 'before' || char(0) || 'after'"
        )
    conn.close()
    return home, sid


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_import_keeps_unstorable_characters_as_u_fffd_and_counts_them(
    old_home: tuple[Path, str], tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    home, sid = old_home
    dump = sessions(home, "export", "-")
    assert dump.returncode == 0, dump.stderr
    [exported] = records(dump.stdout)
    assert exported["messages"][0]["content"] == "before\x00after"
    # a record written elsewhere may hold a lone surrogate (JSON's "\ud800")
    extra = json.dumps(
        {
            "format": 1,
            "session": {**exported["session"], "id": "20250101_000000_abcdef01", "title": None},
            "messages": [{"role": "user", "content": "lone \ud800 one"}],
        }
    )
    (tmp_path / "dump.jsonl").write_text(dump.stdout + extra + "\n", encoding="utf-8")
    new, env, schema, server = tmp_path / "new", {}, None, ""
    new.mkdir()
    if backend == "postgres":
        server = request.getfixturevalue("pg_server")
        schema = pgserver.fresh_schema(server)
        (new / "config.yaml").write_text("state:\n  backend: postgres\n  dsn_env: SB_IMPORT_DSN\n")
        env = {"SB_IMPORT_DSN": pgserver.with_schema(server, schema)}
    try:
        done = sessions(new, "import", str(tmp_path / "dump.jsonl"), **env)
        assert done.returncode == 0, done.stderr
        assert "imported 2 sessions, 3 messages" in done.stderr
        # the NULs of the content, user_id and preview, the copy's user_id and preview, and
        # the lone surrogate
        assert "6 characters no store can hold (NUL, lone surrogates) kept as U+FFFD" in done.stderr
        moved = {r["session"]["id"]: r for r in records(sessions(new, "export", "-", **env).stdout)}
        assert [m["content"] for m in moved[sid]["messages"]] == ["before\ufffdafter", "echo: fine"]
        assert moved[sid]["session"]["user_id"] == "u\ufffd1"
        assert moved[sid]["session"]["preview"] == "before\ufffdafter"
        lone = moved["20250101_000000_abcdef01"]["messages"]
        assert [m["content"] for m in lone] == ["lone \ufffd one"]
    finally:
        if schema is not None:
            pgserver.drop_schema(server, schema)
