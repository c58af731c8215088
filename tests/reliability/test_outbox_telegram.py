"""Exactly once where it can be, at most once where it cannot: the
daemon, a real subprocess polling the Telegram fake, SIGKILLs itself at each fault point
with one message in flight. After a restart the message is stored once and answered once;
a reply committed but possibly sent when the daemon died ('sending') is never sent again by
default (the gap is counted in /health) and sent again with
inbox.resend_unconfirmed_replies (at least once)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes.telegram import FakeTelegram


async def _daemon(home: Path, fake: FakeTelegram, **env: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(TELEGRAM_BOT_TOKEN=fake.token, **env),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


def _stored(home: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(home / "state.db")
    try:
        return conn.execute("SELECT role, content FROM messages ORDER BY id").fetchall()
    finally:
        conn.close()


async def _health(url: str) -> dict:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as resp:
        return await resp.json()


async def _settle(fake: FakeTelegram, home: Path, replies: int) -> None:
    """Until the store holds the exchange and the fake saw `replies` sends, then a moment
    more in which nothing else may arrive (checked by the caller's exact counts)."""
    for _ in range(400):
        if len(fake.sent()) >= replies and ("user", "hello") in _stored(home):
            break
        await asyncio.sleep(0.05)
    for _ in range(10):  # a duplicate would be sent within these polls
        await asyncio.sleep(0.05)


CASES = [  # (fault point, resend switch, replies the chat sees)
    ("after_inbox_commit", False, 1),
    ("mid_agent", False, 1),
    ("after_reply_commit", False, 0),  # stored, 'sending': at most once, counted
    ("after_reply_commit", True, 1),
    ("after_send_before_mark", False, 1),
    ("after_send_before_mark", True, 2),  # at least once: it may arrive twice
]


@pytest.mark.parametrize(("point", "resend", "replies"), CASES)
async def test_a_kill_at_each_fault_point_answers_as_promised(
    tmp_path: Path, point: str, resend: bool, replies: int
) -> None:
    fake = FakeTelegram()
    await fake.start()
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\n  telegram:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.base_url}\n"
        f"inbox:\n  resend_unconfirmed_replies: {'true' if resend else 'false'}\n"
    )
    url = f"http://127.0.0.1:{port}"
    try:
        proc = await _daemon(home, fake, SWITCHBOARD_FAULT=point)
        await wait_healthy(url, proc)
        fake.push(fake.message("hello", fake.dm_chat()))
        assert await asyncio.wait_for(proc.wait(), 30) == -9
        proc = await _daemon(home, fake)
        try:
            await wait_healthy(url, proc)
            await _settle(fake, home, replies)
            health = await _health(url)
        finally:
            proc.terminate()
            await proc.wait()
    finally:
        await fake.stop()
    assert [m["text"] for m in fake.sent()] == ["echo: hello"] * replies
    assert _stored(home) == [("user", "hello"), ("assistant", "echo: hello")]
    # a reply left 'sending' is one the outbox cannot vouch for: counted, whether or not
    # the chat got it (after_send_before_mark: it did)
    unconfirmed = point in ("after_reply_commit", "after_send_before_mark") and not resend
    assert health["unsent_replies"] == int(unconfirmed)
