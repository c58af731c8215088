"""The api server serves Slack's Events API route before the Slack adapter has started (it
starts first, and stops last): an event that arrives then is answered 503, so Slack sends
it again, instead of a 200 for an event nobody took. Found by the cluster chaos test
(tests/cluster/test_harness.py: a restarted replica acked events while starting)."""

from __future__ import annotations

import aiohttp

from gateway.adapters.api import ApiAdapter
from gateway.adapters.slack import SlackAdapter
from gateway.messages import InboundMessage
from tests.fakes.slack import SECRET, FakeSlack, event, signed


async def _post(url: str, payload: dict) -> int:
    body, headers = signed(payload)
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as resp:
        return resp.status


async def test_an_event_before_start_and_after_stop_is_refused_then_taken_once_running() -> None:
    fake = FakeSlack()
    await fake.start()
    taken: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        taken.append(msg.text)

    adapter = SlackAdapter("xoxb-fake-token", SECRET, base_url=fake.base_url)
    server = ApiAdapter(port=0, routes=dict(adapter.routes()))
    await server.start(emit)
    url = f"http://127.0.0.1:{server.bound_port}/slack/events"
    ev = {
        "type": "message",
        "channel": "D0DM",
        "user": "U1",
        "text": "early",
        "ts": "5.1",
        "event_ts": "5.1",
        "channel_type": "im",
    }
    try:
        assert await _post(url, event(ev, "E1")) == 503  # not started: Slack retries
        await adapter.start(emit)
        assert await _post(url, event(ev, "E1")) == 200  # the retry is taken
        await adapter.stop()
        assert await _post(url, event({**ev, "ts": "5.2", "text": "late"}, "E2")) == 503
    finally:
        await adapter.stop()
        await server.stop()
        await fake.stop()
    assert taken == ["early"]
