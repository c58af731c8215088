"""Helpers for tests with several `switchboard run` replicas on one PostgreSQL database:
a fresh database, a replica as a real subprocess (its own home, config and free port;
start, SIGKILL, SIGSTOP/SIGCONT, SIGTERM), the HTTP API and Telegram webhook calls, and
read-only looks into the shared database."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import yaml

from state.pg.control import application_name
from tests.daemon import clean_env, free_port, switchboard, wait_healthy

TELEGRAM_SECRET = "replicas-webhook-secret"


def query(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(conn.execute(sql.encode(), params).fetchall())


def cut_off(dsn: str, replica: str) -> int:
    """End a replica's control connection from the server side, as a network partition
    would once the keepalives gave up: its locks go, so other replicas take over its keys.
    Returns how many connections were ended."""
    found = query(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE application_name = %s AND datname = current_database()",
                  (application_name(replica),))  # fmt: skip
    return len(found)


@dataclass
class Replica:
    """One `switchboard run` on the shared database."""

    name: str
    home: Path
    dsn: str
    replicas: int
    telegram_base: str | None = None
    port: int = field(default_factory=free_port)
    proc: asyncio.subprocess.Process | None = None
    paused: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "state": {"backend": "postgres"},
            "cluster": {"replicas": self.replicas, "replica_id": self.name},
            "platforms": {"api": {"port": self.port}},
            "shutdown": {"drain_seconds": 5},
        }
        if self.telegram_base:
            cfg["platforms"]["telegram"] = {
                "enabled": True, "allow_all_users": True, "base_url": self.telegram_base,
                "mode": "webhook", "webhook_url": "https://bot.example/telegram/webhook",
            }  # fmt: skip
        for section, values in (extra or {}).items():
            cfg.setdefault(section, {}).update(values)
        return cfg

    async def start(self, *, env: Mapping[str, str] | None = None,
                    extra: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.yaml").write_text(yaml.safe_dump(self.config(extra)))
        child_env = clean_env(
            SWITCHBOARD_PG_DSN=self.dsn, TELEGRAM_BOT_TOKEN="123:ABC",
            TELEGRAM_WEBHOOK_SECRET=TELEGRAM_SECRET, **dict(env or {}),
        )  # fmt: skip
        log = (self.home / "daemon.log").open("ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *switchboard(self.home, "run"), env=child_env, stdin=asyncio.subprocess.DEVNULL,
                stdout=log, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        finally:
            log.close()
        await wait_healthy(self.url, self.proc, timeout=60)

    def log(self) -> str:
        path = self.home / "daemon.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        assert self.proc is not None
        if self.paused:
            self.resume()
        self.proc.send_signal(signal.SIGKILL)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    async def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait (the drain); SIGKILL past `timeout`. The exit code."""
        if self.proc is None or self.proc.returncode is not None:
            return None if self.proc is None else self.proc.returncode
        if self.paused:
            self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
            return None

    async def health(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        async with http.get(f"{self.url}/health") as resp:
            return dict(await resp.json())


async def api_message(
    http: aiohttp.ClientSession, replica: Replica, chat: str, text: str, message_id: str,
    timeout: float = 60.0,
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """POST /v1/messages to one replica: (status, body)."""
    async with http.post(
        f"{replica.url}/v1/messages",
        json={"chat_id": chat, "text": text, "message_id": message_id},
        timeout=aiohttp.ClientTimeout(total=timeout),
    ) as resp:
        return resp.status, dict(await resp.json())


async def telegram_update(
    http: aiohttp.ClientSession, replica: Replica, update: dict[str, Any]
) -> int:
    """Deliver one update to a replica's webhook, as Telegram would: the status."""
    async with http.post(
        f"{replica.url}/telegram/webhook", json=update,
        headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
    ) as resp:  # fmt: skip
        return resp.status


def stored_user_texts(dsn: str, session_key: str) -> list[str]:
    """The user messages stored under a key's sessions, in id order."""
    return [str(r[0]) for r in query(
        dsn, "SELECT m.content FROM messages m JOIN sessions s ON s.id = m.session_id "
        "WHERE s.session_key = %s AND m.role = 'user' ORDER BY m.id", (session_key,),
    )]  # fmt: skip


def live_sessions_per_key(dsn: str) -> dict[str, int]:
    return {str(k): int(n) for k, n in query(
        dsn, "SELECT session_key, COUNT(*) FROM sessions WHERE ended_at IS NULL "
        "AND session_key IS NOT NULL GROUP BY 1",
    )}  # fmt: skip


def held_leases(dsn: str) -> list[str]:
    """Keys whose lease a live replica still holds."""
    return [str(r[0]) for r in query(
        dsn, "SELECT session_key FROM session_routes r WHERE lease_owner IN ("
        "SELECT l.objid::bigint FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.objsubid = 2)",
    )]  # fmt: skip


def inbox_states(dsn: str) -> dict[str, int]:
    return {str(s): int(n) for s, n in query(dsn, "SELECT state, COUNT(*) FROM inbox GROUP BY 1")}
