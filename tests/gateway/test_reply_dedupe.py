"""Exactly once across a crash, at the adapter: a reply sent again under
the same dedupe key is shown once. Discord through nonce + enforce_nonce (one nonce per
part), Slack through a marker in message metadata that a resend reads back first; both
through the real client libraries against the loopback fakes."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from gateway.adapters import idempotent_replies
from gateway.adapters.discord import LIMIT as DISCORD_LIMIT
from gateway.adapters.discord import DiscordAdapter, reply_nonce
from gateway.adapters.feishu import LIMIT as FEISHU_LIMIT
from gateway.adapters.feishu import FeishuAdapter, reply_uuid
from gateway.adapters.slack import LIMIT as SLACK_LIMIT
from gateway.adapters.slack import SlackAdapter, posted_part, reply_metadata
from gateway.app import Gateway
from gateway.config import load_config
from gateway.messages import InboundMessage, OutboundMessage
from tests.fakes import stalled_then_on_time, started, wait_for_count
from tests.fakes.discord import DM, FakeDiscord, restore_discord_globals
from tests.fakes.feishu import APP_ID, APP_SECRET, ENCRYPT_KEY, ENV, VERIFICATION_TOKEN, FakeFeishu
from tests.fakes.feishu import message_event as feishu_event
from tests.fakes.feishu import signed as feishu_signed
from tests.fakes.slack import SECRET, FakeSlack


def test_the_registry_knows_which_platforms_dedupe_replies() -> None:
    assert idempotent_replies("discord") and idempotent_replies("slack")
    assert idempotent_replies("feishu")
    assert not idempotent_replies("telegram")
    assert not idempotent_replies("api")  # the core's own source: no adapter class
    assert not idempotent_replies("no-such-platform")


def test_a_nonce_is_stable_short_and_distinct() -> None:
    n = reply_nonce("sb-7", DM, 0)
    assert n == reply_nonce("sb-7", DM, 0) and len(n) <= 25
    others = {
        reply_nonce("sb-8", DM, 0),
        reply_nonce("sb-7", DM, 1),
        reply_nonce("sb-7", "600000000000000002", 0),
    }
    assert n not in others and len(others) == 3


def test_a_feishu_uuid_is_stable_within_fifty_characters_and_distinct() -> None:
    u = reply_uuid("sb-7", "oc_dm", 0)
    assert u == reply_uuid("sb-7", "oc_dm", 0) and len(u) <= 50
    others = {
        reply_uuid("sb-8", "oc_dm", 0),
        reply_uuid("sb-7", "oc_dm", 1),
        reply_uuid("sb-7", "oc_group", 0),
    }
    assert u not in others and len(others) == 3


@pytest.mark.parametrize(
    ("message", "key", "part"),
    [
        ({"metadata": reply_metadata("sb-3", 2)}, "sb-3", 2),
        ({"metadata": reply_metadata("sb-3", 2)}, "sb-4", None),  # another reply
        (
            {"metadata": {"event_type": "other", "event_payload": {"key": "sb-3", "part": 0}}},
            "sb-3",
            None,
        ),
        (
            {
                "metadata": {
                    "event_type": "switchboard_reply",
                    "event_payload": {"key": "sb-3", "part": "0"},
                }
            },
            "sb-3",
            None,
        ),
        (
            {
                "metadata": {
                    "event_type": "switchboard_reply",
                    "event_payload": {"key": "sb-3", "part": True},
                }
            },
            "sb-3",
            None,
        ),
        ({"metadata": {"event_type": "switchboard_reply"}}, "sb-3", None),
        ({"text": "no metadata"}, "sb-3", None),
    ],
)
def test_which_part_a_slack_message_is(message: dict, key: str, part: int | None) -> None:
    assert posted_part(message, key) == part


# --- Discord -----------------------------------------------------------------------------


@pytest.fixture
async def discord_bot(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[DiscordAdapter, FakeDiscord]]:
    restore_discord_globals(monkeypatch)
    fake = FakeDiscord()
    await fake.start()
    adapter = DiscordAdapter(
        "fake-token",
        api_base=fake.api,
        gateway_url=fake.gateway,
        guild_ready_timeout_s=0.05,
        catch_up_messages=0,
    )

    async def emit(_msg: InboundMessage) -> None:
        raise AssertionError("no inbound message in these tests")

    await adapter.start(emit)
    try:
        yield adapter, fake
    finally:
        await adapter.stop()
        await fake.stop()


def _dc(text: str, key: str | None, resend: bool = False) -> OutboundMessage:
    return OutboundMessage("discord", DM, text, dedupe_key=key, resend=resend)


async def test_discord_sends_each_part_with_its_own_enforced_nonce(
    discord_bot: tuple[DiscordAdapter, FakeDiscord],
) -> None:
    adapter, fake = discord_bot
    text = "a" * (DISCORD_LIMIT - 10) + "\n" + "b" * 50
    ref = await adapter.send(_dc(text, "sb-41"))
    posts = fake.posted(DM)
    assert len(posts) == len(ref.message_ids) == 2
    assert [p["nonce"] for p in posts] == [reply_nonce("sb-41", DM, i) for i in (0, 1)]
    assert all(p["enforce_nonce"] is True for p in posts)
    # the resend after a crash: the same nonces, answered with the messages already made
    again = await adapter.send(_dc(text, "sb-41", resend=True))
    assert again.message_ids == ref.message_ids
    assert len(fake.deduped()) == 2 and len(fake.posted(DM)) == 2
    assert len(fake.shown(DM)) == 2


async def test_discord_dedupes_only_within_its_window_and_only_under_a_key(
    discord_bot: tuple[DiscordAdapter, FakeDiscord],
) -> None:
    adapter, fake = discord_bot
    await adapter.send(_dc("no key", None))
    await adapter.send(_dc("no key", None))  # notices, apologies: a random nonce each
    assert fake.shown(DM) == ["no key", "no key"]
    fake.nonce_window_s = 0.0  # Discord forgets a nonce after a few minutes
    await adapter.send(_dc("late", "sb-9"))
    await adapter.send(_dc("late", "sb-9", resend=True))
    assert fake.shown(DM)[2:] == ["late", "late"]


async def test_a_discord_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replicas: the process stands still (SIGSTOP, a stalled VM) after a reply's send
    began and before its request left. Once discord.py's REST request has its connection
    it finds its SEND_BY passed and stops unsent (SetOutLate, out of adapter.send), so the
    turn can ask its lease first (gateway/turns.py's send_checked). On time, it is sent."""
    restore_discord_globals(monkeypatch)
    fake = FakeDiscord(keep_alive=False)  # from the start: no pooled connection to reuse
    await fake.start()
    adapter = DiscordAdapter(
        "fake-token",
        api_base=fake.api,
        gateway_url=fake.gateway,
        guild_ready_timeout_s=0.05,
        catch_up_messages=0,
    )

    async def emit(_msg: InboundMessage) -> None:
        raise AssertionError("no inbound message in this test")

    try:
        await adapter.start(emit)
        try:
            await stalled_then_on_time(
                lambda: adapter.send(_dc("once", "sb-12")), lambda: fake.shown(DM)
            )
            assert len(fake.posted(DM)) == 1  # the stalled send never reached the server
        finally:
            await adapter.stop()
    finally:
        await fake.stop()
    assert len(fake.posted(DM)) == 1 and fake.shown(DM) == ["once"]


