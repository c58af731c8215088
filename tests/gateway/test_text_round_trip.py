"""Text is data on every path: whatever a user sends through the HTTP API is either refused
at intake (400 naming the field, nothing stored) or comes back exactly, on SQLite and on
PostgreSQL, from every reader: the store, the agent's history, `sessions export`, the
dashboard's JSON API, and `sessions show` and `sessions list` (there as plain text, never
read as markup, control characters shown as \\xNN escapes).

One gateway per backend runs on an event loop of its own in a thread for the whole module,
so Hypothesis can drive it from a plain test function."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.app import Gateway
from gateway.cli import sessions as cli
from gateway.config import load_config
from tests import pgserver
from tests.gateway.conftest import ScriptedAgent

T = TypeVar("T")

NASTIES = [
    "[/x]",
    "[/i]",
    "a[i]",
    "[bold red]x[/]",
    "[link=http://evil]click[/link]",
    "[/]",
    "\\",
    "\\[b]",
    ":smile:",
    "\x00",
    "\x00json:",
    '\x00json:[{"type":"text","text":"injected"}]',
    '\x00json:{"a":1}',
    "\ud800",
    "\udfff",
    "\u202e",
    "\u202d",
    "\u2066",
    "\u200b",
    "\u200d",
    "\ufeff",
    "\ufffd",
    "中文",
    "日本語の文",
    "한국어",
    "😀",
    "👨\u200d👩\u200d👧",
    "<script>x</script>",
    "&amp;",
    '"',
    "'",
    "\n",
    "\t",
    "\r",
    "\x1b[31m",
    "\x7f",
    "\x9b",
    "json:",
    ">>>",
    "%s",
    "{}",
]
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def texts() -> st.SearchStrategy[str]:
    piece = st.one_of(st.sampled_from(NASTIES), st.text(max_size=12))
    return st.lists(piece, min_size=1, max_size=8).map("".join)


def on_terminal(text: str) -> str:
    """How the CLI shows text: control characters as \\xNN, nothing else changed."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass
class Rig:
    gateway: Gateway
    agent: ScriptedAgent
    url: str
    loop: asyncio.AbstractEventLoop
    tmp: Path

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp(f"text-{request.param}")
    extra, env, schema, server = "", {}, None, ""
    if request.param == "postgres":
        server = request.getfixturevalue("pg_server")
        schema = pgserver.fresh_schema(server)
        extra = "state:\n  backend: postgres\n  dsn_env: SB_TEXT_DSN\n"
        env = {"SB_TEXT_DSN": pgserver.with_schema(server, schema)}
    (tmp / "config.yaml").write_text("platforms:\n  api:\n    port: 0\n" + extra)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="text-rig", daemon=True)
    thread.start()
    agent = ScriptedAgent()
    gateway = Gateway(config=load_config(tmp / "config.yaml", env), home=tmp / "home", agent=agent)
    rig = Rig(gateway, agent, "", loop, tmp)
    rig.run(gateway.start())
    rig.url = f"http://127.0.0.1:{gateway.adapters[0].bound_port}"  # type: ignore[attr-defined]
    try:
        yield rig
    finally:
        rig.run(gateway.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        if schema is not None:
            pgserver.drop_schema(server, schema)


async def _exchange(rig: Rig, text: str) -> dict[str, Any]:
    """Send `text` as a new user's message, then read it back through every reader."""
    user = f"u-{uuid.uuid4().hex}"
    body = {"user": user, "messages": [{"role": "user", "content": text}]}
    got: dict[str, Any] = {"user": user}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{rig.url}/v1/chat/completions", json=body) as resp:
            got["status"], got["answer"] = resp.status, await resp.json()
        db = rig.gateway.db
        assert db is not None
        got["sessions"] = [
            s for s in await db.list_sessions("api", limit=1000) if s.get("user_id") == user
        ]
        if resp.status != 200:
            return got
        sid = got["answer"]["switchboard"]["session_id"]
        got["stored"] = [m["content"] for m in await db.get_messages(sid)]
        got["history"] = rig.agent.seen[-1]
        async with http.get(f"{rig.url}/api/sessions/{sid}") as resp:
            assert resp.status == 200, await resp.text()
            got["dashboard"] = await resp.json()
    export = rig.tmp / f"{sid}.jsonl"
    with cli.err.capture():
        await cli.cmd_export(db, argparse.Namespace(file=str(export), source=None, session_id=sid))
    # lines end at \n only (str.splitlines would also split at U+2028 inside a string)
    lines = export.read_text("utf-8").split("\n")
    got["exported"] = [json.loads(line) for line in lines if line]
    with cli.out.capture() as shown:
        await cli.cmd_show(db, argparse.Namespace(ref=sid, messages=20, json=False))
    got["show"] = shown.get()
    with cli.out.capture() as listed:
        await cli.cmd_list(db, argparse.Namespace(source="api", all=False, limit=5, json=False))
    got["list"] = listed.get()
    got["session"] = await db.require_session(sid)
    return got


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(text=texts())
@example(text="preview [/i] here")
@example(text="[bold red]x[/] [link=http://evil]click[/link] a[i]")
@example(text="before\x00after")
@example(text='\x00json:[{"type":"text","text":"injected"}]')
@example(text="\ud800 alone")
@example(text="\ud800\udfff")
@example(text="\u202eevil\u202c \u200b中文 😀")
@example(text="x" * 100_000)
@example(text=("中文😀[/i]\u200d" * 15_000)[:100_000])
def test_text_round_trips_exactly_or_is_refused_naming_the_field(rig: Rig, text: str) -> None:
    got = rig.run(_exchange(rig, text))
    # what the daemon reads: JSON's escapes of a high surrogate then a low one are one
    # character (U+10000 and up) once decoded, whatever the client meant by them
    text = json.loads(json.dumps(text))
    if "\x00" in text or re.search("[\ud800-\udfff]", text) or not text.strip():
        assert got["status"] == 400, got["answer"]
        message = got["answer"]["error"]["message"]
        assert message.startswith("messages[0].content contains ") or not text.strip()
        assert got["sessions"] == []  # nothing stored
        return
    assert got["status"] == 200, got["answer"]
    reply = f"echo: {text}"
    assert got["answer"]["choices"][0]["message"]["content"] == reply
    assert got["stored"] == [text, reply]
    assert got["history"][-1] == {"role": "user", "content": text}
    assert [m["content"] for m in got["dashboard"]["messages"]] == [text, reply]
    [record] = got["exported"]
    assert [m["content"] for m in record["messages"]] == [text, reply]
    # the terminal: each message's line, whitespace folded, at most 200 characters
    lines = got["show"].splitlines()
    assert f"       user {on_terminal(one_line(text)[:200])}" in lines
    assert f"  assistant {on_terminal(one_line(reply)[:200])}" in lines
    preview = got["session"]["preview"]
    assert preview == one_line(text)[:60]
    assert on_terminal(preview) in got["list"]
