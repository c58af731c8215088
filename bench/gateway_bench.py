"""Gateway benchmark: the real router, index and store with the echo agent,
in-process. Prints figures; asserts nothing.

  python bench/gateway_bench.py           # 10,000 chats, 100,000 messages
  python bench/gateway_bench.py --quick   # 1,000 chats, 10,000 messages

1. Throughput: messages/s, inbound to reply, with up to 500 in flight, and CPU per message.
2. Latency p50/p99 at 1,000 messages/s offered (open loop).
3. sessions.json writes and bytes over the whole run.
4. RSS at the end; start-up (index load + heal) with a 100,000-entry index, and RSS then.

Messages are emitted as concurrent tasks, as webhook requests arrive (`emit` waits for the
inbox commit; a sequential emitter would measure commit latency instead).
It runs with the thread switch interval `switchboard run` sets (gateway.ops.heap.tune_interpreter)
and, once set up, with the collector settled as `switchboard run` settles it (gateway.ops.heap).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import pct  # noqa: E402
from gateway.agent.echo import EchoAgent  # noqa: E402
from gateway.index import IndexEntry, SessionIndex  # noqa: E402
from gateway.messages import InboundMessage, OutboundMessage, SentRef  # noqa: E402
from gateway.ops import heap  # noqa: E402
from gateway.ops.heap import tune_interpreter  # noqa: E402
from gateway.pipeline import Router  # noqa: E402
from gateway.session_keys import SessionSource  # noqa: E402
from state import SessionDB  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Clock:
    """Records when each reply left, keyed by the inbound id it answers."""

    def __init__(self) -> None:
        self.done: dict[str, float] = {}
        self.event = asyncio.Event()

    async def send(self, msg: OutboundMessage) -> SentRef:
        self.done[msg.reply_to or ""] = time.perf_counter()
        self.event.set()
        return SentRef(msg.platform, msg.chat_id)


def inbound(i: int, chats: int) -> InboundMessage:
    chat = str(i % chats)
    return InboundMessage(
        SessionSource("telegram", chat, "dm", chat, f"user{chat}"),
        f"message number {i} hello there",
        f"m{i}",
    )


_emitting: set[asyncio.Task[None]] = set()


def emit(router: Router, msg: InboundMessage) -> None:
    """Hand a message over as a platform's webhook requests do: each its own task, so the
    inbox commit before the acknowledgement overlaps across messages."""
    task = asyncio.create_task(router.handle(msg))
    _emitting.add(task)
    task.add_done_callback(_emitting.discard)


async def wait_for(clock: Clock, n: int, limit_s: float = 600) -> None:
    deadline = time.monotonic() + limit_s
    while len(clock.done) < n:
        clock.event.clear()
        await asyncio.wait_for(clock.event.wait(), max(0.1, deadline - time.monotonic()))


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    chats, total = (1_000, 10_000) if args.quick else (10_000, 100_000)
    tune_interpreter()  # as `switchboard run` does
    print(
        f"switchboard gateway bench — {chats:,} chats, {total:,} messages, echo agent, in-process"
    )
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        db = await SessionDB.open(home / "state.db")
        index = SessionIndex(home / "sessions" / "sessions.json", db, flush_interval=2.0)
        await index.load()
        clock = Clock()
        router = Router(db, index, EchoAgent(), clock.send)
        heap.settle()  # as `switchboard run` does once started

        # 1. throughput
        started: dict[str, float] = {}
        t0, cpu0 = time.perf_counter(), time.process_time()
        for i in range(total):
            while i - len(clock.done) >= 500:
                clock.event.clear()
                await clock.event.wait()
            started[f"m{i}"] = time.perf_counter()
            emit(router, inbound(i, chats))
        await wait_for(clock, total)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        print("\n1. throughput")
        print(
            f"  {total / elapsed:,.0f} messages/s  ({total:,} in {elapsed:.1f} s; target >= 3,000)"
        )
        print(f"  {cpu / total * 1e6:,.0f} µs CPU per message (the process's threads, all of it)")

        # 2. latency at 1,000 msg/s offered
        n2 = 5_000 if args.quick else 10_000
        clock2 = Clock()
        router.services.replies.send = clock2.send
        start_at: dict[str, float] = {}
        t0 = time.perf_counter()
        for j in range(n2):
            target = t0 + j / 1000
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            msg = inbound(total + j, chats)
            start_at[msg.platform_message_id or ""] = time.perf_counter()
            emit(router, msg)
        await wait_for(clock2, n2)
        lat = [(clock2.done[k] - start_at[k]) * 1000 for k in start_at]
        print(f"\n2. latency at 1,000 msg/s offered ({n2:,} messages)")
        print(
            f"  p50 {pct(lat, 0.5):.1f} ms   p99 {pct(lat, 0.99):.1f} ms   max {max(lat):.1f} ms  (target p99 <= 50 ms)"
        )

        await router.drain(30)
        await index.close()
        print("\n3. sessions.json")
        print(
            f"  {index.writes} writes, {index.bytes_written / 1e6:.1f} MB in total, "
            f"{len(index):,} entries, file {(home / 'sessions' / 'sessions.json').stat().st_size / 1e6:.2f} MB"
        )
        print(f"\n4. RSS at the end: {rss_mb():.0f} MB ({len(index):,} index entries)")

        # start-up with a 100,000-entry index, each entry its own live session in state.db
        # (the chats above plus new ones, as 100,000 chats would leave it)
        n_entries = 100_000
        now = time.time()
        big: dict[str, dict[str, object]] = {}
        own = dict(index.items())
        missing = [f"agent:main:telegram:dm:{i}" for i in range(n_entries)]
        missing = [k for k in missing if k not in own]
        for start in range(0, len(missing), 5_000):
            chunk = missing[start : start + 5_000]
            sids = await asyncio.gather(
                *(
                    db.create_session(
                        source="telegram",
                        session_key=k,
                        chat_id=k.rsplit(":", 1)[1],
                        chat_type="dm",
                    )
                    for k in chunk
                )
            )
            own.update(
                (k, IndexEntry(s, now, now, {}, None, "telegram", "dm"))
                for k, s in zip(chunk, sids, strict=True)
            )
        for i in range(n_entries):
            key = f"agent:main:telegram:dm:{i}"
            big[key] = IndexEntry(
                own[key].session_id,
                now,
                now,
                {
                    "platform": "telegram",
                    "chat_id": str(i),
                    "chat_type": "dm",
                    "user_id": str(i),
                    "user_name": f"user{i}",
                },
                f"user{i}",
                "telegram",
                "dm",
            ).to_json()
        del own
        (home / "sessions" / "sessions.json").write_text(json.dumps(big))
        del big
        await db.close()
        # A daemon starting on that home is a fresh process: measure one.
        probe = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--startup-probe", str(home), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await probe.communicate()
        assert probe.returncode == 0, f"the start-up probe failed ({probe.returncode})"
        got = json.loads(out.decode().splitlines()[-1])
        print(
            f"  start-up with a {got['entries']:,}-entry index, in a fresh process: "
            f"{got['open_s'] + got['load_s']:.2f} s  (target <= 1 s)"
        )
        print(
            f"    state.db open {got['open_s']:.2f} s, then index load + heal {got['load_s']:.2f} s"
        )
        print(
            f"    RSS with it loaded: {got['rss_mb']:.0f} MB (+{got['rss_mb'] - got['rss_before_mb']:.0f} MB "
            "for the index; target <= 250 MB)"
        )


async def startup_probe(home: Path) -> None:
    """What `switchboard run` does first: open state.db, load and heal the index."""
    tune_interpreter()
    t0 = time.perf_counter()
    db = await SessionDB.open(home / "state.db")
    t1 = time.perf_counter()
    before = rss_mb()
    index = SessionIndex(home / "sessions" / "sessions.json", db, flush_interval=2.0)
    how = await index.load()
    t2 = time.perf_counter()
    assert how == "loaded", how
    print(
        json.dumps(
            {
                "open_s": t1 - t0,
                "load_s": t2 - t1,
                "entries": len(index),
                "rss_before_mb": before,
                "rss_mb": rss_mb(),
            }
        )
    )
    await index.close()
    await db.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--startup-probe":
        asyncio.run(startup_probe(Path(sys.argv[2])))
    else:
        asyncio.run(main())
