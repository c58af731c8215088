"""Crash safety: SIGKILL the daemon at random moments under load, restart, and check that
nothing acknowledged was lost and nothing is damaged.

SWITCHBOARD_KILL_POINTS sets how many kills (20 by default; `pytest --long` makes it 100),
SWITCHBOARD_CRASH_SEED the random moments."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
from pathlib import Path

import aiohttp

from tests.daemon import clean_env, free_port, switchboard, wait_healthy

KILL_POINTS = int(os.environ.get("SWITCHBOARD_KILL_POINTS", "20"))
SEED = int(os.environ.get("SWITCHBOARD_CRASH_SEED", "20261129"))
FIGURES: dict[str, int] = {}


async def start_daemon(home: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(*switchboard(home, "run"), env=clean_env(),
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)  # fmt: skip


def check_home(home: Path, acknowledged: list[str]) -> int:
    """The invariants after a crash (the daemon is not running). Returns messages checked."""
    conn = sqlite3.connect(home / "state.db")  # opening recovers the WAL, as a restart would
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.execute(
            "INSERT INTO sb_messages_fts(sb_messages_fts, rank) VALUES ('integrity-check', 1)"
        )
        conn.execute(
            "INSERT INTO messages_aux_fts(messages_aux_fts, rank) VALUES ('integrity-check', 1)"
        )
        users = {r[0] for r in conn.execute("SELECT content FROM messages WHERE role = 'user'")}
        replies = {
            r[0] for r in conn.execute("SELECT content FROM messages WHERE role = 'assistant'")
        }
        lost = [t for t in acknowledged if t not in users or f"echo: {t}" not in replies]
        assert lost == [], f"{len(lost)} acknowledged message(s) lost: {lost[:5]}"
        doubled = conn.execute(
            "SELECT session_key, COUNT(*) FROM sessions WHERE ended_at IS NULL AND session_key IS NOT NULL "
            "GROUP BY session_key HAVING COUNT(*) > 1"
        ).fetchall()
        assert doubled == [], f"keys with two live sessions: {doubled}"
        index = home / "sessions" / "sessions.json"
        if index.exists():
            data = json.loads(index.read_text())  # parses: never torn
            known = {r[0] for r in conn.execute("SELECT id FROM sessions")}
            assert all(v["session_id"] in known for v in data.values())
        return len(acknowledged)
    finally:
        conn.close()


async def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\nsessions:\n  index_flush_seconds: 0.3\n"
    )
    url = f"http://127.0.0.1:{port}"
    acknowledged: list[str] = []
    checked = 0
    for point in range(KILL_POINTS):
        proc = await start_daemon(home)
        await wait_healthy(url, proc)

        async def client(c: int, point: int = point) -> None:
            async with aiohttp.ClientSession() as http:
                for i in range(10_000):
                    text = f"k{point} c{c} m{i}"
                    try:
                        async with http.post(
                            f"{url}/v1/messages", json={"chat_id": f"chat{c % 3}", "text": text}
                        ) as r:
                            if r.status == 200 and (await r.json())["reply"] == f"echo: {text}":
                                acknowledged.append(
                                    text
                                )  # the client saw the reply: it must survive
                    except (TimeoutError, aiohttp.ClientError):
                        return

        clients = [asyncio.create_task(client(c)) for c in range(4)]
        await asyncio.sleep(rng.uniform(0.05, 0.8))
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await asyncio.gather(*clients, return_exceptions=True)
        checked = check_home(home, acknowledged)
    # the last restart: it answers, and its index agrees with state.db
    proc = await start_daemon(home)
    try:
        await wait_healthy(url, proc)
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{url}/v1/messages", json={"chat_id": "chat0", "text": "after the crashes"}
            ) as r:
                assert (await r.json())["reply"] == "echo: after the crashes"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    check_home(home, acknowledged + ["after the crashes"])
    conn = sqlite3.connect(home / "state.db")
    live = dict(
        conn.execute(
            "SELECT session_key, id FROM sessions WHERE ended_at IS NULL AND session_key IS NOT NULL"
        )
    )
    conn.close()
    index = {
        k: v["session_id"]
        for k, v in json.loads((home / "sessions" / "sessions.json").read_text()).items()
    }
    assert index == live
    assert checked > 50  # the load really ran
    FIGURES.update(kill_points=KILL_POINTS, messages_checked=checked)
    print(
        f"\nreliability: survived {KILL_POINTS} SIGKILLs; {checked} acknowledged messages verified"
    )
