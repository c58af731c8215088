"""Mattermost: translation of recorded websocket payloads, the adapter against a loopback fake
of the REST API v4 and websocket (through the real mattermostautodriver and aiohttp), and the
whole daemon (router, state.db, echo agent) behind it."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.base import Backoff
from gateway.adapters.mattermost import MattermostAdapter
from gateway.adapters.mattermost_posts import from_event, to_inbound
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import ConfigError, InvalidToken, NotAccepted
from gateway.handoff import HOME_KEY, handoff_from_terminal
from gateway.messages import InboundMessage, OutboundMessage
from tests.fakes import stalled_then_on_time, wait_for_count
from tests.fakes.mattermost import (
    ANN,
    BOB,
    BOT_ID,
    DM,
    SECRET_ROOM,
    TOWN,
    TRIO,
    FakeMattermost,
)
from tests.gateway.conftest import ScriptedAgent, refused_at_start

FAST = Backoff(initial_s=0.05, factor=2.0, max_s=0.5, jitter=0.1)
KW = {"bot_id": BOT_ID, "bot_username": "switchboard"}


@pytest.fixture
async def fake() -> AsyncIterator[FakeMattermost]:
    server = FakeMattermost()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _config(
    tmp_path: Path, fake: FakeMattermost, extra: str = "    allow_all_users: true\n"
) -> Path:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  mattermost:\n    enabled: true\n"
        f"    url: {fake.url}\n{extra}"
    )
    return cfg


async def _gateway(
    tmp_path: Path, fake: FakeMattermost, token: str | None = None, **kw: Any
) -> Gateway:
    cfg = _config(tmp_path, fake, **kw)
    gw = Gateway(
        config=load_config(cfg, {"MATTERMOST_TOKEN": token or fake.token}), home=tmp_path / "home"
    )
    await gw.start()
    return gw


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeMattermost) -> AsyncIterator[Gateway]:
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


def _answers(fake: FakeMattermost, channel: str | None = None) -> list[str]:
    return [p["message"] for p in fake.bot_posts() if channel is None or p["channel_id"] == channel]


# --- translation, on recorded payloads ------------------------------------------------

POST = {
    "id": "p1",
    "create_at": 1764590000123,
    "update_at": 1764590000123,
    "edit_at": 0,
    "delete_at": 0,
    "user_id": ANN,
    "channel_id": TOWN,
    "root_id": "",
    "message": "hello",
    "type": "",
    "props": {},
    "metadata": {},
}


def _event(post: dict[str, Any], channel_type: str, **data: Any) -> dict[str, Any]:
    return {
        "event": "posted",
        "seq": 4,
        "broadcast": {"channel_id": post["channel_id"]},
        "data": {
            "channel_type": channel_type,
            "post": json.dumps(post),
            "sender_name": "@ann",
            "channel_display_name": "Town Square",
            **data,
        },
    }


def test_a_direct_message_is_a_dm_addressed_without_mention() -> None:
    msg = from_event(_event({**POST, "channel_id": DM}, "D"), **KW)
    assert msg is not None and msg.mentioned
    src = msg.source
    assert (src.chat_type, src.chat_id, src.user_id, src.user_name, src.thread_id) == (
        "dm",
        DM,
        ANN,
        "ann",
        None,
    )
    assert (msg.text, msg.platform_message_id, msg.received_at) == ("hello", "p1", 1764590000.123)


@pytest.mark.parametrize(
    ("message", "data", "addressed"),
    [
        ("hello all", {}, False),
        ("@switchboard what is up", {}, True),
        ("hey @SwitchBoard, what is up", {}, True),
        ("thanks @switchboard.", {}, True),
        ("ask @switchboard-dev instead", {}, False),
        ("mail me at x@switchboard", {}, False),
        ("what is up", {"mentions": json.dumps([BOT_ID])}, True),
        ("what is up", {"mentions": json.dumps([BOB])}, False),
    ],
)
def test_channel_posts_need_a_mention_by_name_or_in_the_mentions_list(
    message: str, data: dict[str, Any], addressed: bool
) -> None:
    msg = from_event(_event({**POST, "message": message}, "O", **data), **KW)
    assert msg is not None and msg.mentioned is addressed
    assert msg.source.chat_type == "group"
    # an addressed top-level post is answered in a thread rooted at it
    assert msg.source.thread_id == ("p1" if addressed else None)
    if addressed:
        assert "switchboard" not in msg.text.lower()


@pytest.mark.parametrize("channel_type", ["P", "G"])
def test_private_channels_and_group_dms_are_groups(channel_type: str) -> None:
    msg = from_event(_event({**POST, "message": "@switchboard hi"}, channel_type), **KW)
    assert msg is not None and msg.source.chat_type == "group" and msg.text == "hi"


def test_a_thread_reply_carries_its_root_and_continues_a_thread_the_bot_is_in() -> None:
    reply = {**POST, "root_id": "root9", "message": "and then?"}
    assert from_event(_event(reply, "O"), **KW).mentioned is False  # type: ignore[union-attr]
    msg = from_event(_event(reply, "O"), **KW, active_threads={(TOWN, "root9")})
    assert msg is not None and msg.mentioned and msg.source.thread_id == "root9"
    dm = from_event(_event({**reply, "channel_id": DM}, "D"), **KW)
    assert dm is not None and dm.source.thread_id == "root9" and dm.source.chat_type == "dm"


def test_require_mention_off_answers_every_channel_post() -> None:
    msg = from_event(_event(POST, "O"), **KW, require_mention=False)
    assert msg is not None and msg.mentioned


@pytest.mark.parametrize(
    "event",
    [
        _event({**POST, "user_id": BOT_ID}, "O"),  # our own post, echoed back
        _event({**POST, "type": "system_join_channel", "message": "ann joined"}, "O"),
        _event({**POST, "props": {"from_bot": "true"}}, "D"),
        _event({**POST, "props": {"from_webhook": "true"}}, "D"),
        _event({**POST, "delete_at": 5}, "D"),
        _event({**POST, "message": "   "}, "D"),
        _event(POST, "X"),
        {"event": "posted", "data": {"channel_type": "D", "post": "{not json"}},
        {"event": "posted", "data": {"channel_type": "D"}},
        {"event": "typing", "data": {"parent_id": ""}},
        {"event": "posted", "data": {"channel_type": "D", "post": json.dumps({"message": "x"})}},
    ],
)
def test_ignored_events(event: dict[str, Any]) -> None:
    assert from_event(event, **KW) is None


def test_a_post_fetched_while_catching_up_translates_like_a_live_one() -> None:
    msg = to_inbound({**POST, "message": "@switchboard later"}, "O", **KW)
    assert msg is not None and msg.mentioned and msg.source.user_name is None


# --- the adapter against the fake -------------------------------------------------------


async def _adapter(
    fake: FakeMattermost, seen: list[InboundMessage], **kw: Any
) -> MattermostAdapter:
    async def emit(msg: InboundMessage) -> None:
        seen.append(msg)

    adapter = MattermostAdapter(fake.token, fake.url, backoff=FAST, **kw)
    await adapter.start(emit)
    return adapter


async def test_replies_are_split_at_the_servers_max_post_size(fake: FakeMattermost) -> None:
    fake.max_post_size = 500
    adapter = await _adapter(fake, [])
    try:
        assert adapter.max_post_size == 500
        text = "\n\n".join(f"paragraph {i} " + "word " * 30 for i in range(12))
        ref = await adapter.send(OutboundMessage("mattermost", TOWN, text, thread_id="root1"))
        posts = fake.bot_posts()
        assert len(posts) == len(ref.message_ids) > 1
        assert all(len(p["message"]) <= 500 and p["root_id"] == "root1" for p in posts)
        assert "\n\n".join(p["message"] for p in posts).split() == text.split()
    finally:
        await adapter.stop()


async def test_a_mattermost_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    fake: FakeMattermost,
) -> None:
    """Replicas: the process stands still after a reply's send began and before its request
    left. The driver's httpx transport (send_by_transport) finds its SEND_BY passed as the
    request's headers are about to be written and stops it unsent (SetOutLate), so the turn
    can ask its lease first. On time, it is posted once."""
    adapter = await _adapter(fake, [])
    fake.keep_alive = False  # each call connects: the send waits for its connection
    try:
        await stalled_then_on_time(
            lambda: adapter.send(OutboundMessage("mattermost", TOWN, "once")),
            lambda: _answers(fake, TOWN),
        )
    finally:
        await adapter.stop()


async def test_without_max_post_size_in_the_client_config_the_default_holds(
    fake: FakeMattermost,
) -> None:
    fake.max_post_size = None
    adapter = await _adapter(fake, [])
    try:
        assert adapter.max_post_size == 16_383
        assert ("GET", "/config/client", {"format": "old"}) in fake.calls
    finally:
        await adapter.stop()


async def test_typing_goes_over_the_websocket_while_a_turn_runs(fake: FakeMattermost) -> None:
    seen: list[InboundMessage] = []
    adapter = await _adapter(fake, seen)
    try:
        await fake.say("@switchboard think hard", TOWN)
        [msg] = await wait_for_count(lambda: seen, 1, 10, "messages")
        adapter.turn_started(msg)
        [typing] = await wait_for_count(fake.typing, 1, 10, "typing actions")
        assert typing == {"channel_id": TOWN, "parent_id": msg.source.thread_id}
        await adapter.send(
            OutboundMessage("mattermost", TOWN, "done", thread_id=msg.source.thread_id)
        )
        assert not adapter._typing  # the reply ends it
    finally:
        await adapter.stop()


@pytest.mark.parametrize("catch_up_hours", [24.0, 0.0])
async def test_a_post_the_gateway_could_not_take_is_caught_up_later_in_order(
    fake: FakeMattermost, catch_up_hours: float
) -> None:
    """Inbox before ack: after NotAccepted the channel's position stays, later posts there
    wait, and a catch-up delivers both in order."""
    seen: list[str] = []
    refuse = {"first"}

    async def emit(msg: InboundMessage) -> None:
        if msg.text in refuse:
            refuse.clear()
            raise NotAccepted("store is busy")
        seen.append(msg.text)

    adapter = MattermostAdapter(fake.token, fake.url, backoff=FAST, catch_up_hours=catch_up_hours)
    await adapter.start(emit)
    try:
        await fake.say("first")
        await fake.say("second")
        await wait_for_count(lambda: seen, 2, 10, "messages")
        await asyncio.sleep(0.3)
        assert seen == ["first", "second"]
    finally:
        await adapter.stop()


async def test_a_failing_catch_up_holds_back_no_live_post_and_is_tried_again(
    fake: FakeMattermost,
) -> None:
    seen: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        seen.append(msg.text)

    adapter = MattermostAdapter(fake.token, fake.url, backoff=FAST)
    await adapter.start(emit)
    try:
        await fake.say("before")
        await wait_for_count(lambda: seen, 1, 10, "messages")
        await fake.drop_sockets(refuse=True)
        await fake.say("missed")
        refusals = fake.failures.setdefault("GET /users/{id}/channels", [])
        refusals += [(403, {})] * 4  # the server refuses the channel list 4 times (~1 s)
        fake.accept_sockets = True
        await fake.wait_connected(hellos=2)
        await fake.say("live")
        await wait_for_count(lambda: seen, 2, 10, "messages")
        assert seen == ["before", "live"] and refusals  # not held back by the catch-up
        await wait_for_count(lambda: seen, 3, 10, "messages")
        await asyncio.sleep(0.3)
        assert seen == ["before", "live", "missed"]  # each once
        reads = [path for verb, path, _b in fake.calls if path.endswith("/channels")]
        assert len(reads) == 6  # the first start's, four refused, the one that worked
    finally:
        await adapter.stop()


async def test_a_refused_token_fails_start_with_invalid_token(
    fake: FakeMattermost, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = MattermostAdapter("wrong", fake.url, backoff=FAST)
    with caplog.at_level(logging.INFO), pytest.raises(InvalidToken, match="rejected the token"):
        await adapter.start(lambda m: asyncio.sleep(0))
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "mattermost refused the token (401 from /api/v4/users/me); the adapter is stopped"
    ]
    assert adapter.health()["state"] == "failed: invalid token"
    assert [c[1] for c in fake.calls] == ["/users/me"]  # no retry, no websocket


async def test_a_token_revoked_while_running_stops_the_websocket(fake: FakeMattermost) -> None:
    adapter = await _adapter(fake, [])
    try:
        fake.token = "rotated"  # the old token no longer passes the authentication challenge
        await fake.drop_sockets()
        await wait_for_count(
            lambda: [1] if adapter.health()["state"] != "running" else [], 1, 10, "a failed state"
        )
        assert adapter.health()["state"] == "failed: invalid token"
        attempts = sum(1 for verb, _path, _b in fake.calls if verb == "WS")
        await asyncio.sleep(0.5)  # FAST backoff would have retried several times by now
        assert sum(1 for verb, _path, _b in fake.calls if verb == "WS") == attempts == 2
    finally:
        await adapter.stop()


def test_config_needs_the_server_url(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("platforms:\n  mattermost:\n    enabled: true\n    allow_all_users: true\n")
    with pytest.raises(ConfigError, match=r"platforms\.mattermost\.url: is required"):
        load_config(cfg, {"MATTERMOST_TOKEN": "tok"})
    cfg.write_text(
        "platforms:\n  mattermost:\n    enabled: true\n    url: https://chat.example.com/mm\n"
    )
    with pytest.raises(ConfigError, match="no path"):
        load_config(cfg, {"MATTERMOST_TOKEN": "tok"})
    cfg.write_text("platforms:\n  mattermost:\n    enabled: true\n    base_url: chat.example.com\n")
    with pytest.raises(ConfigError, match=r"platforms\.mattermost\.base_url: must be the server"):
        load_config(cfg, {"MATTERMOST_TOKEN": "tok"})


def test_without_the_client_library_the_config_check_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mattermostautodriver", None)  # as if not installed
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  mattermost:\n    enabled: true\n    url: https://chat.example.com\n"
        "    allow_all_users: true\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {"MATTERMOST_TOKEN": "tok"})
    assert str(err.value) == (
        "platforms.mattermost: needs the mattermostautodriver package: "
        "pip install 'switchboard[mattermost]'"
    )
    assert err.value.exit_code == 78


# --- the whole daemon -------------------------------------------------------------------


async def test_dm_round_trip(gw: Gateway, fake: FakeMattermost) -> None:
    await fake.say("hello bot")
    [reply] = await fake.wait_bot_posts(1)
    assert (reply["channel_id"], reply["message"], reply["root_id"]) == (DM, "echo: hello bot", "")
    assert await _stored(gw, f"agent:main:mattermost:dm:{DM}") == ["hello bot", "echo: hello bot"]
    assert gw.health()["adapters"]["mattermost"]["state"] == "running"
    await asyncio.sleep(0.3)  # the bot's own post came back over the websocket: not answered
    assert len(fake.bot_posts()) == 1


async def test_channels_need_a_mention_and_a_thread_is_shared(
    gw: Gateway, fake: FakeMattermost
) -> None:
    await fake.say("just humans talking", TOWN)
    root = await fake.say("@switchboard summarise please", TOWN)
    [reply] = await fake.wait_bot_posts(1)
    assert (reply["root_id"], reply["message"]) == (root["id"], "echo: [ann] summarise please")
    # bob follows up in that thread without a mention: the same, shared session
    await fake.say("and one more thing", TOWN, user=BOB, root_id=root["id"])
    posts = await fake.wait_bot_posts(2)
    assert posts[1]["root_id"] == root["id"]
    assert await _stored(gw, f"agent:main:mattermost:group:{TOWN}:t={root['id']}") == [
        "[ann] summarise please",
        "echo: [ann] summarise please",
        "[bob] and one more thing",
        "echo: [bob] and one more thing",
    ]
    # a mention through the event's mentions list, in a private channel
    await fake.say("over here", SECRET_ROOM, mentions=[BOT_ID])
    posts = await fake.wait_bot_posts(3)
    assert posts[2]["channel_id"] == SECRET_ROOM
    await asyncio.sleep(0.3)
    assert len(fake.bot_posts()) == 3  # the first, unaddressed post got nothing


async def test_a_chat_command_and_a_redelivered_post_answered_once(
    gw: Gateway, fake: FakeMattermost
) -> None:
    post = await fake.say(" /status")  # a leading space: Mattermost clients keep / for their own
    [reply] = await fake.wait_bot_posts(1)
    assert reply["message"].startswith("Session: ")
    await fake.redeliver(post)
    await asyncio.sleep(0.3)
    assert len(fake.bot_posts()) == 1


async def test_allowlists_are_by_user_id(tmp_path: Path, fake: FakeMattermost) -> None:
    gw = await _gateway(tmp_path, fake, extra=f"    allowed_users: [{ANN}]\n")
    try:
        await fake.say("@switchboard me too", TRIO, user=BOB)
        await fake.say("@switchboard hi", TRIO, user=ANN)
        [reply] = await fake.wait_bot_posts(1)
        assert reply["message"] == "echo: [ann] hi"
        await asyncio.sleep(0.3)
        assert len(fake.bot_posts()) == 1
    finally:
        await gw.stop()


@pytest.mark.parametrize(
    "headers", [{"X-Ratelimit-Reset": "1", "X-Ratelimit-Limit": "10"}, {"Retry-After": "1"}]
)
async def test_rate_limits_are_waited_out(
    gw: Gateway, fake: FakeMattermost, headers: dict[str, str]
) -> None:
    fake.fail_next("POST /posts", 429, headers)
    await fake.say("patience")
    [reply] = await fake.wait_bot_posts(1)
    assert reply["message"] == "echo: patience"
    assert sum(1 for verb, path, _ in fake.calls if (verb, path) == ("POST", "/posts")) == 2


async def test_server_errors_are_retried(gw: Gateway, fake: FakeMattermost) -> None:
    fake.fail_next("POST /posts", 502)
    await fake.say("still there?")
    [reply] = await fake.wait_bot_posts(1, timeout=15)
    assert reply["message"] == "echo: still there?"


async def test_missed_posts_are_caught_up_once_after_a_reconnect(
    gw: Gateway, fake: FakeMattermost
) -> None:
    await fake.say("before")
    await fake.wait_bot_posts(1)
    await fake.drop_sockets(refuse=True)
    one = await fake.say("missed one")
    await fake.say("people chatting", TOWN)
    mention = await fake.say("@switchboard missed two", TOWN)
    await fake.say("missed three")
    fake.accept_sockets = True
    await fake.wait_bot_posts(4, timeout=20)
    # each chat's missed posts in order (two sessions' turns run side by side)
    assert _answers(fake, DM) == ["echo: before", "echo: missed one", "echo: missed three"]
    [threaded] = [p for p in fake.bot_posts() if p["channel_id"] == TOWN]
    assert (threaded["message"], threaded["root_id"]) == ("echo: [ann] missed two", mention["id"])
    reads = dict(fake.since_reads())
    assert reads[DM] < one["create_at"]
    # a second reconnect with nothing new answers nothing again
    await fake.drop_sockets()
    await fake.wait_connected(hellos=fake.hellos + 1, timeout=20)
    await asyncio.sleep(0.5)
    assert len(fake.bot_posts()) == 4
    assert gw.health()["adapters"]["mattermost"]["reconnects"] >= 2


async def test_posts_made_while_the_daemon_was_stopped_are_answered_after_a_restart(
    tmp_path: Path, fake: FakeMattermost
) -> None:
    gw = await _gateway(tmp_path, fake)
    try:
        await fake.say("first run")
        await fake.wait_bot_posts(1)
    finally:
        await gw.stop()
    await fake.say("while you were out")
    await fake.say("@switchboard and here", TOWN)
    gw = await _gateway(tmp_path, fake)
    try:
        await fake.wait_bot_posts(3, timeout=20)
        assert _answers(fake, DM) == ["echo: first run", "echo: while you were out"]
        assert _answers(fake, TOWN) == ["echo: [ann] and here"]
        await asyncio.sleep(0.3)
        assert len(fake.bot_posts()) == 3
    finally:
        await gw.stop()


async def test_typing_shows_for_a_running_turn(tmp_path: Path, fake: FakeMattermost) -> None:
    agent = ScriptedAgent()
    agent.delay_on["slow"] = 0.5
    cfg = _config(tmp_path, fake)
    gw = Gateway(
        config=load_config(cfg, {"MATTERMOST_TOKEN": fake.token}),
        home=tmp_path / "home",
        agent=agent,
    )
    await gw.start()
    try:
        await fake.say("slow question")
        await wait_for_count(fake.typing, 1, 10, "typing while the turn runs")
        [reply] = await fake.wait_bot_posts(1)
        assert reply["message"] == "echo: slow question" and fake.typing()[0]["channel_id"] == DM
    finally:
        await gw.stop()


async def test_an_invalid_token_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeMattermost
) -> None:
    gw = await _gateway(tmp_path, fake, token="not-the-token")
    try:
        refused_at_start(gw, "mattermost", "rejected the token", ["platforms.mattermost.token_env"])
    finally:
        await gw.stop()


async def test_handoff_opens_a_thread_in_the_home_channel_that_continues_the_session(
    gw: Gateway, fake: FakeMattermost
) -> None:
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05
    await fake.say("@switchboard /sethome", TOWN)
    [ack] = await fake.wait_bot_posts(1)
    assert ack["message"].startswith("Home channel for mattermost set to")
    home = json.loads(await gw.db.get_meta(HOME_KEY.format("mattermost")) or "{}")
    assert home["chat_id"] == TOWN
    sid = await gw.db.create_session(source="cli", title="deploy plan")
    await gw.db.append_messages(sid, [{"role": "user", "content": "we must migrate"}])
    ok, message = await asyncio.wait_for(
        handoff_from_terminal(gw.db, sid, "mattermost", enabled=True), 30
    )
    assert ok, message
    _, seed, confirm = await fake.wait_bot_posts(3)
    assert (seed["message"], seed["root_id"], confirm["root_id"]) == ("deploy plan", "", seed["id"])
    await fake.say("follow-up", TOWN, user=BOB, root_id=seed["id"])
    await fake.wait_bot_posts(4)
    assert (await gw.db.get_messages(sid))[-2]["content"] == "[bob] follow-up"
    adapter = next(a for a in gw.adapters if isinstance(a, MattermostAdapter))
    assert await adapter.create_thread(DM, "no threads in a DM") is None
