"""`switchboard import --from-hermes` on a Hermes home written by the real hermes-agent
0.19.0 package (its store, its gateway's session index and /sethome): everything arrives,
gateway keys are rebuilt as switchboard's and land in sessions.json (or, with the daemon
running, are adopted by it), a second run changes nothing, a dry run writes nothing. The
same into a home whose store is on PostgreSQL (through a scratch state.db)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from state import SessionDB, Store, open_store
from tests import pgserver
from tests.hermes_pkg import run_hermes
from tests.inprocess import gateway_with_telegram

_HERMES_HOME = """
db.create_session("root", "telegram", user_id="u1", model="m1")
db.append_message("root", "user", "first question about 部署")
db.append_message("root", "assistant", None, tool_calls=[{"id": "c1", "type": "function",
    "function": {"name": "web_lookup", "arguments": "{}"}}])
db.append_message("root", "tool", "lookup result", tool_name="web_lookup", tool_call_id="c1")
db.update_token_counts("root", input_tokens=120, output_tokens=30, model="m1",
                       billing_provider="p1", api_call_count=2, estimated_cost_usd=0.5)
db.set_session_title("root", "Deploy Plan")
db.end_session("root", "compression")
db.create_session("tip", "telegram", user_id="u1", parent_session_id="root")
db.append_message("tip", "user", [{"type": "text", "text": "see picture"},
                                  {"type": "image_url", "image_url": {"url": "x"}}])
db.set_session_title("tip", "Deploy Plan #2")
"""


async def _home_arrived(db: Store) -> None:
    """_HERMES_HOME's sessions as they are in the store: tokens, title, end, model,
    lineage, messages with tool calls and parts, searchable."""
    root = await db.require_session("root")
    assert (root["input_tokens"], root["output_tokens"], root["api_call_count"]) == (120, 30, 2)
    assert (root["title"], root["end_reason"], root["model"]) == (
        "Deploy Plan",
        "compression",
        "m1",
    )
    assert await db.get_compression_tip("root") == "tip"
    msgs = await db.get_messages("root")
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[1]["tool_calls"][0]["function"]["name"] == "web_lookup"
    assert (await db.get_messages("tip"))[0]["content"][1]["type"] == "image_url"
    assert [h["session_id"] for h in await db.search_messages("部署")] == ["root"]


def _cli(home: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "import", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


async def test_a_hermes_home_comes_over_once(tmp_path: Path) -> None:
    hermes_home = tmp_path / "hermes"
    hermes_home.mkdir()
    run_hermes(hermes_home / "state.db", _HERMES_HOME, home=hermes_home)
    home = tmp_path / "switchboard"

    dry = _cli(home, "--from-hermes", str(hermes_home), "--dry-run")
    assert "would import 2 sessions, 4 messages, 2 titles" in dry
    db = await SessionDB.open(home / "state.db")
    assert await db.session_count() == 0
    await db.close()

    assert "imported 2 sessions, 4 messages, 2 titles" in _cli(
        home, "--from-hermes", str(hermes_home)
    )
    again = _cli(home, "--from-hermes", str(hermes_home))
    assert "imported 0 sessions, 0 messages" in again and "2 already present" in again

    db = await SessionDB.open(home / "state.db")
    try:
        await _home_arrived(db)
        assert [h["session_id"] for h in await db.search_messages("web_lookup", roles=["tool"])]
        assert (await db.model_usage("root"))[0]["input_tokens"] == 120
        listed = {r["id"]: r for r in await db.list_sessions(include_children=True)}
        assert listed["root"]["preview"] == "first question about 部署"
        assert await db.message_count() == 4
    finally:
        await db.close()


# Hermes's own gateway session store and /sethome writer: DM, per-user group, forum topic
# (shared by everyone in it) and Discord thread sessions, and a Telegram home in a topic.
_HERMES_GATEWAY = """
import os
from gateway.session import SessionStore, SessionSource
from gateway.config import Platform, GatewayConfig
from hermes_cli.config import save_env_value
store = SessionStore(Path(os.environ["HERMES_HOME"]) / "sessions", GatewayConfig())
sources = {
    "dm": SessionSource(platform=Platform.TELEGRAM, chat_id="555", chat_type="dm",
                        user_id="555", user_name="Ann"),
    "group": SessionSource(platform=Platform.TELEGRAM, chat_id="-100777", chat_type="group",
                           user_id="555", user_name="Ann", chat_name="Team"),
    "topic": SessionSource(platform=Platform.TELEGRAM, chat_id="-100777", chat_type="forum",
                           user_id="556", user_name="Bob", chat_name="Team", thread_id="42"),
    "thread": SessionSource(platform=Platform.DISCORD, chat_id="9001", chat_type="thread",
                            user_id="77", user_name="Cy", thread_id="9001"),
}
out = {}
for name, src in sources.items():
    entry = store.get_or_create_session(src)
    store._db.append_message(entry.session_id, "user", "hello from " + name)
    out[name] = [entry.session_key, entry.session_id]