# --- Slack -------------------------------------------------------------------------------


@pytest.fixture
async def slack_bot() -> AsyncIterator[tuple[SlackAdapter, FakeSlack]]:
    fake = FakeSlack()
    await fake.start()
    try:
        yield SlackAdapter("xoxb-fake", SECRET, base_url=fake.base_url), fake
    finally:
        await fake.stop()


def _sl(
    text: str,
    key: str | None,
    resend: bool = False,
    thread: str | None = None,
    channel: str = "D0DM",
) -> OutboundMessage:
    return OutboundMessage(
        "slack",
        channel,
        text,
        thread_id=thread,
        reply_to="1600000000.000100",
        dedupe_key=key,
        resend=resend,
    )


async def test_slack_marks_each_part_and_a_resend_posts_none_twice(
    slack_bot: tuple[SlackAdapter, FakeSlack],
) -> None:
    adapter, fake = slack_bot
    text = "a" * (SLACK_LIMIT - 10) + "\n" + "b" * 50
    ref = await adapter.send(_sl(text, "sb-5"))
    assert [p["metadata"] for p in fake.posted()] == [reply_metadata("sb-5", i) for i in (0, 1)]
    again = await adapter.send(_sl(text, "sb-5", resend=True))
    assert again.message_ids == ref.message_ids
    assert len(fake.shown("D0DM")) == 2
    [(_m, read)] = [(m, p) for m, p in fake.calls if m == "conversations.history"]
    assert read["channel"] == "D0DM" and read["oldest"] == "1600000000.000100"
    assert read["include_all_metadata"] in ("1", "true")


