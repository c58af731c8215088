"""Idempotent requests on the HTTP API: an `Idempotency-Key` (or /v1/messages' message_id) makes a
request safe to repeat across restarts. A repeat of an answered key gets the stored reply
with the same status and body shape plus `Idempotent-Replayed: true`, and runs no second
turn and stores no second user message. Through the whole daemon, real SQLite home."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.config import load_config
from state import open_store
from tests.gateway.conftest import ScriptedAgent


async def _start(tmp_path: Path, agent: ScriptedAgent) -> tuple[Gateway, str]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("platforms:\n  api:\n    port: 0\n")
    gateway = Gateway(config=load_config(cfg, {}), home=tmp_path / "home", agent=agent)
    await gateway.start()
    return gateway, f"http://127.0.0.1:{gateway.adapters[0].bound_port}"  # type: ignore[attr-defined]


async def _post(url: str, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, str], Any]:
    headers = {"Idempotency-Key": key} if key is not None else {}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body, headers=headers) as resp:
            raw = await resp.text()
            data = json.loads(raw) if resp.content_type == "application/json" else raw
            return resp.status, dict(resp.headers), data


async def _user_messages(gateway: Gateway) -> list[str]:
    assert gateway.db is not None
    out = []
    for row in await gateway.db.list_sessions("api"):
        out += [
            m["content"] for m in await gateway.db.get_messages(row["id"]) if m["role"] == "user"
        ]
    return out


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
async def test_a_key_repeated_after_a_restart_gets_the_stored_reply_and_no_second_turn(
    tmp_path: Path, path: str
) -> None:
    agent = ScriptedAgent()
    if path == "/v1/messages":
        body: dict[str, Any] = {"chat_id": "d1", "text": "remember me"}
    else:
        body = {
            "model": "m",
            "user": "d1",
            "messages": [{"role": "user", "content": "remember me"}],
        }
    gateway, url = await _start(tmp_path, agent)
    try:
        status, headers, first = await _post(url + path, body, "key-1")
    finally:
        await gateway.stop()
    assert status == 200 and "Idempotent-Replayed" not in headers
    gateway, url = await _start(tmp_path, agent)  # memory is gone; the store is not
    try:
        status, headers, again = await _post(url + path, body, "key-1")
        stored = await _user_messages(gateway)
    finally:
        await gateway.stop()
    assert status == 200 and headers["Idempotent-Replayed"] == "true"
    assert again.keys() == first.keys()  # the same body shape
    if path == "/v1/messages":
        assert again["reply"] == first["reply"] == "echo: remember me"
        assert again["session_id"] == first["session_id"]
        assert again["session_key"] == first["session_key"]
        assert (first["duplicate"], again["duplicate"]) == (False, True)
    else:
        text = [c["message"]["content"] for c in (first["choices"][0], again["choices"][0])]
        assert text == ["echo: remember me"] * 2
        assert again["switchboard"]["session_id"] == first["switchboard"]["session_id"]
        assert again["switchboard"]["duplicate"] is True
    assert len(agent.seen) == 1  # one turn
    assert stored == ["remember me"]  # one user message


async def test_a_replayed_stream_is_a_stream_too(tmp_path: Path) -> None:
    agent = ScriptedAgent()
    body = {
        "model": "m",
        "user": "d2",
        "stream": True,
        "messages": [{"role": "user", "content": "stream me"}],
    }
    for _ in range(2):
        gateway, url = await _start(tmp_path, agent)
        try:
            status, headers, text = await _post(url + "/v1/chat/completions", body, "key-s")
        finally:
            await gateway.stop()
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert "stream me" in text and text.rstrip().endswith("data: [DONE]")
    assert headers["Idempotent-Replayed"] == "true"
    assert len(agent.seen) == 1


async def test_a_key_stored_but_not_answered_is_a_clear_409(tmp_path: Path) -> None:
    """A turn a crash interrupted: the user message is stored, its reply is not. A repeat
    does not run a second turn beside it; it is told to ask again."""
    db = await open_store({"backend": "sqlite"}, tmp_path / "home")
    try:
        sid = await db.create_session(
            source="api", session_key="agent:main:api:dm:d3", chat_id="d3"
        )
        await db.append_messages(
            sid, [{"role": "user", "content": "cut off", "platform_message_id": "key-c"}]
        )
    finally:
        await db.close()
    agent = ScriptedAgent()
    gateway, url = await _start(tmp_path, agent)
    try:
        status, headers, answer = await _post(
            url + "/v1/messages", {"chat_id": "d3", "text": "cut off"}, "key-c"
        )
        assert status == 409 and answer["error"]["code"] == "in_flight"
        assert "ask again later" in answer["error"]["message"]
        assert agent.seen == []
        # another key in the same chat is a new message
        status, _, fresh = await _post(
            url + "/v1/messages", {"chat_id": "d3", "text": "new"}, "key-d"
        )
        assert status == 200 and fresh["reply"] == "echo: new"
    finally:
        await gateway.stop()


async def test_a_repeat_while_the_first_runs_waits_for_its_answer(tmp_path: Path) -> None:
    agent = ScriptedAgent()
    agent.delay_on["slow"] = 0.5
    gateway, url = await _start(tmp_path, agent)
    try:
        body = {"chat_id": "d4", "text": "slow one"}
        both = await asyncio.wait_for(
            asyncio.gather(
                _post(url + "/v1/messages", body, "key-w"),
                _post(url + "/v1/messages", body, "key-w"),
            ),
            20,
        )
        stored = await _user_messages(gateway)
    finally:
        await gateway.stop()
    assert [s for s, _, _ in both] == [200, 200]
    assert [b["reply"] for _, _, b in both] == ["echo: slow one"] * 2
    assert sorted("Idempotent-Replayed" in h for _, h, _ in both) == [False, True]
    assert len(agent.seen) == 1 and stored == ["slow one"]


async def test_malformed_or_contradicting_keys_are_refused(tmp_path: Path) -> None:
    gateway, url = await _start(tmp_path, ScriptedAgent())
    try:
        for body, key in (
            ({"chat_id": "d5", "text": "x"}, " "),
            ({"chat_id": "d5", "text": "x"}, "k" * 256),
            ({"chat_id": "d5", "text": "x", "message_id": "a"}, "b"),
        ):
            status, _, answer = await _post(url + "/v1/messages", body, key)
            assert status == 400 and answer["error"]["code"] == "invalid_request", key
        assert await _user_messages(gateway) == []
    finally:
        await gateway.stop()


async def test_a_message_the_gateway_could_not_take_is_a_503_and_the_retry_runs() -> None:
    """Inbox before ack on the API: emit raising NotAccepted answers 503 (nothing stored,
    nothing remembered), so the client's retry with the same key runs the turn."""
    from gateway.adapters.api import ApiAdapter
    from gateway.errors import NotAccepted
    from gateway.messages import InboundMessage, OutboundMessage

    api = ApiAdapter(port=0)
    attempts: list[str | None] = []

    async def emit(msg: InboundMessage) -> None:
        attempts.append(msg.platform_message_id)
        if len(attempts) == 1:
            raise NotAccepted("the store is busy")
        await api.send(
            OutboundMessage("api", msg.source.chat_id, "taken", reply_to=msg.platform_message_id)
        )

    await api.start(emit)
    try:
        url = f"http://127.0.0.1:{api.bound_port}/v1/messages"
        status, _, answer = await _post(url, {"chat_id": "d6", "text": "x"}, "key-n")
        assert status == 503 and answer["error"]["code"] == "storage_unavailable"
        status, headers, answer = await _post(url, {"chat_id": "d6", "text": "x"}, "key-n")
        assert status == 200 and answer["reply"] == "taken" and "Idempotent-Replayed" not in headers
        assert attempts == ["key-n", "key-n"]
    finally:
        await api.stop()


