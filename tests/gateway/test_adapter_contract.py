"""The Adapter contract, checked on every adapter: start with an emit callback, deliver an
OutboundMessage, answer create_thread with a ThreadRef or None, report health, stop cleanly
(twice is harmless)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.adapters.api import ApiAdapter
from gateway.adapters.telegram import TelegramAdapter
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from tests.fakes.telegram import FakeTelegram


@pytest.fixture(params=["api", "telegram"])
async def adapter_under_test(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[object, str, object]]:
    if request.param == "api":
        yield ApiAdapter(port=0), "chat-1", None
        return
    fake = FakeTelegram()
    await fake.start()
    try:
        yield TelegramAdapter(fake.token, base_url=fake.base_url, poll_timeout_s=1), "42", fake
    finally:
        await fake.stop()


async def test_adapter_contract(adapter_under_test: tuple[object, str, object]) -> None:
    adapter, chat_id, fake = adapter_under_test
    seen: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        seen.append(msg)

    assert isinstance(adapter.platform, str) and adapter.platform  # type: ignore[attr-defined]
    await adapter.start(emit)  # type: ignore[attr-defined]
    try:
        assert adapter.health()["state"] == "running"  # type: ignore[attr-defined]
        ref = await adapter.send(OutboundMessage(adapter.platform, chat_id, "hello"))  # type: ignore[attr-defined]
        assert (
            isinstance(ref, SentRef) and ref.platform == adapter.platform and ref.chat_id == chat_id
        )
        thread = await adapter.create_thread(chat_id, "a thread")  # type: ignore[attr-defined]
        assert thread is None or (thread.platform == adapter.platform and thread.thread_id)
        if isinstance(adapter, ApiAdapter):
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{adapter.bound_port}/health") as resp:
                    assert resp.status == 200
        if isinstance(fake, FakeTelegram):
            assert fake.sent()[0]["text"] == "hello"
    finally:
        await adapter.stop()  # type: ignore[attr-defined]
        await adapter.stop()  # type: ignore[attr-defined]
    assert adapter.health()["state"] == "stopped"  # type: ignore[attr-defined]
