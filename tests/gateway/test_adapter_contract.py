"""The Adapter contract, checked on every adapter against its loopback fake: start with an
emit callback, deliver an OutboundMessage, answer create_thread with a ThreadRef or None,
report health, stop cleanly (twice is harmless)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.adapters.api import ApiAdapter
from gateway.adapters.discord import DiscordAdapter
from gateway.adapters.matrix import MatrixAdapter
from gateway.adapters.slack import SlackAdapter
from gateway.adapters.telegram import TelegramAdapter
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from tests.fakes.discord import GENERAL, FakeDiscord, restore_discord_globals
from tests.fakes.matrix import BOT, FakeMatrix
from tests.fakes.slack import SECRET, FakeSlack
from tests.fakes.telegram import FakeTelegram


@pytest.fixture(params=["api", "telegram", "discord", "slack", "matrix"])
async def case(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Any, str, Any]]:
    if request.param == "api":
        yield ApiAdapter(port=0), "chat-1", None
        return
    fake: Any
    if request.param == "telegram":
        fake = FakeTelegram()
    elif request.param == "discord":
        restore_discord_globals(monkeypatch)
        fake = FakeDiscord()
    elif request.param == "matrix":
        fake = FakeMatrix()
    else:
        fake = FakeSlack()
    await fake.start()
    try:
        if isinstance(fake, FakeTelegram):
            yield TelegramAdapter(fake.token, base_url=fake.base_url, poll_timeout_s=1), "42", fake
        elif isinstance(fake, FakeDiscord):
            adapter = DiscordAdapter(
                fake.token, api_base=fake.api, gateway_url=fake.gateway, guild_ready_timeout_s=0.05
            )
            yield adapter, GENERAL, fake
        elif isinstance(fake, FakeMatrix):
            fake.add_room(
                "!general:fake.test", {"@alice:fake.test": "Alice", "@bob:fake.test": "Bob"}
            )
            yield (
                MatrixAdapter(fake.base_url, BOT, fake.token, poll_timeout_s=1),
                "!general:fake.test",
                fake,
            )
        else:
            yield SlackAdapter("xoxb-fake", SECRET, base_url=fake.base_url), "C0GEN", fake
    finally:
        await fake.stop()


def _delivered(fake: Any) -> str:
    if isinstance(fake, FakeTelegram):
        return str(fake.sent()[0]["text"])
    if isinstance(fake, FakeDiscord):
        return str(fake.posted(GENERAL)[0]["content"])
    if isinstance(fake, FakeMatrix):
        return str(fake.sends()[0]["body"])
    return str(fake.posted()[0]["text"])


async def test_adapter_contract(case: tuple[Any, str, Any]) -> None:
    adapter, chat_id, fake = case
    seen: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        seen.append(msg)

    assert isinstance(adapter.platform, str) and adapter.platform
    await adapter.start(emit)
    try:
        assert adapter.health()["state"] == "running"
        ref = await adapter.send(OutboundMessage(adapter.platform, chat_id, "hello"))
        assert (
            isinstance(ref, SentRef) and ref.platform == adapter.platform and ref.chat_id == chat_id
        )
        if fake is not None:
            assert _delivered(fake) == "hello" and ref.message_ids
        thread = await adapter.create_thread(chat_id, "a thread")
        assert thread is None or (thread.platform == adapter.platform and thread.thread_id)
        if isinstance(adapter, ApiAdapter):
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{adapter.bound_port}/health") as resp:
                    assert resp.status == 200
    finally:
        await adapter.stop()
        await adapter.stop()
    assert adapter.health()["state"] == "stopped"
