"""Telegram through the whole daemon (router, state.db, echo agent), driven by the real
python-telegram-bot against a loopback fake of the Bot API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from telegram import Bot
from telegram.error import TimedOut

from gateway.adapters.telegram import TelegramAdapter, to_inbound
from gateway.adapters.telegram_request import AiohttpRequest
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import SEND_TRANSIENT, InvalidToken, send_failure
from gateway.messages import OutboundMessage
from gateway.pipeline import REFUSAL
from tests.fakes import wait_for_count
from tests.fakes.telegram import FakeTelegram
from tests.gateway.conftest import ScriptedAgent, refused_at_start


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    server = FakeTelegram()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _gateway(tmp_path: Path, fake: FakeTelegram, token: str = "123:ABC") -> Gateway:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  telegram:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: {fake.base_url}\n"
    )
    gw = Gateway(config=load_config(cfg, {"TELEGRAM_BOT_TOKEN": token}), home=tmp_path / "home")
    await gw.start()
    return gw


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeTelegram) -> AsyncIterator[Gateway]:
    gateway = await _gateway(tmp_path, fake)
    try:
        yield gateway
    finally:
        await gateway.stop()


async def _stored(gw: Gateway, key: str) -> list[str]:
    assert gw.index is not None and gw.db is not None
    entry = gw.index.get(key)
    assert entry is not None, key
    return [m["content"] for m in await gw.db.get_messages(entry.session_id)]


async def test_dm_round_trip(gw: Gateway, fake: FakeTelegram) -> None:
    fake.push(fake.message("hello bot", fake.dm_chat(7)))
    [sent] = await fake.wait_sent(1)
    assert (sent["chat_id"], sent["text"]) == (7, "echo: hello bot")
    assert "message_thread_id" not in sent
    assert await _stored(gw, "agent:main:telegram:dm:7") == ["hello bot", "echo: hello bot"]
    assert gw.health()["adapters"]["telegram"]["state"] == "running"


async def test_group_messages_need_a_mention_and_are_per_user(
    gw: Gateway, fake: FakeTelegram
) -> None:
    chat = fake.group_chat(-100111)
    fake.push(fake.message("chatter between humans", chat, user_id=1))
    fake.push(fake.message("@switchboard_bot what time is it", chat, user_id=1))
    fake.push(fake.message("/status@switchboard_bot", chat, user_id=2, name="Bob"))
    sent = await fake.wait_sent(2)
    await asyncio.sleep(0.2)
    assert len(fake.sent()) == 2
    texts = [s["text"] for s in sent]
    assert "echo: what time is it" in texts and any(t.startswith("Session: ") for t in texts)
    assert await _stored(gw, "agent:main:telegram:group:-100111:1") == [
        "what time is it",
        "echo: what time is it",
    ]


async def test_a_forum_topic_is_a_shared_thread_and_replies_stay_in_it(
    gw: Gateway, fake: FakeTelegram
) -> None:
    chat = fake.group_chat(-100222, forum=True)
    fake.push(fake.message("/title topic talk", chat, user_id=1, thread=77))
    fake.push(
        fake.message("@switchboard_bot hi from the topic", chat, user_id=2, name="Bob", thread=77)
    )
    sent = await fake.wait_sent(2)
    assert all(s["message_thread_id"] == 77 for s in sent)
    assert await _stored(gw, "agent:main:telegram:group:-100222:t=77") == [
        "[Bob] hi from the topic",
        "echo: [Bob] hi from the topic",
    ]


async def test_long_replies_are_split_below_the_limit(gw: Gateway, fake: FakeTelegram) -> None:
    text = ("word " * 1000).strip()  # the echo reply is ~5,000 characters
    fake.push(fake.message(text, fake.dm_chat(8)))
    sent = await fake.wait_sent(2)
    assert all(len(s["text"]) <= 4096 for s in sent)
    assert " ".join(s["text"] for s in sent).split() == ("echo: " + text).split()


async def test_flood_control_is_waited_out_not_dropped(gw: Gateway, fake: FakeTelegram) -> None:
    fake.fail_next("sendMessage", 429, retry_after=1)
    fake.push(fake.message("are you there", fake.dm_chat(9)))
    sent = await fake.wait_sent(2)  # the refused attempt, then the real one
    assert sent[-1]["text"] == "echo: are you there"


async def test_a_redelivered_message_is_answered_once(gw: Gateway, fake: FakeTelegram) -> None:
    msg = fake.message("only once", fake.dm_chat(10))
    fake.push(msg)
    await fake.wait_sent(1)
    fake.push(dict(msg))  # the same message in a new update
    await asyncio.sleep(0.5)
    assert len(fake.sent()) == 1


@pytest.mark.slow
async def test_polling_recovers_after_the_server_fails(gw: Gateway, fake: FakeTelegram) -> None:
    fake.fail_next("getUpdates", 502)
    fake.fail_next("getUpdates", 502)
    await asyncio.sleep(0.1)
    fake.push(fake.message("after the outage", fake.dm_chat(11)))
    [sent] = await fake.wait_sent(1, timeout=15)
    assert sent["text"] == "echo: after the outage"


async def test_create_thread_makes_a_forum_topic_or_says_none(
    gw: Gateway, fake: FakeTelegram
) -> None:
    fake.forum_chats.add(-100222)
    adapter = next(a for a in gw.adapters if isinstance(a, TelegramAdapter))
    ref = await adapter.create_thread("-100222", "handoff")
    assert ref is not None and ref.chat_id == "-100222" and ref.thread_id.isdigit()
    assert fake.sent("createForumTopic")[0]["name"] == "handoff"
    assert await adapter.create_thread("-100111", "nope") is None


async def test_a_reply_sent_carries_the_bot_apis_ids_and_a_revoked_token_keeps_it(
    gw: Gateway, fake: FakeTelegram
) -> None:
    adapter = next(a for a in gw.adapters if isinstance(a, TelegramAdapter))
    text = "a <b>tag</b> \u202e" + "x" * 5000  # two parts
    ref = await adapter.send(OutboundMessage("telegram", "42", text, thread_id="7"))
    sent = fake.sent()
    assert [p["text"] for p in sent] == [text[:4096], text[4096:]]
    assert {(p["chat_id"], p["message_thread_id"]) for p in sent} == {(42, 7)}
    assert ref.message_ids == tuple(str(m["message_id"]) for m in fake.posted)
    # once getMe has worked, python-telegram-bot calls the token's 401 a missing method:
    # the send is still one the credentials block (kept for later), not one refused
    fake.fail_next("sendMessage", 401)
    with pytest.raises(InvalidToken) as failed:
        await adapter.send(OutboundMessage("telegram", "42", "later"))
    assert send_failure(failed.value) == (SEND_TRANSIENT, 0.0)


async def test_an_invalid_token_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    gw = await _gateway(tmp_path, fake, token="999:WRONG")
    try:
        refused_at_start(gw, "telegram", "rejected the bot token", ["platforms.telegram.token_env"])
    finally:
        await gw.stop()


@pytest.mark.parametrize(
    "update",
    [
        {},
        {"update_id": 1},
        {"update_id": 1, "message": None},
        {"update_id": 1, "message": {"message_id": 1}},
        {
            "update_id": 1,
            "message": {"message_id": 1, "chat": {"id": 5, "type": "private"}},
        },  # no text
        {
            "update_id": 1,
            "message": {"message_id": 1, "text": "x", "chat": {"id": 5, "type": "weird"}},
        },
        {"update_id": 1, "message": {"message_id": 1, "text": "x", "chat": "not a dict"}},
        {
            "update_id": 1,
            "message": {
                "message_id": 1,
                "text": "x",
                "chat": {"id": 5, "type": "private"},
                "from": {"id": 9, "is_bot": True},
            },
        },
        {
            "update_id": 1,
            "edited_message": {"message_id": 1, "text": "x", "chat": {"id": 5, "type": "private"}},
        },
        {
            "update_id": 1,
            "message": {"message_id": 1, "text": 42, "chat": {"id": 5, "type": "private"}},
        },
    ],
)
def test_malformed_or_irrelevant_updates_are_ignored(update: dict) -> None:
    assert to_inbound(update, "switchboard_bot") is None


def test_general_topic_and_reply_chains_are_not_threads() -> None:
    base = {
        "message_id": 5,
        "text": "@switchboard_bot hi",
        "chat": {"id": -1, "type": "supergroup", "is_forum": True},
        "from": {"id": 3, "is_bot": False, "first_name": "A"},
    }
    general = to_inbound({"update_id": 1, "message": base}, "switchboard_bot")
    chain = to_inbound(
        {"update_id": 2, "message": {**base, "message_thread_id": 4}}, "switchboard_bot"
    )
    topic = to_inbound(
        {"update_id": 3, "message": {**base, "message_thread_id": 4, "is_topic_message": True}},
        "switchboard_bot",
    )
    assert general is not None and general.source.thread_id is None and general.text == "hi"
    assert chain is not None and chain.source.thread_id is None
    assert topic is not None and topic.source.thread_id == "4"
    channel = to_inbound(
        {
            "update_id": 4,
            "channel_post": {
                "message_id": 9,
                "text": "news",
                "chat": {"id": -5, "type": "channel", "title": "C"},
            },
        },
        None,
        False,
    )
    assert channel is not None and channel.source.chat_type == "channel"


async def test_webhook_mode_checks_the_secret_and_delivers_updates(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    import aiohttp

    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  telegram:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: {fake.base_url}\n    mode: webhook\n    webhook_url: https://bot.example/telegram/webhook\n"
    )
    env = {"TELEGRAM_BOT_TOKEN": "123:ABC", "TELEGRAM_WEBHOOK_SECRET": "s3cr3t-token"}
    gw = Gateway(config=load_config(cfg, env), home=tmp_path / "home")
    await gw.start()
    try:
        [hook] = fake.sent("setWebhook")
        assert (hook["url"], hook["secret_token"]) == (
            "https://bot.example/telegram/webhook",
            "s3cr3t-token",
        )
        assert fake.sent("getUpdates") == []  # no polling in webhook mode
        url = f"http://127.0.0.1:{gw.adapters[0].bound_port}/telegram/webhook"  # type: ignore[attr-defined]
        update = {"update_id": 1, "message": fake.message("via webhook", fake.dm_chat(21))}
        async with aiohttp.ClientSession() as http:
            for headers, status in (({}, 403), ({"X-Telegram-Bot-Api-Secret-Token": "wrong"}, 403)):
                async with http.post(url, json=update, headers=headers) as resp:
                    assert resp.status == status
            good = {"X-Telegram-Bot-Api-Secret-Token": "s3cr3t-token"}
            async with http.post(url, data=b"{not json", headers=good) as resp:
                assert resp.status == 400
            async with http.post(url, json=update, headers=good) as resp:
                assert resp.status == 200
        [sent] = await fake.wait_sent(1)
        assert sent["text"] == "echo: via webhook"
    finally:
        await gw.stop()


async def test_typing_shows_only_for_a_running_turn(tmp_path: Path, fake: FakeTelegram) -> None:
    """Typing starts when the router runs a turn (one slower than TYPING_AFTER_S),
    not for a redelivered message or a user who is not allowed, and ends with the reply."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  telegram:\n    enabled: true\n"
        f"    allowed_users: ['7', '8']\n    base_url: {fake.base_url}\n"
    )
    agent = ScriptedAgent()
    agent.delay_on["slow"] = 1.5
    gateway = Gateway(
        config=load_config(cfg, {"TELEGRAM_BOT_TOKEN": "123:ABC"}),
        home=tmp_path / "home",
        agent=agent,
    )
    await gateway.start()

    def typed(chat: int) -> list[dict[str, object]]:
        return [a for a in fake.sent("sendChatAction") if a["chat_id"] == chat]

    try:
        first = fake.message("slow question", fake.dm_chat(7))
        fake.push(first)
        await wait_for_count(lambda: typed(7), 1, 10.0, "typing while the turn runs")
        [reply] = await fake.wait_sent(1)
        assert reply["text"] == "echo: slow question" and typed(7)[0]["action"] == "typing"
        shown = len(typed(7))
        fake.push(dict(first))  # redelivered under a new update id
        fake.push(fake.message("let me in", fake.dm_chat(9), user_id=9))
        fake.push(fake.message("quick", fake.dm_chat(8), user_id=8))
        sent = await fake.wait_sent(3)
        assert sorted(m["text"] for m in sent[1:]) == [REFUSAL, "echo: quick"]
        assert len(typed(7)) == shown and typed(9) == []
        assert typed(8) == []  # answered at once: no typing
    finally:
        await gateway.stop()


# --- python-telegram-bot on the adapter's aiohttp transport ------------------------------

ODD = "a <b>tag</b> &x=1+2 % \u202eevil\u202c 你好 \U0001f600 \\n \"quoted\" 'single'"


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
