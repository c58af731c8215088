"""The store on SQLite and on PostgreSQL, side by side through `state.Store` only (the
same code measures both). Prints figures; asserts nothing.

  python bench/pg_bench.py --quick                # 20k appends, 5k sessions
  python bench/pg_bench.py --dsn "host=... dbname=..."  # default: $SWITCHBOARD_PG_DSN,
                                                  # else 127.0.0.1:5432 user postgres db test

1. Append rate: 200 producers, each awaiting its own appends (group commit on both).
2. Append latency p50/p99 at an offered 800 appends/s (open loop, the cluster's target rate).
3. list_sessions(limit=20) median over the sessions written.
4. search p50/p95 per query kind (word, two words, phrase, prefix, OR, CJK), relevance sort.
5. Commits of 8 appends that carry tokens (a batch of turns' replies: messages, session
   counts and per-model usage rows): CPU per commit of this process and, on PostgreSQL, of
   the server's backends (from /proc), and the wall time. `--batches` runs this alone.

PostgreSQL runs in a schema of its own that is dropped at the end. Client and server share
the machine's cores, so the PostgreSQL figures include the server's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import TextGen, pct  # noqa: E402
from bench.loops import backend_pids, cpu_s, open_loop  # noqa: E402
from state import Store, open_store  # noqa: E402

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
QUERIES = {
    "word": ["deploy", "server", "error", "python", "meeting"],
    "two words": ["deploy server", "error log", "python code", "team meeting", "fix bug"],
    "phrase": ['"of the"', '"the server"', '"fix the"', '"in the"', '"to be"'],
    "prefix": ["dep*", "ser*", "pyth*", "mee*", "comm*"],
    "OR": ["deploy OR release", "error OR bug", "docker OR linux", "email OR call", "plan OR idea"],
    "CJK": ["一丁", "丂七", "丈三", "上下", "不与"],
}


async def append_rate(store: Store, sids: list[str], rows: list[tuple[int, str, str]]) -> float:
    chunks = [rows[i::200] for i in range(200)]

    async def produce(chunk: list[tuple[int, str, str]]) -> None:
        for s, role, text in chunk:
            await store.append_message(sids[s], role, text)

    t = time.perf_counter()
    await asyncio.gather(*(produce(c) for c in chunks))
    return len(rows) / (time.perf_counter() - t)


async def latency_at(store: Store, sids: list[str], rate: float, seconds: float) -> list[float]:
    gen = TextGen(5)
    out: list[float] = []

    async def one(i: int) -> None:
        t = time.perf_counter()
        await store.append_message(sids[i % len(sids)], "user", gen.english("user"))
        out.append((time.perf_counter() - t) * 1000)

    await open_loop(rate, int(rate * seconds), one)
    return out


async def run(store: Store, label: str, quick: bool, dsn: str | None = None) -> None:
    gen = TextGen(3)
    n_rows = 20_000 if quick else 100_000
    n_sessions = 5_000 if quick else 20_000
    print(f"\n== {label}")
    sids = [
        await store.create_session(source=("telegram", "slack", "api")[i % 3], user_id=f"u{i % 97}")
        for i in range(200)
    ]
    rows = [
        (
            i % 200,
            ("user", "assistant")[i % 2],
            gen.cjk() if i % 20 == 0 else gen.english(("user", "assistant")[i % 2]),
        )
        for i in range(n_rows)
    ]
    rate = await append_rate(store, sids, rows)
    st = store.write_stats()
    print(
        f"1. append rate, 200 producers : {rate:,.0f} appends/s "
        f"(mean batch {st.operations / max(1, st.batches):.1f} ops)"
    )
    lat = await latency_at(store, sids, 800, 3 if quick else 10)
    print(
        f"2. append at 800/s offered    : p50 {pct(lat, 0.5):.2f} ms  p99 {pct(lat, 0.99):.2f} ms  "
        f"max {max(lat):.1f} ms"
    )
    for i in range(n_sessions - 200):
        sid = await store.create_session(source=("telegram", "slack")[i % 2], user_id=f"u{i % 97}")
        await store.append_message(sid, "user", gen.english("user"))
    times = []
    for _ in range(100):
        t = time.perf_counter()
        await store.list_sessions(limit=20)
        times.append((time.perf_counter() - t) * 1000)
    print(
        f"3. list_sessions(limit=20)    : median {statistics.median(times):.2f} ms "
        f"over {await store.session_count():,} sessions"
    )
    print(f"4. search over {await store.message_count():,} messages (2 passes, the 2nd timed)")
    for kind, times in (await search_times(store)).items():
        print(f"   {kind:<10} p50 {pct(times, 0.5):7.2f} ms   p95 {pct(times, 0.95):7.2f} ms")
    await batch_cpu(store, dsn, quick)


BATCH, BATCHES = 8, 3_000  # section 5


def backends_cpu_s(dsn: str) -> float:
    """User + system CPU of the server's other backends on this database so far."""
    return sum(cpu_s(pid) for pid in backend_pids(dsn))


