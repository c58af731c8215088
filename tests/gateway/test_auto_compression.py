"""Automatic compression as the daemon's log shows it: a session of a few huge messages
passes the context share on every turn yet is too short to summarise; the log names why,
once for the session, while `/compress` answers "Nothing to compress yet"."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp

from tests.daemon import clean_env, free_port, switchboard, wait_healthy


async def test_a_session_too_short_to_compress_logs_the_reason_once(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\nagent:\n  context_tokens: 1000\n"
        "  reply_tokens: 100\n"
    )
    log = home / "run.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *switchboard(home, "run"), env=clean_env(), stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    replies = []
    try:
        await wait_healthy(url, proc)
        async with aiohttp.ClientSession() as http:
            for n in range(3):  # each turn: a huge message and its echo, over the share
                text = f"huge message {n} " + "lorem ipsum dolor sit amet " * 200
                async with http.post(
                    f"{url}/v1/messages", json={"chat_id": "1", "text": text}
                ) as r:
                    assert r.status == 200
                    replies.append((await r.json())["reply"])
            async with http.post(
                f"{url}/v1/messages", json={"chat_id": "1", "text": "/compress"}
            ) as r:
                assert r.status == 200
                compress_reply = (await r.json())["reply"]
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    text = log.read_text()
    assert proc.returncode == 0, text
    assert all(reply.startswith("echo: huge message") for reply in replies)
    assert compress_reply == "Nothing to compress yet."
    lines = [line for line in text.splitlines() if "automatic compression" in line]
    assert len(lines) == 1, text
    assert "nothing older is left to summarise" in lines[0]
    assert "the last 6 stay verbatim" in lines[0]
