"""Inbox before ack on Telegram: the webhook answers 200 and the poller confirms an
update (the next getUpdates offset) only after `emit` returned, and an update the gateway
could not take comes back. Driven by python-telegram-bot against the loopback fake."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.adapters.api import ApiAdapter
from gateway.adapters.base import Backoff
from gateway.adapters.telegram import TelegramAdapter
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import NotAccepted
from gateway.messages import InboundMessage, OutboundMessage
from gateway.vocab import AdapterState
from tests.fakes import stalled_then_on_time, wait_for_count
from tests.fakes.telegram import FakeTelegram

SECRET = "s3cr3t-token"
QUICK = Backoff(initial_s=0.01, max_s=0.05)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    server = FakeTelegram()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _polling(fake: FakeTelegram) -> TelegramAdapter:
    return TelegramAdapter(fake.token, base_url=fake.base_url, poll_timeout_s=1, backoff=QUICK)


def _offsets(fake: FakeTelegram) -> list[int | None]:
    return [p.get("offset") for p in fake.sent("getUpdates")]


async def _post(url: str, update: dict) -> int:
    async with aiohttp.ClientSession() as http:
        headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
        async with http.post(url, json=update, headers=headers) as resp:
            return resp.status


@pytest.fixture
async def webhook(fake: FakeTelegram) -> AsyncIterator[tuple[TelegramAdapter, ApiAdapter]]:
    adapter = TelegramAdapter(
        fake.token,
        base_url=fake.base_url,
        webhook_url="https://bot.example/telegram/webhook",
        webhook_secret=SECRET,
    )
    server = ApiAdapter(port=0, routes=dict(adapter.routes()))
    yield adapter, server
    await adapter.stop()
    await server.stop()


async def _start(adapter: TelegramAdapter, server: ApiAdapter, emit) -> str:  # type: ignore[no-untyped-def]
    await server.start(emit)
    await adapter.start(emit)
    return f"http://127.0.0.1:{server.bound_port}/telegram/webhook"


async def test_webhook_answers_503_when_not_accepted_and_takes_the_redelivery(
    fake: FakeTelegram, webhook: tuple[TelegramAdapter, ApiAdapter]
) -> None:
    adapter, server = webhook
    attempts: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        attempts.append(msg.text)
        if len(attempts) == 1:
            raise NotAccepted("the store is busy")

    url = await _start(adapter, server, emit)
    update = {"update_id": 5, "message": fake.message("keep me", fake.dm_chat(3))}
    assert await _post(url, update) == 503  # Telegram will deliver it again
    assert await _post(url, update) == 200  # ... and this time it is taken
    assert attempts == ["keep me", "keep me"]


async def test_webhook_200_waits_for_emit_and_non_messages_are_answered_at_once(
    fake: FakeTelegram, webhook: tuple[TelegramAdapter, ApiAdapter]
) -> None:
    adapter, server = webhook
    entered, release = asyncio.Event(), asyncio.Event()
    taken: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        entered.set()
        await release.wait()
        taken.append(msg.text)

    url = await _start(adapter, server, emit)
    edit = {"update_id": 8, "edited_message": fake.message("an edit", fake.dm_chat(3))}
    assert await _post(url, edit) == 200  # not a message for us: answered without emit
    assert not entered.is_set()
    post = asyncio.create_task(
        _post(url, {"update_id": 9, "message": fake.message("slow", fake.dm_chat(3))})
    )
    await asyncio.wait_for(entered.wait(), 5)
    done, _ = await asyncio.wait({post}, timeout=0.3)
    assert not done, "the 200 went out while emit was still running"
    release.set()
    assert await asyncio.wait_for(post, 5) == 200
    assert taken == ["slow"]


async def test_polling_confirms_an_update_only_after_emit_returned(fake: FakeTelegram) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    taken: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        if msg.text == "first":
            entered.set()
            await release.wait()
        taken.append(msg.text)

    first = fake.push(fake.message("first", fake.dm_chat(3)))
    second = fake.push(fake.message("second", fake.dm_chat(3)))
    adapter = _polling(fake)
    await adapter.start(emit)
    try:
        await asyncio.wait_for(entered.wait(), 5)
        assert all(o is None or o <= first for o in _offsets(fake))  # nothing confirmed yet
        release.set()
        await wait_for_count(
            lambda: [o for o in _offsets(fake) if o == second + 1],
            1,
            5,
            "a poll confirming both updates",
        )
        assert taken == ["first", "second"]
        assert adapter.health()["offset"] == second + 1
    finally:
        await adapter.stop()
    # stop confirmed what was handled: nothing is fetched again
    assert fake.updates == []


async def test_polling_fetches_a_not_accepted_update_again(fake: FakeTelegram) -> None:
    attempts: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        attempts.append(msg.text)
        if len(attempts) == 1:
            raise NotAccepted("the store is busy")

    uid = fake.push(fake.message("keep me", fake.dm_chat(3)))
    adapter = _polling(fake)
    await adapter.start(emit)
    try:
        await wait_for_count(lambda: attempts, 2, 5, "a second delivery")
        assert attempts[:2] == ["keep me", "keep me"]
        offsets = _offsets(fake)
        assert offsets[:2] == [None, None]  # the second poll did not skip the refused update
        await wait_for_count(
            lambda: [o for o in _offsets(fake) if o == uid + 1], 1, 5, "the offset past the update"
        )
        assert "NotAccepted" in str(adapter.health()["last_error"])
    finally:
        await adapter.stop()


async def test_polling_reports_a_conflict_and_keeps_going(fake: FakeTelegram) -> None:
    taken: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        taken.append(msg.text)

    fake.fail_next("getUpdates", 409)
    adapter = _polling(fake)
    await adapter.start(emit)
    try:
        fake.push(fake.message("after the conflict", fake.dm_chat(3)))
        await wait_for_count(lambda: taken, 1, 5, "the message")
        assert "Conflict" in str(adapter.health()["last_error"])
        assert adapter.state == AdapterState.RUNNING
    finally:
        await adapter.stop()


async def test_polling_waits_out_flood_control_and_stops_on_a_refused_token(
    fake: FakeTelegram,
) -> None:
    taken: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        taken.append(msg.text)

    fake.fail_next("getUpdates", 429, retry_after=1)
    fake.push(fake.message("after the wait", fake.dm_chat(3)))
    adapter = _polling(fake)
    await adapter.start(emit)
    try:
        await wait_for_count(lambda: taken, 1, 5, "the message")
        fake.fail_next("getUpdates", 401)
        fake.push(fake.message("wake the poll", fake.dm_chat(3)))
        await wait_for_count(
            lambda: [1] if adapter.state.startswith(AdapterState.FAILED) else [],
            1,
            5,
            "the adapter to stop on the refused token",
        )
        assert "invalid token" in adapter.state
    finally:
        await adapter.stop()


async def test_webhook_through_the_daemon_is_answered_once_per_redelivery(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  telegram:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: {fake.base_url}\n    mode: webhook\n    webhook_url: https://bot.example/telegram/webhook\n"
    )
    env = {"TELEGRAM_BOT_TOKEN": "123:ABC", "TELEGRAM_WEBHOOK_SECRET": SECRET}
    gw = Gateway(config=load_config(cfg, env), home=tmp_path / "home")
    await gw.start()
    try:
        url = f"http://127.0.0.1:{gw.adapters[0].bound_port}/telegram/webhook"  # type: ignore[attr-defined]
        update = {"update_id": 1, "message": fake.message("once", fake.dm_chat(21))}
        assert await _post(url, update) == 200
        await fake.wait_sent(1)
        assert await _post(url, update) == 200  # Telegram retried: taken, not answered again
        assert gw.db is not None and gw.index is not None
        entry = gw.index.get("agent:main:telegram:dm:21")
        assert entry is not None
        msgs = await gw.db.get_messages(entry.session_id)
        assert [m["content"] for m in msgs if m["role"] == "user"] == ["once"]
        assert [s["text"] for s in fake.sent()] == ["echo: once"]
    finally:
        await gw.stop()


async def test_a_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    webhook: tuple[TelegramAdapter, ApiAdapter], fake: FakeTelegram
) -> None:
    """Replicas: the process stands still (SIGSTOP, a stalled VM) after a reply's send
    began and before its request left. Once the request has its connection it finds its
    SEND_BY passed and stops unsent (SetOutLate, through python-telegram-bot's wrapping),
    so the turn can ask its lease first; on time, it is sent."""
    adapter, server = webhook

    async def emit(_msg: InboundMessage) -> None:
        return None

    fake.keep_alive = False  # each call connects: the send waits for its connection
    await _start(adapter, server, emit)
    await stalled_then_on_time(
        lambda: adapter.send(OutboundMessage("telegram", "42", "once")),
        lambda: [m["text"] for m in fake.sent()],
    )
