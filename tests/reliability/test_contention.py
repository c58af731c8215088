"""Contention: the daemon under load while four other processes run `switchboard sessions`
commands and `switchboard chat` turns on the same state.db. No "database is locked" (or any
other error) reaches anyone, and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from pathlib import Path

import aiohttp

from state import SessionDB
from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.reliability.test_crash import start_daemon

# Bounded by count, never by time: each CLI process runs this many commands while three
# HTTP clients keep the daemon busy (each sends at least TURNS_PER_CLIENT, and goes on
# until the CLI work is done). The deadline only catches a hang.
OPS_PER_WORKER = int(os.environ.get("SWITCHBOARD_CONTENTION_OPS", "4"))
TURNS_PER_CLIENT = 20
HANG_S = 300


async def _cli(home: Path, *args: str, stdin: str = "") -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *switchboard(home, *args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 120)
    return int(proc.returncode or 0), out.decode() + err.decode()


async def test_cli_processes_and_the_daemon_share_the_file_without_errors(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    db = await SessionDB.open(home / "state.db")
    doomed, renamed = [], []
    for i in range(60):
        sid = await db.create_session(source="api", started_at=time.time() - 400 * 86400)
        await db.append_message(sid, "user", f"old {i}", timestamp=time.time() - 400 * 86400)
        if i % 3 == 0:
            await db.end_session(sid, "idle")  # old and ended: for prune
        else:
            (doomed if i % 3 == 1 else renamed).append(sid)  # live: prune never takes these
    await db.close()
    (home / "config.yaml").write_text(f"platforms:\n  api:\n    port: {port}\n")
    daemon = await start_daemon(home)
    url = f"http://127.0.0.1:{port}"
    await wait_healthy(url, daemon)
    acknowledged: list[str] = []
    ops: list[tuple[str, int, str]] = []
    cli_done = asyncio.Event()

    async def load(c: int) -> None:
        async with aiohttp.ClientSession() as http:
            i = 0
            while i < TURNS_PER_CLIENT or not cli_done.is_set():
                text = f"c{c} m{i}"
                async with http.post(
                    f"{url}/v1/messages", json={"chat_id": f"chat{c}", "text": text}
                ) as r:
                    assert r.status == 200, await r.text()
                    acknowledged.append(text)
                i += 1

    async def worker(w: int) -> None:
        for n in range(1, OPS_PER_WORKER + 1):
            if w == 0 and renamed:
                args: tuple[str, ...] = (
                    "sessions",
                    "rename",
                    renamed[n % len(renamed)],
                    f"renamed {w} {n}",
                )
            elif w == 1 and doomed:
                args = ("sessions", "delete", doomed.pop(), "--yes", "--force")
            elif w == 2:
                args = (
                    ("sessions", "prune", "--older-than", "300", "--yes")
                    if n % 3 == 0
                    else ("sessions", "export", "-")
                )
            else:
                args = ("chat",)
            code, text = await _cli(
                home, *args, stdin=f"turn {w}.{n}\n/quit\n" if args == ("chat",) else ""
            )
            ops.append((" ".join(args[:2]), code, text))

    async def workers() -> None:
        try:
            await asyncio.gather(*(worker(w) for w in range(4)))
        finally:
            cli_done.set()

    try:
        await asyncio.wait_for(asyncio.gather(*(load(c) for c in range(3)), workers()), HANG_S)
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(daemon.wait(), 30) == 0
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()
    failures = [
        (what, code, text[-300:])
        for what, code, text in ops
        if code != 0 or "locked" in text.lower() or "Traceback" in text
    ]
    assert failures == []
    assert len(ops) == 4 * OPS_PER_WORKER and len(acknowledged) >= 3 * TURNS_PER_CLIENT
    conn = sqlite3.connect(home / "state.db")
    users = {r[0] for r in conn.execute("SELECT content FROM messages WHERE role = 'user'")}
    conn.close()
    assert [t for t in acknowledged if t not in users] == []
    kinds = {what for what, *_ in ops}
    assert kinds == {
        "sessions rename",
        "sessions delete",
        "sessions prune",
        "sessions export",
        "chat",
    }
    print(
        f"\ncontention: {len(ops)} CLI operations beside {len(acknowledged)} daemon turns, no errors"
    )
