"""A repeat of an Idempotency-Key whose turn answers while the adapter reads the store for
it (start-up recovery, or another replica's takeover, runs that turn again): the request
gets the reply, not a 500 from resolving its exchange twice. Found by the cluster chaos
test (tests/cluster/test_chaos.py)."""

from __future__ import annotations

import aiohttp

from gateway.adapters.api import ApiAdapter
from gateway.messages import InboundMessage, OutboundMessage
from state.sqlite.replies import StoredReply


async def test_a_reply_that_lands_during_the_store_read_answers_the_request() -> None:
    adapter: ApiAdapter | None = None
    emitted: list[InboundMessage] = []

    async def stored(chat_id: str, message_id: str) -> StoredReply:
        # meanwhile the recovered turn sends its reply to the waiting request
        assert adapter is not None
        await adapter.send(OutboundMessage("api", chat_id, "echo: hello", reply_to=message_id))
        return StoredReply("s1", "agent:main:api:dm:c1", 1, None)  # stored, not yet answered

    async def emit(msg: InboundMessage) -> None:
        emitted.append(msg)

    adapter = ApiAdapter(port=0, stored_replies=stored)
    await adapter.start(emit)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"http://127.0.0.1:{adapter.bound_port}/v1/messages",
                json={"chat_id": "c1", "text": "hello"},
                headers={"Idempotency-Key": "k1"},
            ) as resp:
                status, body = resp.status, await resp.json()
    finally:
        await adapter.stop()
    assert status == 200, body
    assert body["reply"] == "echo: hello"
    assert emitted == []  # the stored message is not emitted (run) a second time