save_env_value("TELEGRAM_HOME_CHANNEL", "-100777")
save_env_value("TELEGRAM_HOME_CHANNEL_THREAD_ID", "42")
"""

# switchboard's keys for the same four chats (its builder, default key settings)
_EXPECTED_KEYS = {
    "dm": "agent:main:telegram:dm:555",
    "group": "agent:main:telegram:group:-100777:555",
    "topic": "agent:main:telegram:group:-100777:t=42",
    "thread": "agent:main:discord:group:9001:t=9001",
}


def _hermes_gateway_home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    hermes_home = tmp_path / "hermes"
    hermes_home.mkdir()
    got = run_hermes(hermes_home / "state.db", _HERMES_GATEWAY, home=hermes_home, gateway=True)
    sessions = {name: sid for name, (_key, sid) in got["out"].items()}
    assert got["out"]["topic"][0] == "agent:main:telegram:forum:-100777:42"  # Hermes's shape
    return hermes_home, sessions


def _index(home: Path) -> dict[str, str]:
    data = json.loads((home / "sessions" / "sessions.json").read_text("utf-8"))
    return {key: entry["session_id"] for key, entry in data.items()}


async def test_hermes_gateway_keys_and_home_channel_come_over_into_the_index(
    tmp_path: Path,
) -> None:
    hermes_home, hermes = _hermes_gateway_home(tmp_path)
    home = tmp_path / "switchboard"

    dry = _cli(home, "--from-hermes", str(hermes_home), "--dry-run")
    assert "session keys: 4 mapped, 4 live sessions bound" in dry
    assert "home channels: 1 set" in dry and "telegram: -100777 thread 42" in dry
    assert not (home / "sessions" / "sessions.json").exists()
    db = await SessionDB.open(home / "state.db")
    assert await db.get_meta("home_channel.telegram") is None
    await db.close()

    out = _cli(home, "--from-hermes", str(hermes_home))
    assert (
        "session keys: 4 mapped, 4 live sessions bound" in out and "sessions.json: updated" in out
    )
    want = {_EXPECTED_KEYS[name]: hermes[name] for name in _EXPECTED_KEYS}
    assert _index(home) == want
    db = await SessionDB.open(home / "state.db")
    try:
        home_channel = json.loads(await db.get_meta("home_channel.telegram") or "{}")
        assert (home_channel["chat_id"], home_channel["thread_id"], home_channel["chat_type"]) == (
            "-100777",
            "42",
            "group",
        )
        topic = await db.require_session(hermes["topic"])
        assert (topic["session_key"], topic["chat_type"], topic["thread_id"]) == (
            _EXPECTED_KEYS["topic"],
            "group",
            "42",
        )
    finally:
        await db.close()

    again = _cli(home, "--from-hermes", str(hermes_home))
    assert "session keys: 0 mapped, 0 live sessions bound" in again
    assert "home channels: 0 set, 1 already set here" in again
    assert _index(home) == want


async def test_a_key_already_live_in_switchboard_keeps_its_session(tmp_path: Path) -> None:
    hermes_home, hermes = _hermes_gateway_home(tmp_path)
    home = tmp_path / "switchboard"
    db = await SessionDB.open(home / "state.db")
    mine = await db.create_session(
        "telegram", session_key=_EXPECTED_KEYS["dm"], chat_id="555", chat_type="dm"
    )
    await db.close()

    out = _cli(home, "--from-hermes", str(hermes_home))
    assert "3 live sessions bound, 1 kept by a live switchboard session, 1 superseded" in out
    assert _index(home)[_EXPECTED_KEYS["dm"]] == mine
    db = await SessionDB.open(home / "state.db")
    try:
        theirs = await db.require_session(hermes["dm"])
        assert theirs["end_reason"] == "session_switch"
        assert [m["content"] for m in await db.get_messages(hermes["dm"])] == ["hello from dm"]
    finally:
        await db.close()


async def test_with_the_daemon_running_the_import_leaves_the_index_to_it_and_it_adopts(
    tmp_path: Path,
) -> None:
    hermes_home, hermes = _hermes_gateway_home(tmp_path)
    async with gateway_with_telegram(tmp_path, "allow_all_users: true") as (gw, fake):
        home = tmp_path / "home"
        out = await asyncio.to_thread(_cli, home, "--from-hermes", str(hermes_home))
        assert "the running daemon adopts these sessions on their next message" in out
        assert gw.index is not None and gw.db is not None
        assert gw.index.get(_EXPECTED_KEYS["dm"]) is None  # not written behind its back
        fake.push(fake.message("are you still there?", fake.dm_chat(555), user_id=555))
        await fake.wait_sent(1)
        entry = gw.index.get(_EXPECTED_KEYS["dm"])
        assert entry is not None and entry.session_id == hermes["dm"]
        texts = [m["content"] for m in await gw.db.get_messages(hermes["dm"])]
        assert texts[:2] == ["hello from dm", "are you still there?"]


# --- into a home whose store is on PostgreSQL -------------------------------------------------


@dataclass
class PgHome:
    path: Path
    dsn: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SB_HERMES_DSN": self.dsn}

    async def store(self) -> Store:
        return await open_store({"backend": "postgres", "dsn": self.dsn}, self.path)


@pytest.fixture
def pg_home(tmp_path: Path, pg_server: str) -> Iterator[PgHome]:
    schema = pgserver.fresh_schema(pg_server)
    home = tmp_path / "switchboard"
    home.mkdir()
    (home / "config.yaml").write_text("state:\n  backend: postgres\n  dsn_env: SB_HERMES_DSN\n")
    try:
        yield PgHome(home, pgserver.with_schema(pg_server, schema))
    finally:
        pgserver.drop_schema(pg_server, schema)


async def test_a_hermes_home_comes_over_once_into_postgres(tmp_path: Path, pg_home: PgHome) -> None:
    hermes_home = tmp_path / "hermes"
    hermes_home.mkdir()
    run_hermes(hermes_home / "state.db", _HERMES_HOME, home=hermes_home)
    dry = _cli(pg_home.path, "--from-hermes", str(hermes_home), "--dry-run", env=pg_home.env)
    assert "would import 2 sessions, 4 messages, 2 titles" in dry
    db = await pg_home.store()
    try:
        assert await db.session_count() == 0
    finally:
        await db.close()

    out = _cli(pg_home.path, "--from-hermes", str(hermes_home), env=pg_home.env)
    assert "imported 2 sessions, 4 messages, 2 titles" in out and "0 already present" in out
    again = _cli(pg_home.path, "--from-hermes", str(hermes_home), env=pg_home.env)
    assert "imported 0 sessions, 0 messages" in again and "2 already present" in again
    assert not (pg_home.path / "state.db").exists()
    db = await pg_home.store()
    try:
        await _home_arrived(db)
        assert await db.message_count() == 4
    finally:
        await db.close()


async def test_hermes_gateway_keys_and_home_channel_come_over_into_postgres(
    tmp_path: Path, pg_home: PgHome
) -> None:
    """The keys land in the database (each adopted by the replica its key's next message
    reaches: no sessions.json there) and the home channel in its meta; twice changes
    nothing."""
    hermes_home, hermes = _hermes_gateway_home(tmp_path)
    out = _cli(pg_home.path, "--from-hermes", str(hermes_home), env=pg_home.env)
    assert "session keys: 4 mapped, 4 live sessions bound" in out
    assert "session_routes: the replica a key's next message reaches adopts its session" in out
    assert "home channels: 1 set" in out
    db = await pg_home.store()
    try:
        want = {_EXPECTED_KEYS[name]: hermes[name] for name in _EXPECTED_KEYS}
        assert await db.newest_live_session_by_key() == want
        home_channel = json.loads(await db.get_meta("home_channel.telegram") or "{}")
        assert (home_channel["chat_id"], home_channel["thread_id"]) == ("-100777", "42")
    finally:
        await db.close()
    again = _cli(pg_home.path, "--from-hermes", str(hermes_home), env=pg_home.env)
    assert "session keys: 0 mapped, 0 live sessions bound" in again
    assert "home channels: 0 set, 1 already set here" in again


async def test_a_key_already_live_on_postgres_keeps_its_session(
    tmp_path: Path, pg_home: PgHome
) -> None:
    hermes_home, hermes = _hermes_gateway_home(tmp_path)
    db = await pg_home.store()
    try:
        mine = await db.create_session(
            source="telegram", session_key=_EXPECTED_KEYS["dm"], chat_id="555", chat_type="dm"
        )
    finally:
        await db.close()
    out = _cli(pg_home.path, "--from-hermes", str(hermes_home), env=pg_home.env)
    assert "3 live sessions bound, 1 kept by a live switchboard session, 1 superseded" in out
    db = await pg_home.store()
    try:
        assert (await db.newest_live_session_by_key())[_EXPECTED_KEYS["dm"]] == mine
        theirs = await db.require_session(hermes["dm"])
        assert theirs["end_reason"] == "session_switch"
        assert [m["content"] for m in await db.get_messages(hermes["dm"])] == ["hello from dm"]
    finally:
        await db.close()


async def test_a_title_already_used_on_postgres_is_renamed_and_said(
    tmp_path: Path, pg_home: PgHome
) -> None:
    """As `sessions import` does on that store: the imported session's title gets
    " (imported)" added, and the output names both."""
    hermes_home = tmp_path / "hermes"
    hermes_home.mkdir()
    run_hermes(hermes_home / "state.db", _HERMES_HOME, home=hermes_home)
    db = await pg_home.store()
    try:
        mine = await db.create_session(source="telegram", title="deploy plan")
    finally:
        await db.close()
    out = _cli(pg_home.path, "--from-hermes", str(hermes_home), env=pg_home.env)
    assert "imported 2 sessions, 4 messages" in out
    renamed = [ln for ln in out.splitlines() if ln.startswith("  title renamed")]
    assert len(renamed) == 1 and renamed[0].startswith(
        "  title renamed (already used here): Deploy Plan -> "
    )
    db = await pg_home.store()
    try:
        assert (await db.require_session(mine))["title"] == "deploy plan"
        root_title = (await db.require_session("root"))["title"]
        assert root_title == renamed[0].rpartition(" -> ")[2] == "Deploy Plan (imported)"
    finally:
        await db.close()
