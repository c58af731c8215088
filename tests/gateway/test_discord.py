"""Discord through the whole daemon, driven by the real discord.py against a loopback fake
of the REST API and the gateway websocket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.adapters.discord import DiscordAdapter, to_inbound
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import AdapterError, InvalidToken
from gateway.pipeline import APOLOGY, REFUSAL
from tests.fakes import wait_for_count
from tests.fakes.discord import GENERAL, THREAD, FakeDiscord, restore_discord_globals
from tests.gateway.conftest import ScriptedAgent


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    restore_discord_globals(monkeypatch)
    server = FakeDiscord()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _adapter(fake: FakeDiscord, token: str = "fake-token") -> DiscordAdapter:
    return DiscordAdapter(
        token, api_base=fake.api, gateway_url=fake.gateway, guild_ready_timeout_s=0.05
    )


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeDiscord) -> AsyncIterator[Gateway]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  discord:\n    allow_all_users: true\n"
    )
    gateway = Gateway(
        config=load_config(cfg, {}), home=tmp_path / "home", adapters=[_adapter(fake)]
    )
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


async def _stored(gw: Gateway, key: str) -> list[str]:
    assert gw.index is not None and gw.db is not None
    entry = gw.index.get(key)
    assert entry is not None, (key, [k for k, _ in gw.index.items()])
    return [m["content"] for m in await gw.db.get_messages(entry.session_id)]


async def test_dm_round_trip(gw: Gateway, fake: FakeDiscord) -> None:
    await fake.dispatch(
        "MESSAGE_CREATE", fake.message("hi there", "600000000000000001", guild=False)
    )
    [post] = await fake.wait_posted(1)
    assert post["content"] == "echo: hi there"
    assert post["allowed_mentions"]["parse"] == ["users"]  # no @everyone, no roles
    assert await _stored(gw, "agent:main:discord:dm:600000000000000001") == [
        "hi there",
        "echo: hi there",
    ]


async def test_guild_channel_needs_a_mention(gw: Gateway, fake: FakeDiscord) -> None:
    await fake.dispatch("MESSAGE_CREATE", fake.message("humans only", GENERAL))
    await fake.dispatch(
        "MESSAGE_CREATE", fake.message("<@300000000000000001> hello bot", GENERAL, mention=True)
    )
    [post] = await fake.wait_posted(1)
    await asyncio.sleep(0.2)
    assert len(fake.posted()) == 1 and post["content"] == "echo: hello bot"
    assert fake.posted(GENERAL) == [post]
    key = "agent:main:discord:group:200000000000000010:500000000000000001"
    assert await _stored(gw, key) == ["hello bot", "echo: hello bot"]
    assert gw.index is not None and gw.index.get(key).display_name == "Fake Guild / #general"  # type: ignore[union-attr]


async def test_a_thread_the_bot_owns_is_answered_without_a_mention(
    gw: Gateway, fake: FakeDiscord
) -> None:
    await fake.dispatch("MESSAGE_CREATE", fake.message("in the ticket thread", THREAD))
    [post] = await fake.wait_posted(1)
    assert fake.posted(THREAD) == [post]
    assert await _stored(gw, f"agent:main:discord:group:{THREAD}:t={THREAD}") == [
        "[ann] in the ticket thread",
        "echo: [ann] in the ticket thread",
    ]


async def test_long_replies_are_split_at_2000(gw: Gateway, fake: FakeDiscord) -> None:
    await fake.dispatch(
        "MESSAGE_CREATE", fake.message("x " * 1500, "600000000000000002", guild=False)
    )
    posts = await fake.wait_posted(2)
    assert all(len(p["content"]) <= 2000 for p in posts)


async def test_create_thread_and_a_refusal_is_reported(gw: Gateway, fake: FakeDiscord) -> None:
    adapter = next(a for a in gw.adapters if isinstance(a, DiscordAdapter))
    ref = await adapter.create_thread(GENERAL, "handoff")
    assert ref is not None and ref.chat_id == ref.thread_id
    [(verb, path, body)] = [c for c in fake.calls if c[1].endswith("/threads")]
    assert (path, body["name"], body["auto_archive_duration"]) == (
        f"/channels/{GENERAL}/threads",
        "handoff",
        1440,
    )
    fake.refuse_threads = True
    with pytest.raises(AdapterError, match="refused to create the thread"):
        await adapter.create_thread(GENERAL, "again")
    assert fake.posted() == []  # not silently replaced by a reply in the parent


async def test_reconnects_after_the_gateway_drops(gw: Gateway, fake: FakeDiscord) -> None:
    await fake.drop_connections(4000)
    await fake.wait_connected(timeout=20)
    for _ in range(200):  # until the session is resumed or re-identified
        if fake.resumes or fake.identifies > 1:
            break
        await asyncio.sleep(0.05)
    await fake.dispatch(
        "MESSAGE_CREATE", fake.message("still there?", "600000000000000003", guild=False)
    )
    [post] = await fake.wait_posted(1, timeout=15)
    assert post["content"] == "echo: still there?"


async def test_an_invalid_token_is_a_clear_error(fake: FakeDiscord) -> None:
    adapter = _adapter(fake, token="wrong")

    async def emit(_msg: object) -> None:
        raise AssertionError("nothing should arrive")

    with pytest.raises(InvalidToken, match="rejected the bot token"):
        await adapter.start(emit)  # type: ignore[arg-type]
    assert adapter.health()["state"] == "failed: invalid token"


@pytest.mark.parametrize(
    "fields, addressed",
    [
        ({"id": 1, "content": "x", "author_id": 2, "kind": "dm", "channel_id": 3}, True),
        ({"id": 1, "content": "x", "author_id": 2, "kind": "text", "channel_id": 3}, False),
        (
            {
                "id": 1,
                "content": "x",
                "author_id": 2,
                "kind": "text",
                "channel_id": 3,
                "mentions_bot": True,
            },
            True,
        ),
        (
            {
                "id": 1,
                "content": "x",
                "author_id": 2,
                "kind": "thread",
                "channel_id": 3,
                "parent_id": 9,
            },
            False,
        ),
    ],
)
def test_addressing_rules(fields: dict, addressed: bool) -> None:
    msg = to_inbound(fields)
    assert msg is not None and msg.mentioned is addressed
    assert to_inbound({**fields, "kind": "thread"}, active_threads={"3"}).mentioned is True  # type: ignore[union-attr]
    assert to_inbound({**fields, "kind": "text"}, free_channels=frozenset({"3"})).mentioned is True  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"content": "x"},
        {"id": 1, "content": "", "author_id": 2, "kind": "dm", "channel_id": 3},
        {
            "id": 1,
            "content": "x",
            "author_id": 2,
            "kind": "dm",
            "channel_id": 3,
            "author_bot": True,
        },
        {"id": 1, "content": "x", "author_id": 2, "kind": "voice", "channel_id": 3},
    ],
)
def test_ignored_messages(fields: dict) -> None:
    assert to_inbound(fields) is None


async def test_a_redelivered_message_is_answered_once_and_rate_limits_are_waited_out(
    gw: Gateway, fake: FakeDiscord
) -> None:
    fake.rate_limit_next_post = True
    data = fake.message("just once", "600000000000000004", guild=False)
    await fake.dispatch("MESSAGE_CREATE", data)
    await fake.dispatch("MESSAGE_CREATE", dict(data))  # the gateway replays the same message
    [post] = await fake.wait_posted(1)
    await asyncio.sleep(0.5)
    assert post["content"] == "echo: just once" and len(fake.posted()) == 1
    assert any(verb == "POST-429" for verb, _p, _b in fake.calls)  # the first attempt was refused


async def _until(check: Callable[[], bool], what: str) -> None:
    await wait_for_count(lambda: [True] if check() else [], 1, 10.0, what)


async def test_typing_shows_only_for_a_running_turn_and_stops_on_every_outcome(
    tmp_path: Path, fake: FakeDiscord
) -> None:
    """Typing starts when the router runs a turn, never for a duplicate or a user
    who is not allowed, and stops after a reply, a drop or a failure."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  discord:\n"
        "    allowed_users: ['500000000000000001']\n"
    )
    agent = ScriptedAgent()
    agent.delay_on["slow"] = 0.5
    agent.fail_on.add("boom")
    adapter = _adapter(fake)
    gateway = Gateway(
        config=load_config(cfg, {}), home=tmp_path / "home", adapters=[adapter], agent=agent
    )
    await gateway.start()

    def typed(channel: str) -> int:
        return sum(1 for _v, path, _b in fake.calls if path == f"/channels/{channel}/typing")

    try:
        a, b, c = "600000000000000011", "600000000000000012", "600000000000000013"
        first = fake.message("slow question", a, guild=False)
        await fake.dispatch("MESSAGE_CREATE", first)
        await _until(lambda: typed(a) > 0, "typing while the slow turn runs")
        [reply] = await fake.wait_posted(1)
        assert reply["content"] == "echo: slow question"
        await _until(lambda: adapter.health()["typing_in"] == [], "typing stopped after the reply")
        shown = typed(a)
        # a redelivered message and a user who is not allowed: no turn runs, no typing
        await fake.dispatch("MESSAGE_CREATE", dict(first))
        await fake.dispatch(
            "MESSAGE_CREATE", fake.message("let me in", c, user="500000000000000009", guild=False)
        )
        await fake.dispatch("MESSAGE_CREATE", fake.message("quick", b, guild=False))
        posted = await fake.wait_posted(3)  # the refusal and the quick reply, in either order
        assert sorted(p["content"] for p in posted[1:]) == [REFUSAL, "echo: quick"]
        assert typed(a) == shown and typed(c) == 0
        assert adapter.health()["typing_in"] == []
        # a failing turn: typing stops with the apology
        await fake.dispatch("MESSAGE_CREATE", fake.message("slow boom", b, guild=False))
        await _until(lambda: b in adapter.health()["typing_in"], "typing for the failing turn")
        apology = (await fake.wait_posted(4))[3]
        assert apology["content"] == APOLOGY
        await _until(lambda: adapter.health()["typing_in"] == [], "typing stopped after failure")
        assert len(fake.posted()) == 4  # the duplicate was answered by nobody
    finally:
        await gateway.stop()
