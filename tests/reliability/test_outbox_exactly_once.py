"""Exactly once on the platforms that dedupe a resent reply: the daemon, a
real subprocess on the Discord fake (gateway websocket + REST) or the Slack fake (signed
Events API), SIGKILLs itself after the platform took the reply and before the outbox marked
it. With inbox.resend_unconfirmed_replies off, the restart sends the reply again under the
same key (a Discord nonce, a Slack metadata marker): the chat shows it once, /health counts
no unsent reply, and the inbox row ends 'sent'."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes.discord import DM, FakeDiscord
from tests.fakes.slack import SECRET, FakeSlack, event, signed


async def _daemon(home: Path, **env: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(**env),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


def _home(tmp_path: Path, platform: str) -> tuple[Path, str]:
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\n{platform}"
        "inbox:\n  resend_unconfirmed_replies: false\n"
    )
    return home, f"http://127.0.0.1:{port}"


def _inbox(home: Path) -> list[tuple[str, str | None]]:
    conn = sqlite3.connect(home / "state.db")
    try:
        return conn.execute("SELECT state, reply_state FROM inbox ORDER BY id").fetchall()
    finally:
        conn.close()


async def _health(url: str) -> dict:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as resp:
        return await resp.json()


async def _until_sent(home: Path, shown: Callable[[], list[str]]) -> None:
    """Until the inbox row is marked 'sent', then a moment more in which a second copy
    would show up (the caller checks the exact count)."""
    deadline = time.monotonic() + 20
    while _inbox(home) != [("answered", "sent")]:
        assert time.monotonic() < deadline, (_inbox(home), shown())
        await asyncio.sleep(0.05)
    for _ in range(10):
        await asyncio.sleep(0.05)


async def test_discord_a_reply_resent_after_a_kill_is_shown_once(tmp_path: Path) -> None:
    fake = FakeDiscord()
    await fake.start()
    home, url = _home(
        tmp_path,
        "  discord:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: {fake.api}\n    gateway_url: {fake.gateway}\n",
    )
    try:
        proc = await _daemon(
            home, DISCORD_BOT_TOKEN=fake.token, SWITCHBOARD_FAULT="after_send_before_mark"
        )
        await wait_healthy(url, proc)
        await fake.wait_connected()
        await fake.dispatch("MESSAGE_CREATE", fake.message("hello", DM, guild=False))
        assert await asyncio.wait_for(proc.wait(), 30) == -9
        assert fake.shown(DM) == ["echo: hello"]  # the platform took it before the kill
        assert _inbox(home) == [("answered", "ready")]
        proc = await _daemon(home, DISCORD_BOT_TOKEN=fake.token)
        try:
            await wait_healthy(url, proc)
            await _until_sent(home, lambda: fake.shown(DM))
            health = await _health(url)
        finally:
            proc.terminate()
            await proc.wait()
    finally:
        await fake.stop()
    assert fake.shown(DM) == ["echo: hello"]
    [first] = fake.posted(DM)
    assert [d["nonce"] for d in fake.deduped()] == [first["nonce"]]  # the resend, answered
    assert health["unsent_replies"] == 0


async def test_slack_a_reply_resent_after_a_kill_is_shown_once(tmp_path: Path) -> None:
    now = int(time.time())
    fake = FakeSlack(ts_base=now + 1)  # the replies' ts come after the message's, as on Slack
    await fake.start()
    home, url = _home(
        tmp_path,
        f"  slack:\n    enabled: true\n    allow_all_users: true\n    base_url: {fake.base_url}\n",
    )
    env = {"SLACK_BOT_TOKEN": "xoxb-fake-token", "SLACK_SIGNING_SECRET": SECRET}
    ts = f"{now}.000100"
    ev = {
        "type": "message",
        "channel": "D0DM",
        "channel_type": "im",
        "user": "U1",
        "text": "hello",
        "ts": ts,
        "event_ts": ts,
    }
    try:
        proc = await _daemon(home, SWITCHBOARD_FAULT="after_send_before_mark", **env)
        await wait_healthy(url, proc)
        body, headers = signed(event(ev, "Ev1"))
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{url}/slack/events", data=body, headers=headers) as resp:
                    assert resp.status == 200
        except aiohttp.ClientError:
            pass  # the kill can beat the ack; the message was committed before it either way
        assert await asyncio.wait_for(proc.wait(), 30) == -9
        assert fake.shown("D0DM") == ["echo: hello"]
        assert _inbox(home) == [("answered", "ready")]
        proc = await _daemon(home, **env)
        try:
            await wait_healthy(url, proc)
            await _until_sent(home, lambda: fake.shown("D0DM"))
            health = await _health(url)
        finally:
            proc.terminate()
            await proc.wait()
    finally:
        await fake.stop()
    assert fake.shown("D0DM") == ["echo: hello"]
    assert len(fake.posted()) == 1
    [read] = [p for m, p in fake.calls if m == "conversations.history"]  # before the resend
    assert (read["channel"], read["oldest"]) == ("D0DM", ts)
    assert health["unsent_replies"] == 0