async def test_a_slack_resend_posts_only_the_parts_missing_from_a_thread(
    slack_bot: tuple[SlackAdapter, FakeSlack],
) -> None:
    adapter, fake = slack_bot
    text = "a" * (SLACK_LIMIT - 10) + "\n" + "b" * 50
    await adapter.send(_sl(text, "sb-6", thread="1600000000.000100", channel="C0GEN"))
    fake.history["C0GEN"].pop()  # the daemon died between the two parts
    await adapter.send(_sl("unrelated", "sb-7", thread="1600000000.000100", channel="C0GEN"))
    await adapter.send(_sl(text, "sb-6", resend=True, thread="1600000000.000100", channel="C0GEN"))
    reads = [p for m, p in fake.calls if m == "conversations.replies"]
    assert [r["ts"] for r in reads] == ["1600000000.000100"]
    shown = fake.shown("C0GEN")
    assert len(shown) == 3 and shown[2].startswith("b") and shown[1] == "unrelated"
    assert [m["metadata"]["event_payload"] for m in fake.history["C0GEN"]] == [
        {"key": "sb-6", "part": 0},
        {"key": "sb-7", "part": 0},
        {"key": "sb-6", "part": 1},
    ]


async def test_a_first_send_does_not_read_and_a_keyless_one_carries_no_marker(
    slack_bot: tuple[SlackAdapter, FakeSlack],
) -> None:
    adapter, fake = slack_bot
    await adapter.send(_sl("hi", None))
    await adapter.send(_sl("hi", None, resend=True))  # no key: nothing to look for
    assert [m for m, _p in fake.calls] == ["chat.postMessage", "chat.postMessage"]
    assert all("metadata" not in p for p in fake.posted())


async def test_a_rate_limited_read_before_a_slack_resend_is_waited_out(
    slack_bot: tuple[SlackAdapter, FakeSlack],
) -> None:
    adapter, fake = slack_bot
    await adapter.send(_sl("once", "sb-10"))
    fake.fail_next("conversations.history", 429, {"Retry-After": "0"})
    await adapter.send(_sl("once", "sb-10", resend=True))
    assert [m for m, _p in fake.calls].count("conversations.history") == 2
    assert fake.shown("D0DM") == ["once"]


async def test_a_slack_reply_that_stood_still_on_its_way_out_stops_before_it_is_posted(
    slack_bot: tuple[SlackAdapter, FakeSlack],
) -> None:
    """Replicas: the process stands still (SIGSTOP, a stalled VM) after a reply's send
    began and before its request left. Once the request has its connection it finds its
    SEND_BY passed and stops unsent (SetOutLate), so the turn can ask its lease first
    (gateway/turns.py's send_checked). On time, it is posted."""
    adapter, fake = slack_bot

    fake.keep_alive = False  # each call connects: the send waits for its connection
    async with started(adapter):
        await stalled_then_on_time(
            lambda: adapter.send(_sl("once", "sb-11")), lambda: fake.shown("D0DM")
        )


async def test_a_slack_resend_that_cannot_read_the_conversation_still_sends(
    slack_bot: tuple[SlackAdapter, FakeSlack],
) -> None:
    adapter, fake = slack_bot
    fake.fail_next("conversations.history", 403)
    ref = await adapter.send(_sl("hello again", "sb-8", resend=True))
    assert len(ref.message_ids) == 1 and fake.shown("D0DM") == ["hello again"]
    assert adapter.last_error is not None and "before a resend" in adapter.last_error


