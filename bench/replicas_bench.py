"""Several replicas on one PostgreSQL: end-to-end messages per second through the HTTP API
with the echo agent, for 1..N replicas on a fresh database each time.

Each chat sends its messages one after another (the next once the last was answered), to
the replicas in turn, so every message after a chat's first lands on another replica than
the one before it: the lease moves with nearly every message (the worst case for leases;
a load balancer hashing chats to replicas would keep them local). Prints, per replica
count: messages/s, p50/p99 latency, and the replicas' CPU seconds per 1,000 messages (from
/proc, so the PostgreSQL server's share is not in it).

    SWITCHBOARD_TEST_PG_DSN=... python -m bench.replicas_bench --replicas 1 2 --chats 64 --messages 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from tests import pgserver
from tests.cluster.harness import drop_database, fresh_database
from tests.cluster.replicas import Replica, api_message


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(server: str, n: int, chats: int, messages: int) -> None:
    name, dsn = fresh_database(server)
    group: list[Replica] = []
    try:
        with tempfile.TemporaryDirectory(prefix="sb-replicas-bench-") as tmp:
            group = [Replica(f"b{i}", Path(tmp) / f"b{i}", dsn, n) for i in range(n)]
            for r in group:
                await r.start(extra={"logging": {"level": "warning"}})
            pids = [r.proc.pid for r in group if r.proc is not None]
            latencies: list[float] = []
            limits = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=limits) as http:

                async def chat(c: int) -> None:
                    for i in range(messages):
                        started = time.perf_counter()
                        status, _ = await api_message(
                            http, group[(c + i) % n], f"c{c}", f"m{i}", f"{c}-{i}"
                        )
                        assert status == 200
                        latencies.append(time.perf_counter() - started)

                await asyncio.gather(*(chat(c) for c in range(min(chats, 4))))  # warm-up
                latencies.clear()
                cpu0 = sum(_cpu_seconds(p) for p in pids)
                t0 = time.perf_counter()
                await asyncio.gather(*(chat(c) for c in range(4, 4 + chats)))
                elapsed = time.perf_counter() - t0
                cpu = sum(_cpu_seconds(p) for p in pids) - cpu0
            total = chats * messages
            q = statistics.quantiles(latencies, n=100)
            print(f"{n} replica(s): {total / elapsed:,.0f} msg/s over {total} messages; "
                  f"p50 {q[49] * 1000:.1f} ms, p99 {q[98] * 1000:.1f} ms; "
                  f"{cpu / total * 1000:.2f} replica CPU s per 1,000 messages")  # fmt: skip
            for r in group:
                await r.stop()
    finally:
        for r in group:
            await r.stop()
        drop_database(server, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--chats", type=int, default=64)
    parser.add_argument("--messages", type=int, default=20)
    args = parser.parse_args()
    server, cluster = pgserver.find_server(pgserver.server_candidates())
    try:
        for n in args.replicas:
            asyncio.run(run(server, n, args.chats, args.messages))
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
