"""`switchboard doctor` on a healthy home, a damaged one (unreadable index, dangling
lineage), with --fix, while a daemon holds the home, against a platform fake, and the
replicas it counts on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import load_config
from gateway.home import HomeLock
from gateway.ops.doctor import exit_code, run_doctor
from state import SessionDB
from tests.cluster.harness import Platforms, Replica, drop_database, fresh_database, stop_replicas
from tests.fakes.telegram import FakeTelegram


def _doctor(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "doctor", "--offline", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _home_with_sessions(home: Path) -> tuple[str, str]:
    db = await SessionDB.open(home / "state.db")
    parent = await db.create_session(source="api", session_key="agent:main:api:dm:1", chat_id="1")
    child = await db.fork_session(parent, "compression", end_reason="compression")
    await db.close()
    (home / "sessions").mkdir(parents=True, exist_ok=True)
    return parent, child


@pytest.mark.slow
async def test_a_healthy_home_passes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    await _home_with_sessions(home)
    assert _doctor(home, "--fix").returncode == 0  # writes the index once
    proc = _doctor(home, "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"] is True
    assert {c["name"] for c in report["checks"]} >= {
        "config",
        "state.db integrity",
        "search index",
        "schema",
        "session index",
        "lineage",
        "WAL size",
    }


@pytest.mark.slow
async def test_a_damaged_home_fails_and_fix_repairs_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    parent, child = await _home_with_sessions(home)
    (home / "sessions" / "sessions.json").write_text("{torn")
    conn = sqlite3.connect(home / "state.db")
    conn.execute(
        "DELETE FROM sessions WHERE id = ?", (parent,)
    )  # behind the store's back: child now dangles
    conn.commit()
    conn.close()
    proc = _doctor(home)
    assert proc.returncode == 1
    assert "[FAIL] session index" in proc.stdout and "unreadable" in proc.stdout
    assert "[FAIL] lineage: 1 session(s) point at a deleted parent" in proc.stdout
    fixed = _doctor(home, "--fix")
    assert fixed.returncode == 0, fixed.stdout
    assert (
        "rebuilt from state.db (1 entries)" in fixed.stdout
        and "cleared 1 parent link" in fixed.stdout
    )
    assert _doctor(home).returncode == 0
    assert (
        json.loads((home / "sessions" / "sessions.json").read_text())["agent:main:api:dm:1"][
            "session_id"
        ]
        == child
    )


@pytest.mark.slow
async def test_fix_leaves_the_index_alone_while_a_daemon_holds_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    await _home_with_sessions(home)
    lock = HomeLock(home)
    lock.acquire()
    try:
        proc = _doctor(home, "--fix")
    finally:
        lock.release()
    assert proc.returncode == 1 and "not fixed" in proc.stdout and "stop it first" in proc.stdout
    assert not (home / "sessions" / "sessions.json").exists()


def test_a_bad_config_and_a_corrupt_database_are_reported(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("agent:\n  backend: nope\n")
    (home / "state.db").write_bytes(b"not a database at all" * 50)
    proc = _doctor(home)
    assert proc.returncode == 1
    assert "[FAIL] config: agent.backend" in proc.stdout and "[FAIL] state.db:" in proc.stdout


@pytest.mark.parametrize("token, ok", [("123:ABC", True), ("999:NOPE", False)])
async def test_platform_reachability(tmp_path: Path, token: str, ok: bool) -> None:
    fake = FakeTelegram()
    await fake.start()
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            f"platforms:\n  telegram:\n    enabled: true\n    allow_all_users: true\n    base_url: {fake.base_url}\n"
        )
        config = load_config(cfg, {"TELEGRAM_BOT_TOKEN": token})
        checks = await run_doctor(tmp_path / "home", config, None, fix=False, full=False)
    finally:
        await fake.stop()
    [reach] = [c for c in checks if c.name == "telegram reachable"]
    assert reach.ok is ok and (
        reach.detail == "@switchboard_bot" if ok else "Unauthorized" in reach.detail
    )
    assert exit_code(checks) == (0 if ok else 1)


@pytest.mark.slow
async def test_a_chat_the_daemon_has_not_written_yet_is_not_a_fault(tmp_path: Path) -> None:
    # doctor right after a new chat, with the daemon running and its index not yet flushed
    from gateway.app import Gateway
    from gateway.messages import InboundMessage
    from gateway.session_keys import SessionSource

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(
        "sessions:\n  index_flush_seconds: 5\nplatforms:\n  api:\n    port: 0\n"
    )
    gw = Gateway(config=load_config(home / "config.yaml", {}), home=home)
    await gw.start()
    try:
        assert gw.router is not None and gw.index is not None
        for chat in ("1", "2"):
            await gw.router.handle(InboundMessage(SessionSource("api", chat, "dm", chat), "hi"))
            await gw.router.drain(5)
            if chat == "1":
                await gw.index.flush()
        written = json.loads((home / "sessions" / "sessions.json").read_text())
        assert list(written) == ["agent:main:api:dm:1"]  # chat 2 is not written yet
        # the doctor looks at once (in this process, beside the running daemon)
        checks = await run_doctor(
            home, gw.config, None, fix=False, full=False, check_platforms=False
        )
        assert exit_code(checks) == 0, [c.line() for c in checks]
        lines = [c.line() for c in checks]
        assert "[ok  ] session index: 2 entries agree with state.db" in lines
    finally:
        await gw.stop()


@pytest.mark.slow
async def test_imported_live_sessions_are_a_warning_and_adopted_at_start(tmp_path: Path) -> None:
    # a home whose sessions came only from `sessions import`
    source = tmp_path / "source"
    db = await SessionDB.open(source / "state.db")
    sid = await db.create_session(
        source="telegram", session_key="agent:main:telegram:dm:9", chat_id="9", chat_type="dm"
    )
    await db.append_messages(sid, [{"role": "user", "content": "carried over"}])
    await db.close()
    dump = tmp_path / "dump.jsonl"
    cli = [sys.executable, "-m", "gateway"]
    export = await asyncio.to_thread(
        subprocess.run,
        [*cli, "--home", str(source), "sessions", "export", str(dump)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert export.returncode == 0, export.stderr
    home = tmp_path / "home"
    imported = await asyncio.to_thread(
        subprocess.run,
        [*cli, "--home", str(home), "sessions", "import", str(dump)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert imported.returncode == 0, imported.stderr
    proc = await asyncio.to_thread(_doctor, home)
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, proc.stdout
    assert (
        "sessions.json is missing (1 live sessions in state.db); the daemon builds it"
        in proc.stdout
    )
    # a home whose daemon has run before has the file, without the imported chat
    (home / "sessions").mkdir()
    (home / "sessions" / "sessions.json").write_text("{}")
    proc = await asyncio.to_thread(_doctor, home)
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, proc.stdout
    assert "[warn] session index: 1 live session(s) with no entry yet" in proc.stdout
    assert "adopts them when it next starts" in proc.stdout
    # ... and the daemon does adopt it
    from gateway.app import Gateway

    (home / "config.yaml").write_text("platforms:\n  api:\n    enabled: false\n")
    gw = Gateway(config=load_config(home / "config.yaml", {}), home=home)
    await gw.start()
    try:
        assert gw.index is not None
        assert gw.index.get("agent:main:telegram:dm:9").session_id == sid  # type: ignore[union-attr]
    finally:
        await gw.stop()
    after = await asyncio.to_thread(_doctor, home)
    assert after.returncode == 0 and "[ok  ] session index: 1 entries agree" in after.stdout


async def test_doctor_on_postgresql_counts_each_running_daemon_once(
    tmp_path: Path, pg_server: str
) -> None:
    """The leader lock is a second advisory lock of one replica, not another replica, and
    doctor's own connection holds no lock: one daemon is one live replica, two are two."""
    name, dsn = fresh_database(pg_server)
    made = [Replica.on(dsn, f"r{i}", tmp_path / f"r{i}", 2, Platforms()) for i in (1, 2)]

    def doctor(replica: Replica) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "--home", str(replica.home), "doctor", "--offline"],
            capture_output=True,
            text=True,
            timeout=60,
            env=replica.env,
        )

    try:
        await made[0].start()
        one = await asyncio.to_thread(doctor, made[0])
        assert "1 live replica(s)" in one.stdout, one.stdout + one.stderr
        await made[1].start()
        two = await asyncio.to_thread(doctor, made[1])
        assert "2 live replica(s)" in two.stdout, two.stdout + two.stderr
    finally:
        problems = await stop_replicas(made)
        drop_database(pg_server, name)
    assert problems == []


async def test_a_postgresql_home_says_it_is_new_only_on_its_first_start(
    tmp_path: Path, pg_server: str
) -> None:
    name, dsn = fresh_database(pg_server)
    replica = Replica.on(dsn, "r1", tmp_path / "r1", 1, Platforms())
    try:
        for _ in range(2):
            await replica.start()
            assert await stop_replicas([replica]) == []
    finally:
        await replica.kill()
        drop_database(pg_server, name)
    first, second = (log.read_text() for log in replica.logs)
    assert first.count(f"created a new home at {replica.home}") == 1
    assert "created a new home" not in second