async def test_a_sending_reply_of_a_deduping_platform_is_resent_at_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outbox entry left 'sending' (committed before its platform deduped, or by an
    older version) is safe to send again on such a platform: sent under its key, shown
    once, marked 'sent', not counted as unsent."""
    restore_discord_globals(monkeypatch)
    fake = FakeDiscord()
    await fake.start()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  discord:\n    allow_all_users: true\n"
    )

    def gateway() -> Gateway:
        adapter = DiscordAdapter(
            "fake-token",
            api_base=fake.api,
            gateway_url=fake.gateway,
            guild_ready_timeout_s=0.05,
            catch_up_messages=0,
        )
        return Gateway(config=load_config(cfg, {}), home=tmp_path / "home", adapters=[adapter])

    async def deliver(_gw: Gateway) -> None:
        await fake.dispatch("MESSAGE_CREATE", fake.message("hi", DM, guild=False))
        await fake.wait_posted(1)

    try:
        await _left_sending_then_restarted(tmp_path, gateway, deliver)
    finally:
        await fake.stop()
    assert fake.shown(DM) == ["echo: hi"]
    assert len(fake.deduped()) == 1


async def _left_sending_then_restarted(
    tmp_path: Path, gateway: Callable[[], Gateway], deliver: Callable[[Gateway], Awaitable[None]]
) -> None:
    """A first daemon answers one message (`deliver` sends it and waits for the reply) and
    marks it sent; the mark is undone, as if the daemon died between the send and the mark;
    a second daemon on the same home sends it again: marked sent, not counted unsent."""
    first = gateway()
    await first.start()
    try:
        await deliver(first)
        await wait_for_count(lambda: _outbox(tmp_path, "sent"), 1, 10, "sent rows")
    finally:
        await first.stop()
    _outbox(tmp_path, "sending", set_to=True)  # as if the mark never happened
    second = gateway()
    await second.start()
    try:
        await wait_for_count(lambda: _outbox(tmp_path, "sent"), 1, 10, "sent rows")
        assert second.metrics.unsent.total() == 0
    finally:
        await second.stop()


def _outbox(tmp_path: Path, state: str, set_to: bool = False) -> list[int]:
    """The inbox rows whose reply is in `state`; with set_to, every row is put there."""
    conn = sqlite3.connect(tmp_path / "home" / "state.db")
    try:
        if set_to:
            with conn:
                conn.execute("UPDATE inbox SET reply_state = ?", (state,))
        return [r[0] for r in conn.execute("SELECT id FROM inbox WHERE reply_state = ?", (state,))]
    finally:
        conn.close()


# --- Feishu ------------------------------------------------------------------------------


def _feishu(fake: FakeFeishu) -> FeishuAdapter:
    return FeishuAdapter(APP_ID, APP_SECRET, ENCRYPT_KEY, VERIFICATION_TOKEN, domain=fake.base_url)


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    fake = FakeFeishu()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def _fs(text: str, key: str | None, resend: bool = False) -> OutboundMessage:
    return OutboundMessage("feishu", "oc_dm", text, dedupe_key=key, resend=resend)


async def test_feishu_sends_each_part_under_a_uuid_from_the_replys_key(feishu: FakeFeishu) -> None:
    adapter = _feishu(feishu)
    text = "a" * (FEISHU_LIMIT - 10) + "\n" + "b" * 50
    ref = await adapter.send(_fs(text, "sb-51"))
    assert len(feishu.sent()) == len(ref.message_ids) == 2
    assert [p["uuid"] for p in feishu.sent()] == [reply_uuid("sb-51", "oc_dm", i) for i in (0, 1)]
    # the resend after a crash: the same uuids, answered with the messages already made
    again = await adapter.send(_fs(text, "sb-51", resend=True))
    assert again.message_ids == ref.message_ids
    assert len(feishu.deduped()) == 2 and len(feishu.sent()) == 2


async def test_feishu_dedupes_only_within_its_hour_and_only_under_a_key(feishu: FakeFeishu) -> None:
    adapter = _feishu(feishu)
    await adapter.send(_fs("no key", None))
    await adapter.send(_fs("no key", None))  # notices, apologies: a random uuid each
    assert [p["markdown"] for p in feishu.sent()] == ["no key", "no key"]
    feishu.uuid_window_s = 0.0  # Feishu forgets a uuid after an hour
    await adapter.send(_fs("late", "sb-52"))
    await adapter.send(_fs("late", "sb-52", resend=True))
    assert [p["markdown"] for p in feishu.sent()][2:] == ["late", "late"]


@pytest.mark.parametrize("late_first", [False, True])
async def test_a_feishu_reply_sent_late_by_a_replica_that_stood_still_shows_once(
    feishu: FakeFeishu, late_first: bool
) -> None:
    """Replicas: one replica's reply stood still on its way out (Feishu's client opens a
    connection per request and takes no hook, so nothing stops it there) while another took
    the chat over and sent the dead runner's reply again, then the chat's next one. Whichever
    of the two sends of that reply reaches Feishu first, the chat shows it once, before the
    next."""
    stalled, new_holder = _feishu(feishu), _feishu(feishu)
    if late_first:
        await stalled.send(_fs("first", "sb-61"))
    await new_holder.send(_fs("first", "sb-61", resend=True))
    await new_holder.send(_fs("second", "sb-62"))
    if not late_first:
        await stalled.send(_fs("first", "sb-61"))
    assert [p["markdown"] for p in feishu.sent()] == ["first", "second"]
    assert len(feishu.deduped()) == 1


async def test_a_sending_feishu_reply_is_resent_at_start_up_and_shown_once(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    """An outbox entry left 'sending' (the daemon died between the send and its mark) is
    sent again at start-up under its uuid: shown once, marked 'sent', not counted unsent."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  feishu:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {feishu.base_url}\n"
    )

    def gateway() -> Gateway:
        return Gateway(config=load_config(cfg, ENV), home=tmp_path / "home")

    async def deliver(gw: Gateway) -> None:
        api = next(a for a in gw.adapters if a.platform == "api")
        url = f"http://127.0.0.1:{api.bound_port}/feishu/events"  # type: ignore[attr-defined]
        body, headers = feishu_signed(feishu_event("hi"))
        async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as r:
            assert r.status == 200
        await feishu.wait_sent(1)

    await _left_sending_then_restarted(tmp_path, gateway, deliver)
    assert [p["markdown"] for p in feishu.sent()] == ["echo: hi"]
    assert len(feishu.deduped()) == 1
