"""Dashboard API benchmarks. Prints figures; asserts nothing.

  python bench/dashboard_bench.py           # 100,000 sessions / 1,000,000 messages
  python bench/dashboard_bench.py --quick   # 10,000 / 100,000

Every request goes over loopback HTTP to the real api-server app with the dashboard
mounted (bearer key, JSON), so the figures include aiohttp, routing, the guard middleware
and JSON encoding, not just SQL:
1. GET /api/sessions: the first page, deep pages reached by following the cursor, and the
   filters (platform, status, untitled, a date range, oldest first). Target p95 <= 100 ms.
2. GET /api/search: the search bench's sampled queries. Target p95 <= 150 ms.
3. GET /api/insights?days=90 (and 7, 30, 365 for the curve). Target <= 500 ms.
Each set runs once unmeasured first (the OS page cache), then measured.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import corpus_db, pct  # noqa: E402
from bench.search_bench import OUT, sample_queries  # noqa: E402
from gateway.adapters.api import ApiAdapter  # noqa: E402
from gateway.web import Dashboard, DashboardSettings  # noqa: E402
from state import SessionDB  # noqa: E402
from state.sqlite import schema  # noqa: E402

KEY = "bench-key-123456"


async def _timed(http: aiohttp.ClientSession, url: str) -> tuple[float, dict[str, object]]:
    t = time.perf_counter()
    async with http.get(url, headers={"Authorization": f"Bearer {KEY}"}) as resp:
        body = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {body}")
    return (time.perf_counter() - t) * 1000, body


def _line(label: str, times: list[float], target: float | None = None) -> None:
    goal = f"  (target p95 <= {target:g} ms)" if target else ""
    print(
        f"  {label:<34} n={len(times):>4}  p50 {pct(times, 0.5):7.1f} ms  "
        f"p95 {pct(times, 0.95):7.1f} ms  max {max(times):7.1f} ms{goal}"
    )


async def sessions_figures(
    http: aiohttp.ClientSession, base: str, span: tuple[float, float]
) -> list[float]:
    from datetime import UTC, datetime

    day = lambda ts: datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")  # noqa: E731
    mid = (span[0] + span[1]) / 2
    kinds = {
        "first page (50)": ["limit=50"] * 40,
        "platform=telegram": ["platform=telegram"] * 40,
        "status=ended, untitled": ["status=ended&titled=no"] * 40,
        "date range (one week)": [f"from={day(mid)}&to={day(mid + 6 * 86400)}"] * 40,
        "oldest first, by start": ["sort=started&order=asc"] * 40,
        "chat_type=group (absent)": ["chat_type=group&limit=50"] * 10,
    }
    every: list[float] = []
    for label, qs in kinds.items():
        for _ in range(2):  # the first pass warms the cache
            times = [(await _timed(http, f"{base}/api/sessions?{q}"))[0] for q in qs]
        _line(label, times, 100)
        if "absent" not in label:
            every += times
    # deep pages: follow the cursor 200 pages (10,000 sessions) in
    deep: list[float] = []
    cursor = None
    for i in range(200):
        ms, body = await _timed(
            http, f"{base}/api/sessions?limit=50" + (f"&after={cursor}" if cursor else "")
        )
        cursor = body["next"]
        if i >= 100:
            deep.append(ms)
    _line("pages 101-200 via the cursor", deep, 100)
    return every + deep


async def search_figures(http: aiohttp.ClientSession, base: str, path: Path) -> list[float]:
    from urllib.parse import quote

    every: list[float] = []
    for kind, qs in sample_queries(path, 40).items():
        for _ in range(2):
            times = [
                (await _timed(http, f"{base}/api/search?q={quote(q)}&limit=20"))[0] for q in qs
            ]
        _line(kind, times, 150)
        every += times
    return every


async def insights_figures(http: aiohttp.ClientSession, base: str) -> None:
    for days in (7, 30, 90, 365):
        times = []
        body: dict[str, object] = {}
        for _ in range(6):
            ms, body = await _timed(http, f"{base}/api/insights?days={days}")
            times.append(ms)
        times = times[1:]
        _line(
            f"insights, {days} days ({body['messages']:,} msgs)", times, 500 if days == 90 else None
        )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sessions, n_messages = (10_000, 100_000) if args.quick else (100_000, 1_000_000)
    path = corpus_db(OUT, sessions, n_messages, 0.05)
    conn = sqlite3.connect(path)
    span = conn.execute("SELECT MIN(started_at), MAX(last_active) FROM sessions").fetchone()
    conn.close()
    print(
        f"switchboard dashboard bench — {n_messages:,} messages in {sessions:,} sessions "
        f"over 365 days, SQLite {sqlite3.sqlite_version}"
    )
    conn = sqlite3.connect(path)
    version = schema.current_version(conn)
    conn.close()
    t = time.perf_counter()
    db = await SessionDB.open(path)
    if version < schema.LATEST:
        print(
            f"  opening migrated the corpus from schema {version} to {schema.LATEST} "
            f"in {time.perf_counter() - t:.2f} s"
        )
    dash = Dashboard(db, DashboardSettings(key=KEY))
    server = TestServer(ApiAdapter(key=KEY, subapps=dash.subapps()).app(), host="127.0.0.1")
    await server.start_server()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as http:
            print("\n1. GET /api/sessions (keyset pages of 50)")
            every = await sessions_figures(http, base, span)
            _line("all of the above", every, 100)
            print("\n2. GET /api/search (limit 20, relevance)")
            every = await search_figures(http, base, path)
            _line("all queries", every, 150)
            print("\n3. GET /api/insights (the corpus ends at its build time; 90 days ≈ a quarter)")
            await insights_figures(http, base)
    finally:
        await server.close()
        await db.close()


if __name__ == "__main__":
    asyncio.run(main())
