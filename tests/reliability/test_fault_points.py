"""Inbox before ack and recovery: the daemon SIGKILLs itself at a named fault
point (gateway.faults) while a message is in flight; after a restart every message it took
is in its session exactly once and answered exactly once, and a message older than
`inbox.recovery_max_age_seconds` gets an apology naming it instead of a turn."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from tests.daemon import clean_env, free_port, switchboard, wait_healthy


async def _run(home: Path, **env: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(**env),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def _post(url: str, text: str, message_id: str) -> int | None:
    """The status, or None when the daemon died before answering."""
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{url}/v1/messages", json={"chat_id": "c1", "text": text, "message_id": message_id}
            ) as resp:
                return resp.status
    except aiohttp.ClientError:
        return None


def _rows(home: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    conn = sqlite3.connect(home / "state.db")
    try:
        messages = conn.execute("SELECT role, content FROM messages ORDER BY id").fetchall()
        inbox = conn.execute("SELECT platform_message_id, state FROM inbox ORDER BY id").fetchall()
    finally:
        conn.close()
    return messages, inbox


def _home(tmp_path: Path, extra: str = "") -> tuple[Path, str]:
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(f"platforms:\n  api:\n    port: {port}\n{extra}")
    return home, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("point", ["after_inbox_commit", "mid_agent", "after_reply_commit"])
async def test_a_turn_killed_at_a_fault_point_is_answered_once_after_a_restart(
    tmp_path: Path, point: str
) -> None:
    home, url = _home(tmp_path)
    proc = await _run(home, SWITCHBOARD_FAULT=point)
    await wait_healthy(url, proc)
    assert await _post(url, "hello", "m1") is None  # the daemon died mid-request
    assert await proc.wait() == -9
    proc = await _run(home)
    try:
        await wait_healthy(url, proc)
        for _ in range(200):  # recovery runs the turn in the background at start-up
            messages, inbox = _rows(home)
            if inbox == [("m1", "answered")]:
                break
            await asyncio.sleep(0.05)
        # the platform (here: the client) sends it again: taken once, answered once
        status = await _post(url, "hello", "m1")
        assert status in (200, 409)
    finally:
        proc.terminate()
        await proc.wait()
    messages, inbox = _rows(home)
    assert inbox == [("m1", "answered")]
    assert messages == [("user", "hello"), ("assistant", "echo: hello")]


async def test_an_interrupted_message_too_old_to_answer_gets_an_apology(tmp_path: Path) -> None:
    home, url = _home(tmp_path, "inbox:\n  recovery_max_age_seconds: 0\n")
    proc = await _run(home, SWITCHBOARD_FAULT="after_inbox_commit")
    await wait_healthy(url, proc)
    assert await _post(url, "what is the weather", "m1") is None
    await proc.wait()
    proc = await _run(home)
    try:
        await wait_healthy(url, proc)
        for _ in range(200):
            _messages, inbox = _rows(home)
            if inbox and inbox[0][1] != "received":
                break
            await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as resp:
            health = await resp.json()
    finally:
        proc.terminate()
        await proc.wait()
    messages, inbox = _rows(home)
    assert inbox == [("m1", "dropped")]
    assert messages == []  # no turn ran: nothing stored for it
    assert health["recovered_turns"] == {"apologised": 1}


async def test_doctor_reports_a_turn_a_crash_left_open(tmp_path: Path) -> None:
    from gateway.config import load_config
    from gateway.ops.doctor import run_doctor

    home, url = _home(tmp_path)
    proc = await _run(home, SWITCHBOARD_FAULT="mid_agent")
    await wait_healthy(url, proc)
    assert await _post(url, "hello", "m1") is None
    await proc.wait()
    checks = await run_doctor(
        home,
        load_config(home / "config.yaml", {}),
        None,
        fix=False,
        full=False,
        check_platforms=False,
    )
    [inbox] = [c for c in checks if c.name == "inbox"]
    assert inbox.warn and inbox.detail.startswith("1 turn(s) open (1 started)")
