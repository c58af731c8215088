"""Automatic session titles: the echo agent's (the user's words, as written, each once) and
`agent.auto_title`, which turns the agent's title call off, through the whole daemon with
the openai backend against a loopback fake."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.agent.echo import EchoAgent
from gateway.app import Gateway
from gateway.config import load_config
from tests.fakes.openai import FakeOpenAI

TITLE_PROMPT = "Reply with only a 3 to 7 word title"


@pytest.mark.parametrize(
    "said, title",
    [
        (["hello"], "hello"),
        (["Hello"], "Hello"),
        (["plan a trip to Kyoto"], "plan a trip to Kyoto"),
        (["What about NASA's Artemis II launch?"], "What about NASA's Artemis II launch"),
        (["Tea TEA tea, green tea"], "Tea green"),
        (["ok ok ok"], "ok"),
        (["the cat", "the Cat sat on the mat with a hat and a bat"], "the cat sat on mat with a"),
        (["!!!"], "Untitled"),
    ],
)
async def test_an_echo_title_keeps_the_users_words_and_case_each_word_once(
    said: list[str], title: str
) -> None:
    history = []
    for text in said:
        history += [
            {"role": "user", "content": text},
            {"role": "assistant", "content": f"echo: {text}"},
        ]
    assert await EchoAgent().suggest_title(history) == title


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _exchange(tmp_path: Path, fake: FakeOpenAI, auto_title: str) -> Gateway:
    """A daemon on the openai backend that has answered one message through the HTTP API,
    with every background task the exchange started run to its end."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        f"platforms:\n  api:\n    port: 0\nagent:\n  backend: openai\n{auto_title}"
        f"  openai:\n    base_url: http://127.0.0.1:{fake.port}/v1\n    model: fake-model\n"
        "    max_retries: 0\n    tools: []\n"
    )
    fake.reply("Kyoto in spring is lovely.")
    fake.reply("Spring trip to Kyoto")
    gateway = Gateway(config=load_config(cfg, {"OPENAI_API_KEY": "sk-test"}), home=tmp_path / "h")
    await gateway.start()
    port = gateway.adapters[0].bound_port  # type: ignore[attr-defined]
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={
                "user": "ann",
                "messages": [{"role": "user", "content": "plan a trip to Kyoto"}],
            },
        ) as resp:
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["message"][
                "content"
            ] == "Kyoto in spring is lovely."
    # the title task starts before the reply is answered; wait for it (and any like it)
    background = [t for t in asyncio.all_tasks() if t.get_name().startswith("title:")]
    await asyncio.wait_for(asyncio.gather(*background, return_exceptions=True), 30)
    return gateway


async def test_a_title_is_asked_of_the_agent_after_the_first_exchange_by_default(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    gateway = await _exchange(tmp_path, fake, "")
    try:
        assert len(fake.requests) == 2
        assert TITLE_PROMPT in str(fake.requests[1]["messages"])
        assert gateway.db is not None
        [session] = await gateway.db.list_sessions()
        assert session["title"] == "Spring trip to Kyoto"
    finally:
        await gateway.stop()


async def test_auto_title_false_makes_no_title_call_and_leaves_the_session_untitled(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    gateway = await _exchange(tmp_path, fake, "  auto_title: false\n")
    try:
        assert len(fake.requests) == 1
        assert TITLE_PROMPT not in str(fake.requests[0]["messages"])
        assert gateway.db is not None
        [session] = await gateway.db.list_sessions()
        assert session["title"] is None
    finally:
        await gateway.stop()
