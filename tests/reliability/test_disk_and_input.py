"""Disk trouble and hostile input, through the running gateway.

A full disk is real SQLite SQLITE_FULL (PRAGMA max_page_count on the writer): the client
gets a 503 (never a 200 for something not stored), nothing is half-written, and service
resumes when space returns. Random and malformed payloads through the HTTP API and the
Telegram fake never take the daemon down."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.adapters import discord as dc
from gateway.adapters import slack as sl
from gateway.adapters import telegram as tg
from gateway.app import Gateway
from gateway.config import load_config
from tests.fakes.telegram import FakeTelegram
from tests.inprocess import gateway_with_telegram


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[tuple[Gateway, str, FakeTelegram]]:
    async with gateway_with_telegram(tmp_path, "allow_all_users: true", api="port: 0") as (
        gateway,
        fake,
    ):
        yield gateway, f"http://127.0.0.1:{gateway.adapters[0].bound_port}", fake  # type: ignore[attr-defined]


async def _post(url: str, body: Any, path: str = "/v1/messages") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with http.post(
            url + path, data=data, headers={"Content-Type": "application/json"}
        ) as r:
            try:
                return r.status, await r.json(content_type=None)
            except ValueError:
                return r.status, await r.text()


async def test_a_full_disk_is_a_503_loses_nothing_and_recovers(
    gw: tuple[Gateway, str, FakeTelegram],
) -> None:
    gateway, url, _ = gw
    assert gateway.db is not None
    assert (await _post(url, {"chat_id": "1", "text": "before"}))[0] == 200
    pages = await gateway.db.writer.exclusive(
        lambda c: c.execute("PRAGMA page_count").fetchone()[0]
    )
    await gateway.db.writer.exclusive(
        lambda c: c.execute(f"PRAGMA max_page_count = {pages}").fetchone()
    )
    big = "x" * 200_000  # needs new pages: SQLITE_FULL
    status, body = await _post(url, {"chat_id": "1", "text": big})
    assert status == 503 and "could not store your message" in body["error"]["message"]
    assert gateway.health()["last_error"]
    await gateway.db.writer.exclusive(
        lambda c: c.execute("PRAGMA max_page_count = 1073741823").fetchone()
    )
    status, body = await _post(url, {"chat_id": "1", "text": "after"})
    assert status == 200 and body["reply"] == "echo: after"
    contents = [m["content"] for m in await gateway.db.get_messages(body["session_id"])]
    assert contents == ["before", "echo: before", "after", "echo: after"]  # nothing half-written
    assert (
        await gateway.db.integrity_check(quick=False) == []
        and await gateway.db.check_search_index() == []
    )


async def test_a_state_db_replaced_underneath_the_daemon_is_refused_not_written(
    gw: tuple[Gateway, str, FakeTelegram], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gateway, url, _ = gw
    assert gateway.db is not None
    assert (await _post(url, {"chat_id": "1", "text": "before"}))[0] == 200
    path = Path(gateway.db.path)
    # an operator (or a careless script) puts another file where state.db was
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE untouched (x)")
    before = other.read_bytes()
    os.replace(other, path)
    for text in ("after one", "after two"):
        status, body = await _post(url, {"chat_id": "1", "text": text})
        assert status == 503 and body["error"]["code"] == "storage_unavailable"
    assert path.read_bytes() == before  # nothing was written into either file's place
    said = [r for r in caplog.records if "replaced or removed while the daemon" in r.getMessage()]
    assert len(said) == 1  # said once, not per write
    assert "replaced or removed" in (gateway.health()["last_error"] or "")


async def test_a_one_megabyte_message_is_stored_and_answered(
    gw: tuple[Gateway, str, FakeTelegram],
) -> None:
    gateway, url, _ = gw
    text = ("lorem ipsum " * 90_000)[:1_000_000]
    status, body = await _post(url, {"chat_id": "big", "text": text})
    assert status == 200 and len(body["reply"]) == len(text) + len("echo: ")
    assert gateway.db is not None and [
        h["session_id"] for h in await gateway.db.search_messages("lorem", limit=1)
    ] == [body["session_id"]]


def _junk(rng: random.Random, depth: int = 0) -> Any:
    kinds = (
        ["str", "int", "float", "none", "bool", "list", "dict"]
        if depth < 3
        else ["str", "int", "none"]
    )
    kind = rng.choice(kinds)
    if kind == "str":
        return "".join(
            chr(rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0x10FFF)]))
            for _ in range(rng.randint(0, 40))
        )
    if kind == "int":
        return rng.choice([0, -1, 2**63, rng.randint(-(10**6), 10**6)])
    if kind == "float":
        return rng.random() * 1e9
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "list":
        return [_junk(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == "dict":
        keys = [
            "chat_id",
            "text",
            "user_id",
            "chat_type",
            "thread_id",
            "messages",
            "role",
            "content",
            "user",
            "x",
        ]
        return {rng.choice(keys): _junk(rng, depth + 1) for _ in range(rng.randint(0, 6))}
    return None


async def test_random_payloads_never_take_the_gateway_down(
    gw: tuple[Gateway, str, FakeTelegram],
) -> None:
    gateway, url, fake = gw
    rng = random.Random(42)
    statuses: dict[int, int] = {}
    for i in range(150):
        body = _junk(rng)
        for path in ("/v1/messages", "/v1/chat/completions"):
            status, _ = await _post(url, body if i % 10 else b"\xff\xfe{not json", path)
            statuses[status] = statuses.get(status, 0) + 1
            assert status in (200, 400), (path, body, status)
    for i in range(60):  # random Telegram updates through the real python-telegram-bot
        fake.updates.append({"update_id": 10_000 + i, "message": _junk(rng)})
    fake.updates.append({"update_id": 20_000, "edited_message": {"text": "x"}})
    fake.updates.append({"update_id": 20_001, "callback_query": {"id": "1"}})
    fake.push(fake.message("still answering?", fake.dm_chat(77)))
    [sent] = await fake.wait_sent(1, timeout=20)
    assert sent["text"] == "echo: still answering?"
    status, body = await _post(url, {"chat_id": "ok", "text": "and here?"})
    assert status == 200 and body["reply"] == "echo: and here?"
    assert gateway.health()["status"] == "ok"


@pytest.mark.parametrize(
    "chat_id", ["\x01\x02", "🎉" * 50, "a" * 200, " spaces ", "a:b%c=d", "x\ny", "\u202e\u200b"]
)
async def test_odd_ids_are_handled(gw: tuple[Gateway, str, FakeTelegram], chat_id: str) -> None:
    _, url, _ = gw
    status, body = await _post(url, {"chat_id": chat_id, "text": "hello", "user_id": chat_id})
    assert status == 200 and body["reply"] == "echo: hello"


async def test_an_id_holding_a_nul_is_refused_naming_it(
    gw: tuple[Gateway, str, FakeTelegram],
) -> None:
    """No store holds U+0000: the API refuses it (400, the field named), never 503."""
    _, url, _ = gw
    status, body = await _post(url, {"chat_id": "\x00\x01", "text": "hello"})
    assert status == 400 and body["error"]["message"].startswith("chat_id contains U+0000")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=6)
    ),
    max_leaves=20,
)
payload_keys = st.sampled_from(
    [
        "message",
        "channel_post",
        "text",
        "chat",
        "from",
        "type",
        "channel",
        "user",
        "ts",
        "thread_ts",
        "subtype",
        "id",
        "content",
        "author_id",
        "kind",
        "channel_id",
    ]
)
payloads = st.dictionaries(payload_keys, json_values, max_size=8)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(payloads, payloads)
def test_platform_translation_never_raises(top: dict, inner: dict) -> None:
    for update in (
        top,
        {"update_id": 1, "message": inner},
        {"update_id": 1, "channel_post": inner},
    ):
        assert (
            tg.to_inbound(update, "bot") is None
            or tg.to_inbound(update, "bot").source.platform == "telegram"
        )  # type: ignore[union-attr]
    for ev in (top, {**inner, "type": "message"}):
        result = sl.to_inbound(ev, "U0BOT")
        assert result is None or result.source.platform == "slack"
    result = dc.to_inbound(inner)
    assert result is None or result.source.platform == "discord"


def test_the_store_survives_a_deleted_wal_file_between_runs(tmp_path: Path) -> None:
    """Losing the WAL file while nothing runs loses only what was not checkpointed; the file
    stays a valid database and opens again."""
    import asyncio

    from state import SessionDB

    async def scenario() -> None:
        db = await SessionDB.open(tmp_path / "state.db")
        sid = await db.create_session(source="api")
        await db.append_message(sid, "user", "checkpointed")
        await db.checkpoint("TRUNCATE")
        await db.close()
        wal = tmp_path / "state.db-wal"
        if wal.exists():
            wal.unlink()
        again = await SessionDB.open(tmp_path / "state.db")
        try:
            assert [m["content"] for m in await again.get_messages(sid)] == ["checkpointed"]
            assert await again.integrity_check(quick=False) == []
        finally:
            await again.close()

    asyncio.run(scenario())
    assert (
        sqlite3.connect(tmp_path / "state.db").execute("PRAGMA integrity_check").fetchone()[0]
        == "ok"
    )


def _as_unprivileged() -> list[str]:
    """A prefix under which file modes bind the command. Under root that is root without
    CAP_DAC_OVERRIDE (dropped from the bounding set, so the exec'd command never has it):
    it gets EACCES from a 0555 directory or a 0444 file exactly as an ordinary owner does,
    yet stays the owner of the checkout and the venv, wherever those live (a `mktemp -d`
    clone is 0700, which a switch to `nobody` could not even enter)."""
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--inh-caps=-dac_override", "--bounding-set=-dac_override"]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"]).returncode != 0:
        pytest.skip("running as root and cannot drop CAP_DAC_OVERRIDE: modes would not bind")
    return prefix


@pytest.mark.slow
def test_a_read_only_home_is_a_clear_error_and_recovers(tmp_path: Path) -> None:
    """A home the daemon cannot write is refused at start-up with a message naming the home
    (not a traceback, not 'damaged database'); the CLI says state.db cannot be written; once
    the home is writable again the daemon starts and the stored session is intact."""
    import asyncio

    from state import SessionDB

    prefix = _as_unprivileged()
    home = tmp_path / "home"
    home.mkdir()
    try:

        async def seed() -> str:
            db = await SessionDB.open(home / "state.db")
            sid = await db.create_session(source="api")
            await db.append_message(sid, "user", "kept through a read-only spell")
            await db.close()
            return sid

        sid = asyncio.run(seed())
        for path in [home, *home.iterdir()]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        cli = [*prefix, sys.executable, "-m", "gateway", "--home", str(home)]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

        run = subprocess.run([*cli, "run"], capture_output=True, text=True, timeout=60, env=env)
        assert run.returncode == 1, run.stderr
        assert f"home {home} is not writable" in run.stderr
        assert "Traceback" not in run.stderr

        listing = subprocess.run(
            [*cli, "sessions", "list"], capture_output=True, text=True, timeout=60, env=env
        )
        assert listing.returncode == 1, listing.stderr
        assert "cannot be written" in listing.stderr and "damaged" not in listing.stderr

        # The condition clears: the home becomes writable for its owner again.
        for path in [home, *home.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        listing = subprocess.run(
            [*cli, "sessions", "list", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert listing.returncode == 0, listing.stderr
        assert sid in listing.stdout
        conn = sqlite3.connect(home / "state.db")
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute(
            "SELECT content FROM messages WHERE session_id = ?", (sid,)
        ).fetchall() == [("kept through a read-only spell",)]
        conn.close()
    finally:
        for path in [home, *home.iterdir()]:  # let pytest remove tmp_path even if we failed
            path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture
def small_filesystem() -> Iterator[Path]:
    """A real 4 MB tmpfs, so ENOSPC comes from the kernel (needs root and mount(2))."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small filesystem needs root")
    mnt = Path(tempfile.mkdtemp(prefix="switchboard-full-", dir="/tmp"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        mnt.rmdir()


async def test_a_really_full_filesystem_is_a_503_and_recovers(small_filesystem: Path) -> None:
    """The home on a real 4 MB filesystem filled to the brim: turns get 503 (never a 200 for
    something not stored), the daemon stays up, and once space is freed it answers again with
    everything acknowledged still there."""
    cfg = small_filesystem / "c.yaml"
    cfg.write_text("platforms:\n  api:\n    port: 0\n")
    gateway = Gateway(config=load_config(cfg, {}), home=small_filesystem / "home")
    await gateway.start()
    try:
        url = f"http://127.0.0.1:{gateway.adapters[0].bound_port}"  # type: ignore[attr-defined]
        status, first = await _post(url, {"chat_id": "1", "text": "before"})
        assert status == 200
        filler = small_filesystem / "filler"
        # take every free block; unbuffered, so a short last write leaves nothing for
        # close() to flush into a full disk (which depended on the free space modulo 64 KiB)
        with filler.open("wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
            except OSError:
                pass
        statuses = [
            (await _post(url, {"chat_id": "1", "text": f"{i} " + "y" * 50_000}))[0]
            for i in range(5)
        ]
        assert 503 in statuses and set(statuses) <= {200, 503}, statuses
        assert gateway.health()["status"] == "ok"
        filler.unlink()
        status, body = await _post(url, {"chat_id": "1", "text": "after"})
        assert status == 200 and body["reply"] == "echo: after"
        assert gateway.db is not None
        contents = [m["content"] for m in await gateway.db.get_messages(first["session_id"])]
        assert contents[:2] == ["before", "echo: before"] and contents[-2:] == [
            "after",
            "echo: after",
        ]
        stored = [c for c in contents if c.endswith("y" * 50_000) and not c.startswith("echo")]
        assert len(stored) == statuses.count(200)  # exactly the acknowledged ones
        assert await gateway.db.integrity_check(quick=False) == []
    finally:
        await gateway.stop()
