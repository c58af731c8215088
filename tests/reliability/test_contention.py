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

DURATION_S = float(os.environ.get("SWITCHBOARD_CONTENTION_SECONDS", "6"))


async def _cli(home: Path, *args: str, stdin: str = "") -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(*switchboard(home, *args), stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                env=clean_env())  # fmt: skip
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
    stop_at = time.monotonic() + DURATION_S

    async def load(c: int) -> None:
        async with aiohttp.ClientSession() as http:
            i = 0
            while time.monotonic() < stop_at:
                text = f"c{c} m{i}"
                async with http.post(
                    f"{url}/v1/messages", json={"chat_id": f"chat{c}", "text": text}
                ) as r:
                    assert r.status == 200, await r.text()
                    acknowledged.append(text)
                i += 1

    async def worker(w: int) -> None:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            if w == 0 and renamed:
                args: tuple[str, ...] = (
                    "sessions",
                    "rename",
                    renamed[n % len(renamed)],
                    f"renamed {w} {n}",
                )
            elif w == 1 and doomed:
                args = ("sessions", "delete", doomed.pop(), "--yes")
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

    await asyncio.gather(*(load(c) for c in range(3)), *(worker(w) for w in range(4)))
    daemon.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(daemon.wait(), 30) == 0
    failures = [
        (what, code, text[-300:])
        for what, code, text in ops
        if code != 0 or "locked" in text.lower() or "Traceback" in text
    ]
    assert failures == []
    assert len(ops) >= 8 and len(acknowledged) > 50
    conn = sqlite3.connect(home / "state.db")
    users = {r[0] for r in conn.execute("SELECT content FROM messages WHERE role = 'user'")}
    conn.close()
    assert [t for t in acknowledged if t not in users] == []
    assert sum(1 for what, *_ in ops if what == "chat") >= 1
    print(
        f"\ncontention: {len(ops)} CLI operations beside {len(acknowledged)} daemon turns, no errors"
    )
