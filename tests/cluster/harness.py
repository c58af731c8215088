"""N `switchboard run` replicas on one PostgreSQL database, as real subprocesses.

Each replica has its own home (config, log, home lock) and a free API port; all share one
database created fresh for the test (advisory locks are per database, so a schema of its
own would not keep two tests' replicas apart). The tests reach them through the
round-robin balancer (tests/cluster/balancer.py) or one by one, and kill, pause, cut off
and restart them here. Every replica's output goes to a log file per start, so a run can
end by looking for tracebacks in all of them. Also here: the HTTP API and Telegram
webhook calls the tests make of one replica, and read-only looks into the shared database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import yaml

from state.pg.control import application_name
from tests.daemon import clean_env, free_port, switchboard, wait_healthy

DSN_ENV = "SWITCHBOARD_PG_DSN"
TELEGRAM_TOKEN = "123:ABC"  # FakeTelegram's default token
TELEGRAM_SECRET = "cluster-webhook-secret"
SLACK_TOKEN = "xoxb-cluster-token"
SLACK_SECRET = "fake-signing-secret"  # tests/fakes/slack.py signs events with it


# --- what the replica core adds (leases, routes, the leader lock) ------------------


def replica_core_missing() -> str | None:
    """Why several replicas cannot share one database in this build (None: they can).

    The replica core adds the `session_routes` table (leases with fencing epochs) to the
    PostgreSQL schema; without it every replica keeps per-key order, redelivery memory and
    its sweep to itself, so two replicas would double turns and resets."""
    from state.pg.schema import MIGRATIONS

    if not any("session_routes" in script for _, script in MIGRATIONS):
        return (
            "the replica core (session_routes leases) is not in this build: "
            "two replicas on one database are not safe yet"
        )
    return None


def cluster_config_keys() -> set[str]:
    """The keys the config schema's `cluster` section knows (empty: no such section)."""
    from gateway.config import schema

    section = schema().get("cluster")
    return set(section) if isinstance(section, Mapping) else set()


# --- the database ---------------------------------------------------------------------------


def fresh_database(server_dsn: str) -> tuple[str, str]:
    """CREATE DATABASE on the server: (its name, a DSN for it)."""
    name = f"sbc_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return name, psycopg.conninfo.make_conninfo(server_dsn, dbname=name)


