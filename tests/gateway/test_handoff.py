"""Handoff from the terminal to a chat thread, end to end through each platform's fake:
the thread is created on the home channel, the confirmation lands there, and the next
message a person sends in that thread continues the very same session id."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.adapters.discord import DiscordAdapter
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.handoff import HOME_KEY, configured_home, handoff_from_terminal
from state import SessionDB
from tests.fakes.discord import GENERAL, FakeDiscord, restore_discord_globals
from tests.fakes.slack import BOT_USER, SECRET, FakeSlack, event, signed
from tests.fakes.telegram import FakeTelegram
from tests.inprocess import gateway_with_telegram


async def _terminal_session(db: SessionDB) -> str:
    sid = await db.create_session(source="cli", title="deploy plan")
    await db.append_messages(
        sid,
        [
            {"role": "user", "content": "we must migrate the database"},
            {"role": "assistant", "content": "echo: we must migrate the database"},
        ],
    )
    return sid


async def _run(gw: Gateway, sid: str, platform: str, **kw: object) -> tuple[bool, str]:
    assert gw.db is not None
    return await asyncio.wait_for(
        handoff_from_terminal(gw.db, sid, platform, enabled=True, **kw), 30
    )  # type: ignore[arg-type]


@pytest.fixture
async def telegram(tmp_path: Path) -> AsyncIterator[tuple[Gateway, FakeTelegram]]:
    async with gateway_with_telegram(tmp_path, "allow_all_users: true") as (gw, fake):
        fake.forum_chats.add(-100222)
        assert gw.handoffs is not None
        gw.handoffs.poll_s = 0.05
        yield gw, fake


async def test_telegram_handoff_opens_a_topic_and_the_topic_continues_the_session(
    telegram: tuple[Gateway, FakeTelegram],
) -> None:
    gw, fake = telegram
    assert gw.db is not None
    await gw.db.set_meta(
        HOME_KEY.format("telegram"), json.dumps({"chat_id": "-100222", "chat_type": "group"})
    )
    sid = await _terminal_session(gw.db)
    ok, message = await _run(gw, sid, "telegram")
    assert ok, message
    [topic] = fake.sent("createForumTopic")
    assert topic["name"] == "deploy plan"
    [confirm] = await fake.wait_sent(1)
    assert confirm["message_thread_id"] and confirm["text"].startswith(
        "Continuing here from the terminal (deploy plan)."
    )
    assert "we must migrate the database" in confirm["text"]  # the summary
    row = await gw.db.require_session(sid)
    assert (row["handoff_state"], row["source"], row["ended_at"]) == ("completed", "telegram", None)
    thread = confirm["message_thread_id"]
    chat = fake.group_chat(-100222, forum=True)
    fake.push(fake.message("@switchboard_bot carry on", chat, user_id=7, thread=thread))
    await fake.wait_sent(2)
    contents = [m["content"] for m in await gw.db.get_messages(sid)]
    assert contents[-2:] == ["[Ann] carry on", "echo: [Ann] carry on"]  # the same session id


async def test_no_home_channel_and_no_daemon_leave_the_session_as_it_was(
    telegram: tuple[Gateway, FakeTelegram], tmp_path: Path
) -> None:
    gw, _fake = telegram
    assert gw.db is not None
    sid = await _terminal_session(gw.db)
    ok, message = await _run(gw, sid, "telegram")
    assert not ok and "no home channel yet: send /sethome" in message
    # a second store on another home: nobody is watching it
    lonely = await SessionDB.open(tmp_path / "lonely" / "state.db")
    try:
        await lonely.set_meta(HOME_KEY.format("telegram"), json.dumps({"chat_id": "1"}))
        lone = await _terminal_session(lonely)
        ok, message = await handoff_from_terminal(
            lonely, lone, "telegram", enabled=True, claim_timeout_s=0.3, poll_s=0.05
        )
        assert not ok and "the gateway is not running" in message
        row = await lonely.require_session(lone)
        assert row["handoff_state"] is None and row["source"] == "cli"
        ok, message = await handoff_from_terminal(lonely, lone, "slack", enabled=False)
        assert not ok and "not enabled" in message
    finally:
        await lonely.close()


async def test_a_refused_thread_fails_the_handoff_and_keeps_the_terminal_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restore_discord_globals(monkeypatch)
    fake = FakeDiscord()
    await fake.start()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  discord:\n    allow_all_users: true\n"
    )
    adapter = DiscordAdapter(
        fake.token, api_base=fake.api, gateway_url=fake.gateway, guild_ready_timeout_s=0.05
    )
    gw = Gateway(config=load_config(cfg, {}), home=tmp_path / "home", adapters=[adapter])
    await gw.start()
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05
    try:
        await gw.db.set_meta(HOME_KEY.format("discord"), json.dumps({"chat_id": GENERAL}))
        sid = await _terminal_session(gw.db)
        fake.refuse_threads = True
        ok, message = await _run(gw, sid, "discord")
        assert not ok and "refused to create the thread" in message
        row = await gw.db.require_session(sid)
        assert (row["handoff_state"], row["source"], row["message_count"]) == ("failed", "cli", 2)
        assert fake.posted() == []
        fake.refuse_threads = False  # and a retry goes through, into a new thread
        ok, message = await _run(gw, sid, "discord")
        assert ok, message
        [post] = await fake.wait_posted(1)
        thread_id = next(
            p.split("/")[2] for v, p, _ in fake.calls if v == "POST" and p.endswith("/messages")
        )
        await fake.dispatch("MESSAGE_CREATE", fake.message("in the new thread", thread_id))
        await fake.wait_posted(2)
        assert (await gw.db.get_messages(sid))[-1]["content"].startswith("echo:")
        assert post["content"].startswith("Continuing here from the terminal")
    finally:
        await gw.stop()
        await fake.stop()


async def test_slack_handoff_seeds_a_thread_that_continues_the_session(tmp_path: Path) -> None:
    import aiohttp

    fake = FakeSlack()
    await fake.start()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"platforms:\n  api:\n    port: 0\n  slack:\n    enabled: true\n    allow_all_users: true\n    base_url: {fake.base_url}\n"
    )
    gw = Gateway(
        config=load_config(cfg, {"SLACK_BOT_TOKEN": "xoxb-x", "SLACK_SIGNING_SECRET": SECRET}),
        home=tmp_path / "home",
    )
    await gw.start()
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05
    try:
        await gw.db.set_meta(HOME_KEY.format("slack"), json.dumps({"chat_id": "C0GEN"}))
        sid = await _terminal_session(gw.db)
        ok, message = await _run(gw, sid, "slack")
        assert ok, message
        seed, confirm = await fake.wait_posted(2)
        assert seed["text"] == "deploy plan" and confirm["thread_ts"] == "1700000000.000001"
        body, headers = signed(
            event(
                {
                    "type": "message",
                    "channel": "C0GEN",
                    "channel_type": "channel",
                    "user": "U1",
                    "text": "follow-up",
                    "ts": "9.1",
                    "thread_ts": confirm["thread_ts"],
                },
                "E77",
            )
        )
        url = f"http://127.0.0.1:{gw.adapters[0].bound_port}/slack/events"  # type: ignore[attr-defined]
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=body, headers=headers) as resp:
                assert resp.status == 200
        await fake.wait_posted(3)
        assert (await gw.db.get_messages(sid))[-2]["content"] == "[U1] follow-up"
        assert BOT_USER  # the fake's bot identity is what Bolt uses to ignore its own posts
    finally:
        await gw.stop()
        await fake.stop()


async def test_a_handoff_left_running_by_a_dead_gateway_is_failed_not_stuck(
    telegram: tuple[Gateway, FakeTelegram],
) -> None:
    gw, _ = telegram
    assert gw.db is not None and gw.handoffs is not None
    sid = await _terminal_session(gw.db)
    await gw.db.request_handoff(sid, "telegram", now=time.time() - 1000)
    await gw.db.claim_handoff(
        ["telegram"], now=time.time() - 1000
    )  # claimed by a daemon that then died
    await gw.handoffs.run_once()
    row = await gw.db.require_session(sid)
    assert row["handoff_state"] == "failed" and "stopped during the handoff" in row["handoff_error"]


async def test_only_one_of_two_claimers_wins(tmp_path: Path) -> None:
    a = await SessionDB.open(tmp_path / "state.db")
    b = await SessionDB.open(tmp_path / "state.db")
    try:
        sid = await _terminal_session(a)
        assert await a.request_handoff(sid, "telegram")
        assert not await a.request_handoff(sid, "telegram")  # already in flight
        claims = await asyncio.gather(a.claim_handoff(["telegram"]), b.claim_handoff(["telegram"]))
        assert sorted(c is not None for c in claims) == [False, True]
    finally:
        await a.close()
        await b.close()


async def test_the_configured_home_channel_is_the_default_and_sethome_overrides_it(
    tmp_path: Path,
) -> None:
    # platforms.<p>.home_channel is where a handoff goes until /sethome picks another chat
    line = "allow_all_users: true\n    require_mention: false\n    home_channel: '-100222'"
    async with gateway_with_telegram(tmp_path, line) as (gw, fake):
        assert gw.db is not None and gw.handoffs is not None
        gw.handoffs.poll_s = 0.05
        fake.forum_chats.update({-100222, -100333})
        configured = gw.config.platform("telegram")["home_channel"]
        sid = await _terminal_session(gw.db)
        ok, message = await _run(gw, sid, "telegram", configured_home=configured)
        assert ok, message
        [topic] = fake.sent("createForumTopic")
        assert topic["chat_id"] == -100222
        # /sethome in another chat wins over the config from then on
        fake.push(fake.message("/sethome", fake.group_chat(-100333, forum=True)))
        ack = (await fake.wait_sent(2))[-1]
        assert ack["text"] == "Home channel for telegram set to this chat."
        await gw.db.set_session_title(sid, None)
        second = await _terminal_session(gw.db)
        ok, message = await _run(gw, second, "telegram", configured_home=configured)
        assert ok, message
        assert [t["chat_id"] for t in fake.sent("createForumTopic")] == [-100222, -100333]


def test_a_configured_home_channel_may_name_a_thread_and_is_checked(tmp_path: Path) -> None:
    home = configured_home("telegram", "-100222:77")
    assert home == {"chat_id": "-100222", "thread_id": "77", "chat_type": "group"}
    assert configured_home("telegram", 12345)["chat_type"] == "dm"  # type: ignore[index]
    assert configured_home("discord", None) is None
    for bad in ("-100222:", ":77", "a:b:c"):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"platforms:\n  telegram:\n    home_channel: '{bad}'\n")
        with pytest.raises(ConfigError) as err:
            load_config(cfg, {})
        assert err.value.key == "platforms.telegram.home_channel"
