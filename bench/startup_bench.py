"""Start-up time of a real daemon on a large store: seconds until /health answers 200.
Prints figures; asserts nothing.

  python bench/startup_bench.py [--runs 3] [--sessions 100000] [--messages 1000000]
                                [--db PATH]

Each run copies the state.db that bench/corpus.py builds (once, into bench/out/) into a fresh
home with no sessions.json, as an operator restoring a backup or moving a store meets it,
starts `switchboard run` (the echo agent, the local HTTP API, SQLite) and times it until
/health answers 200; then one turn, so the daemon serves and not only answers. An empty
store is timed the same way for comparison.

bench/corpus.py writes its rows as another program would (no `sb_written`), so they wait in
`sb_pending` for their previews and side index: the daemon indexes a bounded part before
it serves and the rest behind it. The script then sends one turn after another until that
queue is empty, and prints how long that took and the turns' latency meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.corpus import corpus_db  # noqa: E402
from bench.memory_bench import OUT, Daemon  # noqa: E402


def queued(path: Path) -> bool:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT 1 FROM sb_pending LIMIT 1").fetchone() is not None
    finally:
        conn.close()


async def one(
    home: Path, db: Path | None, behind: list[tuple[float, list[float]]]
) -> tuple[float, float]:
    daemon = Daemon(home)
    if db is not None:
        shutil.copy(db, home / "state.db")
    t = time.perf_counter()
    await daemon.start()
    healthy = time.perf_counter() - t
    try:
        await daemon.turns(["first-user"], concurrency=1)
        served = time.perf_counter() - t
        if db is not None and queued(home / "state.db"):
            latencies = []
            while queued(home / "state.db"):
                t1 = time.perf_counter()
                await daemon.turns([f"during-{len(latencies) % 50}"], concurrency=1)
                latencies.append(time.perf_counter() - t1)
            behind.append((time.perf_counter() - t, latencies))
    finally:
        daemon.stop()
    return healthy, served


def spread(name: str, runs: list[tuple[float, float]]) -> None:
    health = sorted(h for h, _ in runs)
    turn = sorted(s for _, s in runs)
    print(
        f"   {name:<22} /health: median {statistics.median(health):5.1f} s "
        f"(min {health[0]:.1f}, max {health[-1]:.1f}); first turn answered: median "
        f"{statistics.median(turn):5.1f} s (min {turn[0]:.1f}, max {turn[-1]:.1f})"
    )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--db", type=Path, help="time this state.db (copied) instead of the corpus")
    args = ap.parse_args()
    corpus = args.db or corpus_db(OUT, args.sessions, args.messages, 0.05)
    results: dict[str, list[tuple[float, float]]] = {"empty store": [], "corpus": []}
    behind: list[tuple[float, list[float]]] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.runs):
            for name, db in (("empty store", None), ("corpus", corpus)):
                home = Path(d) / f"{name.replace(' ', '-')}-{i}"
                results[name].append(await one(home, db, behind))
                shutil.rmtree(home)
    print(f"start-up, {args.runs} runs each (seconds from spawn)")
    spread("empty store", results["empty store"])
    spread(args.db.name if args.db else f"{args.messages:,} messages", results["corpus"])
    for done, lat in behind:
        lat.sort()
        print(
            f"   rows other programs wrote, all indexed {done:.1f} s after spawn; meanwhile "
            f"{len(lat)} turns one at a time, median {statistics.median(lat) * 1000:.0f} ms, "
            f"max {lat[-1] * 1000:.0f} ms"
            if lat
            else f"   rows other programs wrote, all indexed {done:.1f} s after spawn"
        )


if __name__ == "__main__":
    asyncio.run(main())
