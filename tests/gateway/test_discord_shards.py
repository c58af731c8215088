"""Discord with several gateway shards in one daemon (on SQLite no ledger:
the daemon runs every shard), against the fake that routes guild events by
(guild_id >> 22) % shard_count and DMs to shard 0 only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.adapters.discord import DiscordAdapter
from gateway.app import Gateway
from gateway.config import load_config
from gateway.messages import InboundMessage
from tests.fakes.discord import (
    DM,
    GENERAL,
    GENERAL2,
    GUILD,
    GUILD2,
    FakeDiscord,
    restore_discord_globals,
)


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    restore_discord_globals(monkeypatch)
    server = FakeDiscord(guilds=(GUILD, GUILD2))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_the_fake_puts_the_two_guilds_on_different_shards() -> None:
    assert FakeDiscord.shard_for({"guild_id": GUILD}, 2) == 0
    assert FakeDiscord.shard_for({"guild_id": GUILD2}, 2) == 1
    assert FakeDiscord.shard_for({"channel_id": DM}, 2) == 0  # a DM: shard 0
    assert FakeDiscord.shard_for({"guild_id": GUILD2}, 1) == 0


async def test_one_daemon_runs_every_shard_and_each_message_is_answered_once(
    tmp_path: Path, fake: FakeDiscord
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  discord:\n    allow_all_users: true\n"
    )
    adapter = DiscordAdapter(
        "fake-token",
        api_base=fake.api,
        gateway_url=fake.gateway,
        guild_ready_timeout_s=0.05,
        require_mention=False,
        shard_count=2,
    )
    gw = Gateway(config=load_config(cfg, {}), home=tmp_path / "home", adapters=[adapter])
    await gw.start()
    try:
        assert fake.connected_shards() == [(0, 2), (1, 2)]
        assert adapter.health()["shards"] == {"0": 0, "1": 0}
        await fake.dispatch("MESSAGE_CREATE", fake.message("one", GENERAL))
        await fake.dispatch("MESSAGE_CREATE", fake.message("two", GENERAL2, guild_id=GUILD2))
        await fake.dispatch("MESSAGE_CREATE", fake.message("three", DM, guild=False))
        await fake.wait_posted(3)
        await asyncio.sleep(0.3)  # room for a second answer, were an event delivered twice
        assert [p["content"] for p in fake.posted(GENERAL)] == ["echo: one"]
        assert [p["content"] for p in fake.posted(GENERAL2)] == ["echo: two"]
        assert [p["content"] for p in fake.posted(DM)] == ["echo: three"]
        assert fake.identifies == 2
        # a thread is made through the connection whose cache holds the guild's channel
        thread = await adapter.create_thread(GENERAL2, "side talk")
        assert thread is not None and thread.thread_id
    finally:
        await gw.stop()
    assert fake.connected_shards() == []


async def test_a_single_shard_connection_gets_every_guild_and_dm(fake: FakeDiscord) -> None:
    got: list[str] = []
    three = asyncio.Event()

    async def emit(msg: InboundMessage) -> None:
        got.append(msg.text)
        if len(got) == 3:
            three.set()

    adapter = DiscordAdapter(
        "fake-token",
        api_base=fake.api,
        gateway_url=fake.gateway,
        guild_ready_timeout_s=0.05,
        require_mention=False,
        catch_up_messages=0,
    )
    await adapter.start(emit)
    try:
        assert fake.connected_shards() == [(0, 1)]
        assert "shards" not in adapter.health()
        await fake.dispatch("MESSAGE_CREATE", fake.message("a", GENERAL))
        await fake.dispatch("MESSAGE_CREATE", fake.message("b", GENERAL2, guild_id=GUILD2))
        await fake.dispatch("MESSAGE_CREATE", fake.message("c", DM, guild=False))
        await asyncio.wait_for(three.wait(), 10)
        assert got == ["a", "b", "c"]
    finally:
        await adapter.stop()
