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


def test_a_sessions_requests_write_the_same_json_as_encoding_each_whole() -> None:
    enc = EncodedMessages()
    odd = 'nul\x00 lone\ud800 bidi\u202e <b>[i]{x}</b> \u4e2d\u6587 \U0001f600 "q" \\'
    system = {"role": "system", "content": "be brief"}
    said = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{odd} {i}"} for i in range(12)
    ]
    said[7]["content"] = said[5]["content"]  # one text twice: the run is not where it first is
    turns: list[list[Any]] = [
        [system, *said[:2]],
        [system, *said[:4]],  # the last request and two new messages
        [system, *said[2:6]],  # the oldest fell out
        [system, *said[4:10]],
        [system, *said[7:12]],  # starts at the repeated text
        [{"role": "system", "content": "be long"}, *said[7:12]],  # another system prompt
        [*said[8:12]],  # none at all
        [{"role": "assistant", "content": said[8]["content"]}, *said[9:12]],  # another role
        [*said[8:11], {"role": "user", "content": "edited"}, said[11]],  # an edited history
        [
            *said[8:12],
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{}"},
        ],
        [*said[8:12], {"role": "user", "content": [{"type": "text", "text": "multimodal"}]}],
        [{"content": "content first", "role": "user"}, *said[8:12]],
        [],
    ]
    for messages in turns:  # new dicts around the same strings each turn, as windows hand them
        fresh = [dict(m) for m in messages]
        assert json.loads(enc.body(fresh, "s1")) == fresh
        assert enc.body(fresh) == json.dumps(fresh, separators=(",", ":")).encode("ascii")
    assert json.loads(enc.body([system, *said], "s2")) == [system, *said]  # another session
    same = [  # every answer the same text, the window sliding by a question and an answer
        {"role": "user", "content": f"q{i // 2}"}
        if i % 2 == 0
        else {"role": "assistant", "content": "ok"}
        for i in range(30)
    ]
    for turn in range(10):
        window = [system, *(dict(m) for m in same[2 * turn + 1 : 2 * turn + 12])]
        assert json.loads(enc.body(window, "s3")) == window


def test_the_kept_json_stays_within_its_limit_the_newest_sessions_kept() -> None:
    limit = 64 * 1024
    enc = EncodedMessages(limit=limit)
    text = "x" * 1000
    said = [{"role": "user", "content": f"{i} {text}"} for i in range(20)]
    for turn in range(8):  # one session: what it keeps is what its last request sent
        window = said[turn : 2 * turn + 4]
        enc.body([dict(m) for m in window], "one")
        encoded = [json.dumps(m, separators=(",", ":")) for m in window]
        assert enc.used == sum(map(len, encoded)) + EncodedMessages.PER_MESSAGE * len(window)
    for turn in range(3):
        for session in range(100):
            # each turn two more messages, the oldest falling out
            window = [
                {"role": "user", "content": f"{session} {i} {text}"}
                for i in range(turn, 3 * turn + 5)
            ]
            assert json.loads(enc.body(window, f"s{session}")) == window
            assert enc.used <= limit
    assert 0 < len(enc) < 100
    tool = {"role": "tool", "tool_call_id": "c1", "content": "{}"}
    for session in range(100):  # nothing of a request with a tool's answer is kept
        enc.body([tool], f"s{session}")
    assert (len(enc), enc.used) == (0, 0)
    one = [{"role": "user", "content": "y" * limit}]  # more than a session may take
    assert json.loads(enc.body(one, "big")) == one and enc.used <= limit


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
