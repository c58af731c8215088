"""`switchboard run` as a real subprocess: talk over HTTP, SIGTERM under load, exit codes."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from state import SessionDB
from state.hermes import foreign
from tests.daemon import clean_env, free_port, switchboard, wait_healthy


def _start(home: Path, port: int, extra: str = "") -> subprocess.Popen[str]:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(f"platforms:\n  api:\n    port: {port}\n{extra}")
    return subprocess.Popen(
        switchboard(home, "run"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )


@pytest.mark.slow
async def test_sigterm_under_load_drains_exits_zero_and_loses_nothing(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    proc = _start(home, port)
    url = f"http://127.0.0.1:{port}"
    acknowledged: list[str] = []
    try:
        await wait_healthy(url, proc)
        async with aiohttp.ClientSession() as http:
            flowing = asyncio.Event()

            async def client(c: int) -> None:
                for i in range(1000):
                    text = f"c{c} m{i}"
                    try:
                        async with http.post(
                            f"{url}/v1/messages", json={"chat_id": f"chat{c}", "text": text}
                        ) as resp:
                            if (
                                resp.status == 200
                                and (await resp.json())["reply"] == f"echo: {text}"
                            ):
                                acknowledged.append(text)
                                if len(acknowledged) >= 40:
                                    flowing.set()
                            else:
                                break
                    except aiohttp.ClientError:
                        break
                flowing.set()

            tasks = [asyncio.create_task(client(c)) for c in range(8)]
            # SIGTERM under load: once turns are flowing (or a client has stopped, which the
            # assertions below explain); the deadline only catches a hang
            await asyncio.wait_for(flowing.wait(), 120)
            proc.send_signal(signal.SIGTERM)
            await asyncio.gather(*tasks)
        rc = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
    assert len(acknowledged) >= 40
    conn = sqlite3.connect(home / "state.db")
    stored = {r[0] for r in conn.execute("SELECT content FROM messages WHERE role = 'user'")}
    replies = {r[0] for r in conn.execute("SELECT content FROM messages WHERE role = 'assistant'")}
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    missing = [t for t in acknowledged if t not in stored or f"echo: {t}" not in replies]
    assert missing == []
    assert (home / "sessions" / "sessions.json").exists()
    assert not (home / "state.db-wal").exists() or (home / "state.db-wal").stat().st_size == 0


@pytest.mark.slow
async def test_a_second_daemon_on_the_same_home_exits_1(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    first = _start(home, port)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", first)
        second = _start(home, free_port())
        out, err = second.communicate(timeout=20)
        assert second.returncode == 1
        assert "already running" in err and str(first.pid) in err
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(20) == 0


@pytest.mark.slow
def test_a_bad_config_exits_78_naming_the_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("agent:\n  backend: telepathy\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "run"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 78
    assert "agent.backend" in proc.stderr and "Traceback" not in proc.stderr
    check = subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "check-config"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert check.returncode == 78 and "agent.backend" in check.stderr


@pytest.mark.slow
def test_a_corrupt_state_db_exits_1_with_a_clear_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "state.db").write_bytes(b"garbage" * 100)
    (home / "config.yaml").write_text(f"platforms:\n  api:\n    port: {free_port()}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "run"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1
    assert (
        "state.db" in proc.stderr
        and "not an SQLite database" in proc.stderr
        and "Traceback" not in proc.stderr
    )


@pytest.mark.slow
def test_check_config_lists_every_problem_and_run_refuses_duplicate_keys(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("agent:\n  backend: telepathy\nlogging:\n  level: loud\n")
    check = subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "check-config"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert check.returncode == 78
    lines = check.stderr.splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["config error"] * 2
    assert sorted(line.split(":")[2].strip() for line in lines) == [
        "agent.backend",
        "logging.level",
    ]
    (home / "config.yaml").write_text("platforms:\n  api:\n    port: 0\n    port: 8642\n")
    for command in ("run", "check-config"):
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", "--home", str(home), command],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 78, proc.stderr
        assert "platforms.api.port: duplicate key at line 4 (first at line 3)" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
async def test_a_started_daemon_freezes_its_start_up_heap_and_reports_the_collector(
    tmp_path: Path,
) -> None:
    """What start-up built is frozen out of the collector's walks (gateway/ops/heap.py), and
    /metrics tells how often the collector ran and how long it held the process."""
    home, port = tmp_path / "home", free_port()
    proc = _start(home, port)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(url, proc)
        async with aiohttp.ClientSession() as http:
            for i in range(50):
                async with http.post(
                    f"{url}/v1/messages", json={"chat_id": "c", "text": f"m{i}"}
                ) as r:
                    assert r.status == 200
            async with http.get(f"{url}/metrics") as r:
                text = await r.text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("switchboard_gc_")
    }
    assert values["switchboard_gc_frozen_objects"] > 10_000  # modules, config, adapters ...
    assert values["switchboard_gc_passes_total"] >= values["switchboard_gc_full_passes_total"] >= 0
    assert values["switchboard_gc_pause_seconds_total"] >= 0
    assert values["switchboard_gc_pause_longest_ms"] >= 0


@pytest.mark.slow
def test_pauses_count_each_collectors_pass_by_generation_until_removed() -> None:
    import gc

    from gateway.ops.heap import Pauses

    pauses = Pauses()
    pauses.install()
    try:
        gc.collect()  # a full pass: generation 2
        gc.collect(0)
    finally:
        pauses.remove()
    gc.collect()
    assert pauses.passes[2] == 1 and pauses.passes[0] >= 1
    assert pauses.longest_ms >= 0 and pauses.seconds * 1000 >= pauses.longest_ms


@pytest.mark.slow
async def test_the_daemon_runs_on_the_event_loop_its_config_names(tmp_path: Path) -> None:
    """runtime.event_loop: uvloop by default where installed, asyncio's own loop when asked;
    /health names the one running, and both answer."""
    for extra, expected in (("", "uvloop"), ("runtime:\n  event_loop: asyncio\n", "asyncio")):
        home, port = tmp_path / expected, free_port()
        proc = _start(home, port, extra)
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_healthy(url, proc)
            async with aiohttp.ClientSession() as http:
                async with http.post(
                    f"{url}/v1/messages", json={"chat_id": "c", "text": "hi"}
                ) as r:
                    assert (await r.json())["reply"] == "echo: hi"
                async with http.get(f"{url}/health") as r:
                    assert (await r.json())["event_loop"] == expected
        finally:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 20) == 0


async def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, args, capture_output=True, text=True, timeout=60, env=clean_env()
    )


async def test_a_clean_stop_then_a_start_logs_no_index_warning_after_other_processes_wrote(
    tmp_path: Path,
) -> None:
    """While the daemon runs, `sessions delete` refuses a chat's live session (exit 3) and
    `--force` deletes it; another process starts a newer live session for a chat's key.
    SIGTERM exits 0 and leaves sessions.json current, so the next start warns about
    nothing; the deleted session's chat then starts a fresh session, and the other chat
    continues the newer session state.db holds."""
    from state import SessionDB

    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"

    async def say(http: aiohttp.ClientSession, chat: str, text: str) -> dict[str, str]:
        async with http.post(f"{url}/v1/messages", json={"chat_id": chat, "text": text}) as r:
            assert r.status == 200, await r.text()
            return dict(await r.json())

    async def stop(proc: subprocess.Popen[str]) -> str:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, None, 30)
        assert proc.returncode == 0, err
        return str(err)

    proc = _start(home, port)
    try:
        await wait_healthy(url, proc)
        async with aiohttp.ClientSession() as http:
            doomed = (await say(http, "b", "hello"))["session_id"]
            await say(http, "a", "hello")
            await say(http, "a", "/new Osaka food 🍜")
        delete = [*switchboard(home, "sessions", "delete", doomed, "--yes")]
        refused = await _cli(delete)
        assert refused.returncode == 3 and "is live" in refused.stderr
        forced = await _cli([*delete, "--force"])
        assert forced.returncode == 0, forced.stderr
        db = await SessionDB.open(home / "state.db")  # another process: `sessions import`
        try:
            newer = await db.create_session(
                source="api",
                session_key="agent:main:api:dm:a",
                chat_id="a",
                chat_type="dm",
                user_id="a",
                started_at=time.time() + 60,
            )
        finally:
            await db.close()
        await stop(proc)
        proc = _start(home, port)
        await wait_healthy(url, proc)
        async with aiohttp.ClientSession() as http:
            fresh = await say(http, "b", "again")
            assert fresh["session_id"] != doomed and fresh["reply"] == "echo: again"
            assert (await say(http, "a", "and you"))["session_id"] == newer
        log = await stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "gateway.index" not in "\n".join(ln for ln in log.splitlines() if "WARNING" in ln), log
    assert "behind state.db" not in log and "points at a missing session" not in log


@pytest.mark.slow
async def test_a_store_another_program_filled_is_served_then_indexed_behind(
    tmp_path: Path,
) -> None:
    """A state.db moved in with far more rows than start-up indexes (another program wrote
    them: no previews, no side index yet): the daemon answers a turn and indexes them all
    behind it, without a write of its own asking for it."""
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    await (await SessionDB.open(home / "state.db")).close()
    n = 10 * foreign.OPEN_LIMIT
    conn = sqlite3.connect(home / "state.db")
    conn.executemany(
        "INSERT INTO sessions(id, source, started_at) VALUES (?, 'cli', ?)",
        [(f"o{i}", 1000.0 + i) for i in range(n)],
    )
    conn.executemany(
        "INSERT INTO messages(session_id, role, content, timestamp) VALUES (?, 'user', ?, ?)",
        [(f"o{i}", f"moved in {i}", 1000.0 + i) for i in range(n)],
    )
    conn.commit()
    conn.close()
    proc = _start(home, port)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(url, proc, timeout=60)
        async with aiohttp.ClientSession() as http:
            body = {"chat_id": "c1", "text": "hello"}
            async with http.post(f"{url}/v1/messages", json=body) as resp:
                assert resp.status == 200 and (await resp.json())["reply"] == "echo: hello"
        missing = n
        for _ in range(1200):  # the bound only catches a hang
            conn = sqlite3.connect(home / "state.db")
            (missing,) = conn.execute(
                "SELECT count(*) FROM sessions WHERE id LIKE 'o%' AND preview IS NULL"
            ).fetchone()
            conn.close()
            if missing == 0:
                break
            await asyncio.sleep(0.1)
        assert missing == 0
        async with aiohttp.ClientSession() as http:
            backlog = None
            for _ in range(100):  # /health says so once the last batch is in
                async with http.get(f"{url}/health") as resp:
                    backlog = (await resp.json())["indexing_backlog"]
                if backlog == 0:
                    break
                await asyncio.sleep(0.1)
            assert backlog == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 30)
    err = proc.stderr.read() if proc.stderr else ""
    assert rc == 0, err
    assert "row(s) other programs wrote into the store" in err
    conn = sqlite3.connect(home / "state.db")
    assert conn.execute("SELECT count(*) FROM sb_pending").fetchone() == (0,)
    assert conn.execute("SELECT preview FROM sessions WHERE id = ?", (f"o{n - 1}",)).fetchone() == (
        f"moved in {n - 1}",
    )
    conn.close()