async def test_a_store_that_cannot_be_read_runs_no_turn_and_answers_503(tmp_path: Path) -> None:
    """The stored-answer lookup fails (here: a closed store): the request is not run blind,
    which could answer a key twice; it gets 503 and may be sent again."""
    from gateway.adapters.api import ApiAdapter
    from gateway.messages import InboundMessage

    db = await open_store({"backend": "sqlite"}, tmp_path)
    await db.close()
    emitted: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        emitted.append(msg)

    api = ApiAdapter(
        port=0, stored_replies=lambda chat, key: db.reply_to_platform_message("api", chat, key)
    )
    await api.start(emit)
    try:
        url = f"http://127.0.0.1:{api.bound_port}/v1/messages"
        status, _, answer = await _post(url, {"chat_id": "d7", "text": "x"}, "key-z")
        assert status == 503 and answer["error"]["code"] == "storage_unavailable"
        assert emitted == []
    finally:
        await api.stop()


@pytest.mark.parametrize("stored", ["in_flight", "answered"])
async def test_a_repeat_whose_recovered_turn_answers_during_the_store_read_gets_that_answer(
    stored: str,
) -> None:
    """After a restart the recovered turn of a key may send its reply while a repeat of
    that key is reading the store (registered first, so the reply lands on it): the repeat
    answers 200 with that reply, never a 500 for setting an answer twice."""
    from gateway.adapters.api import ApiAdapter
    from gateway.messages import InboundMessage, OutboundMessage
    from state.sqlite.replies import StoredReply

    emitted: list[InboundMessage] = []
    api: ApiAdapter

    async def read(chat: str, key: str) -> StoredReply:
        # the recovered turn answers while the store is read
        await api.send(OutboundMessage("api", chat, "echo: x", reply_to=key))
        return StoredReply("s1", None, 1, "echo: x" if stored == "answered" else None)

    async def emit(msg: InboundMessage) -> None:
        emitted.append(msg)

    api = ApiAdapter(port=0, stored_replies=read)
    await api.start(emit)
    try:
        url = f"http://127.0.0.1:{api.bound_port}/v1/messages"
        status, _, answer = await _post(url, {"chat_id": "d8", "text": "x"}, "key-r")
        assert status == 200 and answer["reply"] == "echo: x"
        assert emitted == []  # no second turn
    finally:
        await api.stop()
