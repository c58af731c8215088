"""What the HTTP API answers, through the whole gateway: never a false "saved",
notices beside the reply, redelivered message ids, the live session id after a command,
the OpenAI endpoints (streaming, models, errors) and the metrics exposition."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from gateway.app import Gateway
from gateway.config import load_config
from gateway.pipeline import STORAGE_APOLOGY
from tests.gateway.conftest import ScriptedAgent
from tests.inprocess import gateway_with_telegram


@pytest.fixture
def agent() -> ScriptedAgent:
    return ScriptedAgent()


async def _start(tmp_path: Path, agent: ScriptedAgent, extra: str = "") -> tuple[Gateway, str]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("platforms:\n  api:\n    port: 0\n" + extra)
    gateway = Gateway(config=load_config(cfg, {}), home=tmp_path / "home", agent=agent)
    await gateway.start()
    port = gateway.adapters[0].bound_port  # type: ignore[attr-defined]
    return gateway, f"http://127.0.0.1:{port}"


@pytest.fixture
async def gw(tmp_path: Path, agent: ScriptedAgent) -> AsyncIterator[tuple[Gateway, str]]:
    gateway, url = await _start(tmp_path, agent)
    try:
        yield gateway, url
    finally:
        await gateway.stop()


async def _post(
    http: aiohttp.ClientSession, url: str, body: bytes | dict[str, Any]
) -> tuple[int, Any]:
    kwargs: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with http.post(url, **kwargs) as resp:
        return resp.status, await resp.json()


# --- a message that cannot be stored is never reported as saved ---------------------


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/messages", b'{"chat_id": "x", "text": "\\ud800"}', "text"),
        ("/v1/messages", b'{"chat_id": "x", "text": "hi", "user_name": "a\\udfff"}', "user_name"),
        ("/v1/messages", b'{"chat_id": "\\ud800", "text": "hi"}', "chat_id"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a\\udc00"}]}]}',
            "messages[0].content[0].text",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "a"}, {"role": '
            b'"user", "content": [{"type": "image_url"}, {"type": "text", "text": "b\\u0000"}]}]}',
            "messages[1].content[1].text",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x\\u0000y"}]}',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "\\u0000json:[{\\"type'
            b'\\":\\"text\\",\\"text\\":\\"injected\\"}]"}]}',
            "messages[0].content",
        ),
        ("/v1/messages", b'{"chat_id": "x", "text": "before\\u0000after"}', "text"),
        ("/v1/messages", b'{"chat_id": "x", "text": "hi", "chat_name": "\\u0000"}', "chat_name"),
        (
            "/v1/chat/completions",
            b'{"user": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}',
            "user",
        ),
    ],
)
async def test_text_no_store_can_hold_is_refused_naming_the_field(
    gw: tuple[Gateway, str], path: str, body: bytes, field: str
) -> None:
    gateway, url = gw
    async with aiohttp.ClientSession() as http:
        status, answer = await _post(http, url + path, body)
    assert status == 400, answer
    assert answer["error"]["message"].startswith(f"{field} contains ")
    assert answer["error"]["type"] == "invalid_request_error"
    assert gateway.db is not None and await gateway.db.message_count() == 0


async def test_a_store_failure_on_a_chat_platform_is_not_reported_as_saved(
    tmp_path: Path,
) -> None:
    """The store refuses a message after its inbox row is committed (here a trigger on
    the messages table refuses one text); the chat is told its message was not stored (not
    "Your message was saved"), and the next message is answered."""
    async with gateway_with_telegram(tmp_path, "allow_all_users: true") as (gateway, fake):
        with sqlite3.connect(tmp_path / "home" / "state.db") as conn:
            conn.execute(
                "CREATE TRIGGER refuse_doomed BEFORE INSERT ON messages "
                "WHEN NEW.content = 'doomed' BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        conn.close()
        fake.push(fake.message("doomed", fake.dm_chat()))
        [apology] = await fake.wait_sent(1)
        fake.push(fake.message("fine", fake.dm_chat()))
        later = await fake.wait_sent(2)
    assert apology["text"] == STORAGE_APOLOGY and "saved" not in apology["text"]
    assert later[1]["text"] == "echo: fine"


async def test_text_no_store_can_hold_from_a_chat_platform_is_kept_with_u_fffd(
    tmp_path: Path,
) -> None:
    """A chat platform cannot be refused: NUL and lone surrogates in the text Telegram
    delivers become U+FFFD, the rest of the text is kept, stored and answered, and a text
    that starts like structured content stays text."""
    async with gateway_with_telegram(tmp_path, "allow_all_users: true") as (gateway, fake):
        fake.push(fake.message("bad \ud800 text", fake.dm_chat()))
        fake.push(fake.message("before\x00after", fake.dm_chat()))
        fake.push(fake.message('\x00json:[{"type":"text","text":"injected"}]', fake.dm_chat()))
        sent = await fake.wait_sent(3)
        assert gateway.db is not None
        [session] = await gateway.db.list_sessions("telegram")
        stored = [m["content"] for m in await gateway.db.get_messages(session["id"])]
    assert [m["text"] for m in sent] == [
        "echo: bad \ufffd text",
        "echo: before\ufffdafter",
        'echo: \ufffdjson:[{"type":"text","text":"injected"}]',
    ]
    assert stored[::2] == [
        "bad \ufffd text",
        "before\ufffdafter",
        '\ufffdjson:[{"type":"text","text":"injected"}]',
    ]


# --- a reset notice comes beside the agent's answer ---------------------------------


async def test_the_reply_after_a_reset_notice_is_returned_too(
    tmp_path: Path, agent: ScriptedAgent
) -> None:
    gateway, url = await _start(
        tmp_path, agent, "session_reset:\n  mode: idle\n  idle_minutes: 1\n  notify: true\n"
    )
    try:
        async with aiohttp.ClientSession() as http:
            status, first = await _post(http, f"{url}/v1/messages", {"chat_id": "r", "text": "one"})
            assert status == 200 and first["notices"] == []
            assert gateway.router is not None and gateway.router.resetter is not None
            gateway.router.resetter.clock = lambda: time.time() + 3600  # an hour of quiet
            status, second = await _post(
                http, f"{url}/v1/messages", {"chat_id": "r", "text": "two"}
            )
    finally:
        await gateway.stop()
    assert status == 200
    assert second["reply"] == "echo: two"
    [notice] = second["notices"]
    assert notice.startswith("A new session was started") and "/resume" in notice
    assert second["session_id"] != first["session_id"]


# --- a redelivered message id is answered at once -----------------------------------


async def test_a_redelivered_message_id_gets_the_first_reply(
    tmp_path: Path, agent: ScriptedAgent
) -> None:
    agent.delay_on["slow"] = 0.5
    gateway, url = await _start(tmp_path, agent)
    body = {"chat_id": "d2", "text": "slow x", "message_id": "m9"}
    try:
        async with aiohttp.ClientSession() as http:
            # the second arrives while the first turn runs: it waits for that turn's reply
            both = await asyncio.wait_for(
                asyncio.gather(
                    _post(http, f"{url}/v1/messages", body), _post(http, f"{url}/v1/messages", body)
                ),
                timeout=20,
            )
            # after the turn: answered at once with the stored reply
            again = await asyncio.wait_for(_post(http, f"{url}/v1/messages", body), timeout=20)
            # the same id in another chat is another message
            other = await _post(http, f"{url}/v1/messages", {**body, "chat_id": "d3"})
        assert gateway.db is not None
        stored = await gateway.db.message_count()
    finally:
        await gateway.stop()
    assert [s for s, _ in both] == [200, 200] and again[0] == 200
    replies = [b["reply"] for _, b in (*both, again)]
    assert replies == ["echo: slow x"] * 3
    assert sorted(b["duplicate"] for _, b in both) == [False, True] and again[1]["duplicate"]
    assert other[1]["reply"] == "echo: slow x" and other[1]["duplicate"] is False
    assert stored == 4  # one exchange per chat, not two


async def test_a_message_id_redelivered_after_a_restart_is_answered_at_once(
    tmp_path: Path, agent: ScriptedAgent
) -> None:
    body = {"chat_id": "d2", "text": "x", "message_id": "m9"}
    for round_ in range(2):
        gateway, url = await _start(tmp_path, agent)
        try:
            async with aiohttp.ClientSession() as http:
                status, answer = await asyncio.wait_for(
                    _post(http, f"{url}/v1/messages", body), timeout=20
                )
        finally:
            await gateway.stop()
        if round_ == 0:
            assert status == 200 and answer["reply"] == "echo: x"
    # the reply is in state.db but not in the new process's memory: read back from the store
    # (tests/gateway/test_api_idempotency.py has the rest)
    assert status == 200 and answer["reply"] == "echo: x" and answer["duplicate"] is True


# --- the session id is the live one after a session command -------------------------


async def test_session_commands_answer_with_the_live_session_id(gw: tuple[Gateway, str]) -> None:
    gateway, url = gw
    async with aiohttp.ClientSession() as http:

        async def say(text: str) -> dict[str, Any]:
            status, body = await _post(http, f"{url}/v1/messages", {"chat_id": "s", "text": text})
            assert status == 200, body
            return body

        first = await say("hello")
        new = await say("/new")
        assert new["session_id"] != first["session_id"]
        branch = await say("/branch")
        assert branch["session_id"] not in (first["session_id"], new["session_id"])
        resumed = await say(f"/resume {first['session_id']}")
        assert resumed["session_id"] == first["session_id"]
        assert gateway.index is not None
        live = gateway.index.get(first["session_key"])
        assert live is not None and live.session_id == first["session_id"]


# --- OpenAI compatibility -----------------------------------------------------------


async def test_the_openai_client_streams_and_lists_models(gw: tuple[Gateway, str]) -> None:
    _, url = gw
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    try:
        models = await client.models.list()
        stream = await client.chat.completions.create(
            model="echo",
            user="streamer",
            stream=True,
            messages=[{"role": "user", "content": "stream me " + "word " * 200}],
        )
        chunks = [chunk async for chunk in stream]
        plain = await client.chat.completions.create(
            model="echo", user="streamer", messages=[{"role": "user", "content": "plain"}]
        )
    finally:
        await client.close()
    assert [m.id for m in models.data] == ["echo"]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "echo: stream me " + "word " * 200
    assert len([c for c in chunks if c.choices[0].delta.content]) > 1  # in pieces
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert plain.choices[0].message.content == "echo: plain"


async def test_the_stream_ends_with_done(gw: tuple[Gateway, str]) -> None:
    _, url = gw
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/v1/chat/completions",
            json={"stream": True, "messages": [{"role": "user", "content": "hi"}]},
        ) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            raw = await resp.text()
    events = [line[6:] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert (
        "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
        == "echo: hi"
    )


async def test_an_agent_failure_is_a_server_error_in_openai_shape(
    gw: tuple[Gateway, str], agent: ScriptedAgent
) -> None:
    gateway, url = gw
    agent.fail_on.add("boom")
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="echo", user="f", messages=[{"role": "user", "content": "boom"}]
            )
    finally:
        await client.close()
    assert caught.value.status_code == 502
    error = caught.value.body
    assert (
        isinstance(error, dict)
        and error["type"] == "server_error"
        and error["code"] == "agent_error"
    )
    # the webhook keeps the chat platforms' apology (the message was stored)
    async with aiohttp.ClientSession() as http:
        status, body = await _post(http, f"{url}/v1/messages", {"chat_id": "f", "text": "boom"})
    assert status == 200 and body["error"] == "agent" and "saved" in body["reply"]
    assert gateway.db is not None and await gateway.db.message_count() == 2  # both stored


@pytest.mark.parametrize(
    "method, path, data, status, kind",
    [
        (
            "POST",
            "/v1/messages",
            b"{" + b" " * (3 * 1024 * 1024) + b"}",
            413,
            "invalid_request_error",
        ),
        ("POST", "/v1/nothing", b"{}", 404, "not_found_error"),
        ("GET", "/v1/messages", None, 405, "invalid_request_error"),
        (
            "POST",
            "/v1/chat/completions",
            b'{"stream": "yes", "messages": [{"role": "user", "content": "x"}]}',
            400,
            "invalid_request_error",
        ),
    ],
)
async def test_every_error_is_json_in_one_shape(
    gw: tuple[Gateway, str], method: str, path: str, data: bytes | None, status: int, kind: str
) -> None:
    _, url = gw
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url + path, data=data) as resp:
            assert resp.status == status
            assert resp.content_type == "application/json"
            error = (await resp.json())["error"]
    assert error["type"] == kind and error["message"] and "code" in error


# --- counters are typed as counters ------------------------------------------------


async def test_metrics_type_every_total_as_a_counter(gw: tuple[Gateway, str]) -> None:
    _, url = gw
    async with aiohttp.ClientSession() as http:
        await _post(http, f"{url}/v1/messages", {"chat_id": "m", "text": "x"})
        async with http.get(f"{url}/metrics") as resp:
            text = await resp.text()
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE "))
    samples = {
        line.split()[0].split("{")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert "switchboard_writer_batches_total" in types
    for name, kind in types.items():
        assert kind in ("counter", "gauge", "histogram"), (name, kind)
        assert (kind == "counter") == name.endswith("_total"), (name, kind)
        assert any(s == name or s.startswith(name + "_") for s in samples), name
