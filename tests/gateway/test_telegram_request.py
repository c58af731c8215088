"""python-telegram-bot on the adapter's aiohttp transport, against the loopback Bot API."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from telegram import Bot
from telegram.error import TimedOut

from gateway.adapters.telegram_request import AiohttpRequest
from tests.fakes.telegram import FakeTelegram

ODD = "a <b>tag</b> &x=1+2 % \u202eevil\u202c 你好 \U0001f600 \\n \"quoted\" 'single'"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    server = FakeTelegram()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def bot(fake: FakeTelegram) -> AsyncIterator[Bot]:
    request = AiohttpRequest(connect_timeout=5, read_timeout=5, pool_size=4)
    bot = Bot(fake.token, base_url=fake.base_url, request=request)
    await bot.initialize()
    try:
        yield bot
    finally:
        await bot.shutdown()


@pytest.mark.filterwarnings("ignore:Please use 'Bot.sendMessage'")
async def test_form_fields_reach_the_bot_api_as_sent(bot: Bot, fake: FakeTelegram) -> None:
    sent = await bot.send_message(chat_id=-100123, text=ODD, message_thread_id=9)
    raw = await bot.do_api_request(
        "sendMessage", api_kwargs={"chat_id": -100123, "text": ODD, "message_thread_id": 9}
    )
    assert fake.sent() == [{"chat_id": -100123, "text": ODD, "message_thread_id": 9}] * 2
    assert sent.text == raw["text"] == ODD
    assert [sent.message_id, raw["message_id"]] == [m["message_id"] for m in fake.posted]


async def test_a_call_without_parameters_sends_no_body(bot: Bot, fake: FakeTelegram) -> None:
    me = await bot.get_me()
    assert me.username == "switchboard_bot"
    assert fake.calls[-1] == ("getMe", {})


async def test_a_calls_own_read_timeout_ends_a_slow_answer(bot: Bot, fake: FakeTelegram) -> None:
    fake.outage.fail("timeout:3")
    with pytest.raises(TimedOut):
        # the body is written within the read budget: the wait is read + write
        await bot.send_message(chat_id=1, text="slow", read_timeout=0.2, write_timeout=0.1)
    # the transport's own budget (5 + 5 s) holds for the next call
    assert (await bot.send_message(chat_id=1, text="next")).text == "next"
