"""A PostgreSQL server for the tests: the one `SWITCHBOARD_TEST_PG_DSN` names, else one
answering on 127.0.0.1:5432, else a private cluster started here (initdb + pg_ctl from
PG_BIN in a temporary directory, fsync on, a free port; as `nobody` when running as root,
since PostgreSQL refuses to run as root). Each test gets a schema of its own
(`fresh_schema`), dropped afterwards."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

PG_BIN = Path(os.environ.get("SWITCHBOARD_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"


def answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """A private cluster this process started (and must stop)."""

    dir: Path
    port: int
    user: str | None

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=5"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(a) for a in args]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)

    def start(self) -> None:
        data = self.dir / "data"
        self._run(
            PG_BIN / "initdb",
            "-D",
            str(data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-instructions",
            "-E",
            "UTF8",
            "--locale=C",
        )
        self.up()

    def up(self) -> None:
        """Start the server on its data directory (again, after `down` or `crash`)."""
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c fsync=on "
            f"-c unix_socket_directories={self.dir}"
        )
        self._run(
            PG_BIN / "pg_ctl",
            "-D",
            str(self.dir / "data"),
            "-o",
            opts,
            "-l",
            str(self.dir / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def down(self) -> None:
        """`pg_ctl stop -m fast`: every session is ended, the server shuts down cleanly."""
        self._run(PG_BIN / "pg_ctl", "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")

    def crash(self) -> None:
        """SIGKILL the postmaster (and its children, as the kernel would take them with a
        crashed machine): the next `up` runs crash recovery from the WAL."""
        pid = int((self.dir / "data" / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
        for victim in [pid, *map(int, children.stdout.split())]:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in range(500):  # until the port is free again
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)

    def stop(self) -> None:
        try:
            self._run(PG_BIN / "pg_ctl", "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def start_cluster() -> Cluster:
    user = "nobody" if os.geteuid() == 0 else None
    base = Path(tempfile.mkdtemp(prefix="sb-pg-"))
    if user:
        shutil.chown(base, user)
    cluster = Cluster(base, free_port(), user)
    try:
        cluster.start()
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    return cluster


def find_server(candidates: list[str]) -> tuple[str, Cluster | None]:
    """The first DSN that answers, else a private cluster's (returned to be stopped)."""
    for dsn in candidates:
        if answers(dsn):
            return dsn, None
    cluster = start_cluster()
    return cluster.dsn, cluster


def server_candidates() -> list[str]:
    given = os.environ.get("SWITCHBOARD_TEST_PG_DSN")
    return [given] if given else [DEFAULT_DSN]


def with_schema(dsn: str, schema: str) -> str:
    """The DSN with `schema` first on the search path."""
    return psycopg.conninfo.make_conninfo(dsn, options=f"-c search_path={schema}")


def fresh_schema(dsn: str) -> str:
    name = f"sbt_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return name


def drop_schema(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


async def until_waiting_on_a_lock(
    watch: psycopg.AsyncConnection, pid: int, task: asyncio.Future[object]
) -> None:
    """Poll pg_stat_activity on `watch` until backend `pid` waits for a lock, or `task` has
    finished without waiting (about 5 s at most)."""
    for _ in range(500):
        cur = await watch.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        )
        row = await cur.fetchone()
        if task.done() or (row and row[0] == "Lock"):
            return
        await asyncio.sleep(0.01)


async def generic_plan(
    conn: psycopg.AsyncConnection[Any], statement: bytes, args: str, types: str = ""
) -> str:
    """The plan `conn` runs `statement` (`$n` placeholders; `types`: its parameters' types,
    when given) with: prepared there and EXPLAINed with `args` (SQL literals)."""
    await conn.execute(b"PREPARE sb_probe" + types.encode() + b" AS " + statement)
    try:
        cur = await conn.execute(f"EXPLAIN EXECUTE sb_probe({args})".encode())
        return "\n".join(str(r[0]) for r in await cur.fetchall())
    finally:
        await conn.execute(b"DEALLOCATE sb_probe")


def round_trips_and_begins(trace: str) -> tuple[int, int]:
    """In libpq's protocol trace (`pgconn.trace`), the client's round trips (each ends with
    a Sync, or is a simple Query) and the BEGINs it sent."""
    sent = [line.split("\t") for line in trace.splitlines()]
    sent = [f for f in sent if f[:1] == ["F"]]
    return (
        sum(1 for f in sent if len(f) > 2 and f[2].split(" ")[0] in ("Sync", "Query")),
        sum(1 for f in sent if '"BEGIN"' in "\t".join(f)),
    )
