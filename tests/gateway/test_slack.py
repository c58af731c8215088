"""Slack through the whole daemon: signed Events API requests to the daemon's HTTP server,
replies through slack_sdk to a loopback fake of the Web API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.adapters.slack import SlackAdapter, to_inbound, to_mrkdwn
from gateway.app import Gateway
from gateway.config import load_config
from tests.fakes.slack import BOT_USER, SECRET, FakeSlack, event, message, signed


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    server = FakeSlack()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeSlack) -> AsyncIterator[tuple[Gateway, str]]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  slack:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: {fake.base_url}\n"
    )
    env = {"SLACK_BOT_TOKEN": "xoxb-fake-token", "SLACK_SIGNING_SECRET": SECRET}
    gateway = Gateway(config=load_config(cfg, env), home=tmp_path / "home")
    await gateway.start()
    api = next(a for a in gateway.adapters if a.platform == "api")
    try:
        yield gateway, f"http://127.0.0.1:{api.bound_port}/slack/events"  # type: ignore[attr-defined]
    finally:
        await gateway.stop()


async def _post(url: str, payload: dict, **kw: object) -> int:
    body, headers = signed(payload, **kw)  # type: ignore[arg-type]
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=body, headers=headers) as resp:
            return resp.status


msg = message


async def test_dm_round_trip_and_session_key(gw: tuple[Gateway, str], fake: FakeSlack) -> None:
    gateway, url = gw
    assert await _post(url, event(msg("hello slack"))) == 200
    [post] = await fake.wait_posted(1)
    assert (post["channel"], post["text"]) == (
        "D0DM",
        "echo: hello slack",
    ) and "thread_ts" not in post
    assert gateway.index is not None and gateway.index.get("agent:main:slack:dm:D0DM") is not None


async def test_a_channel_mention_starts_a_thread_that_continues_without_mentions(
    gw: tuple[Gateway, str], fake: FakeSlack
) -> None:
    gateway, url = gw
    assert (
        await _post(url, event(msg("just humans talking", channel="C0GEN", ts="1.1"), "E1")) == 200
    )
    assert (
        await _post(
            url, event(msg(f"<@{BOT_USER}> summarise please", channel="C0GEN", ts="2.1"), "E2")
        )
        == 200
    )
    [post] = await fake.wait_posted(1)
    assert (post["thread_ts"], post["text"]) == (
        "2.1",
        "echo: [U1] summarise please",
    )  # a shared thread
    assert (
        await _post(
            url, event(msg("and one more thing", channel="C0GEN", ts="3.1", thread_ts="2.1"), "E3")
        )
        == 200
    )
    posts = await fake.wait_posted(2)
    assert posts[1]["thread_ts"] == "2.1"
    assert (
        gateway.index is not None
        and gateway.index.get("agent:main:slack:group:C0GEN:t=2.1") is not None
    )


async def test_slack_retries_and_double_deliveries_are_answered_once(
    gw: tuple[Gateway, str], fake: FakeSlack
) -> None:
    _, url = gw
    ev = msg("once please", ts="5.5")
    assert await _post(url, event(ev, "E9")) == 200
    assert await _post(url, event(ev, "E9")) == 200  # Slack's retry: same event id
    assert (
        await _post(url, event({**ev, "type": "app_mention"}, "E10")) == 200
    )  # the same message again
    await fake.wait_posted(1)
    await asyncio.sleep(0.3)
    assert len(fake.posted()) == 1


async def test_bad_signatures_and_stale_requests_are_refused(
    gw: tuple[Gateway, str], fake: FakeSlack
) -> None:
    _, url = gw
    assert await _post(url, event(msg("forged")), secret="wrong-secret") == 401
    assert await _post(url, event(msg("replayed")), age_s=600) == 401
    await asyncio.sleep(0.2)
    assert fake.posted() == []


async def test_rate_limits_are_waited_out(gw: tuple[Gateway, str], fake: FakeSlack) -> None:
    _, url = gw
    fake.fail_next("chat.postMessage", 429, {"Retry-After": "1"})
    assert await _post(url, event(msg("patience", ts="7.7"), "E7")) == 200
    posts = await fake.wait_posted(2)
    assert posts[-1]["text"] == "echo: patience"


async def test_create_thread_posts_a_seed_message_whose_ts_is_the_thread(
    gw: tuple[Gateway, str], fake: FakeSlack
) -> None:
    gateway, url = gw
    adapter = next(a for a in gateway.adapters if isinstance(a, SlackAdapter))
    ref = await adapter.create_thread("C0GEN", "Handoff from the terminal")
    [seed] = fake.posted()
    assert (seed["channel"], seed["text"]) == ("C0GEN", "Handoff from the terminal")
    assert ref is not None and (ref.chat_id, ref.thread_id) == ("C0GEN", "1700000000.000001")
    # a person answering in that thread needs no mention
    assert (
        await _post(
            url, event(msg("thanks", channel="C0GEN", ts="9.9", thread_ts=ref.thread_id), "E20")
        )
        == 200
    )
    posts = await fake.wait_posted(2)
    assert posts[1]["thread_ts"] == ref.thread_id


@pytest.mark.parametrize(
    "ev",
    [
        {"type": "message", "subtype": "message_changed", "channel": "C1", "ts": "1"},
        {
            "type": "message",
            "subtype": "bot_message",
            "channel": "C1",
            "ts": "1",
            "text": "x",
            "bot_id": "B",
        },
        {"type": "message", "channel": "C1", "ts": "1", "text": "x", "user": BOT_USER},
        {"type": "message", "channel": "C1", "ts": "1", "user": "U1"},
        {"type": "reaction_added", "user": "U1"},
        {"type": "message"},
        {"type": "message", "channel": "C1", "ts": "1", "text": ["x"], "user": "U1"},
    ],
)
def test_ignored_events(ev: dict) -> None:
    assert to_inbound(ev, BOT_USER) is None


def test_markdown_becomes_mrkdwn_outside_code() -> None:
    assert to_mrkdwn("**bold** and [docs](https://x.io/a)") == "*bold* and <https://x.io/a|docs>"
    assert to_mrkdwn("```\n**not bold**\n```") == "```\n**not bold**\n```"


async def test_socket_mode_acks_answers_and_reconnects_on_refresh(
    tmp_path: Path, fake: FakeSlack
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  slack:\n    enabled: true\n    allow_all_users: true\n"
        f"    mode: socket\n    base_url: {fake.base_url}\n"
    )
    env = {"SLACK_BOT_TOKEN": "xoxb-fake-token", "SLACK_APP_TOKEN": "xapp-fake-token"}
    gw = Gateway(config=load_config(cfg, env), home=tmp_path / "home")
    await gw.start()
    try:
        await fake.wait_socket(1)
        await fake.socket_event(
            event(msg("over the socket", ts="11.1"), "E31"), envelope_id="env-1"
        )
        [post] = await fake.wait_posted(1)
        assert post["text"] == "echo: over the socket"
        assert "env-1" in fake.acks
        await fake.socket_disconnect()  # Slack asks for a fresh connection
        await fake.wait_socket(2, timeout=20)
        await fake.socket_event(
            event(msg("after the refresh", ts="12.1"), "E32"), envelope_id="env-2"
        )
        posts = await fake.wait_posted(2, timeout=15)
        assert posts[1]["text"] == "echo: after the refresh"
    finally:
        await gw.stop()