def drop_database(server_dsn: str, name: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def replica_env(dsn: str, **extra: str) -> dict[str, str]:
    """A replica's environment: the database's DSN and the fakes' tokens and secrets."""
    return clean_env(
        **{
            DSN_ENV: dsn,
            "TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN,
            "TELEGRAM_WEBHOOK_SECRET": TELEGRAM_SECRET,
            "SLACK_BOT_TOKEN": SLACK_TOKEN,
            "SLACK_SIGNING_SECRET": SLACK_SECRET,
            **extra,
        }
    )


# --- one replica ------------------------------------------------------------------------------


@dataclass
class Replica:
    """One `switchboard run` with its own home and port; started again after each kill."""

    name: str
    home: Path
    port: int
    env: dict[str, str]
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0
    kills: int = 0
    paused: bool = False
    logs: list[Path] = field(default_factory=list)
    python: list[str] | None = None  # the interpreter's command line (default: this one's -m)

    @classmethod
    def on(
        cls,
        dsn: str,
        name: str,
        home: Path,
        replicas: int,
        platforms: Platforms | None = None,
        extra_config: Mapping[str, Any] | None = None,
        cluster_keys: set[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Replica:
        """One of `replicas` on the database at `dsn`, not started: its home with its
        config.yaml (`replica_config`) on a free port. `env`: more of its environment."""
        home.mkdir(parents=True)
        port = free_port()
        cfg = replica_config(
            port, platforms or Platforms(), name, replicas, extra_config, cluster_keys
        )
        (home / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        return cls(name, home, port, replica_env(dsn, **(env or {})))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self, *, wait: bool = True, extra_env: Mapping[str, str] | None = None) -> None:
        assert not self.running, f"{self.name} is already running"
        self.starts += 1
        log = self.home / f"run-{self.starts}.log"
        self.logs.append(log)
        with log.open("wb") as out:  # the child keeps its own descriptor
            self.proc = await asyncio.create_subprocess_exec(
                *self._command(),
                env={**self.env, **(extra_env or {})},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        if wait:
            await self.healthy()

    def _command(self) -> list[str]:
        if self.python is None:
            return switchboard(self.home, "run")
        return [*self.python, "--home", str(self.home), "run"]

    async def healthy(self, timeout: float = 60.0) -> None:
        assert self.proc is not None
        await wait_healthy(self.url, self.proc, timeout)

    async def kill(self) -> None:
        """SIGKILL: no clean-up at all (its leases are freed by the database, not by it)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        if self.paused:
            self.proc.send_signal(signal.SIGCONT)
            self.paused = False
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        self.kills += 1

    async def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait: the drain. Returns the exit code (None if it was not running)."""
        if self.proc is None or self.proc.returncode is not None:
            return None
        if self.paused:
            self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
            raise AssertionError(
                f"{self.name} did not stop within {timeout} s of SIGTERM"
            ) from None

    def pause(self) -> None:
        """SIGSTOP: the process holds its connections but does nothing, as a stalled VM."""
        assert self.proc is not None and self.proc.returncode is None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    async def health(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        async with http.get(f"{self.url}/health") as resp:
            return dict(await resp.json())


async def stop_replicas(replicas: Iterable[Replica]) -> list[str]:
    """SIGTERM every replica and wait (each one, whatever another did); what went wrong:
    one that did not stop in time, exited other than 0 or -9 (SIGKILLed, by the test or by
    its own fault point) or logged a traceback."""
    problems = []
    for r in replicas:
        try:
            await r.stop()
        except AssertionError as exc:
            problems.append(str(exc))
            continue
        code = r.proc.returncode if r.proc is not None else None
        if code not in (0, -9):
            problems.append(f"{r.name} exited {code}")
        if "Traceback" in r.log_text():
            problems.append(f"a traceback in the log of {r.name}")
    return problems


# --- the cluster ------------------------------------------------------------------------------


@dataclass
class Platforms:
    """Where the replicas' platform clients point: the fakes' base URLs and the balancer
    (Telegram's webhook URL names it, as setWebhook would name a load balancer)."""

    telegram_base: str | None = None
    slack_base: str | None = None
    balancer_url: str = "https://bot.example"  # none: the replicas are called one by one


def replica_config(
    port: int,
    platforms: Platforms,
    replica_id: str,
    replicas: int,
    extra: Mapping[str, Any] | None = None,
    known: set[str] | None = None,
) -> dict[str, Any]:
    """One replica's config.yaml as data: PostgreSQL through `state.dsn_env`, the API on
    its own loopback port, Telegram webhooks and the Slack Events API when their fakes run."""
    cfg: dict[str, Any] = {
        "logging": {"level": "info"},
        "state": {"backend": "postgres", "dsn_env": DSN_ENV},
        "platforms": {"api": {"port": port}},
        "inbox": {"recovery_max_age_seconds": 3600},
        "shutdown": {"drain_seconds": 5},
    }
    known = cluster_config_keys() if known is None else known
    cfg["cluster"] = {
        k: v for k, v in (("replicas", replicas), ("replica_id", replica_id)) if k in known
    }
    if not cfg["cluster"]:
        del cfg["cluster"]
    if platforms.telegram_base:
        cfg["platforms"]["telegram"] = {
            "enabled": True,
            "allow_all_users": True,
            "base_url": platforms.telegram_base,
            "mode": "webhook",
            "webhook_url": f"{platforms.balancer_url}/telegram/webhook",
            "home_channel": "-1009000",
        }
    if platforms.slack_base:
        cfg["platforms"]["slack"] = {
            "enabled": True,
            "allow_all_users": True,
            "base_url": platforms.slack_base,
            "mode": "http",
        }
    for section, values in (extra or {}).items():
        if isinstance(values, Mapping) and isinstance(cfg.get(section), dict):
            cfg[section] = _merged(cfg[section], values)
        else:
            cfg[section] = values
    return cfg


def _merged(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = (
            _merged(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
        )
    return out


class Cluster:
    """N replicas sharing one database. `start()` starts them one after another (the first
    migrates the schema); `close()` stops them (SIGTERM, each must exit 0) and drops the
    database."""

    def __init__(
        self,
        root: Path,
        server_dsn: str,
        n: int,
        platforms: Platforms,
        extra_config: Mapping[str, Any] | None = None,
        cluster_keys: set[str] | None = None,
    ) -> None:
        """`cluster_keys`: the `cluster` config keys the replicas' code knows (default:
        this checkout's; a benchmark may run another one)."""
        self.root = root
        self.server_dsn = server_dsn
        self.db_name, self.dsn = fresh_database(server_dsn)
        self.replicas = [
            Replica.on(self.dsn, f"r{i}", root / f"r{i}", n, platforms, extra_config, cluster_keys)
            for i in range(n)
        ]

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.replicas)

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.running and not r.paused]

    async def start(self) -> None:
        for r in self.replicas:
            await r.start()

    async def close(self) -> dict[str, int | None]:
        """Stop every replica (SIGTERM) and drop the database (kept for a look when
        SWITCHBOARD_CLUSTER_KEEP_DB is set); the exit codes by name."""
        codes: dict[str, int | None] = {}
        try:
            for r in self.replicas:
                with contextlib.suppress(AssertionError):
                    codes[r.name] = await r.stop()
        finally:
            for r in self.replicas:
                await r.kill()
            if os.environ.get("SWITCHBOARD_CLUSTER_KEEP_DB"):
                print(f"\nkept the cluster's database: {self.dsn}")
            else:
                drop_database(self.server_dsn, self.db_name)
        return codes

    def connect(self) -> psycopg.Connection[Any]:
        """A synchronous connection to the cluster's database, for checks."""
        return psycopg.connect(self.dsn, autocommit=True)

    def tracebacks(self) -> list[str]:
        """Every traceback any replica printed, with the replica's name and the log's
        line before it (the log record that carried it)."""
        found = []
        for r in self.replicas:
            for log in r.logs:
                if not log.exists():
                    continue
                lines = log.read_text(errors="replace").splitlines()
                for n, line in enumerate(lines):
                    if line.startswith("Traceback (most recent call last)"):
                        context = lines[max(0, n - 1) : n + 12]
                        found.append(f"{r.name} {log.name}:{n + 1}:\n" + "\n".join(context))
        return found


async def until(check: Callable[[], bool], timeout: float = 60.0, every: float = 0.05) -> float:
    """Poll `check()` until true; the seconds it took (fails after `timeout`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        await asyncio.sleep(every)
    raise AssertionError(f"not within {timeout} s: {check.__doc__ or check}")


# --- calls to one replica ---------------------------------------------------------------------


async def leaders(http: aiohttp.ClientSession, among: Iterable[Replica]) -> list[Replica]:
    """The replicas among `among` whose /health says they hold the leader lock (one that
    does not answer is not counted)."""
    found = []
    for r in among:
        try:
            if (await r.health(http)).get("replica", {}).get("leader"):
                found.append(r)
        except aiohttp.ClientError:
            continue
    return found


async def api_message(
    http: aiohttp.ClientSession,
    replica: Replica,
    chat: str,
    text: str,
    message_id: str,
    timeout: float = 60.0,
) -> tuple[int, dict[str, Any]]:
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
        f"{replica.url}/telegram/webhook",
        json=update,
        headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
    ) as resp:
        return resp.status


# --- looks into the shared database -----------------------------------------------------------


def query(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(conn.execute(sql.encode(), params).fetchall())


def cut_off(dsn: str, replica: str) -> int:
    """End a replica's control connection from the server side, as a network partition
    would once the keepalives gave up: its locks go, so other replicas take over its keys.
    Returns how many connections were ended."""
    found = query(
        dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = %s AND datname = current_database()",
        (application_name(replica),),
    )
    return len(found)


def stored_user_texts(dsn: str, session_key: str) -> list[str]:
    """The user messages stored under a key's sessions, in id order."""
    return [
        str(r[0])
        for r in query(
            dsn,
            "SELECT m.content FROM messages m JOIN sessions s ON s.id = m.session_id "
            "WHERE s.session_key = %s AND m.role = 'user' ORDER BY m.id",
            (session_key,),
        )
    ]


def live_sessions_per_key(dsn: str) -> dict[str, int]:
    return {
        str(k): int(n)
        for k, n in query(
            dsn,
            "SELECT session_key, COUNT(*) FROM sessions WHERE ended_at IS NULL "
            "AND session_key IS NOT NULL GROUP BY 1",
        )
    }


def held_leases(dsn: str) -> list[str]:
    """Keys whose lease a live replica still holds."""
    return [
        str(r[0])
        for r in query(
            dsn,
            "SELECT session_key FROM session_routes r WHERE lease_owner IN ("
            "SELECT l.objid::bigint FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
            "AND l.objsubid = 2)",
        )
    ]


def inbox_states(dsn: str) -> dict[str, int]:
    return {str(s): int(n) for s, n in query(dsn, "SELECT state, COUNT(*) FROM inbox GROUP BY 1")}
