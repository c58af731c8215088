"""The `usage` of /v1/chat/completions through the whole daemon: the agent's token counts
for the turn (the openai backend's, against a loopback fake), our estimate where there are
none (the echo agent, a server that reports no usage), the same figures /status and the
session's totals count, and zero with `usage_source: none` when no agent call answered."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.config import load_config
from tests.fakes.openai import FakeOpenAI


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _gateway(tmp_path: Path, agent: str = "") -> tuple[Gateway, str]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"platforms:\n  api:\n    port: 0\nagent:\n  auto_title: false\n{agent}")
    gateway = Gateway(config=load_config(cfg, {"OPENAI_API_KEY": "sk-test"}), home=tmp_path / "h")
    await gateway.start()
    return gateway, f"http://127.0.0.1:{gateway.adapters[0].bound_port}"  # type: ignore[attr-defined]


def _openai(fake: FakeOpenAI) -> str:
    return (
        f"  backend: openai\n  openai:\n    base_url: http://127.0.0.1:{fake.port}/v1\n"
        "    model: fake-model\n    max_retries: 0\n    tools: []\n"
    )


async def _ask(url: str, text: str, **more: Any) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/v1/chat/completions",
            json={
                "user": "ann",
                "messages": [{"role": "user", "content": text}],
                **more,
            },
        ) as resp:
            assert resp.status == 200
            if not more.get("stream"):
                return dict(await resp.json())
            events = [
                line[6:] for line in (await resp.text()).splitlines() if line.startswith("data: ")
            ]
            assert events[-1] == "[DONE]"
            return {"chunks": [json.loads(e) for e in events[:-1]]}


async def _session_tokens(gateway: Gateway, body: dict[str, Any]) -> tuple[int, int]:
    assert gateway.db is not None
    row = await gateway.db.require_session(body["switchboard"]["session_id"])
    return row["input_tokens"], row["output_tokens"]


async def test_usage_is_the_backends_token_counts_for_the_turn(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    gateway, url = await _gateway(tmp_path, _openai(fake))
    try:
        fake.reply("Kyoto in spring.")  # the fake reports 11 prompt and 5 completion tokens
        body = await _ask(url, "where should I go?")
        assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
        assert body["switchboard"]["usage_source"] == "agent"
        assert await _session_tokens(gateway, body) == (11, 5)
    finally:
        await gateway.stop()


async def test_a_server_without_usage_gets_our_estimate_marked_as_such(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    gateway, url = await _gateway(tmp_path, _openai(fake))
    try:
        fake.reply(
            raw={
                "id": "c1",
                "model": "fake-model",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "x" * 400},
                        "finish_reason": "stop",
                    }
                ],
            }
        )
        body = await _ask(url, "y" * 40)
        usage = body["usage"]
        # about 4 characters a token, plus a few per message
        assert 100 <= usage["completion_tokens"] <= 110 and 10 <= usage["prompt_tokens"] <= 30
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert body["switchboard"]["usage_source"] == "estimate"
        assert await _session_tokens(gateway, body) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
    finally:
        await gateway.stop()


async def test_the_echo_agent_reports_an_estimate_that_status_counts_too(tmp_path: Path) -> None:
    gateway, url = await _gateway(tmp_path)
    try:
        first = await _ask(url, "a question of some forty characters, yes")
        usage = first["usage"]
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert first["switchboard"]["usage_source"] == "estimate"
        assert await _session_tokens(gateway, first) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        status = await _ask(url, "/status")  # a command: no agent call
        assert status["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        assert status["switchboard"]["usage_source"] == "none"
        text = status["choices"][0]["message"]["content"]
        assert f"{usage['prompt_tokens']}" in text and f"{usage['completion_tokens']}" in text
    finally:
        await gateway.stop()


async def test_a_stream_carries_usage_in_a_last_chunk_when_asked(tmp_path: Path) -> None:
    gateway, url = await _gateway(tmp_path)
    try:
        plain = await _ask(url, "hello", stream=True)
        assert all("usage" not in c for c in plain["chunks"])
        asked = await _ask(url, "hello again", stream=True, stream_options={"include_usage": True})
        last = asked["chunks"][-1]
        assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0
        assert last["usage"]["total_tokens"] == (
            last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
        )
    finally:
        await gateway.stop()
