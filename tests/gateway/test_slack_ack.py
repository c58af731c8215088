"""Inbox before ack on Slack: the Events API response and the Socket Mode ack go
out only after `emit` returned; an event the gateway could not take is not acknowledged
(503, or no envelope ack) and its retry is taken. Real slack-bolt against the loopback fake."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.adapters.api import ApiAdapter
from gateway.adapters.slack import SlackAdapter
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import NotAccepted
from gateway.messages import InboundMessage
from tests.fakes import wait_for_count
from tests.fakes.slack import SECRET, FakeSlack, event, signed


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    server = FakeSlack()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def dm(text: str, ts: str) -> dict:
    return {
        "type": "message",
        "channel": "D0DM",
        "user": "U1",
        "text": text,
        "ts": ts,
        "event_ts": ts,
        "channel_type": "im",
    }


async def _post(url: str, payload: dict, retry: int | None = None) -> int:
    body, headers = signed(payload)
    if retry is not None:
        headers |= {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_error"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=body, headers=headers) as resp:
            return resp.status


@pytest.fixture
async def events_api(fake: FakeSlack) -> AsyncIterator[tuple[SlackAdapter, ApiAdapter]]:
    adapter = SlackAdapter("xoxb-fake-token", SECRET, base_url=fake.base_url)
    server = ApiAdapter(port=0, routes=dict(adapter.routes()))
    yield adapter, server
    await adapter.stop()
    await server.stop()


async def _serve(pair: tuple[SlackAdapter, ApiAdapter], emit) -> str:  # type: ignore[no-untyped-def]
    adapter, server = pair
    await server.start(emit)
    await adapter.start(emit)
    return f"http://127.0.0.1:{server.bound_port}/slack/events"


async def test_events_api_answers_503_when_not_accepted_and_takes_the_retry(
    events_api: tuple[SlackAdapter, ApiAdapter],
) -> None:
    attempts: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        attempts.append(msg.text)
        if len(attempts) == 1:
            raise NotAccepted("the store is busy")

    url = await _serve(events_api, emit)
    payload = event(dm("keep me", "7.1"), "E1")
    assert await _post(url, payload) == 503  # not acked: Slack retries
    assert await _post(url, payload, retry=1) == 200  # the retry is taken
    assert await _post(url, payload, retry=2) == 200  # a later retry is acked, not re-emitted
    assert attempts == ["keep me", "keep me"]


async def test_events_api_response_waits_for_emit(
    events_api: tuple[SlackAdapter, ApiAdapter],
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def emit(msg: InboundMessage) -> None:
        entered.set()
        await release.wait()

    url = await _serve(events_api, emit)
    post = asyncio.create_task(_post(url, event(dm("slow", "8.1"), "E2")))
    await asyncio.wait_for(entered.wait(), 5)
    done, _ = await asyncio.wait({post}, timeout=0.3)
    assert not done, "Slack got its 200 while emit was still running"
    release.set()
    assert await asyncio.wait_for(post, 5) == 200


async def test_socket_mode_acks_only_after_emit_and_not_when_refused(fake: FakeSlack) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    attempts: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        attempts.append(msg.text)
        if msg.text == "refused once" and attempts.count("refused once") == 1:
            raise NotAccepted("the store is busy")
        if msg.text == "slow":
            entered.set()
            await release.wait()

    adapter = SlackAdapter("xoxb-fake-token", "", base_url=fake.base_url, app_token="xapp-fake")
    await adapter.start(emit)
    try:
        await fake.wait_socket(1)
        await fake.socket_event(event(dm("slow", "9.1"), "E3"), envelope_id="env-slow")
        await asyncio.wait_for(entered.wait(), 5)
        await fake.socket_event(event(dm("refused once", "9.2"), "E4"), envelope_id="env-no")
        await wait_for_count(lambda: [a for a in attempts if a == "refused once"], 1, 5, "emit")
        assert "env-slow" not in fake.acks  # emit is still running
        release.set()
        await wait_for_count(lambda: fake.acks, 1, 5, "the ack")
        assert fake.acks == ["env-slow"]  # the refused envelope was never acked
        # Slack sends an unacknowledged envelope again
        await fake.socket_event(
            event(dm("refused once", "9.2"), "E4"), envelope_id="env-no-2", retry_attempt=1
        )
        await wait_for_count(lambda: fake.acks, 2, 5, "the ack of the retry")
        assert fake.acks == ["env-slow", "env-no-2"]
        assert attempts == ["slow", "refused once", "refused once"]
    finally:
        await adapter.stop()


async def test_slack_retries_of_a_committed_event_are_answered_once_by_the_daemon(
    tmp_path: Path, fake: FakeSlack
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  slack:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: {fake.base_url}\n"
    )
    env = {"SLACK_BOT_TOKEN": "xoxb-fake-token", "SLACK_SIGNING_SECRET": SECRET}
    gw = Gateway(config=load_config(cfg, env), home=tmp_path / "home")
    await gw.start()
    try:
        api = next(a for a in gw.adapters if a.platform == "api")
        url = f"http://127.0.0.1:{api.bound_port}/slack/events"  # type: ignore[attr-defined]
        payload = event(dm("answer me once", "10.1"), "E5")
        assert await _post(url, payload) == 200
        for n in (1, 2, 3):  # Slack's retries, as if our 200 had not arrived in time
            assert await _post(url, payload, retry=n) == 200
        [post] = await fake.wait_posted(1)
        assert post["text"] == "echo: answer me once"
        assert gw.db is not None and gw.index is not None
        entry = gw.index.get("agent:main:slack:dm:D0DM")
        assert entry is not None
        stored = [m["content"] for m in await gw.db.get_messages(entry.session_id)]
        assert stored == ["answer me once", "echo: answer me once"]
        assert len(fake.posted()) == 1
    finally:
        await gw.stop()
