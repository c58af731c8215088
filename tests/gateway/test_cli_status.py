"""`switchboard status` as a real subprocess beside a real daemon (and without one): the
daemon's pid, health and uptime, each adapter's state, queues, live sessions and today's
messages, the store's size and last backup, the next reset sweep; `--json` in its
documented shape; the same home on PostgreSQL names the replica and whether it leads."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

from gateway.ops.status import render
from tests import pgserver
from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes.telegram import FakeTelegram

TOP_KEYS = {
    "shape",
    "home",
    "cli_version",
    "checked_at",
    "daemon",
    "adapters",
    "queues",
    "sessions",
    "store",
    "reset",
    "config_problems",
}


def sb(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        switchboard(home, *args), capture_output=True, text=True, timeout=60, env=clean_env(**env)
    )


async def asb(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(sb, home, *args, **env)


def test_a_home_without_a_daemon_says_so_and_exits_3(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("session_reset:\n  mode: idle\n")
    proc = sb(home, "status")
    assert proc.returncode == 3, proc.stderr
    assert "daemon     not running" in proc.stdout
    assert "no state.db yet" in proc.stdout
    assert "reset      idle, sweep every 60s, next - (the daemon is not running)" in proc.stdout
    report = json.loads(sb(home, "status", "--json").stdout)
    assert set(report) == TOP_KEYS and report["shape"] == 1
    assert report["daemon"]["running"] is False and report["daemon"]["pid"] is None
    assert report["adapters"] == {"api": {"enabled": True, "state": "stopped", "last_error": None}}


async def test_a_running_daemon_is_shown_with_its_adapters_sessions_and_backup(
    tmp_path: Path,
) -> None:
    fake = FakeTelegram(token="4242:status-token")
    await fake.start()
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\n  telegram:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.base_url}\n"
    )
    (home / "switchboard.env").write_text(f"TELEGRAM_BOT_TOKEN={fake.token}\n")
    proc = await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(TELEGRAM_BOT_TOKEN=fake.token),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        fake.push(fake.message("hello status", fake.dm_chat(5)))
        await fake.wait_sent(1, timeout=20)
        shown = await asb(home, "status")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert f"daemon     running, pid {proc.pid}, ok, up " in shown.stdout
        assert "  telegram     running" in shown.stdout
        assert "sessions   1 live, 2 messages today (UTC)" in shown.stdout
        assert "backup     none recorded" in shown.stdout
        report = json.loads((await asb(home, "status", "--json")).stdout)
        assert report["daemon"]["pid"] == proc.pid and report["daemon"]["health"] == "ok"
        assert report["daemon"]["version"] and report["daemon"]["uptime_seconds"] >= 0
        assert report["adapters"]["telegram"] == {
            "enabled": True,
            "state": "running",
            "last_error": None,
        }
        assert report["queues"]["turns_in_flight"] == 0 and report["queues"]["writer"] == 0
        assert report["store"]["backend"] == "sqlite" and report["store"]["bytes"] > 0
        assert report["reset"]["next_sweep"] > report["checked_at"]
        exported = await asb(home, "sessions", "export", str(tmp_path / "all.jsonl"))
        assert exported.returncode == 0, exported.stderr
        after = await asb(home, "status")
        assert f"1 sessions to {tmp_path / 'all.jsonl'}" in after.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        await fake.stop()
    down = await asb(home, "status")
    assert down.returncode == 3
    assert "daemon     not running" in down.stdout
    assert "  telegram     stopped" in down.stdout
    assert "sessions   1 live, 2 messages today (UTC)" in down.stdout  # read from the store


async def test_a_postgres_replica_is_named_with_its_leadership(
    tmp_path: Path, pg_server: str
) -> None:
    schema = pgserver.fresh_schema(pg_server)
    dsn = pgserver.with_schema(pg_server, schema)
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"state:\n  backend: postgres\n  dsn_env: SB_STATUS_DSN\ncluster:\n  replica_id: r-one\n"
        f"platforms:\n  api:\n    port: {port}\n"
    )
    proc = await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(SB_STATUS_DSN=dsn),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        for _ in range(100):
            report = json.loads((await asb(home, "status", "--json", SB_STATUS_DSN=dsn)).stdout)
            if report["daemon"]["leader"]:
                break
            await asyncio.sleep(0.1)
        assert report["daemon"]["replica"] == "r-one" and report["daemon"]["leader"] is True
        assert report["store"]["backend"] == "postgres" and report["store"]["error"] is None
        shown = await asb(home, "status", SB_STATUS_DSN=dsn)
        assert "replica    r-one (leader; 1 live)" in shown.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        pgserver.drop_schema(pg_server, schema)


def test_text_from_the_daemon_cannot_drive_the_terminal() -> None:
    """An adapter's last error is platform text: escapes print as text, not as commands."""
    report = json.loads(
        json.dumps(
            {
                "cli_version": "1",
                "home": "/h",
                "config_problems": [],
                "daemon": {
                    "running": True,
                    "pid": 1,
                    "health": "degraded",
                    "uptime_seconds": 5,
                    "version": "1",
                    "replica": None,
                    "error": None,
                    "last_error": None,
                },
                "adapters": {
                    "telegram": {
                        "enabled": True,
                        "state": "failed",
                        "last_error": "bad\x1b[2J\x1b]0;owned\x07 token\nnext",
                    }
                },
                "queues": {
                    "writer": 0,
                    "turns_in_flight": 0,
                    "unsent_replies": 0,
                    "inbox": {},
                    "outbox": 0,
                },
                "sessions": {"live": 0, "messages_today": 0},
                "store": {
                    "backend": "sqlite",
                    "path": "/h/state.db",
                    "bytes": 10,
                    "error": None,
                    "last_backup": None,
                },
                "reset": {"mode": "none", "sweep_seconds": 60, "next_sweep": None},
            }
        )
    )
    screen = render(report)
    assert "\x1b" not in screen and "\x07" not in screen
    assert "last error: bad\\x1b[2J\\x1b]0;owned\\x07 token\\nnext" in screen
    assert "indexing" not in screen  # said only while rows wait
    report["queues"]["indexing"] = 1200
    assert "held -, indexing 1200" in render(report)