async def batch_cpu(store: Store, dsn: str | None, quick: bool) -> None:
    """Section 5: BATCHES commits of BATCH concurrent token-carrying appends."""
    sids = [await store.create_session(source="api") for _ in range(64)]

    async def commit(k: int) -> None:
        await asyncio.gather(
            *(
                store.append_messages(
                    sids[(k * BATCH + j) % len(sids)],
                    [{"role": "assistant", "content": f"reply {k} {j} with a few words"}],
                    input_tokens=5,
                    output_tokens=7,
                )
                for j in range(BATCH)
            )
        )

    for k in range(200):  # warm: statements prepared, sessions cached
        await commit(k)
    n = BATCHES // 5 if quick else BATCHES
    server = backends_cpu_s(dsn) if dsn else 0.0
    own, wall = time.process_time(), time.perf_counter()
    for k in range(n):
        await commit(k)
    own, wall = time.process_time() - own, time.perf_counter() - wall
    server_part = f"  server {(backends_cpu_s(dsn) - server) * 1000 / n:.2f} ms" if dsn else ""
    print(
        f"5. commits of {BATCH} appends with tokens: client {own * 1000 / n:.2f} ms"
        f"{server_part}  wall {wall * 1000 / n:.2f} ms per commit ({n:,} commits)"
    )


async def search_times(store: Store) -> dict[str, list[float]]:
    """Milliseconds per search_messages call, by query kind: one warm-up pass, then four
    timed passes over QUERIES (bench/cluster_bench.py reuses it on a larger corpus)."""
    out: dict[str, list[float]] = {}
    for kind, queries in QUERIES.items():
        for q in queries:
            await store.search_messages(q)
        times = out.setdefault(kind, [])
        for _ in range(4):
            for q in queries:
                t = time.perf_counter()
                await store.search_messages(q)
                times.append((time.perf_counter() - t) * 1000)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dsn", default=os.environ.get("SWITCHBOARD_PG_DSN", DEFAULT_DSN))
    ap.add_argument("--only", choices=("sqlite", "postgres"))
    ap.add_argument("--batches", action="store_true", help="section 5 alone, on PostgreSQL")
    args = ap.parse_args()
    print(f"switchboard store bench, {os.cpu_count()} cores (client and server share them)")
    schema = f"sb_bench_{os.getpid()}"
    if args.only != "postgres" and not args.batches:
        with tempfile.TemporaryDirectory() as tmp:
            store = await open_store({"backend": "sqlite"}, tmp)
            try:
                await run(store, "SQLite (state.db, WAL, synchronous=NORMAL)", args.quick)
            finally:
                await store.close()
    if args.only == "sqlite":
        return
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        version = conn.execute("SHOW server_version").fetchone()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
    dsn = psycopg.conninfo.make_conninfo(args.dsn, options=f"-c search_path={schema}")
    try:
        store = await open_store({"backend": "postgres", "dsn": dsn}, ".")
        try:
            label = f"PostgreSQL {version[0] if version else '?'} (synchronous_commit={sync[0] if sync else '?'})"
            if args.batches:
                print(f"== {label}")
                await batch_cpu(store, dsn, args.quick)
            else:
                await run(store, label, args.quick, dsn)
        finally:
            await store.close()
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    asyncio.run(main())
