"""The openai backend against a fake OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.agent.base import TurnContext
from gateway.agent.openai import EncodedMessages, OpenAIAgent
from gateway.errors import AgentError
from tests.fakes.openai import FakeOpenAI


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _agent(fake: FakeOpenAI, **kw: object) -> OpenAIAgent:
    return OpenAIAgent(f"http://127.0.0.1:{fake.port}/v1", "m1", "sk-test", timeout_s=5, **kw)  # type: ignore[arg-type]


CTX = TurnContext(session_id="s", session_key="k", platform="api", system_prompt="be brief")


async def test_a_reply_with_usage_and_the_request_shape(fake: FakeOpenAI) -> None:
    fake.reply("hello back")
    agent = _agent(fake)
    try:
        reply = await agent.respond([{"role": "user", "content": "hi"}], CTX)
    finally:
        await agent.close()
    assert (reply.text, reply.input_tokens, reply.output_tokens, reply.model) == (
        "hello back",
        11,
        5,
        "fake-model",
    )
    body = fake.requests[0]
    assert body["model"] == "m1"
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert fake.headers[0]["Authorization"] == "Bearer sk-test"
    assert "tools" not in body  # no tool runner in this context


async def test_odd_text_travels_to_the_model_intact_as_json(fake: FakeOpenAI) -> None:
    odd = "nul\x00 lone\ud800 bidi\u202e <b>[i]{x}</b> \u4e2d\u6587 \U0001f600"
    fake.reply("ok")
    agent = _agent(fake, reply_tokens=64)
    try:
        await agent.respond([{"role": "user", "content": odd}], CTX)
    finally:
        await agent.close()
    assert fake.headers[0]["Content-Type"] == "application/json"
    body = fake.requests[0]
    assert body["messages"][1] == {"role": "user", "content": odd}
    assert body["max_tokens"] == 64 and body["model"] == "m1"


async def test_a_200_answer_that_is_not_json_is_a_clear_error(fake: FakeOpenAI) -> None:
    fake.reply(raw=b"<html>gateway timeout</html>")
    agent = _agent(fake)
    try:
        with pytest.raises(AgentError, match="without JSON"):
            await agent.respond([{"role": "user", "content": "hi"}], CTX)
    finally:
        await agent.close()


async def test_rate_limits_and_server_errors_are_retried(fake: FakeOpenAI) -> None:
    fake.reply(status=429, headers={"Retry-After": "0.05"})
    fake.reply(status=502)
    fake.reply("third time lucky")
    agent = _agent(fake, max_retries=3)
    try:
        reply = await agent.respond([{"role": "user", "content": "hi"}], CTX)
    finally:
        await agent.close()
    assert reply.text == "third time lucky" and len(fake.requests) == 3


@pytest.mark.parametrize("status, phrase", [(401, "refused the API key"), (400, "answered 400")])
async def test_client_errors_fail_at_once(fake: FakeOpenAI, status: int, phrase: str) -> None:
    fake.reply(status=status)
    agent = _agent(fake)
    try:
        with pytest.raises(AgentError, match=phrase):
            await agent.respond([{"role": "user", "content": "hi"}], CTX)
    finally:
        await agent.close()
    assert len(fake.requests) == 1


async def test_retries_run_out_with_a_clear_error(fake: FakeOpenAI) -> None:
    for _ in range(3):
        fake.reply(status=503)
    agent = _agent(fake, max_retries=2)
    try:
        with pytest.raises(AgentError, match="after 3 attempts"):
            await agent.respond([{"role": "user", "content": "hi"}], CTX)
    finally:
        await agent.close()


async def test_tool_calls_run_session_search_and_feed_the_result_back(fake: FakeOpenAI) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "session_search", "arguments": json.dumps({"query": "kraken"})},
    }
    fake.reply(None, tool_calls=[call])
    fake.reply("found it")
    seen: list[tuple[str, dict]] = []

    async def run_tool(name: str, args: dict) -> str:
        seen.append((name, args))
        return json.dumps({"success": True, "results": []})

    agent = _agent(fake)
    try:
        reply = await agent.respond(
            [{"role": "user", "content": "what about the kraken?"}],
            TurnContext("s", "k", "api", None, run_tool),
        )
    finally:
        await agent.close()
    assert reply.text == "found it" and seen == [("session_search", {"query": "kraken"})]
    assert fake.requests[0]["tools"][0]["function"]["name"] == "session_search"
    second = fake.requests[1]["messages"]
    assert second[-2]["tool_calls"] == [call]
    assert second[-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": json.dumps({"success": True, "results": []}),
        "name": "session_search",
    }
    assert [m["role"] for m in reply.tool_messages] == ["assistant", "tool"]


def test_kept_encodings_write_the_same_json_as_encoding_the_whole_list() -> None:
    enc = EncodedMessages()
    odd = 'nul\x00 lone\ud800 bidi\u202e <b>[i]{x}</b> \u4e2d\u6587 \U0001f600 "q" \\'
    messages: list[Any] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": odd},
        {"role": "assistant", "content": odd},  # the same text under another role
        {"content": "content first", "role": "user"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
        {"role": "user", "content": [{"type": "text", "text": "multimodal"}]},
    ]
    for _turn in range(3):  # new dicts around the same strings each turn, as windows hand them
        fresh = [dict(m) for m in messages]
        assert json.loads(enc.body(fresh)) == fresh
    assert enc.body([]) == b"[]"
    assert messages[1] in enc and messages[2] in enc and messages[3] in enc
    assert messages[4] not in enc and messages[6] not in enc  # encoded each time


def test_kept_encodings_stay_bounded_and_keep_the_messages_in_use() -> None:
    enc = EncodedMessages(limit=4096)
    prompt = {"role": "system", "content": "you answer in one line"}
    for turn in range(500):
        history = [{"role": "user", "content": f"message {turn} " + "x" * 100}]
        body = json.loads(enc.body([dict(prompt), *history]))
        assert body == [prompt, *history]
    assert len(enc) < 4096 // 100  # about the limit's worth, not 500 turns' messages
    assert prompt in enc  # sent with every turn: kept through every turn-over
    assert {"role": "user", "content": "message 0 " + "x" * 100} not in enc


async def test_turns_over_one_history_send_it_whole_each_time(fake: FakeOpenAI) -> None:
    agent = _agent(fake)
    history: list[Any] = []
    try:
        for turn in range(3):
            fake.reply(f"answer {turn}")
            history.append({"role": "user", "content": f"question {turn}"})
            reply = await agent.respond([dict(m) for m in history], CTX)
            history.append({"role": "assistant", "content": reply.text})
    finally:
        await agent.close()
    assert [len(body["messages"]) for body in fake.requests] == [2, 4, 6]
    assert fake.requests[2]["messages"] == [{"role": "system", "content": "be brief"}, *history[:5]]
