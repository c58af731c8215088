"""The CPU of one round trip to PostgreSQL through psycopg on this machine: a prepared
`SELECT 1` run N times on one connection, the client's CPU (process_time) plus the
backend's (utime + stime from its /proc entry, as bench/hermes_search_bench.py reads it),
per statement, for psycopg's blocking connection, its asyncio one, and the store's
(`state.pg.db.LoopConnection`, psycopg's asyncio connection with its socket left
registered with the loop), the asyncio ones on uvloop (the daemon's loop) and on the
standard library's. No statement costs less: it is the floor of a search's statements.
Then a prepared statement of two parameters through the store's query helpers
(`state.pg.db.tuples`) on uvloop, on psycopg's cursor and on the direct path the writer's
and the read pool's connections take (`state.pg.db.Direct`).

  python bench/pg_roundtrip_bench.py [--dsn DSN] [--runs 5] [--statements 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from state.pg import db  # noqa: E402
from state.pg.db import LoopConnection  # noqa: E402

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
TICK = os.sysconf("SC_CLK_TCK")
QUERY = b"SELECT 1"
LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio loop": asyncio.new_event_loop}


def backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def blocking(dsn: str, runs: int, n: int) -> list[tuple[float, float]]:
    out = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = conn.info.backend_pid
        for _ in range(runs):
            for _ in range(n // 10):  # prepared and warm
                conn.execute(QUERY, prepare=True).fetchall()
            server, client = backend_cpu(pid), time.process_time()
            for _ in range(n):
                conn.execute(QUERY, prepare=True).fetchall()
            out.append((time.process_time() - client, backend_cpu(pid) - server))
    return out


async def with_asyncio(
    cls: type[psycopg.AsyncConnection[Any]], dsn: str, runs: int, n: int
) -> list[tuple[float, float]]:
    out = []
    async with await cls.connect(dsn, autocommit=True) as conn:
        pid = conn.info.backend_pid
        for _ in range(runs):
            for _ in range(n // 10):
                await (await conn.execute(QUERY, prepare=True)).fetchall()
            server, client = backend_cpu(pid), time.process_time()
            for _ in range(n):
                await (await conn.execute(QUERY, prepare=True)).fetchall()
            out.append((time.process_time() - client, backend_cpu(pid) - server))
    return out


HELPED = "SELECT %s::bigint + 1, %s::text"


async def through_helpers(direct: bool, dsn: str, runs: int, n: int) -> list[tuple[float, float]]:
    out = []
    async with await LoopConnection.connect(dsn, autocommit=True) as conn:
        if direct:
            db.go_direct(conn)
        pid = conn.info.backend_pid
        for _ in range(runs):
            for i in range(n // 10):
                await db.tuples(conn, HELPED, (i, "x"), prepare=True)
            server, client = backend_cpu(pid), time.process_time()
            for i in range(n):
                await db.tuples(conn, HELPED, (i, "x"), prepare=True)
            out.append((time.process_time() - client, backend_cpu(pid) - server))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default=os.environ.get("SWITCHBOARD_PG_DSN", DEFAULT_DSN))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--statements", type=int, default=2000)
    args = ap.parse_args()
    n = args.statements
    print(f"a prepared SELECT 1, {n} per run, {args.runs} runs: CPU per round trip, µs")
    rows = [("psycopg, blocking", blocking(args.dsn, args.runs, n))]
    for loop_name, factory in LOOPS.items():
        for name, cls in (("psycopg, asyncio", psycopg.AsyncConnection), ("store", LoopConnection)):
            with asyncio.Runner(loop_factory=factory) as runner:
                found = runner.run(with_asyncio(cls, args.dsn, args.runs, n))
            rows.append((f"{name}, {loop_name}", found))
    for name, direct in (("helpers, cursor, uvloop", False), ("helpers, direct, uvloop", True)):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            found = runner.run(through_helpers(direct, args.dsn, args.runs, n))
        rows.append((name, found))
    for name, found in rows:
        total = sorted((c + s) / n * 1e6 for c, s in found)
        client = sorted(c / n * 1e6 for c, _ in found)
        server = sorted(s / n * 1e6 for _, s in found)
        print(
            f"{name:<27} client {statistics.median(client):5.0f} ({client[0]:.0f}-{client[-1]:.0f})"
            f"  server {statistics.median(server):4.0f} ({server[0]:.0f}-{server[-1]:.0f})"
            f"  both {statistics.median(total):5.0f} ({total[0]:.0f}-{total[-1]:.0f})"
        )


if __name__ == "__main__":
    main()
