"""Inbox before ack on Discord, which has no ack: messages posted while the daemon was down are
fetched after a restart (REST history through discord.py, against the loopback fake) and
answered once each, in order; the window (count per channel, age) bounds the catch-up, and
a channel's position moves only after emit took its message."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.adapters.base import Backoff
from gateway.adapters.discord import DiscordAdapter
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import NotAccepted
from gateway.messages import InboundMessage
from gateway.wiring import StoreCursors
from state import open_store
from tests.fakes import wait_for_count
from tests.fakes.discord import THREAD, FakeDiscord, restore_discord_globals

DM = "600000000000000077"


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    restore_discord_globals(monkeypatch)
    server = FakeDiscord()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _daemon(tmp_path: Path, fake: FakeDiscord, **catch_up: float) -> Gateway:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  discord:\n    allow_all_users: true\n"
    )
    adapter = DiscordAdapter(
        "fake-token",
        api_base=fake.api,
        gateway_url=fake.gateway,
        guild_ready_timeout_s=0.05,
        **catch_up,  # type: ignore[arg-type]
    )
    return Gateway(config=load_config(cfg, {}), home=tmp_path / "home", adapters=[adapter])


def _texts(fake: FakeDiscord, channel: str) -> list[str]:
    return [p["content"] for p in fake.posted(channel)]


async def test_messages_posted_while_down_are_answered_once_in_order_after_restart(
    tmp_path: Path, fake: FakeDiscord
) -> None:
    gw = _daemon(tmp_path, fake)
    await gw.start()
    try:
        await fake.dispatch("MESSAGE_CREATE", fake.message("one", DM, guild=False))
        await fake.dispatch("MESSAGE_CREATE", fake.message("in the thread", THREAD))
        await fake.wait_posted(2)
    finally:
        await gw.stop()
    # the daemon is down: Discord keeps these, but will never push them to us
    for text in ("two", "three", "four"):
        fake.post_while_away(fake.message(text, DM, guild=False))
    fake.post_while_away(fake.message("missed in the thread", THREAD))

    gw = _daemon(tmp_path, fake)
    await gw.start()
    try:
        await wait_for_count(lambda: _texts(fake, DM), 4, 10, "DM answers")
        await wait_for_count(lambda: _texts(fake, THREAD), 2, 10, "thread answers")
        assert _texts(fake, DM) == ["echo: one", "echo: two", "echo: three", "echo: four"]
        assert _texts(fake, THREAD)[1] == "echo: [ann] missed in the thread"
        # a live message after the catch-up follows it, and nothing is answered twice
        await fake.dispatch("MESSAGE_CREATE", fake.message("five", DM, guild=False))
        await wait_for_count(lambda: _texts(fake, DM), 5, 10, "the live answer")
        assert gw.db is not None and gw.index is not None
        entry = gw.index.get(f"agent:main:discord:dm:{DM}")
        assert entry is not None
        users = [
            m["content"] for m in await gw.db.get_messages(entry.session_id) if m["role"] == "user"
        ]
        assert users == ["one", "two", "three", "four", "five"]
        adapter = gw.adapters[0]
        assert adapter.health()["caught_up"] == 4
    finally:
        await gw.stop()

    # a second restart with nothing new fetches, but answers nothing again
    gw = _daemon(tmp_path, fake)
    await gw.start()
    try:
        await wait_for_count(lambda: fake.history_requests(DM), 2, 10, "a second catch-up")
        await fake.dispatch("MESSAGE_CREATE", fake.message("six", DM, guild=False))
        await wait_for_count(lambda: _texts(fake, DM), 6, 10, "the live answer")
        assert _texts(fake, DM)[4:] == ["echo: five", "echo: six"]
    finally:
        await gw.stop()


async def test_the_catch_up_skips_messages_older_than_the_window_and_keeps_the_newest(
    tmp_path: Path, fake: FakeDiscord
) -> None:
    now = time.time()
    gw = _daemon(tmp_path, fake, catch_up_messages=2, catch_up_hours=24)
    await gw.start()
    try:
        await fake.dispatch(
            "MESSAGE_CREATE", fake.message("long ago", DM, guild=False, at=now - 30 * 3600)
        )
        await wait_for_count(lambda: _texts(fake, DM), 1, 10, "the first answer")
    finally:
        await gw.stop()
    fake.post_while_away(fake.message("stale", DM, guild=False, at=now - 25 * 3600))
    for text in ("fresh 1", "fresh 2", "fresh 3"):
        fake.post_while_away(fake.message(text, DM, guild=False))

    gw = _daemon(tmp_path, fake, catch_up_messages=2, catch_up_hours=24)
    await gw.start()
    try:
        await wait_for_count(lambda: _texts(fake, DM), 3, 10, "the caught-up answers")
        await fake.dispatch("MESSAGE_CREATE", fake.message("live", DM, guild=False))
        await wait_for_count(lambda: _texts(fake, DM), 4, 10, "the live answer")
        # stale is past the 24 h window; of three fresh ones, the newest two (the bound)
        assert _texts(fake, DM) == [
            "echo: long ago",
            "echo: fresh 2",
            "echo: fresh 3",
            "echo: live",
        ]
        [query] = fake.history_requests(DM)
        assert query["limit"] == "2"
    finally:
        await gw.stop()


async def test_a_position_moves_only_after_emit_took_the_message(
    tmp_path: Path, fake: FakeDiscord
) -> None:
    db = await open_store({"backend": "sqlite"}, tmp_path)
    cursors = StoreCursors(db, "discord")
    attempts: list[tuple[str, str | None]] = []

    async def emit(msg: InboundMessage) -> None:
        attempts.append((msg.text, await cursors.get(f"last:{DM}")))
        if len(attempts) == 1:
            raise NotAccepted("the store is busy")

    adapter = DiscordAdapter(
        "fake-token",
        api_base=fake.api,
        gateway_url=fake.gateway,
        guild_ready_timeout_s=0.05,
        backoff=Backoff(initial_s=0.01, max_s=0.05),
    )
    adapter.use_cursors(cursors)
    await adapter.start(emit)
    try:
        data = fake.message("offered again", DM, guild=False)
        await fake.dispatch("MESSAGE_CREATE", data)
        await wait_for_count(lambda: attempts, 2, 10, "a second offer")
        assert attempts == [("offered again", None), ("offered again", None)]
        # the position is kept in memory first, then written to the store
        stored = None
        for _ in range(200):  # the bound only catches a hang
            stored = await cursors.get(f"last:{DM}")
            if stored == data["id"] and await cursors.get("channels") == DM:
                break
            await asyncio.sleep(0.05)
        assert adapter._positions.get(DM) == int(data["id"])
        assert stored == data["id"]
        assert await cursors.get("channels") == DM
    finally:
        await adapter.stop()
        await db.close()
