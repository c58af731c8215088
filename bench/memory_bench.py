"""Memory of a real daemon: RSS per 10,000 live sessions and per 1,000,000 stored messages.
Prints figures; asserts nothing.

  python bench/memory_bench.py [--sessions 10000] [--skip-stored]

Runs `switchboard run` (the echo agent, the local HTTP API, SQLite) in a subprocess and
reads its VmRSS from /proc:

1. Live sessions: after a warm-up turn, one turn in each of N new sessions (the API's `user`
   field picks the session), then N more; the growth per 10,000 sessions is the index entry,
   the live session, the history window and the API's remembered answer of each.
2. Stored messages: the daemon started on a state.db of 1,000,000 messages in 100,000
   sessions (bench/corpus.py builds it once into bench/out/) against one started on an
   empty store, each after 2,000 turns in 200 sessions of its own, so the history windows
   and SQLite's page cache are in use on both.

The history windows are bounded by state/history.py's budget (16,000,000: characters of
content plus 300 per message), whatever the number of sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.corpus import corpus_db  # noqa: E402
from tests.daemon import clean_env, free_port, switchboard  # noqa: E402

OUT = ROOT / "bench" / "out"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Daemon:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.yaml").write_text(
            f"agent:\n  backend: echo\nplatforms:\n  api:\n    port: {self.port}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        self.proc = subprocess.Popen(
            switchboard(self.home, "run"),
            env=clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def start(self) -> None:
        self.spawn()
        async with aiohttp.ClientSession() as http:
            for _ in range(1200):
                try:
                    async with http.get(f"http://127.0.0.1:{self.port}/health") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError("the daemon did not answer /health in 120 s")

    def rss(self) -> float:
        assert self.proc is not None
        return rss_mb(self.proc.pid)

    async def turns(self, users: list[str], concurrency: int = 32) -> None:
        url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        queue: asyncio.Queue[str] = asyncio.Queue()
        for u in users:
            queue.put_nowait(u)

        async def worker(http: aiohttp.ClientSession) -> None:
            while not queue.empty():
                user = queue.get_nowait()
                body = {
                    "model": "echo",
                    "user": user,
                    "messages": [{"role": "user", "content": f"hello from {user}, how are you"}],
                }
                async with http.post(url, json=body) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status} for {user}")

        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(worker(http) for _ in range(concurrency)))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)
            self.proc = None


async def live_sessions(tmp: Path, n: int) -> None:
    daemon = Daemon(tmp / "live")
    await daemon.start()
    try:
        await daemon.turns(["warm"] * 50, concurrency=1)
        base = daemon.rss()
        print(f"1. live sessions (RSS after a warm-up: {base:.0f} MB)")
        before = base
        for step in (1, 2):
            t = time.perf_counter()
            await daemon.turns([f"user-{step}-{i}" for i in range(n)])
            secs = time.perf_counter() - t
            now = daemon.rss()
            print(
                f"   {step * n:>7,} sessions: RSS {now:6.0f} MB, +{now - before:5.1f} MB for these "
                f"{n:,} ({(now - before) / n * 10_000:.1f} MB per 10,000; {n / secs:.0f} turns/s)"
            )
            before = now
    finally:
        daemon.stop()


async def stored_messages(tmp: Path) -> None:
    corpus = corpus_db(OUT, 100_000, 1_000_000, 0.05)
    results = {}
    for name, db in (("empty store", None), ("1,000,000 messages", corpus)):
        daemon = Daemon(tmp / name.replace(" ", "-").replace(",", ""))
        if db is not None:
            shutil.copy(db, daemon.home / "state.db")
        t = time.perf_counter()
        await daemon.start()
        started = time.perf_counter() - t
        try:
            at_start = daemon.rss()
            await daemon.turns([f"s{i % 200}" for i in range(2000)])
            results[name] = (at_start, daemon.rss(), started)
        finally:
            daemon.stop()
    print("2. stored messages (RSS at start, after 2,000 turns in 200 sessions; start-up time)")
    for name, (start, after, secs) in results.items():
        print(f"   {name:<20} {start:6.0f} MB, {after:6.0f} MB   ({secs:.1f} s to /health)")
    (e0, e1, _), (m0, m1, _) = results.values()
    print(f"   per 1,000,000 stored messages: {m0 - e0:+.0f} MB at start, {m1 - e1:+.0f} MB after")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--skip-stored", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        await live_sessions(Path(d), args.sessions)
        if not args.skip_stored:
            await stored_messages(Path(d))


if __name__ == "__main__":
    asyncio.run(main())
